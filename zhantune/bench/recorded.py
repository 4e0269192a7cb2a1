"""Replay: answer measurements from a recorded Kernel Tuner cache file instead of running kernels.

A Kernel Tuner cache file (``.json`` or ``.json.gz``; format documented by Kernel Tuner and in
``tests/data/kerneltuner/README.md``) holds ``device_name``, ``kernel_name``, ``problem_size``,
``tune_params_keys`` (parameter order), ``tune_params`` (name -> values) and ``cache``: one entry per
configuration, keyed by the values joined with commas, with ``time`` (milliseconds, the mean of
``times``) and ``times``. A failed configuration stores a string in ``time``
(``CompilationFailedConfig``, ``RuntimeFailedConfig``, ...). A configuration of the Cartesian
product that is absent from ``cache`` violated the kernel's restrictions: it is infeasible.

The search space comes from ``tune_params`` (one branch; single-valued parameters are fixed), the
device and the problem from the file's ``device_name`` (a file without one is named after its file
name), ``kernel_name`` and ``problem_size``. What a file must hold to be read is checked in
zhantune.bench.recorded_checks.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import statistics
import time
import unicodedata
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from zhantune.bench.measurement import Measurement
from zhantune.bench.recorded_checks import check_cache, check_fits, check_params, is_time
from zhantune.bench.timing import summarize_us
from zhantune.candidate import Candidate
from zhantune.device import DeviceInfo
from zhantune.errors import ConfigError, shown
from zhantune.search.schema import Branch, Param, Space

__all__ = ["KernelTunerFile", "ReplayProblem", "ReplayBenchmarker", "load_kerneltuner", "entry_times_us", "FAILURE_STATUS",
           "recorded_cost_s"]

#: Kernel Tuner's failure markers (the string in ``time``) -> zhantune status
FAILURE_STATUS = {
    "CompilationFailedConfig": "compile_error",
    "RuntimeFailedConfig": "runtime_error",
    "InvalidConfig": "invalid",
}

_REQUIRED_KEYS = ("device_name", "kernel_name", "problem_size", "tune_params_keys", "tune_params", "cache")
#: the largest Kernel Tuner cache file read, decompressed (the shipped ones: 4.7 to 16.5 MB). JSON of
#: small objects takes up to ~29 bytes of memory per byte read (a review measured 963 MB for 33 MiB
#: of ``{},``): 512 MiB, the cap before, let a 0.5 MB gzip file take ~15 GB; 128 MiB bounds it at ~4 GB
MAX_KT_BYTES = 128 << 20
TEMPLATE_PREFIX = "kerneltuner::"
_NO_INDUCTOR = "a Kernel Tuner file records no Inductor compile"


@dataclass(frozen=True)
class ReplayProblem:
    """The problem a replay file measured: kernel name and problem size; FLOPs where the file has them."""

    kernel_name: str
    problem_size: tuple[Any, ...]
    flops_per_run: int

    @property
    def key(self) -> str:
        """Stable problem key, e.g. ``kerneltuner:Xgemm[4096x4096]``."""
        return f"kerneltuner:{self.kernel_name}[{'x'.join(str(s) for s in self.problem_size)}]"

    def flops(self) -> int:
        return self.flops_per_run

    def tflops(self, time_us: float) -> float | None:
        return self.flops_per_run / (time_us * 1e-6) / 1e12 if self.flops_per_run else None

    def row_fields(self) -> dict[str, Any]:
        """Columns of the problem row (zhantune.storage.orm.Problem)."""
        return dict(op=self.kernel_name, shape={"problem_size": list(self.problem_size)}, dtype="recorded",
                    activation=None, lookup_op=self.kernel_name, flops=self.flops_per_run)


@dataclass
class KernelTunerFile:
    """A loaded Kernel Tuner cache file."""

    path: Path
    device_name: str
    kernel_name: str
    problem_size: tuple[Any, ...]
    param_names: list[str]
    tune_params: dict[str, list[Any]]
    cache: dict[str, dict[str, Any]]
    #: the device's name given by the user (``devices=[...]`` of the import); None: from the file
    device_label: str | None = None
    #: ``device_label`` is the device that already holds this recording (a renamed or decompressed
    #: copy of a file named after its file name: zhantune.storage.ingest.adopt_recorded_device)
    adopted: bool = False
    _digest: str | None = field(default=None, repr=False, compare=False)
    #: SHA-256 of the JSON as read (decompressed); set by :func:`load_kerneltuner`
    content_digest: str | None = field(default=None, repr=False, compare=False)

    @property
    def sha256(self) -> str:
        """The file's SHA-256 (hex digest of its bytes as stored, compressed or not), read once: what
        tells two files of one device and problem apart (import and replay study names)."""
        if self._digest is None:
            self._digest = hashlib.sha256(self.path.read_bytes()).hexdigest()
        return self._digest

    @property
    def digests(self) -> frozenset[str]:
        """:attr:`sha256` and the SHA-256 of the JSON decompressed (one digest for a plain .json): a
        recording gzipped, decompressed or renamed keeps the second (zhantune.storage.ingest.same_recording)."""
        return frozenset(d for d in (self.sha256, self.content_digest) if d)

    @property
    def device_named_by(self) -> str:
        """Where the device's name comes from: ``devices`` (the user), ``device_name`` (the file's
        key) or ``file name`` (the file records no device_name, as benchmark_hub's dedispersion
        MI250X file)."""
        if self.device_label:
            return "the device holding this recording" if self.adopted else "devices"
        return "device_name" if self.device_name.strip() else "file name"

    @property
    def device_key(self) -> str:
        """The device's key and name: ``devices=[...]``'s entry, else the file's ``device_name``,
        else a name from the file name (:func:`device_from_file_name`); never empty, so two files
        without a device name never become one device unless their file names agree."""
        if self.device_label:
            return self.device_label.strip()
        if self.device_name.strip():
            return self.device_name.strip()  # as devices=[...] is: 'NAME ' is not a second device that prints as NAME
        return _nfc(device_from_file_name(self.path, self.kernel_name))

    def entry(self, values: dict[str, Any]) -> dict[str, Any] | None:
        """The cache entry of a configuration (param name -> value), None when absent."""
        return self.cache.get(",".join(str(values[n]) for n in self.param_names))

    def space(self, fixed: dict[str, Any] | None = None) -> Space:
        """One template branch over ``tune_params``; feasible points are exactly the cache's keys.

        ``fixed`` (param name -> value) pins parameters to one of their values, restricting the space
        to that slice of the file (e.g. for a search told part of the answer). Raises ConfigError
        naming the parameter when it is not in ``tune_params`` or the value is not one of its values.
        """
        fixed = dict(fixed or {})
        for name, value in fixed.items():
            if name not in self.tune_params:
                raise ConfigError(f"{self.path}: cannot fix {name}: not a parameter of tune_params; "
                                  f"allowed: {', '.join(self.param_names)}")
            if value not in self.tune_params[name]:
                raise ConfigError(f"{self.path}: cannot fix {name}={value!r}: allowed values "
                                  f"{self.tune_params[name]}")
        params = []
        for name in self.param_names:
            values = self.tune_params[name]
            if name in fixed:
                params.append(Param(name, name, None, fixed[name]))
            elif len(values) == 1:
                params.append(Param(name, name, None, values[0]))
            else:
                params.append(Param(name, name, optuna.distributions.CategoricalDistribution(tuple(values))))
        members = frozenset(tuple(e[n] for n in self.param_names) for e in self.cache.values())
        return Space([Branch(name=self.kernel_name, scope="template",
                             template_id=TEMPLATE_PREFIX + self.kernel_name, params=params, fixed={},
                             constraints=[], source=f"{self.path}: tune_params", members=members)])

    def device(self) -> DeviceInfo:
        """The recorded GPU, keyed by its name (Kernel Tuner files carry no architecture name):
        :attr:`device_key`; ``properties["named_by"]`` says where the name came from."""
        key = self.device_key
        return DeviceInfo(kind="cuda", index=None, key=key, name=key,
                          properties={"source": "kerneltuner", "file": self.path.name,
                                      "named_by": self.device_named_by})

    def problem(self) -> ReplayProblem:
        """The problem; FLOPs per run from the first entry that records GFLOP/s (else 0)."""
        flops = 0
        for e in self.cache.values():
            t, gflops = e.get("time"), e.get("GFLOP/s")
            if is_time(t) and is_time(gflops) and t > 0 and gflops > 0:  # both finite and bounded
                flops = round(gflops * 1e9 * t * 1e-3)
                if flops < 2**63:  # fits the databases' BIGINT; else the next entry's (0: unknown)
                    break
                flops = 0
        return ReplayProblem(self.kernel_name, self.problem_size, flops)

    def best_time_us(self) -> float:
        """The file's optimum: the lowest median (microseconds) of a configuration that ran."""
        return min(statistics.median(times) for e in self.cache.values() if (times := entry_times_us(e)))


def device_from_file_name(path: Path, kernel_name: str) -> str:
    """A device name for a file without ``device_name``: the file name without ``.json``/``.json.gz``
    and without a leading kernel name (``dedispersion_MI250X.json.gz`` of ``dedispersion_kernel``:
    ``MI250X``; benchmark_hub names its files after the GPU: ``dedispersion_milo/MI250X.json.gz``)."""
    stem = path.name
    for suffix in (".gz", ".json"):
        stem = stem.removesuffix(suffix)
    base = kernel_name.removesuffix("_kernel")
    for prefix in (kernel_name + "_", base + "_"):
        if base and stem.startswith(prefix) and len(stem) > len(prefix):
            return stem[len(prefix):]
    return stem


def entry_times_us(entry: dict[str, Any]) -> list[float]:
    """The recorded runs of an entry in microseconds (``times``, else ``time``); [] for a failure."""
    t = entry.get("time")
    if not is_time(t):
        return []
    times = entry.get("times")
    if not isinstance(times, list) or not times or not all(is_time(x) for x in times):
        times = [t]
    return [x * 1000.0 for x in times]


def load_kerneltuner(path: str | Path, source: str = "bench.path", device: str | None = None) -> KernelTunerFile:
    """Read a Kernel Tuner cache file (.json or .json.gz); ``device`` names its device (else the
    file's ``device_name``, else its file name: :attr:`KernelTunerFile.device_key`).

    Raises ConfigError (exit code 2) naming ``source`` and the file when it is missing, not JSON,
    over MAX_KT_BYTES decompressed, or lacks a required key; nothing in the file is executed.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{source}={path}: " + ("a directory, not a Kernel Tuner cache file" if p.is_dir() else
                                                  "not a regular file" if p.exists() else "no such file"))
    try:
        opener = gzip.open if p.suffix == ".gz" else open
        with opener(p, "rb") as f:
            raw = f.read(MAX_KT_BYTES + 1)
        if len(raw) > MAX_KT_BYTES:
            raise ConfigError(f"{source}={path}: over {MAX_KT_BYTES >> 20} MiB of JSON"
                              f"{' decompressed' if p.suffix == '.gz' else ''}: not read")
        data = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique)
    except (OSError, EOFError, zlib.error, ValueError) as e:  # ValueError: bad UTF-8 or JSON, a 5,000-digit int
        why = (str(e).splitlines() or [""])[0] or type(e).__name__
        if isinstance(e, EOFError):
            why = "the compressed file is truncated"
        raise ConfigError(f"{source}={path}: not a Kernel Tuner cache file (JSON): {why}") from None
    except RecursionError:
        raise ConfigError(f"{source}={path}: not a Kernel Tuner cache file: JSON nested too deeply") from None
    except MemoryError:
        raise ConfigError(f"{source}={path}: not read: its JSON does not fit in this machine's memory") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}={path}: not a Kernel Tuner cache file: top level is not an object")
    missing = [k for k in _REQUIRED_KEYS if k not in data]
    if missing:
        raise ConfigError(f"{source}={path}: not a Kernel Tuner cache file: missing key {missing[0]!r}")
    names, tune_params, cache = data["tune_params_keys"], data["tune_params"], data["cache"]
    check_params(names, tune_params, cache, f"{source}={path}")
    check_cache(names, tune_params, cache, f"{source}={path}")
    if data["device_name"] is not None and not isinstance(data["device_name"], str):
        raise ConfigError(f"{source}={path}: device_name={data['device_name']!r}; expected a string (may be empty)")
    if not isinstance(data["kernel_name"], str) or not data["kernel_name"].strip():
        raise ConfigError(f"{source}={path}: kernel_name={data['kernel_name']!r}; expected the kernel's name")
    size = data["problem_size"]
    size = tuple(size) if isinstance(size, list) else (size,)
    if not size or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in size):
        raise ConfigError(f"{source}={path}: problem_size={data['problem_size']!r}; expected a positive integer "
                          "or a list of positive integers")
    # NFC: one name typed or recorded in two Unicode forms ("é" as one code point or e + U+0301) is one device
    loaded = KernelTunerFile(p, _nfc(str(data["device_name"] or "")), _nfc(str(data["kernel_name"])), size, list(names),
                             {n: list(tune_params[n]) for n in names}, cache, _nfc(device) if device else None,
                             content_digest=hashlib.sha256(raw).hexdigest())
    check_fits(loaded, f"{source}={path}")
    return loaded


def _nfc(name: str) -> str:
    return unicodedata.normalize("NFC", name)


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all different (ValueError naming the first repeated one): with a
    duplicate cache key, which entry counts depends on the reader (Python's json keeps the last)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"key {json.dumps(dup)} appears twice in one JSON object")
    return obj


#: the parts of a Kernel Tuner cache entry that a real measurement of it took (milliseconds)
PACE_FIELDS = ("compile_time", "verification_time", "benchmark_time")


def recorded_cost_s(entry: dict[str, Any]) -> float:
    """Seconds the recorded measurement took: the entry's compile, verification and benchmark times
    (Kernel Tuner's simulation mode counts the same fields against a time budget); a field that is
    absent or not a duration (negative, not a number) counts 0."""
    return sum(entry[f] for f in PACE_FIELDS if _duration(entry.get(f))) / 1000.0


def _duration(v: Any) -> bool:
    """Whether a recorded field is a duration: a finite, bounded number of milliseconds, at least 0."""
    return is_time(v) and v >= 0


class ReplayBenchmarker:
    """Answers each candidate from the file: timings are the recorded runs (milliseconds -> us).

    There are no baselines in a Kernel Tuner file, so :meth:`baselines` returns none. With ``pace`` > 0
    each answer takes ``pace`` times as long as the recorded measurement took (:func:`recorded_cost_s`),
    so a replayed study (several workers on one study, a cluster's throughput) runs at the speed of
    the real one; 0 answers at once.
    """

    name = "replay"
    lookup_key = None
    lookup = None

    def __init__(self, file: KernelTunerFile, pace: float = 0.0):
        self.file = file
        self.pace = pace
        self.on_compiled: Callable[[], None] | None = None  # nothing compiles here

    def baselines(self) -> list[tuple[str, Measurement]]:
        return []

    def record_lookup(self) -> Measurement:
        """Recorded data made no Inductor lookup: ``invalid``."""
        return Measurement("invalid", error_text=_NO_INDUCTOR)

    def measure_default(self) -> Measurement:
        """A Kernel Tuner file holds no Inductor default: ``invalid``."""
        return Measurement("invalid", error_text=_NO_INDUCTOR)

    def close(self) -> None:
        """Nothing to release."""

    def measure(self, cand: Candidate) -> Measurement:
        entry = self.file.entry(cand.params)
        if entry is None:  # the space's members make this unreachable through a search
            return Measurement("invalid", error_text="configuration absent from the replay file")
        if self.pace > 0:
            time.sleep(self.pace * recorded_cost_s(entry))
        t = entry["time"]
        if isinstance(t, str):
            # a name Kernel Tuner writes as is; any other text cut and escaped (a review's file held
            # 200 KB with a terminal escape, printed and stored whole)
            return Measurement(FAILURE_STATUS.get(t, "runtime_error"), error_text=t if t in FAILURE_STATUS else shown(t))
        times = entry_times_us(entry)
        if not times:
            return Measurement("invalid", error_text=f"time={t!r} is not a number")
        timing = summarize_us(times, "kerneltuner:replay")
        compile_ms = entry.get("compile_time")
        return Measurement("ok", timing=timing,
                           compile_s=compile_ms / 1000.0 if _duration(compile_ms) else None)

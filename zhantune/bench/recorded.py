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
name), ``kernel_name`` and ``problem_size``.
"""

from __future__ import annotations

import gzip
import json
import statistics
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from zhantune.bench.measurement import Measurement
from zhantune.bench.timing import summarize_us
from zhantune.candidate import Candidate
from zhantune.device import DeviceInfo
from zhantune.errors import ConfigError
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

    @property
    def device_named_by(self) -> str:
        """Where the device's name comes from: ``devices`` (the user), ``device_name`` (the file's
        key) or ``file name`` (the file records no device_name, as benchmark_hub's dedispersion
        MI250X file)."""
        if self.device_label:
            return "devices"
        return "device_name" if self.device_name.strip() else "file name"

    @property
    def device_key(self) -> str:
        """The device's key and name: ``devices=[...]``'s entry, else the file's ``device_name``,
        else a name from the file name (:func:`device_from_file_name`); never empty, so two files
        without a device name never become one device unless their file names agree."""
        if self.device_label:
            return self.device_label
        if self.device_name.strip():
            return self.device_name
        return device_from_file_name(self.path, self.kernel_name)

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
            if _is_time(t) and _is_time(gflops) and t > 0 and gflops > 0:  # both finite and bounded
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


#: the longest time (milliseconds: 11.6 days) read as a measurement; a longer or non-finite number
#: is refused in ``time``/``times`` and ignored in the pace fields (``time.sleep`` cannot take it)
MAX_TIME_MS = 1e9


#: the fields of a cache entry that are not parameters (Kernel Tuner's recorded time and its runs)
_ENTRY_FIELDS = ("time", "times")


def _same(a: Any, b: Any) -> bool:
    """Two JSON scalars that would be one value of a parameter (1 and 1.0; never 1 and true)."""
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def _is_number(t: Any) -> bool:
    return isinstance(t, (int, float)) and not isinstance(t, bool)


def _is_time(t: Any) -> bool:
    """A finite number of milliseconds of at most MAX_TIME_MS (sign not checked: _bad_time)."""
    if not _is_number(t):
        return False
    try:
        return abs(float(t)) <= MAX_TIME_MS  # False for nan and inf; a huge int overflows float()
    except OverflowError:
        return False


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 40 else f"{r[:30]}... ({len(r)} characters)"


def _is_scalar(v: Any) -> bool:
    """A JSON scalar: what an Optuna categorical choice and a config hash can hold."""
    return v is None or isinstance(v, (str, int, float, bool))


def _bad_time(entry: dict[str, Any]) -> str | None:
    """``time=...`` / ``times[i]=...`` when an entry records a time that is not positive, else None
    (a string ``time`` is a failure, e.g. CompilationFailedConfig)."""
    t = entry["time"]
    if isinstance(t, str):
        return None
    if _is_number(t) and (not _is_time(t) or t <= 0):
        return f"time={_short(t)}"
    times = entry.get("times")
    if _is_time(t) and isinstance(times, list):
        for i, x in enumerate(times):
            if _is_number(x) and (not _is_time(x) or x <= 0):
                return f"times[{i}]={_short(x)}"
    return None


def entry_times_us(entry: dict[str, Any]) -> list[float]:
    """The recorded runs of an entry in microseconds (``times``, else ``time``); [] for a failure."""
    t = entry.get("time")
    if not _is_time(t):
        return []
    times = entry.get("times")
    if not isinstance(times, list) or not times or not all(_is_time(x) for x in times):
        times = [t]
    return [x * 1000.0 for x in times]


def load_kerneltuner(path: str | Path, source: str = "bench.path", device: str | None = None) -> KernelTunerFile:
    """Read a Kernel Tuner cache file (.json or .json.gz); ``device`` names its device (else the
    file's ``device_name``, else its file name: :attr:`KernelTunerFile.device_key`).

    Raises ConfigError (exit code 2) naming ``source`` and the file when it is missing, not JSON, or
    lacks a required key; nothing in the file is executed.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{source}={path}: no such file")
    try:
        opener = gzip.open if p.suffix == ".gz" else open
        with opener(p, "rt", encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, json.JSONDecodeError) as e:
        why = (str(e).splitlines() or [""])[0] or type(e).__name__
        if isinstance(e, EOFError):
            why = "the compressed file is truncated"
        raise ConfigError(f"{source}={path}: not a Kernel Tuner cache file (JSON): {why}") from None
    except RecursionError:
        raise ConfigError(f"{source}={path}: not a Kernel Tuner cache file: JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}={path}: not a Kernel Tuner cache file: top level is not an object")
    missing = [k for k in _REQUIRED_KEYS if k not in data]
    if missing:
        raise ConfigError(f"{source}={path}: not a Kernel Tuner cache file: missing key {missing[0]!r}")
    names, tune_params, cache = data["tune_params_keys"], data["tune_params"], data["cache"]
    if not isinstance(tune_params, dict) or not isinstance(cache, dict) or not isinstance(names, list):
        raise ConfigError(f"{source}={path}: tune_params and cache must be objects, tune_params_keys a list")
    clash = next((n for n in names if n in _ENTRY_FIELDS), None)
    twice = next((i for i, n in enumerate(names) if n in names[:i]), None)
    if clash is not None or twice is not None:
        raise ConfigError(f"{source}={path}: tune_params_keys " + (
            f"names the parameter {_short(clash)}, which an entry uses for its recorded time; rename it"
            if clash is not None else f"lists {_short(names[twice])} twice; each parameter once"))
    for n in names:
        values = tune_params.get(n) if isinstance(n, str) else None
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{source}={path}: tune_params.{n} must be a non-empty list")
        bad = next((v for v in values if not _is_scalar(v)), None)
        if bad is not None:
            raise ConfigError(f"{source}={path}: tune_params.{n} holds {bad!r}; a parameter's values are "
                              "numbers, strings, booleans or null")
        twice = next((i for i, v in enumerate(values) if any(_same(v, w) for w in values[:i])), None)
        if twice is not None:
            raise ConfigError(f"{source}={path}: tune_params.{n} lists {_short(values[twice])} twice; a parameter's values "
                              "are distinct")
    if not cache:
        raise ConfigError(f"{source}={path}: cache is empty: no recorded configuration to import or replay")
    for key, entry in cache.items():
        if not isinstance(entry, dict) or "time" not in entry or any(n not in entry for n in names):
            raise ConfigError(f"{source}={path}: cache.{key} lacks 'time' or a parameter of tune_params_keys")
        bad = next((n for n in names if not _is_scalar(entry[n])), None)
        if bad is not None:
            raise ConfigError(f"{source}={path}: cache.{key}.{bad}={entry[bad]!r}; a parameter's value is a "
                              "number, a string, a boolean or null")
        bad = next((n for n in names if entry[n] not in tune_params[n]), None)
        if bad is not None:
            raise ConfigError(f"{source}={path}: cache.{_short(key)}.{bad}={_short(entry[bad])} is not one of "
                              f"tune_params.{bad} {_short(tune_params[bad])}")
        own = ",".join(str(entry[n]) for n in names)  # Kernel Tuner's key: the values in tune_params_keys order
        if key != own:
            raise ConfigError(f"{source}={path}: cache.{_short(key)} holds the configuration {_short(own)}; a cache "
                              "key is its entry's values of tune_params_keys, joined by commas")
        bad = _bad_time(entry)
        if bad:
            raise ConfigError(f"{source}={path}: cache.{key}.{bad}; a recorded time is a positive, finite "
                              f"number of milliseconds up to {MAX_TIME_MS:g} (or a failure name such as "
                              "'CompilationFailedConfig')")
    if data["device_name"] is not None and not isinstance(data["device_name"], str):
        raise ConfigError(f"{source}={path}: device_name={data['device_name']!r}; expected a string (may be empty)")
    if not isinstance(data["kernel_name"], str) or not data["kernel_name"].strip():
        raise ConfigError(f"{source}={path}: kernel_name={data['kernel_name']!r}; expected the kernel's name")
    size = data["problem_size"]
    size = tuple(size) if isinstance(size, list) else (size,)
    if not size or not all(isinstance(x, int) and not isinstance(x, bool) for x in size):
        raise ConfigError(f"{source}={path}: problem_size={data['problem_size']!r}; expected an integer "
                          "or a list of integers")
    loaded = KernelTunerFile(p, str(data["device_name"] or ""), str(data["kernel_name"]), size, list(names),
                             {n: list(tune_params[n]) for n in names}, cache, device or None)
    _check_fits(loaded, f"{source}={path}")
    return loaded


#: the longest kernel name and device name the database's columns hold (zhantune/storage/orm.py:
#: Problem.op 128 and MeasurementRow.template_id 128 with its "kerneltuner::" prefix, Device.key;
#: PostgreSQL enforces them, SQLite does not, so a merge would fail later), and the longest problem
#: key and study name (Problem.key, Study.name)
MAX_KERNEL_NAME, MAX_DEVICE_NAME, MAX_KEY = 100, 256, 512


def _check_fits(f: KernelTunerFile, where: str) -> None:
    """ConfigError when the kernel or device name does not fit the database (length, or a control
    character such as NUL, which PostgreSQL's text cannot hold), or the problem key or a study name
    made of them (replay's ``<problem key>@<device>``, import's ``kerneltuner:<file name>[sha256:
    <12 hex>]@<device>``, zhantune.storage.ingest) would be longer than the database holds."""
    for what, value, limit in (("kernel_name", f.kernel_name, MAX_KERNEL_NAME),
                               (f"device name (from {f.device_named_by})", f.device_key, MAX_DEVICE_NAME)):
        if len(value) > limit or any(ord(c) < 32 for c in value):
            shown = repr(value) if len(value) <= 40 else repr(value[:30]) + "..."
            raise ConfigError(f"{where}: {what} {shown} ({len(value)} characters); the database holds "
                              f"names of at most {limit} characters without control characters"
                              + ("; name the device with devices=[...]" if "device" in what else ""))
    key = f.problem().key
    for what, value in (("problem key", key), ("study name", f"{key}@{f.device_key}"),
                        ("study name", f"kerneltuner:{f.path.name}[sha256:{'0' * 12}]@{f.device_key}")):
        if len(value) > MAX_KEY:
            raise ConfigError(f"{where}: its {what} would be {_short(value)}; the database holds at most "
                              f"{MAX_KEY} characters (a shorter file name, device name or problem_size)")


#: the parts of a Kernel Tuner cache entry that a real measurement of it took (milliseconds)
PACE_FIELDS = ("compile_time", "verification_time", "benchmark_time")


def recorded_cost_s(entry: dict[str, Any]) -> float:
    """Seconds the recorded measurement took: the entry's compile, verification and benchmark times
    (Kernel Tuner's simulation mode counts the same fields against a time budget); 0 when absent."""
    return sum(entry[f] for f in PACE_FIELDS if _is_time(entry.get(f))) / 1000.0


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
            return Measurement(FAILURE_STATUS.get(t, "runtime_error"), error_text=t)
        times = entry_times_us(entry)
        if not times:
            return Measurement("invalid", error_text=f"time={t!r} is not a number")
        timing = summarize_us(times, "kerneltuner:replay")
        compile_ms = entry.get("compile_time")
        return Measurement("ok", timing=timing,
                           compile_s=compile_ms / 1000.0 if _is_time(compile_ms) else None)

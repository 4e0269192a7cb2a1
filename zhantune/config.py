"""Structured configs for the tune app, registered in Hydra's ConfigStore.

The YAML files under ``conf/`` only fill these schemas in: a misspelt key fails at compose time with
Hydra's own error. Values whose checks need more than a type (shape, dtype, device) are validated by
:func:`zhantune.request.check_request` (before torch is imported) and
:func:`zhantune.runspec.resolve_run`, so that the user gets one line naming the value and what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from zhantune.bench.decision import DEFAULT_MIN_SPEEDUP

#: the Hydra config tree shipped inside the package (the repository's conf/ links here)
CONF_DIR = Path(__file__).resolve().parent / "conf"

#: search.transfer values (zhantune.search.transfer)
TRANSFER_MODES = ("auto", "off")

__all__ = ["TRANSFER_MODES", "CONF_DIR", "OpConfig", "SearchConfig", "BenchConfig", "StorageConfig", "ExportConfig",
           "ExportAppConfig", "TuneConfig", "CollectConfig", "CheckConfig", "CompareConfig", "ReplayConfig",
           "KernelTunerConfig", "DbConfig", "register", "group_options", "space_descriptions"]


@dataclass
class OpConfig:
    """One GEMM-family op (``conf/op/<name>.yaml``)."""

    name: str = MISSING
    #: names of the dims ``shape`` lists, in order, e.g. [M, N, K] or [B, M, N, K]
    dims: list[str] = field(default_factory=list)
    #: default search spaces (files in conf/space/) per device kind: {cpu: [...], cuda: [...]}
    spaces: dict[str, list[str]] = field(default_factory=dict)
    #: epilogue activation for ops that take one (linear_act: relu or gelu)
    activation: str | None = None


@dataclass
class SearchConfig:
    """The Optuna search (``conf/search/<name>.yaml``)."""

    name: str = "tpe"
    #: Optuna sampler, instantiated from ``_target_`` (allowlist: optuna.samplers.*, zhantune.*)
    sampler: dict[str, Any] = field(default_factory=lambda: {"_target_": "optuna.samplers.TPESampler"})
    #: measured trials in the study, all runs together (infeasible and cached candidates do not use
    #: this budget): the same command again measures only what is missing, and a finished study exits
    #: at once. Several workers on one study share it
    n_trials: int = 16
    #: measure this many trials more than the study holds now (instead of up to ``n_trials``)
    more_trials: int | None = None
    #: stop starting new trials after this many seconds (None: no limit)
    timeout_s: float | None = None
    seed: int = 0
    #: before sampling, measure what Inductor itself would try (its template heuristics' configs for
    #: this problem, and each config branch at Inductor's defaults), at most ``max_seeds`` of them
    seed_inductor: bool = True
    max_seeds: int = 8
    #: Optuna study name; None derives one from the problem and the device
    study_name: str | None = None
    #: problems=FILE: measured trials over all problems (None: n_trials per problem on average),
    #: shared in proportion to each problem's share of the model's GEMM time, at least min_trials each
    #: where the total allows (the total is never exceeded: zhantune.problemset.allocate_trials)
    total_trials: int | None = None
    min_trials: int = 2
    #: transfer (zhantune.search.transfer, docs/search.md): auto uses what the storage already holds
    #: about this problem as the sampler's prior (the same problem on other devices, else neighbouring
    #: shapes on this device); off: a cold start
    transfer: str = "auto"


@dataclass
class BenchConfig:
    """The benchmark protocol (``conf/bench/<name>.yaml``). Times in milliseconds."""

    name: str = "inductor"
    #: warmup by time before timing, milliseconds
    warmup_ms: float = 25.0
    #: time budget for the timed repetitions, milliseconds (Triton's ``rep``)
    target_ms: float = 100.0
    min_reps: int = 5
    max_reps: int = 1000
    #: CPU: write a buffer larger than the last-level cache between repetitions
    flush_cache: bool = True
    #: CPU: niceness of the timing worker (-20 highest; null: normal priority); needs CAP_SYS_NICE or
    #: root, else the runs keep the normal priority (zhantune.bench.timing.raised_priority)
    nice: int | None = -10
    #: CPU: warmup and timed runs under SCHED_FIFO where permitted (zhantune.bench.timing.realtime):
    #: the only setting found that shields short kernels from other work (docs/timing.md)
    fifo: bool = True
    #: before each timed measurement, wait with a doubling back-off for at most this many seconds while
    #: as many other tasks as cores are runnable (CUDA: other processes on the GPU); then time anyway and
    #: flag the row contended (zhantune.bench.conditions.wait_until_idle). 0: do not wait
    busy_wait_s: float = 1.0
    #: CUDA: time through a CUDA graph so Python launch overhead is excluded
    cuda_graph: bool = True
    #: compile and time in a worker subprocess (a crash or hang kills the worker, not the study)
    isolate: bool = True
    #: worker time limits, seconds: until the candidate compiled, then for the check and timed runs
    compile_timeout_s: float = 600.0
    run_timeout_s: float = 300.0
    #: finished C++ kernel binaries kept between tunes (zhantune.inductor.kernel_store, docs/timing.md):
    #: auto: zhantune-kernels/ in Inductor's cache directory; a directory; off: every tune builds its own
    kernel_store: str | None = "auto"
    #: compile ahead: worker subprocesses compiling the next candidates while one is timed
    #: (zhantune.bench.compile_pool.CompilePool); null: one per four cores, at most 4 (on CUDA at least
    #: 1; on CPU 0 below four cores); 0: off. Needs isolate
    compile_workers: int | None = None
    #: close calls: when the best two configs' 20th-80th percentile ranges overlap, measure both again
    #: this many times each, interleaved (A B A B ...), before the winner is exported; and the paired
    #: rounds of the winner against Inductor's default (0: off; 1 confirms no speedup: docs/timing.md)
    remeasure_rounds: int = 3
    #: bench=replay: the Kernel Tuner cache file (.json or .json.gz) that answers every measurement
    path: str | None = None
    #: bench=replay: the recorded device's name (as the import's ``devices=[...]``); null: the file's
    #: ``device_name``, else a name from its file name
    device_name: str | None = None
    #: a resumed study re-uses its stored baselines (eager, Inductor's default) when they were measured
    #: on this device with this torch (and triton) version; true measures them again
    remeasure_baselines: bool = False
    #: bench=replay: each answer takes this many times as long as the recorded measurement took (the
    #: entry's compile + verification + benchmark time), so a replayed study runs at the real one's
    #: speed (several jobs on one study, docs/cluster.md); 0: answer at once
    replay_pace: float = 0.0


#: BenchConfig field -> (lowest, highest) value allowed (None: unbounded), checked by check_bench
BENCH_RANGES: dict[str, tuple[float | None, float | None]] = {
    "warmup_ms": (0.0, 600_000.0), "target_ms": (0.001, 600_000.0), "min_reps": (1, None),
    "max_reps": (1, None), "compile_timeout_s": (0.001, 604_800.0), "run_timeout_s": (0.001, 604_800.0),
    "compile_workers": (0, 64), "remeasure_rounds": (0, 1000), "nice": (-20, 19), "busy_wait_s": (0.0, 600.0),
    "replay_pace": (0.0, 1000.0),
}


def check_bench(bench: Any, prefix: str = "bench.") -> None:
    """Check every numeric benchmark option against BENCH_RANGES (and min_reps <= max_reps);
    raises ConfigError naming the option, e.g. "bench.target_ms=-1 must be at least 0.001"."""
    from zhantune.errors import ConfigError

    for name, (low, high) in BENCH_RANGES.items():
        value = bench.get(name) if hasattr(bench, "get") else getattr(bench, name, None)
        if value is None:
            continue
        if value != value:  # NaN: every comparison is false, so no range check below would catch it
            raise ConfigError(f"{prefix}{name}=nan is not a number" + (f"; allowed: {low:g} to {high:g}"
                                                                        if low is not None and high is not None else ""))
        if low is not None and value < low:
            raise ConfigError(f"{prefix}{name}={value} must be at least {low:g}"
                              + (" (0: off)" if name in ("compile_workers", "remeasure_rounds") else ""))
        if high is not None and value > high:
            raise ConfigError(f"{prefix}{name}={value} must be at most {high:g}")
    if bench.min_reps > bench.max_reps:
        raise ConfigError(f"{prefix}min_reps={bench.min_reps} must not exceed {prefix}max_reps={bench.max_reps}")


@dataclass
class StorageConfig:
    """Where measurements and the Optuna study live: one SQLAlchemy URL."""

    url: str = "sqlite:///zhantune.db"
    #: Optuna's heartbeat of running trials, whole seconds (null: off). A trial whose heartbeat is
    #: ``grace_period_s`` old (its worker was preempted, killed or lost) is failed by another worker
    #: of the study, which releases its claim and measures the point again (docs/cluster.md)
    heartbeat_interval_s: int | None = 10
    grace_period_s: int = 60


@dataclass
class ExportConfig:
    """The lookup table written at the end of a tune (options as for ``python -m zhantune.export``)."""

    enabled: bool = True
    path: str = "zhantune_table.json"
    #: zhantune: the table wrapped with its provenance (versions, devices, source); inductor: the bare
    #: dict ``torch._inductor.config.lookup_table.table`` takes
    format: str = "zhantune"
    #: entries per key, fastest first (1: no autotuning at compile time; more: Inductor autotunes)
    top_k: int = 1
    #: emit a tuned entry only when its confirmed claim beats Inductor's default compile by this
    #: factor, else the default choice; None: always the tuned entry. 1.02: two copies of one kernel
    #: were confirmed 1.002-1.015x apart on CPU and on an H100 (docs/timing.md)
    min_speedup: float | None = DEFAULT_MIN_SPEEDUP
    #: key entries without the device part (usable on any device)
    device_agnostic: bool = False
    #: only rows measured with this torch version (exact string, e.g. "2.13.0+cpu"); None: any
    torch_version: str | None = None


@dataclass
class TuneConfig:
    """The tune app: ``python -m zhantune +op=mm shape=[M,N,K]``."""

    op: OpConfig = MISSING
    #: problem dims in the op's order ([M,N,K] for mm/addmm, [B,M,N,K] for bmm); checked by the app
    shape: Any = MISSING
    dtype: str = "float32"
    #: auto | cpu | cuda | cuda:N (auto: cuda when available)
    device: str = "auto"
    #: the dry run only (python -m zhantune.space): preview the CUDA spaces on a GPU profile (H100, H200,
    #: A100, L4, MI300X; zhantune.inductor.simulate.PROFILES) without a GPU; a tune refuses it
    device_profile: str | None = None
    #: search spaces (file names in conf/space/); None uses the op's default for the device kind
    space: Any = None
    search: SearchConfig = field(default_factory=SearchConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    #: "kn": W [K, N]; "nk": nn.Linear's W [N, K] used as W.t() (part of Inductor's lookup key)
    weight_layout: str = "kn"
    #: a problems file written by ``python -m zhantune.collect``: tune every problem in it
    problems: str | None = None
    #: print the Rich progress bar
    progress: bool = True


@dataclass
class ExportAppConfig(ExportConfig):
    """``python -m zhantune.export``: the table options plus the database and a device filter."""

    storage: StorageConfig = field(default_factory=StorageConfig)
    #: a device key (e.g. "NVIDIA H100 80GB HBM3") to export one device only; None: all devices
    device: str | None = None
    #: a problems file (python -m zhantune.collect): only its problems (a model's table); None: all
    problems: str | None = None


@dataclass
class ModelConfig:
    """A model and its inputs, as collect and check take them."""

    #: module:factory returning an nn.Module (e.g. zhantune.models:mlp)
    model: str | None = None
    #: keyword arguments of the factory, e.g. model_kwargs={d_model:64,hidden:128}
    model_kwargs: Any = None
    #: one shape per model input, e.g. [[64,256]]
    input_shapes: Any = None
    #: float32 | bfloat16 | float16 (None: float32 on CPU, bfloat16 on CUDA)
    dtype: str | None = None
    device: str = "auto"
    bench: BenchConfig = field(default_factory=BenchConfig)


@dataclass
class CollectConfig(ModelConfig):
    """``python -m zhantune.collect``: a model's GEMM problems (conf/collect.yaml)."""

    #: the problems file written
    out: str = "problems.yaml"
    #: time each problem's default compile (its share of the model's GEMM time)
    measure: bool = True


@dataclass
class CheckConfig(ModelConfig):
    """``python -m zhantune.check``: compile a model with a table; hits, misses, stale; three timings."""

    #: the table file (either format)
    table: str | None = None
    #: exit with code 1 when the share of GEMM lookups that hit is below this (of the lookups a table
    #: can serve: a GEMM that is not tunable, attention's bmm on CPU, is left out)
    min_coverage: float = 1.0
    #: also compile and time with max-autotune (slow: Inductor benchmarks every choice)
    max_autotune: bool = True
    #: interleaved timing rounds: each round times every way once, in a rotated order
    rounds: int = 5
    #: write the report (hits, misses, stale, timings) as JSON here
    json: str | None = None


@dataclass
class CompareConfig:
    """``python -m zhantune.compare``: per-device winners, regret, portable choices (conf/compare.yaml)."""

    storage: StorageConfig = field(default_factory=StorageConfig)
    #: device keys, names or numbers to compare (a list; checked by the app); None: every device
    devices: Any = None
    #: how many of the most-disagreeing problems to list
    top: int = 5
    csv: str | None = None
    json: str | None = None
    html: str | None = None
    #: a study's history and importances in the HTML report (its name or a part only it has)
    study: str | None = None
    #: write the portable choices as device-agnostic lookup-table entries (Inductor's default choice
    #: where one may not replace the default: ``min_speedup``)
    table: str | None = None
    #: ``table=``: a portable choice only where it may replace Inductor's default on every compared
    #: device (ExportConfig.min_speedup's rule), else the default's entry; None: no check
    min_speedup: float | None = DEFAULT_MIN_SPEEDUP


@dataclass
class ReplayConfig:
    """``python -m zhantune.replay``: measure a table's entries on this device (conf/replay.yaml)."""

    table: str = MISSING
    device: str = "auto"
    seed: int = 0
    bench: BenchConfig = field(default_factory=BenchConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)


@dataclass
class KernelTunerConfig:
    """``python -m zhantune.kerneltuner``: import Kernel Tuner cache files (conf/kerneltuner.yaml)."""

    storage: StorageConfig = field(default_factory=StorageConfig)
    #: the cache files (a list; checked by the app)
    files: Any = field(default_factory=list)
    #: one device name per file (a list; checked by the app); None: from each file
    devices: Any = None


@dataclass
class DbConfig:
    """``python -m zhantune.db``: the results database (conf/db.yaml)."""

    storage: StorageConfig = field(default_factory=StorageConfig)
    #: merge: the databases to copy into storage.url (a list of URLs)
    sources: Any = field(default_factory=list)


def group_options(group: str) -> str:
    """The options of config group ``group`` (the files in conf/<group>/), comma-separated; the
    ``zt_options`` resolver of the ``--help`` templates (``${zt_options:space}``)."""
    return ", ".join(sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")))


def space_descriptions(indent: int = 4, width: int = 100) -> str:
    """One line per shipped search space, ``name: description`` (its YAML's ``description``); the
    ``zt_spaces`` resolver of the ``--help`` templates, so that help lists every file in conf/space/."""
    import textwrap

    from omegaconf import OmegaConf

    lines = []
    for path in sorted((CONF_DIR / "space").glob("*.yaml")):
        description = OmegaConf.load(path).get("description", "")
        head = f"{' ' * indent}{path.stem + ':':24s}"
        lines += textwrap.wrap(description, width=width, initial_indent=head,
                               subsequent_indent=" " * len(head)) or [head.rstrip()]
    return "\n".join(lines)


def register() -> None:
    """Register the schemas in Hydra's ConfigStore and the resolvers of the ``--help`` templates
    (idempotent). The group options (op, search, bench, storage) are typed by TuneConfig's fields;
    no schema is registered inside a group, so ``--help`` lists only real options."""
    from omegaconf import OmegaConf

    cs = ConfigStore.instance()
    cs.store(name="tune_schema", node=TuneConfig)
    cs.store(name="export_schema", node=ExportAppConfig)
    cs.store(name="collect_schema", node=CollectConfig)
    cs.store(name="check_schema", node=CheckConfig)
    cs.store(name="compare_schema", node=CompareConfig)
    cs.store(name="replay_schema", node=ReplayConfig)
    cs.store(name="kerneltuner_schema", node=KernelTunerConfig)
    cs.store(name="db_schema", node=DbConfig)
    OmegaConf.register_new_resolver("zt_options", group_options, replace=True)
    OmegaConf.register_new_resolver("zt_spaces", lambda: space_descriptions(), replace=True)

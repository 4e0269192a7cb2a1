"""Structured configs for the tune app, registered in Hydra's ConfigStore.

The YAML files under ``conf/`` only fill these schemas in: a misspelt key fails at compose time with
Hydra's own error. Values whose checks need more than a type (shape, dtype, device) are validated by
:func:`zhantune.cli.resolve_run` so that the user gets one line naming the value and what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

#: the Hydra config tree shipped inside the package (the repository's conf/ links here)
CONF_DIR = Path(__file__).resolve().parent / "conf"

__all__ = ["CONF_DIR", "OpConfig", "SearchConfig", "BenchConfig", "StorageConfig", "ExportConfig", "TuneConfig", "register"]


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
    #: measured trials to run (infeasible and cached candidates do not use this budget)
    n_trials: int = 16
    #: stop starting new trials after this many seconds (None: no limit)
    timeout_s: float | None = None
    seed: int = 0
    #: before sampling, measure what Inductor itself would try (its template heuristics' configs for
    #: this problem, and each config branch at Inductor's defaults), at most ``max_seeds`` of them
    seed_inductor: bool = True
    max_seeds: int = 8
    #: Optuna study name; None derives one from the problem and the device
    study_name: str | None = None


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
    #: CUDA: time through a CUDA graph so Python launch overhead is excluded
    cuda_graph: bool = True
    #: compile and time in a worker subprocess (a crash or hang kills the worker, not the study)
    isolate: bool = True
    #: worker time limits, seconds: until the candidate compiled, then for the check and timed runs
    compile_timeout_s: float = 600.0
    run_timeout_s: float = 300.0
    #: bench=replay: the Kernel Tuner cache file (.json or .json.gz) that answers every measurement
    path: str | None = None


@dataclass
class StorageConfig:
    """Where measurements and the Optuna study live: one SQLAlchemy URL."""

    url: str = "sqlite:///zhantune.db"


@dataclass
class ExportConfig:
    """The lookup table written at the end of a tune."""

    enabled: bool = True
    path: str = "zhantune_table.json"


@dataclass
class TuneConfig:
    """The tune app: ``python -m zhantune +op=mm shape=[M,N,K]``."""

    op: OpConfig = MISSING
    #: problem dims in the op's order ([M,N,K] for mm/addmm, [B,M,N,K] for bmm); checked by the app
    shape: Any = MISSING
    dtype: str = "float32"
    #: auto | cpu | cuda | cuda:N (auto: cuda when available)
    device: str = "auto"
    #: search spaces (file names in conf/space/); None uses the op's default for the device kind
    space: Any = None
    search: SearchConfig = field(default_factory=SearchConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    #: print the Rich progress bar
    progress: bool = True


def register() -> None:
    """Register the schemas in Hydra's ConfigStore (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name="tune_schema", node=TuneConfig)
    cs.store(group="op", name="op_schema", node=OpConfig)
    cs.store(group="search", name="search_schema", node=SearchConfig)
    cs.store(group="bench", name="bench_schema", node=BenchConfig)
    cs.store(group="storage", name="storage_schema", node=StorageConfig)

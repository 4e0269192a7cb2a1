"""Benchmarking: the benchmarker protocol and its implementations, the timing protocol, the
machine's conditions, typed measurements and the decisions taken from them.

- :class:`Benchmarker` (zhantune.bench.protocol): what the tune loop calls;
  ``InductorBenchmarker`` (inductor.py: compile one candidate, check it applied, check, time),
  ``ReplayBenchmarker`` (recorded.py: a Kernel Tuner cache file), ``IsolatedBenchmarker``
  (isolated.py: either in a worker subprocess) and ``CompilePool`` (compile_pool.py: compile ahead);
- :class:`Measurement` (measurement.py): a status, timings in microseconds (timing.py), the
  conditions it was taken in (conditions.py);
- decisions under one-sided noise (decision.py: the decision statistic, the ranking rule, paired
  speedup verdicts) and the tune's settles (settle.py: close calls, speedups over the default).

The benchmarker classes are imported on first use (they import torch); the rest is light.
"""

from typing import Any

from zhantune.bench.decision import (
    Round,
    SpeedupVerdict,
    best_per_config,
    decision_us,
    judge_speedup,
    rank_key,
)
from zhantune.bench.measurement import STATUSES, Measurement
from zhantune.bench.protocol import Benchmarker

__all__ = ["Benchmarker", "Measurement", "STATUSES", "Round", "SpeedupVerdict", "judge_speedup", "decision_us",
           "rank_key", "best_per_config", "InductorBenchmarker", "ReplayBenchmarker", "IsolatedBenchmarker",
           "CompilePool"]

_LAZY = {"InductorBenchmarker": "zhantune.bench.inductor", "ReplayBenchmarker": "zhantune.bench.recorded",
         "IsolatedBenchmarker": "zhantune.bench.isolated", "CompilePool": "zhantune.bench.compile_pool"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'zhantune.bench' has no attribute {name!r}")

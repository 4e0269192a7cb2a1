"""Rows stored for a test without a tune: what a database holds after another run on this machine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zhantune.bench.measurement import Measurement
from zhantune.bench.timing import Timing
from zhantune.device import resolve_device
from zhantune.problems import GemmProblem
from zhantune.storage import Recorder, Store


def warm_default_row(db: Path, lookup_key: str | None = None, method: str = "cpu:perf_counter:fifo",
                     study: str = "warm", us: float = 24.9) -> tuple[Any, GemmProblem]:
    """One ok ``default`` row of mm 16x16x16 float32 on this CPU in the SQLite file ``db`` (timed
    warm-cache by default, ``us`` microseconds), in study ``study``; returns (the CPU, the problem)."""
    cpu, problem = resolve_device("cpu"), GemmProblem("mm", (16, 16, 16), "float32")
    store = Store(f"sqlite:///{db}")
    rec = Recorder(store, problem, store.study_id(study, {}), store.device_id(cpu.key, cpu.name, "cpu", cpu.properties),
                   store.problem_id(problem.key, lookup_key=lookup_key, **problem.row_fields()), cpu)
    rec.add(Measurement("ok", Timing(us, us, us, us, us, 100, method)), "default")
    store.engine.dispose()
    return cpu, problem

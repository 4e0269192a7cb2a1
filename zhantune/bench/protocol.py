"""The benchmarker protocol: what the tune loop, the settles and the isolated worker call.

Implemented by zhantune.bench.inductor.InductorBenchmarker (compiles and times in this process),
zhantune.bench.recorded.ReplayBenchmarker (answers from a Kernel Tuner file) and
zhantune.bench.isolated.IsolatedBenchmarker (either of them in a worker subprocess).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from zhantune.bench.measurement import Measurement
    from zhantune.candidate import Candidate
    from zhantune.inductor.choices import LookupEvent

__all__ = ["Benchmarker"]


class Benchmarker(Protocol):
    """Measures one problem on one device. Every method returns a Measurement (a status, and
    timings in microseconds when it ran); a failure is a status, never an exception."""

    #: "inductor" or "replay"
    name: str
    #: the GEMM lookup Inductor made while compiling the default baseline (None: none yet, or
    #: recorded data): template candidates are served under its key
    lookup: LookupEvent | None
    #: called once a candidate compiled, before its timed runs (the isolated worker switches from
    #: the compile time limit to the run time limit); None: nobody listens
    on_compiled: Callable[[], None] | None

    @property
    def lookup_key(self) -> str | None:
        """The device-agnostic Inductor input key of the problem's GEMM (after the baselines)."""

    def baselines(self) -> list[tuple[str, Measurement]]:
        """(kind, measurement) of each baseline: eager, Inductor's default (which records the
        lookup), on CPU its default without freezing; [] for recorded data."""

    def record_lookup(self) -> Measurement:
        """Compile Inductor's default once, untimed, to record the problem's GEMM lookup."""

    def measure_default(self) -> Measurement:
        """Inductor's default compile, timed again (the speedup settle's paired rounds)."""

    def measure(self, candidate: Candidate) -> Measurement:
        """Compile with exactly this candidate, confirm it applied, check the output, time it."""

    def close(self) -> None:
        """Release what the benchmarker holds (a worker process); a no-op in this process."""

"""A test-only benchmarker that crashes or hangs on chosen candidates, built inside a benchmark
worker (zhantune.bench.isolated.WorkerSpec ``faults:faulty``): the tests of the isolation inject
their faults through it, never through zhantune itself."""

from __future__ import annotations

import os
import time
from typing import Any

from zhantune.bench.isolated import WorkerSpec, build


def faulty_spec(inner: WorkerSpec, faults: list[dict[str, Any]]) -> WorkerSpec:
    """A worker spec for ``inner``'s benchmarker that, on a candidate whose params contain a fault's
    ``match``, aborts the worker (``"action": "abort"``) or sleeps ``seconds`` first (``"sleep"``)."""
    return WorkerSpec("faults:faulty", {**inner.args, "inner": inner, "faults": faults})


def faulty(args: dict[str, Any]) -> FaultyBenchmarker:
    return FaultyBenchmarker(build(args["inner"]), args["faults"])


class FaultyBenchmarker:
    """The benchmarker ``inner``, with faults on the candidates that match."""

    def __init__(self, inner: Any, faults: list[dict[str, Any]]):
        self.__dict__["inner"] = inner
        self.__dict__["faults"] = faults

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:  # on_compiled and the like: the inner one's
        setattr(self.inner, name, value)

    def _fault(self, cand: Any) -> None:
        for fault in self.faults:
            if all(cand.params.get(k) == v for k, v in fault["match"].items()):
                if fault["action"] == "abort":
                    os.abort()
                time.sleep(float(fault.get("seconds", 3600)))

    def measure(self, cand: Any) -> Any:
        self._fault(cand)
        return self.inner.measure(cand)

    def precompile(self, cand: Any) -> Any:
        self._fault(cand)
        return self.inner.precompile(cand)

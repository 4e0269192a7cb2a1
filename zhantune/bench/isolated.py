"""Benchmark in a worker subprocess, so a crash, a hang or an out-of-memory kills only the worker.

The parent (the search, the database) holds no device state: the benchmarker is built inside a
worker started with the ``spawn`` method. Each request gets two time limits: ``compile_timeout_s``
until the worker reports the candidate compiled, then ``run_timeout_s`` for the check and the timed
runs. A worker that dies (a signal such as SIGSEGV or SIGABRT, a CUDA error that kills the process)
yields a ``crashed`` measurement naming the cause; one that exceeds a limit is killed and yields
``timeout``. Either way the next request starts a fresh worker, and the study goes on.

Test hook: when the environment variable ``ZHANTUNE_TEST_FAULTS`` holds a JSON list of
``{"match": {param: value, ...}, "action": "abort" | "sleep", "seconds": s}``, a worker aborts or
sleeps on a candidate whose params contain ``match``. It exists for the tests of this module.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

from zhantune.bench.measurement import Measurement
from zhantune.search.space import Candidate

__all__ = ["WorkerSpec", "IsolatedBenchmarker", "FAULTS_ENV"]

FAULTS_ENV = "ZHANTUNE_TEST_FAULTS"


@dataclass(frozen=True)
class WorkerSpec:
    """How a worker builds its benchmarker: ``kind`` "inductor" (problem, device, bench config,
    seed, the lookup recorded by the baselines) or "replay" (the Kernel Tuner file)."""

    kind: str
    args: dict[str, Any]


def _build(spec: WorkerSpec) -> Any:
    if spec.kind == "replay":
        from zhantune.bench.replay import ReplayBenchmarker, load_kerneltuner

        return ReplayBenchmarker(load_kerneltuner(spec.args["path"]))
    from omegaconf import OmegaConf

    from zhantune.bench.inductor import InductorBenchmarker
    from zhantune.config import BenchConfig
    from zhantune.device import resolve_device

    cfg = OmegaConf.merge(OmegaConf.structured(BenchConfig), spec.args["bench"])
    bench = InductorBenchmarker(spec.args["problem"], resolve_device(spec.args["device"]), cfg, seed=spec.args["seed"])
    bench.lookup = spec.args.get("lookup")
    return bench


def _apply_test_fault(cand: Candidate) -> None:
    faults = os.environ.get(FAULTS_ENV)
    if not faults:
        return
    for fault in json.loads(faults):
        if all(cand.params.get(k) == v for k, v in fault["match"].items()):
            if fault["action"] == "abort":
                os.abort()
            time.sleep(float(fault.get("seconds", 3600)))


def _worker_main(conn: Any, spec: WorkerSpec) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; Ctrl-C reaches the whole group
    from zhantune.quiet import quiet_known_warnings

    quiet_known_warnings()
    bench = _build(spec)
    conn.send(("ready", None))
    if hasattr(bench, "on_compiled"):
        bench.on_compiled = lambda: conn.send(("compiled", None))
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        if request[0] == "baselines":
            result: Any = bench.baselines()
            conn.send(("result", (result, getattr(bench, "lookup", None))))
        elif request[0] == "default":
            conn.send(("result", bench.measure_default()))
        elif request[0] == "measure":
            _apply_test_fault(request[1])
            conn.send(("result", bench.measure(request[1])))
        else:
            return


def _signal_name(exitcode: int | None) -> str:
    if exitcode is None:
        return "unknown"
    if exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"


class IsolatedBenchmarker:
    """The benchmarker protocol (baselines, measure, lookup_key) over a worker subprocess."""

    def __init__(self, spec: WorkerSpec, compile_timeout_s: float, run_timeout_s: float,
                 startup_timeout_s: float = 300.0):
        self.spec = spec
        self.compile_timeout_s = compile_timeout_s
        self.run_timeout_s = run_timeout_s
        self.startup_timeout_s = startup_timeout_s
        self._ctx = mp.get_context("spawn")
        self._proc: Any = None
        self._conn: Any = None
        self.lookup: Any = None
        self.restarts = 0

    @property
    def lookup_key(self) -> str | None:
        return self.lookup.agnostic_key if self.lookup else None

    # -- worker lifecycle -------------------------------------------------------------------
    def _start(self) -> None:
        spec = self.spec
        if self.lookup is not None and spec.kind == "inductor":
            spec = WorkerSpec(spec.kind, {**spec.args, "lookup": self.lookup})
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_worker_main, args=(child, spec), daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent
        if not parent.poll(self.startup_timeout_s):
            raise RuntimeError(f"benchmark worker did not start within {self.startup_timeout_s:.0f} s")
        parent.recv()  # ("ready", None); EOFError if the worker died while starting

    def _kill(self) -> None:
        if self._proc is not None:
            if self._proc.is_alive():
                self._proc.kill()
            self._proc.join(timeout=30)
            self._conn.close()
        self._proc = self._conn = None
        self.restarts += 1

    def close(self) -> None:
        if self._proc is not None:
            try:
                self._conn.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
            self._proc.join(timeout=10)
            if self._proc.is_alive():
                self._proc.kill()
            self._proc = self._conn = None

    def _request(self, request: tuple) -> tuple[str, Any]:
        """("result", payload) or ("crashed" | "timeout", error text)."""
        if self._proc is None:
            self._start()
        self._conn.send(request)
        try:
            return self._wait(self.compile_timeout_s)
        except KeyboardInterrupt:  # the measurement is abandoned: so is its worker
            self._kill()
            raise

    def _wait(self, limit: float) -> tuple[str, Any]:
        phase = "compile"
        while True:
            if not self._conn.poll(limit):
                if not self._proc.is_alive():
                    return self._died()
                self._kill()
                return "timeout", f"{phase} exceeded {limit:.0f} s (bench.{phase}_timeout_s); worker killed"
            try:
                kind, payload = self._conn.recv()
            except (EOFError, ConnectionResetError, OSError):
                return self._died()
            if kind == "compiled":
                phase, limit = "run", self.run_timeout_s
                continue
            return kind, payload

    def _died(self) -> tuple[str, str]:
        self._proc.join(timeout=30)
        cause = _signal_name(self._proc.exitcode)
        self._kill()
        return "crashed", f"benchmark worker died ({cause}); replaced"

    # -- the benchmarker protocol -----------------------------------------------------------
    def baselines(self) -> list[tuple[str, Measurement]]:
        kind, payload = self._request(("baselines",))
        if kind != "result":
            return [("default", Measurement(kind, error_text=payload))]
        baselines, self.lookup = payload
        return baselines

    def measure_default(self) -> Measurement:
        kind, payload = self._request(("default",))
        if kind != "result":
            return Measurement(kind, error_text=payload)
        return payload

    def measure(self, cand: Candidate) -> Measurement:
        kind, payload = self._request(("measure", cand))
        if kind != "result":
            return Measurement(kind, error_text=payload)
        return payload

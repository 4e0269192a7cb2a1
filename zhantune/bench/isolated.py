"""Benchmark in a worker subprocess, so a crash, a hang or an out-of-memory kills only the worker.

The parent (the search, the database) holds no device state: the benchmarker is built inside a
worker started with the ``spawn`` method. Each request gets two time limits: ``compile_timeout_s``
until the worker reports the candidate compiled, then ``run_timeout_s`` for the check and the timed
runs. A worker that dies (a signal such as SIGSEGV or SIGABRT, a CUDA error that kills the process)
yields a ``crashed`` measurement naming the cause; one that exceeds a limit is killed and yields
``timeout``. Either way the next request starts a fresh worker, and the study goes on.

The worker builds its benchmarker from a :class:`WorkerSpec`: ``inductor`` or ``replay`` by name, or
any ``module:function`` that takes the spec's args and returns a Benchmarker (the tests' faulty
benchmarker is built so: tests/faults.py).
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing as mp
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

from zhantune.bench.measurement import Measurement
from zhantune.bench.protocol import Benchmarker
from zhantune.candidate import Candidate

log = logging.getLogger(__name__)

__all__ = ["WorkerSpec", "IsolatedBenchmarker", "build"]


@dataclass(frozen=True)
class WorkerSpec:
    """How a worker builds its benchmarker: ``kind`` "inductor" (problem, device, bench config,
    seed, the lookup recorded by the baselines) or "replay" (the Kernel Tuner file)."""

    kind: str
    args: dict[str, Any]


def build(spec: WorkerSpec) -> Benchmarker:
    """The benchmarker ``spec`` describes, built in this process (the worker calls it first)."""
    cache_dir = spec.args.get("cache_dir")
    if cache_dir:  # the tune's kernel cache (zhantune.inductor.settings.scratch_cache_dir), shared by its workers
        from zhantune.inductor.kernel_store import serve
        from zhantune.inductor.settings import cache_dir_env

        os.environ.update(cache_dir_env(cache_dir))
        serve(spec.args.get("kernel_store"), cache_dir)  # binaries from earlier tunes (bench.kernel_store)
    if spec.kind == "replay":
        from zhantune.bench.recorded import ReplayBenchmarker, load_kerneltuner

        return ReplayBenchmarker(load_kerneltuner(spec.args["path"]), spec.args.get("pace", 0.0))
    if spec.kind != "inductor":  # module:function(args) -> Benchmarker
        module, _, name = spec.kind.partition(":")
        return getattr(importlib.import_module(module), name)(spec.args)
    from zhantune.bench.inductor import InductorBenchmarker
    from zhantune.config import BenchConfig
    from zhantune.device import resolve_device

    cfg = BenchConfig(**spec.args["bench"])
    bench = InductorBenchmarker(spec.args["problem"], resolve_device(spec.args["device"]), cfg, seed=spec.args["seed"])
    bench.lookup = spec.args.get("lookup")
    return bench


def _thread_lock_for_tqdm() -> None:
    """tqdm (torch.fx's interpreter makes a disabled progress bar while compiling) creates a
    multiprocessing lock, a semaphore registered with the parent's resource tracker; a worker killed
    on purpose (a timeout, a compile abandoned at the end of a tune) would leave it for the tracker,
    which warns at exit. A worker needs no cross-process lock: tqdm's documented set_lock."""
    try:
        from tqdm import tqdm
    except ImportError:
        return
    tqdm.set_lock(threading.RLock())


def _die_with_parent(parent: int, every_s: float = 0.5) -> None:
    """Kill this worker's process group (itself and its compilers) once ``parent`` is gone: a parent
    killed by a signal it does not handle (SIGHUP when the terminal closes, SIGKILL) cannot kill the
    group itself, and the worker is outside the terminal's process group (:func:`_worker_main`)."""
    while os.getppid() == parent:
        time.sleep(every_s)
    os.killpg(0, signal.SIGKILL)


def _worker_main(conn: Any, spec: WorkerSpec) -> None:
    # the parent decides: Ctrl-C interrupts it, and it kills the worker
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # a process group of its own: the parent kills the worker with the compilers it runs (a compiler
    # left running after a compile timeout would share the cores with every later timed run), and
    # pauses a compile worker with them; the group dies with the parent
    os.setpgrp()
    parent = mp.parent_process()
    threading.Thread(target=_die_with_parent, args=(parent.pid if parent else os.getppid(),), daemon=True,
                     name="die-with-parent").start()
    from zhantune.quiet import quiet_known_warnings

    quiet_known_warnings()
    _thread_lock_for_tqdm()
    bench = build(spec)
    nice = getattr(getattr(bench, "cfg", None), "nice", None)
    if nice is not None and not spec.args.get("compile_ahead"):
        # the timing worker gets the cores first while it times (compile workers stay as they are;
        # docs/timing.md: the per-trial minimum's CV under four busy loops, 62-72% -> under 1%)
        from zhantune.bench.timing import renice_threads

        renice_threads(nice)
    conn.send(("ready", None))

    def compiled() -> None:  # the parent answers "go" once it is ready for the timed runs
        conn.send(("compiled", None))
        conn.recv()

    bench.on_compiled = compiled
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
        elif request[0] == "lookup":
            conn.send(("result", (bench.record_lookup(), bench.lookup)))
        elif request[0] == "measure":
            conn.send(("result", bench.measure(request[1])))
        elif request[0] == "precompile":
            conn.send(("result", bench.precompile(request[1])))
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
        #: called with "run" when the worker reports the candidate compiled (its timed runs start)
        #: and with "end" when the request ends: a CPU tune pauses its compile-ahead pool meanwhile
        self.phase_hook: Any = None

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

    @property
    def pid(self) -> int | None:
        """The worker's process id while one is running."""
        proc = self._proc
        return proc.pid if proc is not None else None

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the worker's process group (the worker and the compilers it runs)."""
        pid = self.pid
        if pid is not None:
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):  # not (yet) a group leader, or gone
                pass

    def abort(self) -> None:
        """Kill the running worker and its process group (its compilers) without waiting:
        the thread waiting on its answer sees it die (CompilePool.close abandons a compile so)."""
        proc = self._proc
        if proc is not None:
            self.signal_group(signal.SIGKILL)
            if proc.is_alive():
                proc.kill()

    def _kill(self) -> None:
        if self._proc is not None:
            pid = self._proc.pid
            self.abort()
            self._proc.join(timeout=30)
            self._conn.close()
            self._prune(pid)
        self._proc = self._conn = None
        self.restarts += 1

    def _prune(self, group: int) -> None:
        """Once the killed worker's process group (its compilers) is gone, delete what its builds left
        half-written in the tune's kernel cache (zhantune.inductor.kernel_store.prune_partial): Inductor
        would load it by name, or take a failed ISA check for a missing ISA."""
        cache_dir = self.spec.args.get("cache_dir")
        if not cache_dir:
            return
        for _ in range(100):  # at most 5 s: SIGKILL ends a compiler at once
            try:
                os.killpg(group, 0)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.05)
        from zhantune.inductor.kernel_store import prune_partial

        try:
            prune_partial(cache_dir)
        except OSError as e:  # the worker is gone all the same; its replacement may fail on what it left
            log.warning("could not check the kernel cache for half-written binaries: %s", e)

    def close(self) -> None:
        if self._proc is not None:
            try:
                self._conn.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
            self._proc.join(timeout=10)
            if self._proc.is_alive():
                self.signal_group(signal.SIGKILL)
                self._proc.kill()
                self._proc.join(timeout=10)  # reaped: no zombie left behind
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
        finally:
            if self.phase_hook is not None:
                self.phase_hook("end")

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
                if self.phase_hook is not None:
                    self.phase_hook("run")
                try:
                    self._conn.send(("go",))
                except (BrokenPipeError, OSError):
                    return self._died()
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

    def record_lookup(self) -> Measurement:
        """InductorBenchmarker.record_lookup in the worker; keeps the lookup it recorded."""
        kind, payload = self._request(("lookup",))
        if kind != "result":
            return Measurement(kind, error_text=payload)
        meas, self.lookup = payload
        return meas

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

    def precompile(self, cand: Candidate) -> Measurement:
        """Compile only (InductorBenchmarker.precompile: ``ok`` without a timing when it compiled);
        a crash or a time limit is ``crashed`` / ``timeout`` as for :meth:`measure`."""
        kind, payload = self._request(("precompile", cand))
        if kind != "result":
            return Measurement(kind, error_text=f"compile-ahead worker: {payload}")
        return payload

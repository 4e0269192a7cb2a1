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
import queue
import signal
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from zhantune.bench.measurement import Measurement
from zhantune.search.space import Candidate

__all__ = ["WorkerSpec", "IsolatedBenchmarker", "CompilePool", "FAULTS_ENV", "default_compile_workers"]

FAULTS_ENV = "ZHANTUNE_TEST_FAULTS"


@dataclass(frozen=True)
class WorkerSpec:
    """How a worker builds its benchmarker: ``kind`` "inductor" (problem, device, bench config,
    seed, the lookup recorded by the baselines) or "replay" (the Kernel Tuner file)."""

    kind: str
    args: dict[str, Any]


def _build(spec: WorkerSpec) -> Any:
    cache_dir = spec.args.get("cache_dir")
    if cache_dir:  # compile-ahead: Inductor's (and Triton's) on-disk kernel cache, shared by the workers
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
        os.environ["TRITON_CACHE_DIR"] = os.path.join(cache_dir, "triton")
    if spec.kind == "replay":
        from zhantune.bench.replay import ReplayBenchmarker, load_kerneltuner

        return ReplayBenchmarker(load_kerneltuner(spec.args["path"]), spec.args.get("pace", 0.0))
    from omegaconf import OmegaConf

    from zhantune.bench.inductor import InductorBenchmarker
    from zhantune.config import BenchConfig
    from zhantune.device import resolve_device

    cfg = OmegaConf.merge(OmegaConf.structured(BenchConfig), spec.args["bench"])
    bench = InductorBenchmarker(spec.args["problem"], resolve_device(spec.args["device"]), cfg, seed=spec.args["seed"])
    bench.lookup = spec.args.get("lookup")
    bench.kernel_cache = bool(cache_dir)
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


def _worker_main(conn: Any, spec: WorkerSpec) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; Ctrl-C reaches the whole group
    if spec.args.get("own_group"):  # a compile worker: the parent pauses it (and its compilers) as a group
        os.setpgrp()
    from zhantune.quiet import quiet_known_warnings

    quiet_known_warnings()
    _thread_lock_for_tqdm()
    bench = _build(spec)
    nice = getattr(getattr(bench, "cfg", None), "nice", None)
    if nice is not None and not spec.args.get("own_group"):
        # the timing worker gets the cores first while it times (compile workers stay as they are;
        # docs/timing.md: the per-trial minimum's CV under four busy loops, 62-72% -> under 1%)
        from zhantune.bench.timing import renice_threads

        renice_threads(nice)
    conn.send(("ready", None))
    if hasattr(bench, "on_compiled"):
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
            _apply_test_fault(request[1])
            conn.send(("result", bench.measure(request[1])))
        elif request[0] == "precompile":
            _apply_test_fault(request[1])
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
        """Send ``sig`` to a compile worker's process group (the worker and the compilers it runs)."""
        pid = self.pid
        if pid is not None and self.spec.args.get("own_group"):
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):  # not (yet) a group leader, or gone
                pass

    def abort(self) -> None:
        """Kill the running worker (and its process group, for a compile worker) without waiting:
        the thread waiting on its answer sees it die (CompilePool.close abandons a compile so)."""
        proc = self._proc
        if proc is not None:
            self.signal_group(signal.SIGKILL)
            if proc.is_alive():
                proc.kill()

    def _kill(self) -> None:
        if self._proc is not None:
            self.abort()
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
                self.signal_group(signal.SIGKILL)
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


def _wait_stopped(pid: int, limit_s: float) -> None:
    """Wait until /proc says process ``pid`` is stopped (state T), it is gone, or ``limit_s`` passed."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:  # gone, or no /proc
            return
        if stat[stat.rindex(")") + 2] in "Tt":
            return
        time.sleep(0.001)


def default_compile_workers(device_kind: str, cores: int | None = None) -> int:
    """Compile-ahead workers when ``bench.compile_workers`` is unset: one per four cores, at most
    four. On CUDA at least one (the GPU times while the cores compile). On CPU none below four cores:
    the timed runs need every core (the pool is paused meanwhile) and the timing worker still lowers
    each candidate, so one worker on 2 cores measured slower than none (docs/timing.md)."""
    cores = cores or os.cpu_count() or 1
    n = min(4, cores // 4)
    return max(1, n) if device_kind == "cuda" else n


class CompilePool:
    """Compile ahead: worker subprocesses compile the next candidates while the timing worker times
    the current one (Inductor's own idea: precompile the choices in parallel, benchmark serially).

    Every worker (the timing worker included) has Inductor's on-disk kernel cache in one directory
    (``cache_dir`` in the worker spec; zhantune.bench.inductor.KERNEL_CACHE_PATCH), so the timing
    worker's compile of a precompiled candidate finds its C++ or Triton binaries there and skips the
    C++/Triton compiler; it still lowers the graph, so its lookup and template checks are its own.
    A candidate that fails to compile here (``compile_error``, ``not_applied``) or kills or hangs its
    compile worker (``crashed``, ``timeout``; the worker is replaced) gets that result without
    reaching the timing worker. The pool is paused (SIGSTOP to each worker's process group,
    compilers included) while the timing worker runs timed repetitions, so compiles never share the
    cores with a timing on CPU, and on CUDA no compile worker launches its candidate's kernels (each
    runs its compile once to check it) on the GPU being timed; the compile time limit keeps running
    meanwhile. (A kernel a worker launched just before it stopped may still finish on the GPU during
    the timing worker's warmup.)
    """

    def __init__(self, spec: WorkerSpec, size: int, compile_timeout_s: float, run_timeout_s: float):
        if size < 1:
            raise ValueError(f"compile pool size {size} must be at least 1")
        worker_spec = WorkerSpec(spec.kind, {**spec.args, "own_group": True})
        self.size = size
        self._workers = [IsolatedBenchmarker(worker_spec, compile_timeout_s, run_timeout_s) for _ in range(size)]
        self._idle: queue.Queue[IsolatedBenchmarker] = queue.Queue()
        for w in self._workers:
            self._idle.put(w)
        self._executor = ThreadPoolExecutor(max_workers=size, thread_name_prefix="zhantune-compile")
        self._futures: dict[str, Future] = {}
        self._lock = threading.Lock()
        self._busy: set[IsolatedBenchmarker] = set()
        self._paused = False

    @property
    def lookup(self) -> Any:
        return self._workers[0].lookup

    @lookup.setter
    def lookup(self, value: Any) -> None:
        """The GEMM lookup recorded by the timing worker's baselines (template candidates need it)."""
        for w in self._workers:
            w.lookup = value

    @property
    def pids(self) -> list[int]:
        """Process ids of the compile workers running now."""
        return [pid for pid in (w.pid for w in self._workers) if pid is not None]

    def submit(self, cand: Candidate) -> None:
        """Start compiling ``cand`` on the next idle worker; returns at once."""
        if cand.config_hash not in self._futures:
            self._futures[cand.config_hash] = self._executor.submit(self._compile, cand)

    def _compile(self, cand: Candidate) -> Measurement:
        worker = self._idle.get()
        with self._lock:
            self._busy.add(worker)
        try:
            return worker.precompile(cand)
        finally:
            with self._lock:
                self._busy.discard(worker)
            self._idle.put(worker)

    def result(self, cand: Candidate) -> Measurement | None:
        """Wait for ``cand``'s compile: ``ok`` (no timing) or the failure; None when it was not
        submitted (the timing worker then compiles it alone)."""
        future = self._futures.pop(cand.config_hash, None)
        if future is None:
            return None
        try:
            return future.result()
        except (EOFError, OSError, RuntimeError) as e:  # the worker could not start
            return Measurement("crashed", error_text=f"compile-ahead worker: {type(e).__name__}: {e}"[:500])

    def phase_hook(self, phase: str) -> None:
        """IsolatedBenchmarker.phase_hook of the timing worker (CPU and CUDA): pause on "run"."""
        self.pause() if phase == "run" else self.resume()

    def pause(self) -> None:
        """Stop every compile worker's process group; returns once each worker shows as stopped
        (Linux /proc; at most 1 s each)."""
        with self._lock:
            if not self._paused:
                self._paused = True
                for w in self._workers:
                    w.signal_group(signal.SIGSTOP)
                for pid in self.pids:
                    _wait_stopped(pid, 1.0)

    def resume(self) -> None:
        with self._lock:
            if self._paused:
                self._paused = False
                for w in self._workers:
                    w.signal_group(signal.SIGCONT)

    def close(self) -> None:
        """Stop the idle workers, kill the busy ones (a compile in flight is abandoned), wait for
        their threads."""
        self.resume()
        for future in self._futures.values():
            future.cancel()
        with self._lock:
            busy = list(self._busy)
        for w in busy:
            w.abort()
        self._executor.shutdown(wait=True, cancel_futures=True)
        for w in self._workers:
            w.close()
        self._futures.clear()

"""Compile ahead: worker subprocesses compile the next candidates while the timing worker times the
current one (zhantune.bench.isolated runs each worker).
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from zhantune.bench.isolated import IsolatedBenchmarker, WorkerSpec
from zhantune.bench.measurement import Measurement
from zhantune.candidate import Candidate

__all__ = ["CompilePool", "default_compile_workers"]


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
    (``cache_dir`` in the worker spec: the tune's, zhantune.inductor.settings.scratch_cache_dir and
    KERNEL_CACHE_PATCH), so the timing
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
        worker_spec = WorkerSpec(spec.kind, {**spec.args, "compile_ahead": True})
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

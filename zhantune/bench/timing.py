"""The timing protocol: one module, units in every name.

CPU (after Triton's ``do_bench``): run once and synchronise; warm up for ``warmup_ms``; estimate one
run; derive the repetitions from ``target_ms`` within [min_reps, max_reps]; before each repetition
write a buffer larger than the last-level cache (``flush_cache``); time each run on its own with
``time.perf_counter_ns``; reduce to median, min, max and the 20th/80th percentiles.

On a shared machine the timed runs get the cores first: warmup and timed runs run under SCHED_FIFO
(``bench.fifo``, :func:`realtime`: a woken thread preempts ordinary tasks at once), and the timing
worker (zhantune.bench.isolated) runs at niceness ``bench.nice`` (default -10) for its whole life
(:func:`renice_threads`; without FIFO an in-process timing raises its threads for the timed runs,
:func:`raised_priority`). Niceness alone shields a long kernel but not a short one: a 30 us kernel
under four busy loops on two cores measured 13.5-15.7 ms at nice -10 (every call waits for a woken
OpenMP thread's slice) and 29-30 us under SCHED_FIFO (docs/timing.md). Without the privilege (root,
or CAP_SYS_NICE with RLIMIT_RTPRIO / RLIMIT_NICE) the runs keep the normal priority and the method
says so (no ``:fifo`` / ``:nice`` suffix).

CUDA: Triton's own ``triton.testing.do_bench_cudagraph`` (kernel time without Python launch
overhead) or ``do_bench`` (L2 flush, per-run CUDA events), asking for every run's time
(``return_mode="all"``) so that both devices reduce the same way.

Every Timing carries median, min, max, the 20th/80th percentiles, mean, standard deviation, interquartile
range and coefficient of variation; :func:`is_tie` says whether two are within each other's noise.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from zhantune.bench.decision import cpu_timing_method

__all__ = ["Timing", "summarize_us", "time_cpu", "time_cuda", "is_tie", "runs_per_sample", "run_range_us",
           "raised_priority", "renice_threads", "realtime", "DEFAULT_NICE"]

#: the niceness of the timed runs (lower runs first; -20 is the highest, 0 the normal priority)
DEFAULT_NICE = -10

#: fallback size of the flush buffer where sysfs does not give the cache sizes
_DEFAULT_FLUSH_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Timing:
    """Timings of one kernel in microseconds over ``n`` repetitions; ``method`` says how."""

    median_us: float
    min_us: float
    max_us: float
    p20_us: float
    p80_us: float
    n: int
    method: str
    mean_us: float | None = None
    std_us: float | None = None
    #: interquartile range: 75th - 25th percentile
    iqr_us: float | None = None
    p25_us: float | None = None
    p75_us: float | None = None

    @property
    def cv(self) -> float | None:
        """Coefficient of variation of the runs: std / mean (None where unknown)."""
        if self.std_us is None or not self.mean_us:
            return None
        return self.std_us / self.mean_us

    def as_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


def _cut_points(values: list[float], n: int) -> list[float]:
    """The n-quantiles' cut points of ``values``, interpolated linearly between order statistics
    (``statistics.quantiles``' inclusive method: torch.quantile's default rule); one value is every
    cut point of itself."""
    if len(values) == 1:
        return values * (n - 1)
    return statistics.quantiles(values, n=n, method="inclusive")


def summarize_us(times_us: list[float], method: str) -> Timing:
    """Reduce per-run times (microseconds) to a Timing. Raises ValueError on an empty list."""
    if not times_us:
        raise ValueError("no timings to summarize")
    s = sorted(times_us)
    p25, _, p75 = _cut_points(s, 4)
    p20, _, _, p80 = _cut_points(s, 5)
    mean = statistics.fmean(s)  # and std_us in floats: statistics.stdev's exact fractions took 0.3 ms a call
    return Timing(
        median_us=statistics.median(s),
        min_us=s[0],
        max_us=s[-1],
        p20_us=p20,
        p80_us=p80,
        n=len(s),
        method=method,
        mean_us=mean,
        std_us=math.sqrt(math.fsum((x - mean) ** 2 for x in s) / (len(s) - 1)) if len(s) > 1 else 0.0,
        iqr_us=p75 - p25,
        p25_us=p25,
        p75_us=p75,
    )


def runs_per_sample(method: str | None) -> int:
    """How many runs each timed sample averages, from a Timing's ``method`` (``...:batch=N``); 1 for
    per-run times. Triton's ``do_bench_cudagraph`` replays a graph of N unrolled calls and returns
    one mean per replay (:func:`time_cuda`)."""
    for part in (method or "").split(":"):
        if part.startswith("batch="):
            try:
                return max(1, int(part.removeprefix("batch=")))
            except ValueError:
                return 1
    return 1


def run_range_us(t: Any) -> tuple[float, float]:
    """The 20th-80th percentile range of one run's time (microseconds) of a Timing or stored row.
    Samples that are means of N runs (:func:`runs_per_sample`) spread sqrt(N) times less than single
    runs (independent runs); their range is widened by sqrt(N) about the median, so that a CUDA-graph
    timing and a per-run timing (CPU, ``do_bench``) describe the same spread."""
    scale = math.sqrt(runs_per_sample(getattr(t, "method", None) or getattr(t, "timing_method", None)))
    return t.median_us - (t.median_us - t.p20_us) * scale, t.median_us + (t.p80_us - t.median_us) * scale


def is_tie(a: Any, b: Any) -> bool:
    """True when two timings (Timing objects or stored measurement rows, microseconds) are within each
    other's noise: their per-run 20th-80th percentile ranges (:func:`run_range_us`) overlap."""
    (a20, a80), (b20, b80) = run_range_us(a), run_range_us(b)
    return a20 <= b80 and b20 <= a80


def _to_fifo() -> list[tuple[int, int, int]] | None:
    """Every thread of this process under SCHED_FIFO at the lowest real-time priority (1): it
    preempts ordinary tasks at once when it wakes. The (thread, old policy, old priority) changed, or
    None when not permitted (those changed so far are restored)."""
    saved: list[tuple[int, int, int]] = []
    for tid in _thread_ids():
        try:
            policy = os.sched_getscheduler(tid)
            if policy == os.SCHED_FIFO:
                continue
            prio = os.sched_getparam(tid).sched_priority
            os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(1))
            saved.append((tid, policy, prio))
        except ProcessLookupError:
            continue
        except (PermissionError, AttributeError):  # no privilege, or not Linux
            _from_fifo(saved)
            return None
    return saved


def _from_fifo(saved: list[tuple[int, int, int]], known: set[int] | None = None) -> None:
    """Restore each saved thread; a thread started inside the block (not in ``known``, the threads
    at its start) inherited FIFO from its creator and gets the calling thread's old policy (an
    OpenMP pool started by the first timed GEMM would otherwise stay real-time for good)."""
    for tid, policy, prio in saved:
        with contextlib.suppress(OSError):
            os.sched_setscheduler(tid, policy, os.sched_param(prio))
    mine = next(((policy, prio) for tid, policy, prio in saved if tid == threading.get_native_id()), None)
    if known is None or mine is None or any(_policy(tid) == os.SCHED_FIFO for tid in known):
        # a thread FIFO before the block (every one changed is restored by now) may have started the
        # new ones: left as they are. A thread gone since does not count: it was never FIFO here (it
        # counted before, and a pool thread that ended between the block's list and its change left
        # the OpenMP pool started inside it real-time for good, in CI)
        return
    for tid in set(_thread_ids()) - known:
        with contextlib.suppress(OSError):
            if os.sched_getscheduler(tid) == os.SCHED_FIFO:
                os.sched_setscheduler(tid, mine[0], os.sched_param(mine[1]))


def _policy(tid: int) -> int | None:
    """Thread ``tid``'s scheduling policy, or None where it is gone (or not Linux)."""
    try:
        return os.sched_getscheduler(tid)
    except (OSError, AttributeError):
        return None


@contextlib.contextmanager
def realtime(enabled: bool) -> Iterator[bool]:
    """The block's threads run under SCHED_FIFO (priority 1) where permitted (root or
    CAP_SYS_NICE with an RLIMIT_RTPRIO), each thread's policy restored afterwards, and threads
    started inside the block (they inherit FIFO) put back to the calling thread's old policy; yields
    whether it took effect. Only for short timed runs: the kernel's real-time throttling still leaves
    other tasks 5% of each second, and a hung run is ended by the worker's run time limit."""
    known = set(_thread_ids())
    saved = _to_fifo() if enabled else None
    try:
        yield bool(saved)
    finally:
        _from_fifo(saved or [], known)


def _thread_ids() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:  # not Linux: the process as a whole
        return [0]


def renice_threads(nice: int) -> bool:
    """Every thread of this process at niceness ``nice`` from now on (threads started later inherit
    it from their creator); False when not permitted (nothing changed then)."""
    saved = _renice(nice)
    return saved is not None


def _renice(nice: int) -> list[tuple[int, int]] | None:
    """Set every thread above ``nice`` to it; the (thread, old niceness) pairs changed, or None when
    not permitted (those changed so far are restored)."""
    saved: list[tuple[int, int]] = []
    for tid in _thread_ids():
        try:
            before = os.getpriority(os.PRIO_PROCESS, tid)
            if before <= nice:
                continue
            os.setpriority(os.PRIO_PROCESS, tid, nice)
            saved.append((tid, before))
        except ProcessLookupError:  # the thread ended meanwhile
            continue
        except PermissionError:
            _restore(saved)
            return None
    return saved


def _restore(saved: list[tuple[int, int]], known: set[int] | None = None, nice: int | None = None) -> None:
    """Each saved thread back to its old niceness; threads started since (not in ``known``) at
    exactly the raised ``nice`` inherited it from a raised creator and get the calling thread's old
    value (one started by a thread that was higher already keeps its creator's value)."""
    for tid, before in saved:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, tid, before)
    mine = next((before for tid, before in saved if tid == threading.get_native_id()), None)
    if known is None or mine is None or nice is None:
        return
    for tid in set(_thread_ids()) - known:
        with contextlib.suppress(OSError):
            if os.getpriority(os.PRIO_PROCESS, tid) == nice:
                os.setpriority(os.PRIO_PROCESS, tid, mine)


@contextlib.contextmanager
def raised_priority(nice: int | None) -> Iterator[bool]:
    """Every thread of this process at niceness ``nice`` for the block, each thread's own value
    restored afterwards (threads started inside inherit ``nice``: they get the calling thread's old
    value back); yields whether it took effect.
    ``None`` or a value not below the current one changes nothing (yields False), and so does a
    missing privilege (EPERM: only CAP_SYS_NICE or RLIMIT_NICE may lower niceness)."""
    if nice is None:
        yield False
        return
    known = set(_thread_ids())
    saved = _renice(nice)
    try:
        yield bool(saved)
    finally:
        _restore(saved or [], known, nice)


def _last_level_cache_bytes() -> int | None:
    """Largest CPU cache of cpu0 from sysfs ("32768K"), or None where unreadable."""
    import glob

    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            text = open(path, encoding="ascii").read().strip()
        except OSError:
            continue
        mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * mult)
    return max(sizes) if sizes else None


def cpu_flush_bytes() -> int:
    """Flush buffer size: twice the last-level cache (64 MiB where unknown)."""
    llc = _last_level_cache_bytes()
    return 2 * llc if llc else _DEFAULT_FLUSH_BYTES


class _CacheFlusher:
    def __init__(self, nbytes: int):
        import torch

        self.buf = torch.empty(nbytes // 4, dtype=torch.int32)

    def __call__(self) -> None:
        self.buf.fill_(1)


_flusher: _CacheFlusher | None = None


def time_cpu(fn: Callable[[], object], *, warmup_ms: float = 25.0, target_ms: float = 100.0,
             min_reps: int = 5, max_reps: int = 1000, flush_cache: bool = True,
             nice: int | None = DEFAULT_NICE, fifo: bool = True) -> Timing:
    """Time ``fn`` on the CPU; returns microseconds over n runs, each timed alone (median, minimum,
    ...). Warmup and timed runs under SCHED_FIFO where permitted (``fifo``, :func:`realtime`), else
    at niceness ``nice`` (:func:`raised_priority`; None: the normal priority); the method ends in
    ``:fifo`` or ``:nice<N>`` for what took effect."""
    with realtime(fifo) as rt, raised_priority(None if rt else nice) as raised:
        timing = _time_cpu(fn, warmup_ms, target_ms, min_reps, max_reps, flush_cache)
    suffix = ":fifo" if rt else f":nice{nice}" if nice is not None and (
        raised or os.getpriority(os.PRIO_PROCESS, 0) <= nice) else ""
    return Timing(**{**timing.as_dict(), "method": timing.method + suffix}) if suffix else timing


def _time_cpu(fn: Callable[[], object], warmup_ms: float, target_ms: float, min_reps: int, max_reps: int,
              flush_cache: bool) -> Timing:
    global _flusher
    flush = None
    if flush_cache:
        if _flusher is None:
            _flusher = _CacheFlusher(cpu_flush_bytes())
        flush = _flusher
    fn()
    # estimate one run (each after a flush, as in the timed loop; the flush itself is not counted)
    est_ns = []
    for _ in range(3):
        if flush:
            flush()
        t0 = time.perf_counter_ns()
        fn()
        est_ns.append(time.perf_counter_ns() - t0)
    est_ms = max(statistics.median(est_ns) / 1e6, 1e-3)
    deadline = time.perf_counter_ns() + warmup_ms * 1e6
    while time.perf_counter_ns() < deadline:
        fn()
    reps = int(min(max(target_ms / est_ms, min_reps), max_reps))
    times_us = []
    for _ in range(reps):
        if flush:
            flush()
        start = time.perf_counter_ns()
        fn()
        times_us.append((time.perf_counter_ns() - start) / 1e3)
    return summarize_us(times_us, cpu_timing_method(flush is not None))


def time_cuda(fn: Callable[[], object], *, warmup_ms: float = 25.0, target_ms: float = 100.0,
              cuda_graph: bool = True) -> Timing:
    """Time ``fn`` on the current CUDA device with Triton's protocol; microseconds, reduced by
    :func:`summarize_us`.

    ``cuda_graph``: ``triton.testing.do_bench_cudagraph`` (no launch overhead), after ``warmup_ms``
    of calls (:func:`_warm_up_cuda`: Triton's function runs ``fn`` only a handful of times before it
    captures, so the GPU's clocks could still be ramping up). It captures N unrolled calls in one graph
    (N = ``target_ms`` / a first estimate of one call) and returns, with ``return_mode="all"``, ten
    replays' means, not per-run times; the method records N, counted as the calls made while the graph
    was captured (``cuda:triton.do_bench_cudagraph:batch=N``), so that :func:`is_tie` compares per-run
    spreads. Else ``triton.testing.do_bench`` (L2 flush, one CUDA event pair per run): per-run times."""
    import torch
    import triton.testing

    if cuda_graph:
        captured = [0]

        def counted() -> object:  # N: the calls captured into the graph (Triton picks it)
            if torch.cuda.is_current_stream_capturing():
                captured[0] += 1
            return fn()

        _warm_up_cuda(fn, warmup_ms)
        times_ms = triton.testing.do_bench_cudagraph(counted, rep=target_ms, return_mode="all")
        method = f"cuda:triton.do_bench_cudagraph:batch={max(1, captured[0])}"
    else:
        times_ms = triton.testing.do_bench(fn, warmup=warmup_ms, rep=target_ms, return_mode="all")
        method = "cuda:triton.do_bench"
    return summarize_us([t * 1e3 for t in times_ms], method)


def _warm_up_cuda(fn: Callable[[], object], warmup_ms: float) -> None:
    """Call ``fn`` for about ``warmup_ms`` of GPU time, as ``triton.testing.do_bench`` warms up: the
    time of 5 calls (one CUDA event pair) gives the estimate, then warmup_ms / estimate calls."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate_ms = max(start.elapsed_time(end) / 5, 1e-6)
    for _ in range(min(max(1, int(warmup_ms / estimate_ms)), 1_000_000)):
        fn()
    torch.cuda.synchronize()

"""What marks a measurement contended (zhantune.bench.conditions), read through the real /proc: what
this process does itself is not other work, and what other work does is still seen."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
import torch

from zhantune.bench import conditions as cond


def test_the_runnable_count_is_the_fewest_of_readings_a_millisecond_apart(monkeypatch):
    """Right after a timed run /proc/stat's runnable count stays above what /proc lists for 1-5 ms
    (a quiet tune's rows read 2-4 "others"): a snapshot takes readings 1 ms apart and keeps the
    fewest, stopping at the first 0; a count that stays up is read ``_READINGS`` times and kept."""
    answers = iter([3, 2, 0, 5])
    calls = []

    def reading() -> int:
        calls.append(1)
        return next(answers)

    monkeypatch.setattr(cond, "_others_now", reading)
    assert cond.others_running() == 0 and len(calls) == 3
    calls.clear()
    monkeypatch.setattr(cond, "_others_now", lambda: calls.append(1) or 2)
    assert cond.others_running() == 2 and len(calls) == cond._READINGS
    monkeypatch.setattr(cond, "_others_now", lambda: None)  # no /proc/stat
    assert cond.others_running() is None


def test_a_busy_loop_in_another_process_is_still_counted():
    """The fewest of the readings still counts a task that keeps a core: a busy loop started here is
    runnable in every reading (the real /proc/stat)."""
    hog = subprocess.Popen([sys.executable, "-c", "print(flush=True)\nwhile True: pass"], stdout=subprocess.PIPE)
    try:
        assert hog.stdout.readline() == b"\n"  # spinning
        assert cond.others_running() >= 1
    finally:
        hog.kill()
        hog.wait()


def test_a_helper_thread_kept_waiting_by_the_timed_runs_is_not_their_waiting():
    """The timed runs run under SCHED_FIFO on every core; a helper thread of the same process that
    wakes meanwhile (the timing worker's parent watch) waits until they end. That wait was summed
    into ``run_wait_ms``, and rows of a quiet tune were contended (60-90 ms of 100-130). Only the
    threads that run the timed runs count (the caller and the OpenMP pool, not Python's other
    threads): here the helper waited most of the block (its own schedstat) and the row is not delayed."""
    from zhantune.bench.timing import realtime, time_cpu

    with realtime(True) as permitted:
        if not permitted:
            pytest.skip("no SCHED_FIFO here (needs root or CAP_SYS_NICE)")
    torch.set_num_threads(2)
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    a @ b  # the OpenMP pool exists before the block
    stop, tid = threading.Event(), []

    def helper() -> None:  # wakes every 5 ms, as the parent watch does every 0.5 s
        tid.append(threading.get_native_id())
        while not stop.wait(0.005):
            pass

    thread = threading.Thread(target=helper, daemon=True)
    thread.start()
    while not tid:
        time.sleep(0.001)
    try:
        before = cond._run_wait_ns()[str(tid[0])]
        with cond.run_queue_wait() as seen:
            timing = time_cpu(lambda: a @ b, warmup_ms=10, target_ms=100, fifo=True)
        after = cond._run_wait_ns()[str(tid[0])]
    finally:
        stop.set()
        thread.join()
    helper_wait_ms = (after - before) / 1e6
    if helper_wait_ms < cond.RUN_WAIT_SHARE * seen["timed_ms"]:
        pytest.skip(f"the helper was not kept waiting here ({helper_wait_ms:.1f} ms of {seen['timed_ms']:.0f})")
    assert timing.method.endswith(":fifo")
    assert seen["run_wait_ms"] < helper_wait_ms and not cond.run_delayed(seen), (helper_wait_ms, seen)


def test_a_load_average_above_the_cores_is_contention_only_where_the_threads_waiting_was_not_read():
    """The 1-minute load average counts the tune's own threads: a quiet tune at 2 threads on 2 cores
    read 1.8-2.3 and 13 of its 19 rows were contended by it, their threads having waited 0-5 ms of
    67-411. Where the timed runs' own waiting was read it decides; without it (no schedstat) the
    load average still does."""
    row = {"cores": 2, "load_avg_1m": 2.29, "others_running": 0, "busy_at_start": False, "waited_s": 0.0}
    assert not cond.is_contended({**row, "run_wait_ms": 4.8, "timed_ms": 247.3})
    assert cond.is_contended({**row, "run_wait_ms": 120.0, "timed_ms": 247.3})  # kept waiting: contended
    assert cond.is_contended(row)  # nothing else read: the load average decides
    assert cond.is_contended({**row, "others_running": 2, "run_wait_ms": 0.0, "timed_ms": 247.3})

"""What marks a measurement contended (zhantune.bench.conditions), read through the real /proc: what
this process does itself is not other work, and what other work does is still seen."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from unittest import mock

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
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 2)  # every core runs a timed thread (restored below)
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
        torch.set_num_threads(threads)
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


def test_a_thread_of_this_process_that_starts_between_the_reads_does_not_hide_another_task(monkeypatch):
    """A reading subtracts this process's running threads from /proc/stat's count, and the two are not
    read at one moment: a thread that starts running after the count was read is not in it, and
    subtracting it read an always-running busy loop as 0 others (an attack, session 55). The fewer of
    the scans before and after the count is subtracted."""
    stat = mock.mock_open(read_data="procs_running 2\n")  # the reader and a busy loop
    # nothing of this process runs but the reader until the count is read, one thread after it
    monkeypatch.setattr(cond, "own_running", lambda: int(stat.called))
    with mock.patch("zhantune.bench.conditions.open", stat, create=True):
        assert cond._others_now() == 1


def test_on_an_smt_machine_a_task_beside_the_timed_threads_is_contention(tmp_path, monkeypatch):
    """A task on a timed thread's SMT sibling slows it without any run-queue waiting, and is fewer
    tasks than logical CPUs: with SMT (the physical cores, from sysfs, fewer than the logical CPUs),
    more other runnable tasks than whole cores free of the timed threads is contention. Without SMT
    the count of logical CPUs stays the rule (a busy loop beside 2 FIFO threads on 2 cores did not
    change their times: 0 of 11 rows, an attack of session 55)."""
    from zhantune.device import physical_cores

    for cpu, siblings in enumerate(["0,2", "1,3", "0,2", "1,3"]):  # 4 logical CPUs, 2 cores
        (tmp_path / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (tmp_path / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(siblings + "\n")
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    assert physical_cores(str(tmp_path)) == 2
    assert physical_cores(str(tmp_path / "none")) is None  # no sysfs: not known
    row = {"cores": 4, "physical_cores": 2, "threads": 2, "load_avg_1m": 1.0, "busy_at_start": False,
           "run_wait_ms": 0.0, "timed_ms": 120.0}
    assert not cond.is_contended({**row, "others_running": 0})
    assert cond.is_contended({**row, "others_running": 1})  # on a sibling of a timed thread
    big = {**row, "cores": 16, "physical_cores": 8, "threads": 4}
    assert not cond.is_contended({**big, "others_running": 4}) and cond.is_contended({**big, "others_running": 5})
    flat = {**row, "cores": 2, "physical_cores": 2}
    assert not cond.is_contended({**flat, "others_running": 1}) and cond.is_contended({**flat, "others_running": 2})
    assert not cond.is_contended({**row, "physical_cores": None, "others_running": 1})  # topology unknown


def test_this_machine_conditions_record_its_physical_cores():
    from zhantune.device import physical_cores

    c = cond.conditions()
    assert c["physical_cores"] == physical_cores() and 1 <= c["physical_cores"] <= c["cores"], c

"""Stopping and killing the tests' subprocesses by what /proc says, not by how long a sleep was.

A test that reads "the job is measuring" and then sends SIGKILL races the job: on a busy machine the
test can be descheduled between the two (a whole scheduler slice, ~4 ms, or far more), and the trial
ends in between. :func:`kill_while` closes that window: it stops the process first (SIGSTOP, every
thread seen stopped), checks again, and kills only a process it saw in the state the test wants.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path


def state_at(proc: Path) -> str:
    """The state letter in ``proc``/stat (a /proc/<pid> or /proc/<pid>/task/<tid> directory: R
    running, S sleeping, D uninterruptible, T stopped, Z zombie)."""
    stat = (proc / "stat").read_text()
    return stat[stat.rindex(")") + 2]


def _threads(pid: int) -> list[Path]:
    """/proc/<pid>/task/*, or none where the process is gone."""
    try:
        return list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return []


def stop_begun(pid: int) -> bool:
    """Whether the group stop of ``pid`` has begun: one of its threads is stopped or has SIGSTOP
    pending. A thread in uninterruptible sleep ("D", e.g. writing to a busy disk) stops the moment it
    returns from the kernel; in a multi-threaded process another thread may have taken the SIGSTOP
    already, which leaves none pending on a thread still in "D"."""
    for task in _threads(pid):
        try:
            state = state_at(task)
            status = dict(line.split(":", 1) for line in (task / "status").read_text().splitlines() if ":" in line)
        except OSError:  # the thread ended
            continue
        pending = int(status["SigPnd"], 16) | int(status["ShdPnd"], 16)
        if state in "Tt" or pending & (1 << (signal.SIGSTOP - 1)):
            return True
    return False


def all_stopped(pid: int) -> bool:
    """Every thread of ``pid`` is stopped (state T): none is still inside a write that would land."""
    states = []
    for task in _threads(pid):
        try:
            states.append(state_at(task))
        except OSError:  # the thread ended
            continue
    return bool(states) and all(s in "Tt" for s in states)


def kill_while(pid: int, condition: Callable[[], bool], timeout_s: float = 180.0, poll_s: float = 0.02,
               stop_wait_s: float = 10.0) -> None:
    """SIGKILL process ``pid`` at a moment ``condition()`` holds, checked again while the process is
    stopped: poll ``condition``; when it holds, SIGSTOP the process, wait until every thread is
    stopped (at most ``stop_wait_s``), check again, then SIGKILL it (or SIGCONT it and go on polling
    where the condition no longer holds: it changed before the stop took hold). The signals go
    through a pidfd, so a pid reused after the process ended is never signalled. Whatever ends the
    wait (the condition raising, Ctrl-C) continues a process it stopped. Raises AssertionError when
    the condition is not seen within ``timeout_s`` or the process ends first."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        raise AssertionError(f"process {pid} ended") from None
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                assert state_at(Path(f"/proc/{pid}")) != "Z"
            except (OSError, AssertionError):
                raise AssertionError(f"process {pid} ended") from None
            if condition():
                signal.pidfd_send_signal(fd, signal.SIGSTOP)
                try:
                    stop_by = time.monotonic() + stop_wait_s
                    while not all_stopped(pid) and time.monotonic() < stop_by:
                        time.sleep(0.001)
                    if all_stopped(pid) and condition():
                        signal.pidfd_send_signal(fd, signal.SIGKILL)
                        return
                finally:
                    with contextlib.suppress(ProcessLookupError):  # killed, or ended: nothing to continue
                        signal.pidfd_send_signal(fd, signal.SIGCONT)
            time.sleep(poll_s)
        raise AssertionError(f"the condition never held while process {pid} ran ({timeout_s:.0f} s)")
    finally:
        os.close(fd)

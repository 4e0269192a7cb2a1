"""The machine's state while a measurement is taken, stored with the measurement.

CPU: core count, threads torch uses, the frequency governor of cpu0 where sysfs exposes it, the
1-minute load average. GPU (NVML through nvidia-ml-py, when installed): SM and memory clocks,
temperature, utilisation, and the compute processes on the device other than this tune's own (its
timing and compile-ahead workers hold CUDA contexts too); the NVML device is matched to the CUDA
device by UUID (the indices differ under ``CUDA_VISIBLE_DEVICES``).

A measurement is *contended* when as many other tasks as there are cores are runnable right now
(``procs_running`` of /proc/stat less this process's runnable threads, the fewest of readings over
a few milliseconds; on an SMT machine, more than the whole cores free of the timed threads), when
the load average is above the core count (only where the timed runs' own waiting, below, was not
read: the load average counts the tune's own threads), or when other processes use the GPU; the
tune summary warns about contended rows, and a speedup claim needs paired rounds begun with the
cores free (``busy_at_start`` false) and not contended at the normal priority
(zhantune.bench.settle, zhantune.bench.decision).

Before every timed measurement the timing process waits for the machine to be idle
(:func:`wait_until_idle`): it re-reads the runnable-task count with a doubling back-off (10 ms,
20 ms, ...) for at most ``bench.busy_wait_s`` seconds, then measures anyway. The seconds waited
and whether the machine was still busy are stored in the row's ``conditions``
(``waited_s``, ``busy_at_start``), and a row that started busy is contended.

A count of runnable tasks misses what deschedules the timed runs themselves: one real-time task
holding a core is one task on a 2-core machine, and bursts between two checks are none. So the CPU
timing also reads how long the threads that ran the timed runs waited runnable for a core
meanwhile (:func:`run_queue_wait`, /proc/self/task/*/schedstat): ``run_wait_ms`` of ``timed_ms``.
A row whose threads waited more than RUN_WAIT_SHARE of its time is contended, and no claim rests
on it, SCHED_FIFO or not (a session 39 attack: a SCHED_FIFO busy loop on one core of two made a
kernel 0.82x as fast as the default measure 1.92x, confirmed in paired rounds begun with the cores
"free").
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["conditions", "is_contended", "disturbs_claim", "run_queue_wait", "run_delayed", "RUN_WAIT_SHARE", "own_running", "wait_until_idle", "ContentionCount", "contention_count", "own_pids",
           "mark_tune_root", "TUNE_PID_ENV"]

_GOVERNOR = Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")


def _governor() -> str | None:
    try:
        return _GOVERNOR.read_text(encoding="ascii").strip() or None
    except OSError:
        return None


#: the tune process's pid, set by the tune (:func:`mark_tune_root`) and inherited by its workers
TUNE_PID_ENV = "ZHANTUNE_TUNE_PID"


def mark_tune_root() -> None:
    """Make this process the root of :func:`own_pids` for itself and the workers it starts (unless a
    tune further up already is)."""
    os.environ.setdefault(TUNE_PID_ENV, str(os.getpid()))


def own_pids() -> set[int]:
    """The tune's own processes: the tune process (TUNE_PID_ENV, else this one) and every process
    below it (its timing worker, compile-ahead workers and their compile sidecars), each of which may
    hold a CUDA context on the GPU it tunes (Linux /proc; this process alone elsewhere)."""
    try:
        root = int(os.environ.get(TUNE_PID_ENV, os.getpid()))
    except ValueError:
        root = os.getpid()
    pids, todo = {os.getpid(), root}, [root]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                children = [int(pid) for pid in task.read_text(encoding="ascii").split()]
            except (OSError, ValueError):
                continue
            todo += [c for c in children if c not in pids]
            pids.update(children)
    return pids


def _other_processes(nvml_pids: list[int], mine: set[int]) -> int | None:
    """Compute processes on the GPU that are not the tune's own, or None when that cannot be told:
    NVML lists processes and none of them is ours although the reader holds a context (the
    conditions are read right after timing). Inside a container's PID namespace NVML reports the
    host's pids (NVIDIA/nvidia-docker#1483), which never match ours."""
    if nvml_pids and not any(p in mine for p in nvml_pids):
        return None
    return sum(1 for p in nvml_pids if p not in mine)


def _nvml_handle(pynvml: Any, index: int) -> Any:
    """NVML's handle of CUDA device ``index``, matched by UUID: NVML numbers every GPU of the
    machine, CUDA only the visible ones in its own order (``CUDA_VISIBLE_DEVICES``,
    ``CUDA_DEVICE_ORDER``), so the two indices differ. By index only when torch gives no UUID and
    nothing narrows CUDA's view; None when the device cannot be matched."""
    import torch

    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid is not None:
        text = str(uuid)
        if text.startswith(("GPU-", "MIG-")):
            return pynvml.nvmlDeviceGetHandleByUUID(text)
        try:  # torch prints the bare UUID; NVML names a MIG instance "MIG-..."
            return pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{text}")
        except pynvml.NVMLError:
            return pynvml.nvmlDeviceGetHandleByUUID(f"MIG-{text}")
    if os.environ.get("CUDA_VISIBLE_DEVICES") is None:
        return pynvml.nvmlDeviceGetHandleByIndex(index)
    return None


def _gpu(index: int) -> dict[str, Any] | None:
    """NVML's view of CUDA device ``index`` (None without nvidia-ml-py, the ``cuda`` extra, or when
    NVML fails): clocks, temperature, utilisation, and ``other_processes``, the compute processes on
    it that are not this tune's own (:func:`own_pids`)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        h = _nvml_handle(pynvml, index)
        if h is None:
            return None
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    except pynvml.NVMLError:
        return None
    out: dict[str, Any] = {"other_processes": _other_processes([p.pid for p in procs], own_pids())}
    readings = {  # each on its own: a MIG instance or an older GPU does not support every one
        "sm_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
        "mem_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
        "temperature_c": lambda: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
        "utilization_pct": lambda: pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
    }
    for name, read in readings.items():
        try:
            out[name] = read()
        except pynvml.NVMLError:
            out[name] = None
    return out


#: readings of the runnable count :func:`others_running` takes at most, ``_READING_GAP_S`` apart
_READINGS = 8
_READING_GAP_S = 0.001


def others_running() -> int | None:
    """Runnable tasks on the machine besides this process's: the fewest of up to ``_READINGS``
    readings 1 ms apart (it stops at the first 0), each /proc/stat ``procs_running`` less the reader
    less this process's runnable threads (:func:`own_running`: right after a timed run its OpenMP
    workers still spin for a few milliseconds; a review saw every row of a tune at load average 0.7
    marked busy). One reading is not enough: after a timed run the count stays above the runnable
    tasks /proc lists for 1-5 ms (on the project's Linux 6.18 VMs, docs/timing.md; 8 of a quiet tune's
    9 rows read 2-4). A task that keeps a core busy is in every reading; None without /proc/stat."""
    fewest: int | None = None
    for i in range(_READINGS):
        now = _others_now()
        if now is None:
            return fewest
        fewest = now if fewest is None else min(fewest, now)
        if fewest == 0 or i == _READINGS - 1:
            break
        time.sleep(_READING_GAP_S)
    return fewest


def _others_now() -> int | None:
    """One reading: /proc/stat ``procs_running`` less the reader less :func:`own_running`, read just
    before and just after it, the fewer of the two (a thread of this process that starts running
    between the reads is not in the count: subtracting it read an always-running busy loop as 0;
    one that stops is, and the fewest of :func:`others_running`'s readings leaves it out)."""
    own = own_running()
    try:
        with open("/proc/stat", encoding="ascii") as f:
            for line in f:
                if line.startswith("procs_running "):
                    return max(0, int(line.split()[1]) - 1 - min(own, own_running()))
    except (OSError, ValueError):
        return None
    return None


def own_running() -> int:
    """This process's runnable threads besides the caller (state R in /proc/self/task/*/stat); 0
    where /proc cannot tell."""
    n = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # the thread ended
            continue
        end = stat.rfind(b")")  # the state follows the command name, which may hold spaces
        n += stat[end + 2:end + 3] == b"R"
    return max(0, n - 1)


def conditions(device_kind: str = "cpu", index: int | None = None) -> dict[str, Any]:
    """A snapshot: {"cores", "physical_cores", "threads", "governor", "load_avg_1m", "others_running"[,
    "gpu": {...}]}."""
    import torch

    cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:  # pragma: no cover - not on Linux
        load = None
    from zhantune.device import physical_cores

    out: dict[str, Any] = {"cores": cores, "physical_cores": physical_cores(), "threads": torch.get_num_threads(),
                           "governor": _governor(), "load_avg_1m": load, "others_running": others_running()}
    if device_kind == "cuda":
        out["gpu"] = _gpu(index or 0)
    return out


#: the share of a timed measurement's wall time its threads may wait runnable for a core (summed over
#: threads) before the row is contended: on this shared 2-core machine, quiet, 0-12% (docs/timing.md);
#: one SCHED_FIFO busy loop on one of the two cores, 89-101%
RUN_WAIT_SHARE = 0.25


def _run_wait_ns() -> dict[str, int]:
    """Per thread of this process, the nanoseconds it has waited runnable on a run queue (the 2nd
    field of /proc/self/task/<tid>/schedstat); empty where the kernel does not keep it."""
    out: dict[str, int] = {}
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return out
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/schedstat", "rb") as f:
                out[task] = int(f.read().split()[1])
        except (OSError, ValueError, IndexError):  # the thread ended; no schedstat
            continue
    return out


@contextlib.contextmanager
def run_queue_wait() -> Iterator[dict[str, float]]:
    """Around a timed measurement: yields a dict that holds, after the block, ``timed_ms`` (the block's
    wall time) and ``run_wait_ms`` (the milliseconds the timed runs' threads waited runnable for a core
    meanwhile, summed; absent where /proc has no schedstat). The timed runs' threads are the calling
    thread and the threads Python did not start (the OpenMP pool; one started inside the block
    counts from its start): a Python helper thread that wakes meanwhile (the timing worker's parent
    watch, every 0.5 s) waits for the real-time timed runs to end, 60-90 ms of a 100-130 ms timing,
    and was counted as the timed runs' own waiting, marking rows of a quiet tune contended; what
    such a thread takes from the timed runs is their threads' waiting. A row with ``timed_ms`` was
    timed under this check (one without, before it: zhantune.tune_result.settle_again)."""
    helpers = {str(t.native_id) for t in threading.enumerate() if t is not threading.current_thread()}
    before, start = _run_wait_ns(), time.perf_counter_ns()
    out: dict[str, float] = {}
    try:
        yield out
    finally:
        after = _run_wait_ns()
        out["timed_ms"] = round((time.perf_counter_ns() - start) / 1e6, 3)
        if after:
            wait = sum(ns - before.get(task, 0) for task, ns in after.items() if task not in helpers)
            out["run_wait_ms"] = round(max(wait, 0) / 1e6, 3)


def run_delayed(c: dict[str, Any]) -> bool:
    """Whether a measurement's threads waited runnable for a core more than RUN_WAIT_SHARE of its
    time (conditions from :func:`run_queue_wait`; False where they were not read)."""
    wait, timed = c.get("run_wait_ms"), c.get("timed_ms")
    return wait is not None and bool(timed) and wait > RUN_WAIT_SHARE * timed


def is_contended(c: dict[str, Any]) -> bool:
    """Still busy when the timed runs began (:func:`wait_until_idle`), or: on CUDA (conditions with a
    ``gpu`` reading) other processes on the GPU; on CPU the timed runs' threads kept waiting for a
    core (:func:`run_delayed`), as many other runnable tasks as cores, one on an SMT sibling
    (:func:`_shares_a_core`), or, only where the threads' waiting was not read (no ``run_wait_ms``), a
    load average above the core count: it counts the tune's own threads (2 on 2 cores read 1.8-2.3,
    and marked 13 of a quiet tune's 19 rows, whose threads had waited 0-5 ms of 67-411)."""
    if c.get("busy_at_start"):
        return True
    if "gpu" in c:
        return bool((c.get("gpu") or {}).get("other_processes"))
    load, running = c.get("load_avg_1m"), c.get("others_running")
    if run_delayed(c) or (running is not None and running >= c.get("cores", 1)) or (running and _shares_a_core(c)):
        return True
    return c.get("run_wait_ms") is None and load is not None and load > c.get("cores", 1)


def _shares_a_core(c: dict[str, Any]) -> bool:
    """On an SMT machine (fewer physical cores than logical CPUs), more other runnable tasks than
    whole cores free of the timed threads: one of them may run on a timed thread's sibling, which
    slows it and is no run-queue waiting (this project's VMs have no SMT: not measured here)."""
    physical, threads, cores = c.get("physical_cores"), c.get("threads"), c.get("cores", 1)
    if not physical or not threads or physical >= cores:
        return False
    return c.get("others_running", 0) > max(0, physical - threads)


def disturbs_claim(conditions_: dict[str, Any] | None, contended: bool | None, timing_method: str | None) -> bool:
    """A timed measurement a paired comparison cannot vouch for (a tune's claim,
    zhantune.bench.settle; check's ratios, zhantune.bench.model_check): its timed runs began while
    other tasks still held the cores (``busy_at_start`` after the bounded wait; on CUDA, other
    processes on the GPU), its threads waited for a core all the same (:func:`run_delayed`: SCHED_FIFO
    does not shield a run from another real-time task), or it was ``contended`` and not shielded by real-time scheduling (only a
    ``:fifo`` timing is; niceness alone is not: a 30 us kernel measured 13.5 ms under four busy
    loops at nice -10). SCHED_FIFO keeps such a run's minimum usable for ranking, but not a ratio:
    in CI under four busy loops, shielded paired rounds of linear_act 64x64x64 said 1.79x and 1.87x
    where the same two kernels measured 1.27-1.45x once the load was gone."""
    if not contended:
        return False
    c = conditions_ or {}
    return bool(c.get("busy_at_start")) or run_delayed(c) or ":fifo" not in (timing_method or "")


def _busy(device_kind: str, index: int | None) -> bool:
    if device_kind == "cuda":
        return bool((_gpu(index or 0) or {}).get("other_processes"))
    running = others_running()
    return running is not None and running >= (os.cpu_count() or 1)


def wait_until_idle(max_wait_s: float, device_kind: str = "cpu", index: int | None = None) -> dict[str, Any]:
    """Wait, with a doubling back-off from 10 ms, until fewer other tasks than cores are runnable
    (CPU) or no other process uses the GPU, for at most ``max_wait_s`` seconds (0: do not wait).

    Returns {"waited_s": seconds waited, "busy_at_start": still busy when the wait ended}."""
    start = time.monotonic()
    step = 0.01
    busy = _busy(device_kind, index)
    while busy and max_wait_s > 0:
        left = max_wait_s - (time.monotonic() - start)
        if left <= 0:
            break
        time.sleep(min(step, left))
        step *= 2
        busy = _busy(device_kind, index)
    return {"waited_s": time.monotonic() - start if max_wait_s > 0 else 0.0, "busy_at_start": busy}


#: ContentionCount.text's default ending: what a tune, a check and a replay do with their times
CLAIMS = ("rankings use each config's fastest run and a speedup is claimed only from paired rounds begun with the "
          "cores free and not kept waiting for one (and shielded, or not contended at all)")


@dataclass(frozen=True)
class ContentionCount:
    """How many timed measurements were taken contended, and what was done about it: ``waited_s``
    seconds of back-off in all (``bench.busy_wait_s`` at most per measurement), ``shielded`` runs timed
    under SCHED_FIFO (``:fifo`` in the timing method)."""

    timed: int = 0
    contended: int = 0
    waited_s: float = 0.0
    shielded: int = 0

    def add(self, conditions_: dict[str, Any] | None, contended: bool | None, method: str | None) -> ContentionCount:
        c = conditions_ or {}
        return ContentionCount(self.timed + 1, self.contended + bool(contended),
                               self.waited_s + float(c.get("waited_s") or 0.0),
                               self.shielded + (":fifo" in (method or "")))

    def __add__(self, other: ContentionCount) -> ContentionCount:
        return ContentionCount(self.timed + other.timed, self.contended + other.contended,
                               self.waited_s + other.waited_s, self.shielded + other.shielded)

    def text(self, uses: str = CLAIMS, of: str = "") -> str | None:
        """One sentence for a summary, or None when no timed measurement was contended. ``uses``: what
        the command does with the times that the busy machine could mislead (default: a tune's
        rankings and claims, :data:`CLAIMS`); ``of``: whose measurements, e.g. "the study's (every
        run's) " (a tune counts its whole study's: a rerun's "waited 51.3 s" took 33.5 s)."""
        if not self.contended:
            return None
        shield = (f"all {self.timed} timed under SCHED_FIFO" if self.shielded == self.timed
                  else f"{self.shielded} of {self.timed} timed under SCHED_FIFO")
        return (f"{self.contended} of {of}{self.timed} timed measurement(s) were taken on a busy machine (other "
                f"runnable tasks, a load average above the core count, or timed runs kept waiting for a core); waited "
                f"{self.waited_s:.1f} s in all for idle cores (bench.busy_wait_s); {shield}; {uses}")


def contention_count(rows: list[tuple[dict[str, Any] | None, bool | None, str | None]]) -> ContentionCount:
    """Sum (conditions, contended, timing method) of timed measurements into a ContentionCount."""
    count = ContentionCount()
    for c, contended, method in rows:
        count = count.add(c, contended, method)
    return count

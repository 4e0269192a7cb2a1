"""The machine's state while a measurement is taken, stored with the measurement.

CPU: core count, threads torch uses, the frequency governor of cpu0 where sysfs exposes it, the
1-minute load average. GPU (NVML through nvidia-ml-py, when installed): SM and memory clocks,
temperature, utilisation, and the processes on the device other than this one.

A measurement is *contended* when the load average is above the core count, when as many other
tasks as there are cores are runnable right now (``procs_running`` of /proc/stat, this reader
excluded), or when other processes use the GPU; the tune summary warns about contended rows, and a
speedup claim needs paired rounds that were not contended at the normal priority
(zhantune.bench.decision).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["conditions", "is_contended"]

_GOVERNOR = Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")


def _governor() -> str | None:
    try:
        return _GOVERNOR.read_text(encoding="ascii").strip() or None
    except OSError:
        return None


def _gpu(index: int) -> dict[str, Any] | None:  # pragma: no cover - needs a GPU and nvidia-ml-py
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        return {
            "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            "mem_clock_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
            "temperature_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
            "utilization_pct": pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
            "other_processes": sum(1 for p in procs if p.pid != os.getpid()),
        }
    except pynvml.NVMLError:
        return None


def others_running() -> int | None:
    """Runnable tasks on the machine right now besides the caller (/proc/stat ``procs_running``)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            for line in f:
                if line.startswith("procs_running "):
                    return max(0, int(line.split()[1]) - 1)
    except (OSError, ValueError):
        return None
    return None


def conditions(device_kind: str = "cpu", index: int | None = None) -> dict[str, Any]:
    """A snapshot: {"cores", "threads", "governor", "load_avg_1m", "others_running"[, "gpu": {...}]}."""
    import torch

    cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:  # pragma: no cover - not on Linux
        load = None
    out: dict[str, Any] = {"cores": cores, "threads": torch.get_num_threads(), "governor": _governor(),
                           "load_avg_1m": load, "others_running": others_running()}
    if device_kind == "cuda":  # pragma: no cover - needs a GPU
        out["gpu"] = _gpu(index or 0)
    return out


def is_contended(c: dict[str, Any]) -> bool:
    """Load average above the core count, as many other runnable tasks as cores, or other processes
    on the GPU."""
    load = c.get("load_avg_1m")
    if load is not None and load > c.get("cores", 1):
        return True
    running = c.get("others_running")
    if running is not None and running >= c.get("cores", 1):
        return True
    gpu = c.get("gpu") or {}
    return bool(gpu.get("other_processes"))

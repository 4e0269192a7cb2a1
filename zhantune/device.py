"""Device resolution and identity.

The *device key* is the string Inductor's lookup table uses for the device: on CUDA
``torch.cuda.get_device_properties(i).gcnArchName`` (torch/_inductor/lookup_table/choices.py).
Inductor has no lookup on CPU; zhantune names a CPU by its model name (from /proc/cpuinfo) and the
number of threads Inductor compiles its C++ kernels for (:func:`cpu_device_key`, e.g. ``AMD EPYC
(2 threads)``), so that CPU measurements and tables are keyed the same way, and a 2-vCPU runner and a
32-core machine with one CPU model (one cloud instance family) are two devices: their timings,
rankings and speedup claims differ, and so does the C++ template's blocking.
"""

from __future__ import annotations

import functools
import os
import platform
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from zhantune.errors import DeviceError
from zhantune.request import check_device_spec

if TYPE_CHECKING:  # torch is imported where a device is resolved: a replay or an import never needs it
    import torch

__all__ = ["DeviceInfo", "resolve_device", "cpu_model_name", "cpu_device_key", "cpu_threads", "cpu_model", "cpuid",
           "CPU_IDENTITY", "cpu_identity_mismatch", "physical_cores"]

#: the properties of a CPU device that tell apart machines of one model name and thread count (one
#: device key): its vector ISA (torch.backends.cpu.get_cpu_capability()) and :func:`cpuid` (a cloud
#: VM's "AMD EPYC" is Zen 3, Zen 4 and Zen 5; Zen 4 and Zen 5 both AVX-512). Rows, merges and table
#: entries of one key with another value of either are another machine's (zhantune.storage.store,
#: zhantune.storage.merge_checks, zhantune.inductor.cpu_entries.other_cpu)
CPU_IDENTITY = {"isa": "vector ISA", "cpuid": "identity (vendor, family and model in /proc/cpuinfo)"}


@dataclass(frozen=True)
class DeviceInfo:
    """A resolved device: ``torch_device`` to run on, ``key`` for tables and the database."""

    kind: str  # "cpu" or "cuda"
    index: int | None
    key: str
    name: str
    #: smem per block (bytes), SM count, core count, threads, ... used by constraints and provenance
    properties: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def torch_device(self) -> torch.device:
        import torch

        return torch.device(self.kind if self.index is None else f"{self.kind}:{self.index}")


def cpu_model_name() -> str:
    """The CPU's model name ("Intel(R) Xeon(R) ..."), or platform.processor() where unreadable."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


@functools.cache  # read once a process: use_table compares it at every CPU lookup (cpu_entries.other_isa)
def cpuid() -> str | None:
    """The CPU's identity below its model name, from /proc/cpuinfo: ``"AuthenticAMD family 26 model 2"``
    on x86 (vendor_id, cpu family, model: a generation and its variant; not the stepping), ``"ARM
    implementer 0x41 part 0xd40"`` on Arm (CPU implementer, CPU part), None where not readable."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                name, sep, value = line.partition(":")
                if not sep:
                    if fields:
                        break  # the first processor's block only
                    continue
                fields.setdefault(name.strip(), value.strip())
    except OSError:
        return None
    if all(fields.get(k) for k in ("vendor_id", "cpu family", "model")):
        return f"{fields['vendor_id']} family {fields['cpu family']} model {fields['model']}"
    if all(fields.get(k) for k in ("CPU implementer", "CPU part")):
        return f"ARM implementer {fields['CPU implementer']} part {fields['CPU part']}"
    return None


def cpu_identity_mismatch(theirs: Any, mine: Any) -> tuple[str, str, str] | None:
    """(field, theirs, mine) for the first of CPU_IDENTITY that both CPU property dicts hold with
    different values; None where they agree or either lacks it (a device stored before the field)."""
    theirs, mine = (d if isinstance(d, dict) else {} for d in (theirs, mine))
    for f in CPU_IDENTITY:
        if theirs.get(f) and mine.get(f) and theirs[f] != mine[f]:
            return f, str(theirs[f]), str(mine[f])
    return None


def cpu_model() -> str:
    """The CPU's model name as a device name: one line, single spaces, no '+' (which separates the
    parts of an Inductor lookup key)."""
    return re.sub(r"\s+", " ", cpu_model_name()).replace("+", " ").strip()


def cpu_threads() -> int:
    """The threads Inductor compiles C++ kernels for: ``torch._inductor.config.cpp.threads`` where
    set (>= 1), else torch.get_num_threads() (torch/_inductor/utils.py parallel_num_threads; its
    C++ GEMM template's thread factors multiply to it). Inductor's config is read only where it is
    imported already."""
    import sys

    import torch

    config = sys.modules.get("torch._inductor.config")
    threads = getattr(getattr(config, "cpp", None), "threads", -1) if config is not None else -1
    return threads if isinstance(threads, int) and threads >= 1 else torch.get_num_threads()


#: where Linux describes each logical CPU's core (``cpu<N>/topology/thread_siblings_list``)
CPU_SYSFS = "/sys/devices/system/cpu"


@functools.cache  # read once a process: every timed measurement's conditions record it
def physical_cores(root: str = CPU_SYSFS) -> int | None:
    """Physical cores among the ``os.cpu_count()`` logical CPUs: the distinct sets of hardware threads
    sharing one core (SMT siblings, Linux sysfs ``topology/thread_siblings_list``); None where sysfs
    does not say (not Linux, a CPU without topology). Equal to the logical count without SMT."""
    cores = set()
    for n in range(os.cpu_count() or 0):
        try:
            with open(f"{root}/cpu{n}/topology/thread_siblings_list", encoding="ascii") as f:
                cores.add(f.read().strip())
        except OSError:  # offline, or no topology
            continue
    return len(cores) or None


def cpu_device_key(model: str, threads: int) -> str:
    """A CPU's device key: its model name and thread count, ``"AMD EPYC (2 threads)"`` (the format
    revision 0009 of the database gave the keys stored before it)."""
    return f"{model} ({threads} thread{'' if threads == 1 else 's'})"


def _cpu_info() -> DeviceInfo:
    import torch

    name = cpu_model()
    threads = cpu_threads()
    props = {
        "cores": os.cpu_count() or 1,
        "threads": threads,
        "isa": torch.backends.cpu.get_cpu_capability(),
        "machine": platform.machine(),
        **({"cpuid": ident} if (ident := cpuid()) else {}),
    }
    return DeviceInfo(kind="cpu", index=None, key=cpu_device_key(name, threads), name=name, properties=props)


def _cuda_info(index: int) -> DeviceInfo:
    import torch

    p = torch.cuda.get_device_properties(index)
    props = {
        "sm_count": p.multi_processor_count,
        "smem_bytes": getattr(p, "shared_memory_per_block_optin", None) or 49152,
        "memory_bytes": p.total_memory,
        "capability": f"{p.major}.{p.minor}",
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
    }
    return DeviceInfo(kind="cuda", index=index, key=p.gcnArchName, name=p.name, properties=props)


def resolve_device(spec: str) -> DeviceInfo:
    """Resolve ``auto | cpu | cuda | cuda:N``; auto is cuda:0 when CUDA is available, else cpu.

    Raises DeviceError (exit code 2) for an unknown spec or a CUDA device this machine lacks.
    """
    import torch

    spec = check_device_spec(spec)
    if spec == "auto":
        return _cuda_info(0) if torch.cuda.is_available() else _cpu_info()
    if spec == "cpu":
        return _cpu_info()
    index = int(spec.partition(":")[2] or 0)
    if not torch.cuda.is_available():
        raise DeviceError(f"device={spec}: CUDA is not available on this machine; use device=cpu or device=auto")
    if index >= torch.cuda.device_count():
        raise DeviceError(
            f"device={spec}: this machine has {torch.cuda.device_count()} CUDA device(s) (cuda:0..)"
        )
    return _cuda_info(index)

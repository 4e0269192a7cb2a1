"""Device resolution and identity.

The *device key* is the string Inductor's lookup table uses for the device: on CUDA
``torch.cuda.get_device_properties(i).gcnArchName`` (torch/_inductor/lookup_table/choices.py).
Inductor has no lookup on CPU; zhantune names a CPU by its model name (from /proc/cpuinfo) so that
CPU measurements and tables are keyed the same way.
"""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from zhantune.errors import DeviceError
from zhantune.request import check_device_spec

if TYPE_CHECKING:  # torch is imported where a device is resolved: a replay or an import never needs it
    import torch

__all__ = ["DeviceInfo", "resolve_device", "cpu_model_name"]


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


def _cpu_info() -> DeviceInfo:
    # '+' separates the parts of an Inductor lookup key, so it never appears in a device key
    import torch

    name = re.sub(r"\s+", " ", cpu_model_name()).replace("+", " ")
    threads = torch.get_num_threads()
    props = {
        "cores": os.cpu_count() or 1,
        "threads": threads,
        "isa": torch.backends.cpu.get_cpu_capability(),
        "machine": platform.machine(),
    }
    return DeviceInfo(kind="cpu", index=None, key=name, name=name, properties=props)


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

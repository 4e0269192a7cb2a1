"""Provenance: the software and host a measurement or a table was made with.

Every measurement row records torch and triton versions and an environment row
(zhantune.storage.orm.Environment); a shipped table and a problems file record the same versions.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket

__all__ = ["software_versions", "environment_fields", "worker_name"]


def software_versions() -> dict[str, str | None]:
    """{"torch": torch.__version__, "triton": the installed triton's version, None where there is none}."""
    import torch

    try:
        triton = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton = None
    return {"torch": torch.__version__, "triton": triton}


def environment_fields() -> dict[str, str | None]:
    """Software and host of this process, the columns of the environment table: torch, triton,
    cuda, hip, driver (None: not read), python, zhantune, host."""
    import torch

    import zhantune

    return {**software_versions(), "cuda": torch.version.cuda, "hip": torch.version.hip,
            "driver": None, "python": platform.python_version(), "zhantune": zhantune.__version__,
            "host": socket.gethostname()}


def worker_name() -> str:
    """``host:pid`` of this process (log lines of a launcher's jobs name their worker)."""
    return f"{socket.gethostname()}:{os.getpid()}"

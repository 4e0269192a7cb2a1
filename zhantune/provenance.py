"""Provenance: the software and host a measurement or a table was made with.

Every measurement row records torch and triton versions and an environment row
(zhantune.storage.orm.Environment); a shipped table and a problems file record the same versions.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import platform
import socket
import sys
from pathlib import Path
from typing import Any

__all__ = ["software_versions", "environment_fields", "worker_name", "torch_version_info", "torch_release"]


def torch_release(version: str | None) -> str | None:
    """The release a torch version is a build of ("2.13.0+cpu" -> "2.13.0"): lookup keys, template
    sources and Inductor's choices are the same across builds of one release (+cpu, +cu128, ...;
    a nightly's date stays: "2.14.0.dev20261120+cu128" -> "2.14.0.dev20261120"). A source build's
    local label is its commit ("2.14.0a0+git1a2b3c4"): each commit is a release of its own (a
    helper's: two commits of one development cycle were one release, one's claims shipped in a
    table stamped with the other, and use_table served it there)."""
    if version is None:
        return None
    release, _, local = version.partition("+")
    return version if local.startswith("git") else release


def torch_version_info() -> Any:
    """torch's ``torch.version`` module (``__version__``, ``cuda``, ``hip``, ``git_version``): the one
    imported when torch is, else torch/version.py loaded on its own, without importing torch (a
    replay or a Kernel Tuner import records the versions and needs nothing else of torch: 1 s)."""
    loaded = sys.modules.get("torch.version")
    if loaded is not None:
        return loaded
    spec = importlib.util.find_spec("torch")  # finds the package, runs none of it
    if spec is None or spec.origin is None:
        import torch  # not a regular installation: the import says what is wrong

        return torch.version
    return _standalone_torch_version(str(Path(spec.origin).parent / "version.py"))


@functools.cache
def _standalone_torch_version(path: str) -> Any:
    """torch/version.py at ``path`` run once as a module of its own (never put in sys.modules)."""
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location("_zhantune_torch_version", path))
    module.__spec__.loader.exec_module(module)
    return module


def software_versions() -> dict[str, str | None]:
    """{"torch": torch.__version__, "triton": the installed triton's version, None where there is none}."""
    try:
        triton = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton = None
    return {"torch": str(torch_version_info().__version__), "triton": triton}


def environment_fields() -> dict[str, str | None]:
    """Software and host of this process, the columns of the environment table: torch, triton,
    cuda, hip, driver (None: not read), python, zhantune, host."""
    import zhantune

    version = torch_version_info()
    return {**software_versions(), "cuda": version.cuda, "hip": version.hip,
            "driver": None, "python": platform.python_version(), "zhantune": zhantune.__version__,
            "host": socket.gethostname()}


def worker_name() -> str:
    """``host:pid`` of this process (log lines of a launcher's jobs name their worker)."""
    return f"{socket.gethostname()}:{os.getpid()}"

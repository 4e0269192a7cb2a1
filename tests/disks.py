"""Small disks for the tests of a full disk: a tmpfs of a given size (mount needs root: the tests
skip where it is not permitted, as in a container without it) and a file that takes the rest."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (mount's size=, e.g. "100k", "8m") mounted at the new directory ``where``."""
    where.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def fill(disk: Path) -> Path:
    """The rest of ``disk`` taken by one file, a page at a time (unbuffered: its close cannot fail);
    returns it."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"x" * 4096)
    return filler

"""Temporary directories a process owns while it lives, and the sweep of those a killed process left.

A tune compiles in a temporary directory of its own (zhantune.inductor.settings.scratch_cache_dir)
and deletes it when it ends. A tune killed by a signal it cannot handle (SIGKILL, the out-of-memory
killer, SIGHUP when its terminal closes, a CI job's time limit) cannot delete it: the directory
stays in the temporary directory with every kernel compiled there (C++ binaries, Triton's cubins).
So each directory holds a lock file that its process keeps locked (``fcntl.flock``, exclusive) for
as long as the directory is in use; the kernel drops the lock when the process dies, however it
dies. Before it makes a new directory, :func:`owned_tempdir` deletes the directories of the same
prefix whose lock it can take: no process uses them. A lock, unlike a process id, is seen across
PID namespaces (containers sharing /tmp), and a reused process id cannot keep a directory alive.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["owned_tempdir", "sweep"]

#: the lock file in each owned directory
LOCK_NAME = ".zhantune-owner.lock"


def sweep(prefix: str, parent: str | None = None) -> list[str]:
    """Delete the directories ``<parent>/<prefix>*`` that this user owns and no process holds (their
    lock file is not locked); returns their paths. ``parent``: tempfile.gettempdir() when None. A
    directory without a lock file (being created, or made by a zhantune before the lock) is left
    alone, as is one that cannot be read."""
    parent = parent or tempfile.gettempdir()
    swept = []
    for path in Path(parent).glob(f"{prefix}*"):
        try:
            if not path.is_dir() or path.is_symlink() or path.stat().st_uid != os.getuid():
                continue
            fd = os.open(path / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its process lives
            os.close(fd)
            continue
        try:
            shutil.rmtree(path, ignore_errors=True)
        finally:
            os.close(fd)
        swept.append(str(path))
    return swept


@contextlib.contextmanager
def owned_tempdir(prefix: str) -> Iterator[str]:
    """A new temporary directory (tempfile.mkdtemp with ``prefix``), locked by this process while the
    context lasts and deleted with its contents at the end; first the same prefix's directories that
    killed processes left are deleted (:func:`sweep`). The lock's file descriptor is not inherited by
    child processes (PEP 446), so the lock ends with this process."""
    sweep(prefix)
    path = tempfile.mkdtemp(prefix=prefix)
    fd = os.open(os.path.join(path, LOCK_NAME), os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # new, so no one else holds it
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)

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

The lock file is locked under a temporary name and then renamed into place, so no sweep ever finds
it unlocked while its directory is being made. It names the machine and its boot (host name and
/proc/sys/kernel/random/boot_id): a sweep deletes only its own machine's directories, since a lock on
a shared file system may be local to each machine. Where the file system cannot lock, the
directory gets no lock file and is never swept (it is still deleted at the end of its tune).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["owned_tempdir", "sweep"]

#: the lock file in each owned directory
LOCK_NAME = ".zhantune-owner.lock"


def _machine() -> bytes:
    """This machine and its boot, as a lock file records them."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            boot = f.read().strip()
    except OSError:
        boot = b""
    return socket.gethostname().encode() + b"\n" + boot + b"\n"


def sweep(prefix: str, parent: str | None = None) -> list[str]:
    """Delete the directories ``<parent>/<prefix>*`` that this user owns, that this machine made
    (since its last boot) and that no process holds (their lock file is not locked); returns their
    paths. ``parent``: tempfile.gettempdir() when None. A directory without a lock file (being made,
    made where the file system cannot lock, or by a zhantune before the lock) is left alone, as is one
    that cannot be read."""
    parent = parent or tempfile.gettempdir()
    machine = _machine()
    swept = []
    for path in Path(parent).glob(f"{prefix}*"):
        try:
            if not path.is_dir() or path.is_symlink() or path.stat().st_uid != os.getuid():
                continue
            fd = os.open(path / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held: its process lives
            st = os.fstat(fd)  # still the directory's lock file (another sweep may have deleted it)
            if st.st_nlink == 0 or st.st_ino != os.stat(path / LOCK_NAME).st_ino or os.read(fd, 4096) != machine:
                continue
            shutil.rmtree(path, ignore_errors=True)
            swept.append(str(path))
        except OSError:
            continue
        finally:
            os.close(fd)
    return swept


@contextlib.contextmanager
def owned_tempdir(prefix: str) -> Iterator[str]:
    """A new temporary directory (tempfile.mkdtemp with ``prefix``), locked by this process while the
    context lasts and deleted with its contents at the end; first the same prefix's directories that
    killed processes left are deleted (:func:`sweep`). The lock's file descriptor is not inherited by
    child processes (PEP 446), so the lock ends with this process."""
    sweep(prefix)
    path = tempfile.mkdtemp(prefix=prefix)
    fd = os.open(os.path.join(path, LOCK_NAME + ".new"), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: no one else holds it
            os.write(fd, _machine())
            os.rename(os.path.join(path, LOCK_NAME + ".new"), os.path.join(path, LOCK_NAME))
        except OSError:  # a file system without locks: no lock file, never swept
            pass
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)

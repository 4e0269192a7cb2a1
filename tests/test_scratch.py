"""A tune's temporary kernel directory (zhantune.scratch): deleted by the next tune when a signal the
tune cannot handle (SIGKILL) left it, never while its process lives."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from zhantune.scratch import LOCK_NAME, owned_tempdir, sweep

_OWNER = """
import os, signal, sys, time
from zhantune.scratch import owned_tempdir
with owned_tempdir(sys.argv[2]) as d:
    open(os.path.join(d, "kernel.so"), "wb").write(b"x")
    print(d, flush=True)
    if sys.argv[1] == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)
"""


def _owner(tmp_path: Path, how: str, prefix: str = "zhantune-kernels-") -> subprocess.Popen:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    return subprocess.Popen([sys.executable, "-c", _OWNER, how, prefix], env=env, stdout=subprocess.PIPE, text=True)


def test_a_killed_tunes_directory_is_deleted_by_the_next_and_a_live_ones_kept(tmp_path, monkeypatch):
    dead = _owner(tmp_path, "die")
    dead_dir = dead.stdout.readline().strip()
    assert dead.wait(timeout=60) == -signal.SIGKILL
    assert (Path(dead_dir) / "kernel.so").exists()  # what a killed tune leaves
    live = _owner(tmp_path, "live")
    other = _owner(tmp_path, "die", "zhantune-check-")
    try:
        live_dir = live.stdout.readline().strip()
        other_dir = other.stdout.readline().strip()
        other.wait(timeout=60)
        unlocked = tmp_path / "zhantune-kernels-older"  # no lock file: made before the lock, or being made
        unlocked.mkdir()
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
        with owned_tempdir("zhantune-kernels-") as mine:
            assert not os.path.exists(dead_dir)
            assert (Path(live_dir) / "kernel.so").exists() and unlocked.is_dir()
            assert os.path.exists(other_dir)  # another prefix: swept by its own kind
            assert (Path(mine) / LOCK_NAME).exists() and sweep("zhantune-kernels-") == []  # its own is held
        assert not os.path.exists(mine)
    finally:
        live.kill()
        live.wait(timeout=60)
    assert sweep("zhantune-kernels-") == [live_dir] and not os.path.exists(live_dir)
    assert sweep("zhantune-check-") == [other_dir]


def test_a_directory_being_made_or_another_machines_is_never_swept(tmp_path):
    """The lock file is locked under a temporary name and renamed into place (a review made a sweep
    delete a starting tune's directory between its lock file's creation and its lock), and it names
    its machine's boot: on a file system shared by machines, whose locks may be local to each, a sweep
    deletes only this machine's."""
    being_made = tmp_path / "zhantune-kernels-new"
    being_made.mkdir()
    (being_made / (LOCK_NAME + ".new")).write_bytes(b"")  # not yet locked and renamed
    elsewhere = tmp_path / "zhantune-kernels-other-host"
    elsewhere.mkdir()
    (elsewhere / LOCK_NAME).write_bytes(b"another-host\nsome-boot-id\n")  # unlocked here
    assert sweep("zhantune-kernels-", str(tmp_path)) == []
    assert being_made.is_dir() and elsewhere.is_dir()

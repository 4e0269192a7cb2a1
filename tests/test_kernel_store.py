"""The kernel store (``bench.kernel_store``, zhantune.inductor.kernel_store): finished C++ kernel
binaries kept between tunes, taken from there instead of compiled again, and never a binary whose
compile failed or was killed."""

from __future__ import annotations

import ctypes
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from zhantune.errors import ConfigError
from zhantune.inductor import kernel_store

SOURCE = 'extern "C" int answer() { return 42; }\n'


def _builder(source: Path, output_dir: Path):
    from torch._inductor.cpp_builder import CppBuilder, CppOptions

    return CppBuilder(name="k", sources=str(source), BuildOption=CppOptions(), output_dir=str(output_dir))


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


_DIES_WHILE_COMPILING = """
import os, signal, sys
from pathlib import Path
import torch._inductor.cpp_builder as cb
from zhantune.inductor.kernel_store import serve
scratch, store, source = sys.argv[1:4]
serve(store, scratch)
builder = cb.CppBuilder(name="k", sources=source, BuildOption=cb.CppOptions(), output_dir=scratch)
def dying(cmd, cwd):  # the compiler has written half the binary when the worker is killed
    Path(builder.get_target_file_path()).write_bytes(b"\\x7fELF half")
    os.kill(os.getpid(), signal.SIGKILL)
cb.run_compile_cmd = dying
builder.build()
"""


def test_only_a_build_whose_compiler_returned_enters_the_store_and_a_stored_one_is_not_built_again(tmp_path,
                                                                                                   monkeypatch):
    """Real compiles through Inductor's CppBuilder: a worker killed in the middle of a build, and a
    build that fails, leave nothing in the store (the half-written binary stays in the tune's own
    directory); a finished build is kept and the next tune's build of it copies it instead of
    compiling; a build outside the tune's directory (Inductor's precompiled headers) is left alone; a
    stored binary that is not a whole ELF file is built again and replaced."""
    import torch._inductor.cpp_builder as cb

    source, store = tmp_path / "k.cpp", tmp_path / "store"
    source.write_text(SOURCE)
    scratch = tmp_path / "tune1"
    killed = subprocess.run([sys.executable, "-c", _DIES_WHILE_COMPILING, str(scratch), str(store), str(source)],
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert (scratch / "k.so").read_bytes() == b"\x7fELF half" and not _files(store)
    # the worker's replacement would load it by its name: the tune deletes it once the worker is gone
    (scratch / "kept.so").write_bytes(whole_elf := Path(sys.executable).resolve().read_bytes())
    assert kernel_store.prune_partial(scratch) == [scratch / "k.so"] and (scratch / "kept.so").read_bytes() == whole_elf

    bad = tmp_path / "bad.cpp"
    bad.write_text("this is not C++\n")
    with kernel_store.serving(store, str(tmp_path / "tune2")), pytest.raises(Exception, match="(?i)error"):
        _builder(bad, tmp_path / "tune2").build()
    assert not _files(store)

    compiled: list[str] = []
    real = cb.run_compile_cmd
    monkeypatch.setattr(cb, "run_compile_cmd", lambda cmd, cwd: compiled.append(cmd) or real(cmd, cwd))
    with kernel_store.serving(store, str(tmp_path / "tune3")):
        _builder(source, tmp_path / "tune3").build()
    assert len(compiled) == 1 and [p.name for p in _files(store)] == ["k.so"]
    assert (store / "k.so").read_bytes() == (tmp_path / "tune3" / "k.so").read_bytes()

    with kernel_store.serving(store, str(tmp_path / "tune4")):
        built = _builder(source, tmp_path / "tune4")
        built.build()
        _builder(source, tmp_path / "elsewhere").build()  # outside the tune's directory: compiled, not kept
    assert len(compiled) == 2 and [p.name for p in _files(store)] == ["k.so"]
    assert ctypes.CDLL(built.get_target_file_path()).answer() == 42

    _builder(source, tmp_path / "tune5").build()  # outside serving: Inductor's build as it was
    assert len(compiled) == 3

    whole = (store / "k.so").read_bytes()
    (store / "k.so").write_bytes(whole[: len(whole) // 2])  # a store entry cut short (a power loss)
    with kernel_store.serving(store, str(tmp_path / "tune6")):
        _builder(source, tmp_path / "tune6").build()
    assert len(compiled) == 4 and kernel_store._whole(store / "k.so")  # built again, kept whole
    assert ctypes.CDLL(str(store / "k.so")).answer() == 42 and not kernel_store._whole(tmp_path / "tune1" / "k.so")
    assert not [p for p in _files(tmp_path) if p.name.endswith(".tmp")]


def test_store_directory_per_torch_and_compiler_and_its_errors(tmp_path, monkeypatch):
    """auto: zhantune-kernels/ in Inductor's cache directory, one directory per torch, Python and
    compiler; off and null: no store; a directory that cannot be made: one-line ConfigError."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    for name in kernel_store.COMPILER_ENV:  # a machine's own CPATH or LIBRARY_PATH (CUDA modules, conda) aside
        monkeypatch.delenv(name, raising=False)
    auto = kernel_store.store_dir("auto")
    assert auto.parent == tmp_path / "inductor" / "zhantune-kernels" and auto.is_dir()
    assert auto.name.startswith("torch-") and kernel_store.store_dir(str(tmp_path / "mine")).name == auto.name
    # headers from elsewhere (CPATH) build another binary from the same command line: another directory
    for name in kernel_store.COMPILER_ENV:
        monkeypatch.setenv(name, str(tmp_path / "other"))
        assert kernel_store.store_dir("auto").name != auto.name, name
        monkeypatch.delenv(name)
    assert kernel_store.store_dir("auto").name == auto.name
    monkeypatch.setenv("CPATH", "include")  # relative: another directory from another working directory
    in_tmp = kernel_store.store_dir("auto").name
    monkeypatch.chdir(tmp_path / "inductor")
    assert kernel_store.store_dir("auto").name != in_tmp
    monkeypatch.delenv("CPATH")
    # another compiler file of the same version text first in PATH (a wrapper, another build): another
    # directory; a link to the same file: the same one
    from torch._inductor.cpp_builder import get_cpp_compiler

    compiler = shutil.which(get_cpp_compiler())
    (tmp_path / "wrap").mkdir()
    (tmp_path / "wrap" / Path(compiler).name).write_text(f'#!/bin/sh\nexec {compiler} "$@"\n')
    (tmp_path / "wrap" / Path(compiler).name).chmod(0o755)
    (tmp_path / "link").mkdir()
    (tmp_path / "link" / Path(compiler).name).symlink_to(compiler)
    path = os.environ["PATH"]
    monkeypatch.setenv("PATH", f"{tmp_path / 'link'}{os.pathsep}{path}")
    assert kernel_store.store_dir("auto").name == auto.name
    monkeypatch.setenv("PATH", f"{tmp_path / 'wrap'}{os.pathsep}{path}")
    assert kernel_store.store_dir("auto").name != auto.name
    monkeypatch.setenv("PATH", path)
    assert kernel_store.store_dir("off") is None and kernel_store.store_dir(None) is None
    assert kernel_store.store_dir(False) is None  # Hydra's bench.kernel_store=false (it made a directory ./False)
    old = os.umask(0o002)  # Ubuntu's for users: every directory made 0775, which the store then refused
    try:
        made = kernel_store.store_dir(str(tmp_path / "a" / "b"))
    finally:
        os.umask(old)
    assert made is not None and all((d.stat().st_mode & 0o777) == 0o700 for d in (tmp_path / "a", made.parent, made))
    # a copy into the store that a kill interrupted is swept once it is an hour old, never a live one
    (made / "73").mkdir()
    old, live = made / "73" / ".k.so.0a1b.tmp", made / "73" / ".k.so.2c3d.tmp"
    for f in (old, live, made / "73" / "k.so"):
        f.write_bytes(b"x")
    os.utime(old, (1, 1))
    os.utime(made / "73" / "k.so", (1, 1))
    assert kernel_store.store_dir(str(tmp_path / "a" / "b")) == made
    assert sorted(p.name for p in (made / "73").iterdir()) == [".k.so.2c3d.tmp", "k.so"]
    for word in ("OFF", "no", True):
        with pytest.raises(ConfigError, match=re.escape(f"bench.kernel_store={word}: allowed: auto, off (or false, "
                                                        f"null), or a directory (./{word} for one of that name)")):
            kernel_store.store_dir(word)
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"bench.kernel_store=.*/file/x: cannot create .*allowed: auto, off"):
        kernel_store.store_dir(str(tmp_path / "file" / "x"))


def test_half_written_binaries_are_deleted_unless_a_compiler_still_writes_them(tmp_path):
    """What a killed build leaves in the tune's cache (an ISA check binary emptied by a kill made every
    later compile of that tune fall back to a lower vector ISA: a review's reproduction) is deleted;
    a whole binary, and one a live compiler holds open, are not."""
    scratch = tmp_path / "scratch"
    (scratch / "73").mkdir(parents=True)
    (scratch / "73" / "isa.so").write_bytes(b"")
    (scratch / "k.o").write_bytes(b"\x7fELF half")
    (scratch / "w.so").write_bytes(Path(sys.executable).resolve().read_bytes())
    (scratch / "notes.txt").write_text("")
    with open(scratch / "live.so", "wb") as f:
        f.write(b"\x7fELF")
        f.flush()
        assert sorted(p.name for p in kernel_store.prune_partial(scratch)) == ["isa.so", "k.o"]
    assert sorted(p.name for p in _files(scratch)) == ["live.so", "notes.txt", "w.so"]
    assert kernel_store.prune_partial(scratch) == [scratch / "live.so"]  # its writer is gone


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_a_store_another_user_could_write_is_never_used(tmp_path, monkeypatch, caplog):
    """A binary in the store is loaded into the tune: another user who could put one there (a
    directory of theirs on the way, e.g. /tmp/torchinductor_<user> made first, or one anyone may
    write) would run code as the tuning user (a review's reproduction, as root). auto then goes
    without the store, saying why; a directory given is refused; a stored file of another user is
    built again, never loaded."""
    import torch._inductor.cpp_builder as cb

    shared = tmp_path / "inductor"
    shared.mkdir()
    os.chown(shared, 65534, 65534)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(shared))
    with caplog.at_level(logging.WARNING, logger="zhantune.inductor.kernel_store"):
        assert kernel_store.store_dir("auto") is None
    assert f"{shared} belongs to another user (uid 65534)" in caplog.text
    with pytest.raises(ConfigError, match=re.escape(f"{shared} belongs to another user (uid 65534), so a binary")):
        kernel_store.store_dir(str(shared / "mine"))
    os.chown(shared, 0, 0)
    shared.chmod(0o777)
    with pytest.raises(ConfigError, match=re.escape(f"{shared} is writable by other users (mode 777)")):
        kernel_store.store_dir(str(shared / "mine"))
    os.chown(shared, 0, 65534)
    shared.chmod(0o775)  # a group other users are in
    with pytest.raises(ConfigError, match=re.escape(f"{shared} is writable by other users (mode 775)")):
        kernel_store.store_dir(str(shared / "mine"))
    os.chown(shared, 0, 0)  # root's group: a process of any uid may run with gid 0
    with pytest.raises(ConfigError, match=re.escape(f"{shared} is writable by other users (mode 775)")):
        kernel_store.store_dir(str(shared / "mine"))
    shared.chmod(0o1777)  # sticky, as /tmp: the entries below are checked
    store = kernel_store.store_dir(str(shared / "mine"))
    assert store is not None and (store.stat().st_mode & 0o777) == 0o700

    source = tmp_path / "k.cpp"
    source.write_text(SOURCE)
    compiled: list[str] = []
    real = cb.run_compile_cmd
    monkeypatch.setattr(cb, "run_compile_cmd", lambda cmd, cwd: compiled.append(cmd) or real(cmd, cwd))
    with kernel_store.serving(store, str(tmp_path / "tune1")):
        _builder(source, tmp_path / "tune1").build()
    assert len(compiled) == 1 and kernel_store._whole(store / "k.so")
    os.chown(store / "k.so", 65534, 65534)  # put there by another user
    with kernel_store.serving(store, str(tmp_path / "tune2")):
        _builder(source, tmp_path / "tune2").build()
    assert len(compiled) == 2 and (store / "k.so").stat().st_uid == 0  # built again, and replaced
    (store / "k.so").unlink()
    os.mkfifo(store / "k.so")  # opening a FIFO to read waits for a writer: the tune must not
    with kernel_store.serving(store, str(tmp_path / "tune3")):
        _builder(source, tmp_path / "tune3").build()
    assert len(compiled) == 3 and kernel_store._whole(store / "k.so")


def test_group_write_is_the_owners_only_in_a_private_group_no_one_else_is_in(monkeypatch):
    """A umask of 002 leaves the owner's directories group-writable: fine where the group is the
    owner's private one. A member listed in the group, a user whose primary group it is, gid 0, or
    ids without names are other writers."""
    import grp
    import pwd
    import stat as st
    from types import SimpleNamespace

    users = [SimpleNamespace(pw_name="ann", pw_uid=1000, pw_gid=1000), SimpleNamespace(pw_name="bob", pw_uid=1001,
                                                                                      pw_gid=1001)]
    groups = {1000: SimpleNamespace(gr_name="ann", gr_mem=[]), 1001: SimpleNamespace(gr_name="bob", gr_mem=["ann"]),
              0: SimpleNamespace(gr_name="root", gr_mem=[])}
    monkeypatch.setattr(grp, "getgrgid", lambda gid: groups[gid])
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: next(u for u in users + [SimpleNamespace(
        pw_name="root", pw_uid=0, pw_gid=0)] if u.pw_uid == uid))
    monkeypatch.setattr(pwd, "getpwall", lambda: users)

    def writes(mode: int, uid: int, gid: int) -> bool:
        return kernel_store._others_write(os.stat_result((st.S_IFDIR | mode, 0, 0, 1, uid, gid, 0, 0, 0, 0)))

    assert not writes(0o775, 1000, 1000) and not writes(0o755, 1001, 1001)
    assert writes(0o777, 1000, 1000)  # others
    assert writes(0o775, 1001, 1001)  # ann is listed in bob's group
    users.append(SimpleNamespace(pw_name="cat", pw_uid=1002, pw_gid=1000))
    assert writes(0o775, 1000, 1000)  # cat's primary group is ann's
    assert writes(0o775, 0, 0)  # root's group
    assert writes(0o775, 1000, 4242)  # a group without a name


def test_a_link_inside_the_store_never_leads_out_of_it(tmp_path):
    """The file name is opened without following a link; a directory of the store that is a link to
    elsewhere (another user's directory) is not followed either: its builds are neither served nor kept."""
    store, scratch, elsewhere = tmp_path / "store", tmp_path / "scratch", tmp_path / "elsewhere"
    for d in (store, scratch / "ab", scratch / "cd", elsewhere):
        d.mkdir(parents=True)
    (store / "ab").symlink_to(elsewhere, target_is_directory=True)
    with kernel_store.serving(store, str(scratch)):
        assert kernel_store._stored_path(scratch / "ab" / "k.so") is None
        assert kernel_store._stored_path(scratch / "cd" / "k.so") == store.resolve() / "cd" / "k.so"

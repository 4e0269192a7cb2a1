"""The kernel store (``bench.kernel_store``, zhantune.inductor.kernel_store): finished C++ kernel
binaries kept between tunes, taken from there instead of compiled again, and never a binary whose
compile failed or was killed."""

from __future__ import annotations

import ctypes
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
    auto = kernel_store.store_dir("auto")
    assert auto.parent == tmp_path / "inductor" / "zhantune-kernels" and auto.is_dir()
    assert auto.name.startswith("torch-") and kernel_store.store_dir(str(tmp_path / "mine")).name == auto.name
    assert kernel_store.store_dir("off") is None and kernel_store.store_dir(None) is None
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"bench.kernel_store=.*/file/x: cannot create .*allowed: auto, off"):
        kernel_store.store_dir(str(tmp_path / "file" / "x"))

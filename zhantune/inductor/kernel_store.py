"""Finished C++ kernel binaries kept between tunes (``bench.kernel_store``, docs/timing.md#kernel-store).

A tune compiles in a kernel cache directory of its own (zhantune.inductor.settings.scratch_cache_dir),
deleted at its end, because it kills workers in the middle of compiles and Inductor would load a
half-written binary by its name. Most of those binaries are the same from one tune to the next (the
baselines of a shape, the epilogue and wrapper kernels every candidate shares): on this machine a
test run of 23 tunes invoked the compiler 256 times for 34 distinct binaries.

The store keeps them across tunes, without that risk: a binary enters it only once the compiler
that built it has returned (a killed or failed build never gets there), as a new name moved into
place (``os.replace``, so a reader sees the whole file or none), and leaves it only as a
copy into the tune's own directory, again moved into place. Binaries are named as Inductor names them
(the hash of their source and compiler command line: torch/_inductor/codecache.py ``write``); the
store has one directory per torch build, Python and C++ compiler version (:func:`store_dir`), which
the command line does not name. Triton binaries (CUDA) are not stored: Triton's own cache writes
atomically but its directory is the tune's.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["store_dir", "serve", "serving"]

log = logging.getLogger(__name__)

#: what a build leaves that the store keeps: shared objects and the objects a cpp_wrapper links
KEPT_SUFFIXES = (".so", ".o")
_served: dict[str, Path] = {}  # the scratch directory and the store this process serves, while serving


def store_dir(setting: str | None) -> Path | None:
    """The store's directory for this torch, Python and compiler: ``<root>/<tag>`` with root
    ``<Inductor's cache directory>/zhantune-kernels`` for ``"auto"`` (TORCHINDUCTOR_CACHE_DIR, else
    Inductor's default, torch/_inductor/runtime/cache_dir_utils.py), or the path given; None for
    None or ``"off"``. Creates the directory; raises ConfigError when it cannot. Call it before :func:`zhantune.inductor.settings.scratch_cache_dir` sets the
    tune's own cache directory."""
    if setting is None or str(setting) == "off":
        return None
    if str(setting) == "auto":
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        root = Path(cache_dir()) / "zhantune-kernels"
    else:
        root = Path(os.path.expanduser(str(setting))).absolute()
    path = root / _tag()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        from zhantune.errors import ConfigError

        raise ConfigError(f"bench.kernel_store={setting}: cannot create {path} ({e.strerror or e}); "
                          "allowed: auto, off, or a directory zhantune may write") from None
    return path


def _tag() -> str:
    """torch's version and a hash of its git revision, Python's version and the C++ compiler's
    version text (``-v``, as Inductor reads it in torch/_inductor/cpp_builder.py)."""
    import torch
    from torch._inductor.cpp_builder import get_cpp_compiler

    try:
        compiler = get_cpp_compiler()
        version = subprocess.run([compiler, "-v"], capture_output=True, text=True, timeout=60,
                                 env={**os.environ, "LC_ALL": "C"}).stderr
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:  # no compiler: nothing will be built
        compiler, version = "none", repr(e)
    text = "\n".join([torch.__version__, str(torch.version.git_version), sys.version, compiler, version])
    return f"torch-{torch.__version__.replace('+', '_')}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def serve(store: str | Path | None, scratch: str) -> Any:
    """From now on, every C++ build in this process whose target lies in ``scratch`` (the tune's
    cache directory) is taken from ``store`` when it holds that binary, else built and then put
    there. Wraps torch._inductor.cpp_builder.CppBuilder.build; returns the unwrapped build (None
    when ``store`` is None: nothing changes). A worker process calls it once for its life."""
    if store is None:
        return None
    from torch._inductor.cpp_builder import CppBuilder

    original = CppBuilder.build
    _served.update(scratch=Path(scratch).resolve(), store=Path(store))
    CppBuilder.build = _stored_build(original)  # type: ignore[method-assign]
    return original


@contextlib.contextmanager
def serving(store: str | Path | None, scratch: str) -> Iterator[None]:
    """:func:`serve` while inside, then the build as it was."""
    original = serve(store, scratch)
    try:
        yield
    finally:
        if original is not None:
            from torch._inductor.cpp_builder import CppBuilder

            CppBuilder.build = original  # type: ignore[method-assign]
            _served.clear()


def _stored_build(original: Any) -> Any:
    def build(self: Any) -> None:
        target = Path(self.get_target_file_path())
        kept = _stored_path(target)
        if kept is None:
            return original(self)
        if kept.is_file() and _put(kept, target):
            log.debug("kernel store: %s from %s", target.name, kept)
            return None
        original(self)  # raises when the compiler fails; a killed build never returns here
        if target.is_file() and not _put(target, kept):
            log.debug("kernel store: could not keep %s in %s", target.name, kept.parent)
        return None

    return build


def _stored_path(target: Path) -> Path | None:
    """Where ``target`` (a build's output) is kept in the store; None when it is outside the
    served scratch directory or not a binary the store keeps."""
    if not _served or target.suffix not in KEPT_SUFFIXES:
        return None
    try:
        relative = target.resolve().relative_to(_served["scratch"])
    except ValueError:  # Inductor's precompiled headers, a preprocessing run in a temporary directory
        return None
    return _served["store"] / relative


def _put(source: Path, dest: Path) -> bool:
    """Copy ``source`` to a new name beside ``dest``, then move it to ``dest``: a reader of ``dest``
    sees the whole file or none. A copy, not a link: a compiler writing its output in place (the
    assembler truncates an existing ``.o``) must never write into the store's file. False when the
    file system refuses (the store unwritable, full): the tune goes on without it."""
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp.unlink(missing_ok=True)
        shutil.copyfile(source, tmp)
        shutil.copymode(source, tmp)
        os.replace(tmp, dest)
        return True
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        return False

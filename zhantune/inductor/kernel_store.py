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
store has one directory per torch build, Python, C++ compiler version and kind of CPU
(:func:`store_dir`), which the command line does not name. A stored file is served, and a built one
stored, only when it is a whole ELF file. Triton binaries (CUDA) are not stored: Triton's own cache writes
atomically but its directory is the tune's.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["store_dir", "serve", "serving", "prune_partial"]

log = logging.getLogger(__name__)

#: what a build leaves that the store keeps: shared objects and the objects a cpp_wrapper links
KEPT_SUFFIXES = (".so", ".o")
#: the environment variables that change what GCC (and Clang) builds from one command line: where
#: headers, libraries and the compiler's own programs are found ("Environment Variables Affecting
#: GCC" in GCC's manual); Inductor's binary names hash the source and command line only
COMPILER_ENV = ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "LIBRARY_PATH", "GCC_EXEC_PREFIX", "COMPILER_PATH")
_served: dict[str, Path] = {}  # the scratch directory and the store this process serves, while serving


def store_dir(setting: str | None) -> Path | None:
    """The store's directory for this torch, Python, compiler and CPU: ``<root>/<tag>`` (:func:`_tag`)
    with root ``<Inductor's cache directory>/zhantune-kernels`` for ``"auto"`` (TORCHINDUCTOR_CACHE_DIR,
    else Inductor's default, torch/_inductor/runtime/cache_dir_utils.py), or the path given; None for
    None or ``"off"``. Creates the directory; raises ConfigError when it cannot. Call it before
    :func:`zhantune.inductor.settings.scratch_cache_dir` sets the tune's own cache directory."""
    from zhantune.errors import ConfigError

    if setting is None or setting is False or str(setting) == "off":  # false: Hydra's boolean for "off"
        return None
    if setting is True or str(setting).lower() in _WORDS and str(setting) != "auto":
        raise ConfigError(f"bench.kernel_store={setting}: allowed: auto, off (or false, null), or a directory "
                          f"(./{setting} for one of that name)")
    if str(setting) == "auto":
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        root = Path(cache_dir()) / "zhantune-kernels"
    else:
        root = Path(os.path.expanduser(str(setting))).absolute()
    path = root / _tag()
    try:
        _private_dirs(path)
        resolved = path.resolve()  # checked and used as one path: no link re-read in between
    except OSError as e:
        raise ConfigError(f"bench.kernel_store={setting}: cannot create {path} ({e.strerror or e}); "
                          "allowed: auto, off, or a directory zhantune may write") from None
    why = _unsafe(resolved)
    if why is None:
        _sweep_copies(resolved)
        return resolved
    if str(setting) == "auto":  # not the user's choice: the tune goes on, building its own
        log.warning("bench.kernel_store=auto: not used, %s (a binary put there would run in this tune); every "
                    "kernel is built for this tune only", why)
        return None
    raise ConfigError(f"bench.kernel_store={setting}: {why}, so a binary put there would run in this tune; "
                      "allowed: a directory only this user (or root) may write, auto, or off")


def _private_dirs(path: Path) -> None:
    """Make ``path`` and its missing parents, each one it makes 0700 whatever the umask (mkdir's
    ``parents=True`` gives parents the umask's mode). Raises OSError."""
    for d in [*reversed(path.parents), path]:
        if not d.exists():
            d.mkdir(mode=0o700, exist_ok=True)
            d.chmod(0o700)


def _sweep_copies(store: Path, older_than_s: float = 3600.0) -> None:
    """Delete the temporary copies (``.NAME.HEX.tmp``, :func:`_put`) that a process killed in the
    middle of a copy left in ``store``, once they are an hour old (a live copy takes seconds)."""
    cutoff = time.time() - older_than_s
    for folder, _, names in os.walk(store):  # errors (a directory removed meanwhile) are skipped
        for name in names:
            if name.startswith(".") and name.endswith(".tmp"):
                with contextlib.suppress(OSError):
                    if Path(folder, name).lstat().st_mtime < cutoff:
                        Path(folder, name).unlink()


#: words that name a setting rather than a directory (``bench.kernel_store=OFF``, ``no``)
_WORDS = {"auto", "off", "on", "false", "true", "no", "yes", "none", "null"}


def _unsafe(resolved: Path) -> str | None:
    """Why another user could put a file in the store at ``resolved`` (a path without links), or
    None: every directory from the file system's root down to it must belong to this user or to
    root, and be writable by no one else (:func:`_others_write`), unless it is sticky (/tmp: there
    only an entry's owner may replace it, and the entry below is checked)."""
    for d in [*reversed(resolved.parents), resolved]:
        try:
            st = d.lstat()
        except OSError as e:
            return f"{d} cannot be checked ({e.strerror or e})"
        if st.st_uid not in (os.geteuid(), 0):
            return f"{d} belongs to another user (uid {st.st_uid})"
        if _others_write(st) and not st.st_mode & stat.S_ISVTX:
            return f"{d} is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _others_write(st: os.stat_result) -> bool:
    """Whether a user other than the owner may write the file or directory: others may, or its group
    may and that group is not the owner's private group (the group of the owner's name that no one
    else is a member of, under which a umask of 002 leaves files group-writable)."""
    if st.st_mode & 0o002:
        return True
    if not st.st_mode & 0o020:
        return False
    import grp
    import pwd

    try:
        group, owner = grp.getgrgid(st.st_gid), pwd.getpwuid(st.st_uid)
    except KeyError:  # a group or owner without a name (a container's arbitrary ids): not known private
        return True
    # root's group is no one's private group (a process of any uid may run with gid 0); the group's
    # members are its listed ones and the users whose primary group it is
    members = set(group.gr_mem) | {u.pw_name for u in pwd.getpwall() if u.pw_gid == st.st_gid}
    return st.st_gid == 0 or group.gr_name != owner.pw_name or not members <= {owner.pw_name}


def _trusted(st: os.stat_result) -> bool:
    """A stored file this process may load (``st``: the open file's fstat): a regular file of this
    user or root that no one else may write."""
    return stat.S_ISREG(st.st_mode) and st.st_uid in (os.geteuid(), 0) and not _others_write(st)


def _tag() -> str:
    """torch's version and a hash of what Inductor's binary names leave out: torch's git revision,
    Python's version, the C++ compiler's version text (Inductor's ``get_compiler_version_info``,
    torch/_inductor/cpp_builder.py), what ``-march=native`` means on this CPU (the command line says
    only ``-march=native`` and the vector family: two AVX-512 CPUs of other generations would share
    names; ``-Q --help=target``), the environment variables that change what the compiler builds
    from one command line (:data:`COMPILER_ENV`: other headers, libraries or compiler programs) and
    the CPU's model and flags (/proc/cpuinfo). A store on a disk that several machines share keeps
    one directory per kind of machine. The compiler is named with the file PATH finds for it."""
    import torch
    from torch._inductor.cpp_builder import get_compiler_version_info, get_cpp_compiler

    parts = [torch.__version__, str(torch.version.git_version), sys.version]
    try:
        compiler = get_cpp_compiler()
        found = shutil.which(compiler)  # which g++ PATH finds: two of one version may differ (a wrapper, a build)
        parts += [compiler, os.path.realpath(found) if found else "", get_compiler_version_info(compiler),
                  subprocess.run([compiler, "-march=native", "-Q", "--help=target"], capture_output=True, text=True,
                                 timeout=60, env={**os.environ, "LC_ALL": "C"}).stdout]
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:  # no compiler: nothing will be built
        parts.append(repr(e))
    # each entry as an absolute path: CPATH=include names another directory from another working directory
    parts += [f"{name}={os.pathsep.join(os.path.abspath(d) if d else d for d in os.environ[name].split(os.pathsep))}"
              for name in COMPILER_ENV if name in os.environ]
    parts += _cpu_identity()
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    return f"torch-{torch.__version__.replace('+', '_')}-{digest}"


def _cpu_identity() -> list[str]:
    """The first processor's model name and flags lines of /proc/cpuinfo (empty where there is none)."""
    try:
        lines = Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
    except OSError:
        return []
    keys = ("model name", "flags", "cpu family", "model\t", "Features", "CPU part")
    seen: dict[str, str] = {}
    for line in lines:
        for key in keys:
            if line.startswith(key) and key not in seen:
                seen[key] = line
    return [seen[k] for k in keys if k in seen]


def serve(store: str | Path | None, scratch: str) -> Any:
    """From now on, every C++ build in this process whose target lies in ``scratch`` (the tune's
    cache directory) is taken from ``store`` when it holds that binary, else built and then put
    there. Wraps torch._inductor.cpp_builder.CppBuilder.build; returns the unwrapped build (None
    when ``store`` is None: nothing changes). A worker process calls it once for its life."""
    if store is None:
        return None
    from torch._inductor.cpp_builder import CppBuilder

    original = CppBuilder.build
    _served.update(scratch=Path(scratch).resolve(), store=Path(store).resolve())
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
        if _put(kept, target, stored=True):
            log.debug("kernel store: %s from %s", target.name, kept)
            return None
        original(self)  # raises when the compiler fails; a killed build never returns here
        if _whole(target) and not _put(target, kept):
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
        kept = _served["store"] / relative
        kept.parent.resolve().relative_to(_served["store"])  # no link inside the store leads out of it
    except ValueError:  # Inductor's precompiled headers, a preprocessing run in a temporary directory
        return None
    return kept


def _whole(path: Path | Any) -> bool:
    """``path`` is a whole ELF file: its header's section header table (which the linker and the
    assembler write last) ends within the file. False for a missing, empty, truncated or non-ELF file
    (a store entry a power loss emptied, an orphaned linker's half-written output)."""
    try:
        with contextlib.nullcontext(path) if hasattr(path, "read") else open(path, "rb") as f:
            f.seek(0)
            head = f.read(64)
            size = os.fstat(f.fileno()).st_size
    except OSError:
        return False
    if len(head) < 52 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
        return False
    order = "little" if head[5] == 1 else "big"
    if head[4] == 2:  # ELF64
        if len(head) < 64:
            return False
        shoff, shentsize, shnum = (int.from_bytes(head[0x28:0x30], order), int.from_bytes(head[0x3A:0x3C], order),
                                   int.from_bytes(head[0x3C:0x3E], order))
    else:
        shoff, shentsize, shnum = (int.from_bytes(head[0x20:0x24], order), int.from_bytes(head[0x2E:0x30], order),
                                   int.from_bytes(head[0x30:0x32], order))
    return shoff > 0 and shnum > 0 and shoff + shentsize * shnum <= size


def prune_partial(scratch: str | Path) -> list[Path]:
    """Delete the binaries that a killed build left half-written in a tune's cache directory
    ``scratch``: every ``.so`` and ``.o`` under it that is not a whole ELF file (:func:`_whole`) and
    that no process holds open (a live compiler writes its output while it holds it open). Inductor
    builds a binary only where its name is missing (its ISA checks too: one emptied by a kill made
    every later compile of the tune fall back to a lower vector ISA). Call it once the killed
    worker's process group is gone. Returns the deleted paths."""
    partial = []
    for folder, _, names in os.walk(scratch):  # errors (a directory Triton removes meanwhile) are skipped
        for name in names:
            p = Path(folder, name)
            with contextlib.suppress(OSError):
                if p.suffix in KEPT_SUFFIXES and stat.S_ISREG(p.lstat().st_mode) and not _whole(p):
                    partial.append(p)
    if not partial:
        return []
    held = _open_files()
    out = []
    for p in partial:
        if str(p.resolve()) not in held:
            with contextlib.suppress(OSError):
                p.unlink()
                out.append(p)
    if out:
        log.info("removed %d half-written binar%s a killed build left: %s", len(out), "y" if len(out) == 1 else "ies",
                 ", ".join(p.name for p in out))
    return out


def _open_files() -> set[str]:
    """Every file some process (of those this one may inspect) holds open, by path (/proc/PID/fd)."""
    held: set[str] = set()
    for pid in (p for p in os.listdir("/proc") if p.isdigit()) if os.path.isdir("/proc") else ():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                held.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return held


def _put(source: Path, dest: Path, stored: bool = False) -> bool:
    """Copy ``source`` to a new name beside ``dest``, then move it to ``dest``: a reader of ``dest``
    sees the whole file or none (a name of its own per copy, so two machines sharing the store never
    write one temporary file). A copy, not a link: a compiler writing its output in place (the
    assembler truncates an existing ``.o``) must never write into the store's file. ``stored``: the
    source is a store entry, served only when the file opened (never through a link) is
    :func:`_trusted` and a whole ELF file (:func:`_whole`), checked on what is copied. False when
    it is not, or when the file system refuses (the store unwritable, full): the tune goes on."""
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.tmp")
    try:
        # a store entry: never through a link, and a FIFO there opens at once (then fails _trusted)
        with open(os.open(source, os.O_RDONLY | (os.O_NOFOLLOW | os.O_NONBLOCK if stored else 0)), "rb") as src:
            st = os.fstat(src.fileno())
            if stored and not (_trusted(st) and _whole(src)):
                return False
            _private_dirs(dest.parent)
            with open(tmp, "xb") as out:
                src.seek(0)
                shutil.copyfileobj(src, out)
                os.fchmod(out.fileno(), stat.S_IMODE(st.st_mode) & ~0o022)  # writable by this user alone
                out.flush()
                os.fsync(out.fileno())  # on disk before its final name (a power loss leaves no empty entry)
        os.replace(tmp, dest)
        return True
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        return False

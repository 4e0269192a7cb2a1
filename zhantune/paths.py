"""Output paths checked before any work: a tune, an export or a report never fails at its end
because the file it was asked to write cannot be written."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from zhantune.errors import ConfigError

__all__ = ["check_output_path", "write_atomic", "SQLITE_SIDE_FILES"]

#: the files SQLite keeps beside a database ``X`` while it is open: ``X-wal``, ``X-shm``, ``X-journal``
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def check_output_path(path: str | os.PathLike[str], option: str,
                      inputs: dict[str, Any] | None = None) -> Path:
    """Check that ``path`` can be written as a file; returns it as a Path.

    Allowed: an existing writable regular file (replaced) that is not an SQLite database (nor its
    -wal, -shm or -journal file) nor one of the command's ``inputs`` (option -> path; None and
    empty values are skipped), or a new file whose nearest existing ancestor is a writable
    directory (missing directories are created when it is written). Raises
    ConfigError naming the option, e.g. ``export.path=/: is a directory; give a file name``, or
    ``export.path=p.yaml: is the file of problems=p.yaml, which this command reads; ...``.
    """
    p = Path(path)
    where = f"{option}={path}"
    if str(path).strip() == "" or str(path).endswith(os.sep):
        raise ConfigError(f"{option}={str(path)!r}: expected a file name" if not str(path).strip() else
                          f"{where}: expected a file name")
    if p.is_dir():
        raise ConfigError(f"{where}: is a directory; give a file name")
    if _link_loop(p):  # a link to nothing is fine: the writer replaces it, as before
        raise ConfigError(f"{where}: is a loop of symbolic links; give a file name")
    for name, value in (inputs or {}).items():
        if value and _same_file(p, Path(str(value))):
            raise ConfigError(f"{where}: is the file of {name}={value}, which this command reads; writing there "
                              "would replace it: give another file name")
    db = _sqlite_database_at(p)  # the -wal of a database need not exist yet: SQLite would read it next
    if db is not None:
        raise ConfigError(f"{where}: {db} is an SQLite database (a results database?); writing there "
                          "would destroy it: give another file name")
    if p.exists():
        if not p.is_file():
            raise ConfigError(f"{where}: exists and is not a regular file")
        if not os.access(p, os.W_OK) or not os.access(p.parent, os.W_OK | os.X_OK):
            raise ConfigError(f"{where}: not writable")
        _probe(p.parent, where)
        return p
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{where}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{where}: directory {parent} is not writable")
    _probe(parent, where)
    return p


def write_atomic(path: str | os.PathLike[str], text: str, option: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically: into a temporary file beside it, renamed over
    it once whole, so that a reader never sees half a file and a write that fails (a full disk)
    leaves the previous file as it was. A file that was there keeps its mode (a new one gets 0666
    less the umask); a symbolic link there is replaced by the file, as :func:`check_output_path`
    checked its directory; missing folders are created. Raises ConfigError naming ``option``
    (``html=report.html: cannot write: No space left on device; ...``)."""
    import stat
    import tempfile

    dest, tmp = Path(path), None
    try:
        old = dest.stat().st_mode if dest.is_file() and not dest.is_symlink() else None
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".zt-", suffix=".tmp")  # short: any file name fits
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            umask = os.umask(0)
            os.umask(umask)
            with contextlib.suppress(OSError):  # vfat, CIFS: no modes
                os.fchmod(f.fileno(), stat.S_IMODE(old) if old is not None else 0o666 & ~umask)
            f.write(text)
        os.replace(tmp, dest)
        tmp = None
    except (OSError, UnicodeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ConfigError(f"{option}={path}: cannot write: {why}; "
                          f"{'the file there is unchanged' if os.path.lexists(dest) else 'nothing was written'}") from None
    finally:
        if tmp is not None:  # no stray temporary file beside the path
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return dest


def _probe(directory: Path, where: str) -> None:
    """Create and remove a file in ``directory``, as the writer will (a new name, then a rename):
    os.access answers for the permission bits only, and for root it says yes to /proc or a
    read-only mount, where the write then failed at the end of the work (a helper's finding)."""
    import tempfile

    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".zhantune-probe-"):
            pass
    except OSError as e:
        raise ConfigError(f"{where}: cannot create a file in {directory} ({e.strerror or type(e).__name__})") from None


def _link_loop(p: Path) -> bool:
    """Whether ``p`` is a symbolic link that leads back to itself (ELOOP), not one to nothing."""
    import errno

    if not p.is_symlink():
        return False
    try:
        os.path.realpath(p, strict=True)
    except OSError as e:
        return e.errno == errno.ELOOP
    return False


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file: the same inode where both exist (links, other
    spellings), else the same resolved path."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        pass
    try:
        return a.resolve() == b.resolve()
    except (OSError, RuntimeError):  # a symbolic link loop (RuntimeError on Python 3.11): as written
        return a.absolute() == b.absolute()


#: the first 16 bytes of every SQLite database file (https://www.sqlite.org/fileformat.html)
_SQLITE_HEADER = b"SQLite format 3\x00"


def _sqlite_database_at(p: Path) -> Path | None:
    """The SQLite database that writing ``p`` would destroy: ``p`` itself, or the database of a
    ``-wal`` / ``-shm`` / ``-journal`` file beside one; None otherwise."""
    for suffix in SQLITE_SIDE_FILES:
        if p.name.endswith(suffix):
            main = p.with_name(p.name[: -len(suffix)])
            if _is_sqlite(main):
                return main
    return p if _is_sqlite(p) else None


def _is_sqlite(p: Path) -> bool:
    if not p.is_file():  # never read a pipe or a device (a FIFO output path hung compare: session 48)
        return False
    try:
        with open(p, "rb") as f:
            return f.read(len(_SQLITE_HEADER)) == _SQLITE_HEADER
    except OSError:
        return False

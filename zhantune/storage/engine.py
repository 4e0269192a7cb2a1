"""Database engines: URL checks, SQLite settings, schema-creation locks, refusing what is not ours.

Everything here works on a URL or an engine, before (or without) a :class:`zhantune.storage.Store`:
the checks run before anything is written, so that bad input never touches an existing database.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, DatabaseError, OperationalError
from sqlalchemy.pool import NullPool

from zhantune.errors import StorageError, first_line, shown
from zhantune.paths import SQLITE_SIDE_FILES
from zhantune.redact import hide_password, mask, url_secrets
from zhantune.storage.migrate import current_revision, head_revision, known_revisions
from zhantune.storage.optuna_tables import OPTUNA_TABLES, refuse_other_optuna_schema, table_names
from zhantune.storage.sqlite_files import optuna_reader, read_mode, sqlite_path, sqlite_reader

__all__ = ["SQLITE_BUSY_TIMEOUT_MS", "SUPPORTED_BACKENDS", "OPTUNA_TABLES", "redact_url", "sqlite_path", "check_url",
           "check_sqlite_integrity", "table_names", "refuse_foreign_or_newer", "refuse_other_optuna_schema", "make_engine", "sqlite_pragmas", "open_existing", "existing_revision",
           "sqlite_reader", "optuna_reader", "optuna_reads", "users_side", "file_lock", "remove_sqlite_files", "canonical_json", "first_line"]

SQLITE_BUSY_TIMEOUT_MS = 30_000
#: database backends zhantune is tested on (SQLite: one machine; PostgreSQL: many)
SUPPORTED_BACKENDS = ("sqlite", "postgresql")


def redact_url(url: str) -> str:
    """The URL as SQLAlchemy renders it, its password (after ``user:`` or libpq's ``?password=``) as
    ``***`` (for logs, errors and stored configs; credentials are not shipped; zhantune.redact)."""
    secrets = url_secrets([url])
    try:
        u = make_url(url)
    except Exception:  # not a URL SQLAlchemy parses
        return mask(url, secrets)
    if secrets and "@" in (u.host or ""):  # a raw '@' in the password: SQLAlchemy reads part of it as the host
        return mask(url, secrets)
    return mask(u.render_as_string(hide_password=True), secrets)


def check_url(url: str, source: str = "storage.url", writable: bool = True) -> None:
    """Check a storage URL before anything is written. Raises StorageError (exit code 2) naming
    ``source`` (the option the URL came from, e.g. ``sources[0]`` of a merge).

    SQLite: a file (an in-memory database is refused: it keeps nothing), whose directory must exist
    and be writable, and an existing file must be an SQLite database (a corrupt or foreign file is
    left untouched). ``writable`` False (a database only read: a merge's source): an existing
    SQLite database, writable or not.
    """
    try:
        u = make_url(url)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise StorageError(f"{source}={redact_url(url)!r} is not a database URL; e.g. sqlite:///zhantune.db or "
                           "postgresql+psycopg://user@host/db") from None
    if "@" in (u.host or ""):  # user:p@ss@host: SQLAlchemy would connect to host "ss@host"
        raise StorageError(f"{source}={redact_url(url)!r}: an '@' in the host; write an '@' in the password as %40")
    if u.get_backend_name() not in SUPPORTED_BACKENDS:
        raise StorageError(f"{source}={redact_url(url)!r}: the {u.get_backend_name()!r} backend is not supported; "
                           "use sqlite:///FILE or postgresql+psycopg://user@host/db")
    if u.get_backend_name() == "postgresql" and u.get_driver_name() != "psycopg":
        raise StorageError(f"{source}={redact_url(url)!r}: PostgreSQL through psycopg 3: postgresql+psycopg://user@host/db")
    if u.get_backend_name() == "postgresql" and not u.database and not {"dbname", "service"} & set(u.query):
        # libpq then connects to the database named as the user (postgres: the maintenance database)
        raise StorageError(f"{source}={redact_url(url)!r}: no database name; give the one to use: "
                           "postgresql+psycopg://user@host/DB")
    if u.get_backend_name() != "sqlite":
        return
    if u.get_driver_name() != "pysqlite":  # sqlite+aiosqlite, +pysqlcipher: a driver zhantune does not install
        raise StorageError(f"{source}={hide_password(url)!r}: SQLite through Python's sqlite3 module: sqlite:///FILE "
                           f"(not the {u.get_driver_name()!r} driver)")
    if u.query.get("uri") or str(u.database or "").startswith("file:"):
        # SQLite's URI filenames name the file otherwise than the path these checks read (an old
        # database was switched to WAL before it was refused as old: a review's finding)
        raise StorageError(f"{source}={hide_password(url)!r}: SQLite URI filenames (file:...?uri=true) are not "
                           "supported; give the file's path: sqlite:///FILE")
    try:  # the driver's arguments (?timeout=30) read as it will read them: ?timeout=abc was a traceback
        u.query and u.get_dialect()().create_connect_args(u)
    except (ValueError, TypeError, ArgumentError) as e:
        raise StorageError(f"{source}={hide_password(url)!r}: a query parameter does not read as the SQLite driver's "
                           f"argument ({e}); e.g. ?timeout=30 (seconds), or none") from None
    path = sqlite_path(url)
    if path is None:  # sqlite:// and sqlite:///:memory: hold nothing after the process ends
        raise StorageError(f"{source}={hide_password(url)!r}: an in-memory SQLite database keeps nothing; give a file: sqlite:///FILE")
    side = next((x for x in (*SQLITE_SIDE_FILES, ".zt-lock") if path.name.endswith(x)), None)
    if side is not None and path.name != side:
        # SQLite (or zhantune's schema lock) owns that name for the database beside it: opening
        # that database deletes or replaces the file, with whatever was stored in it
        raise StorageError(f"{source}={hide_password(url)}: {path.name} is the name of the {side!r} file of "
                           f"{path.name[:-len(side)]}, which SQLite or zhantune deletes; name the database "
                           "otherwise (e.g. .db)")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise StorageError(f"{source}={hide_password(url)}: directory {parent} does not exist")
    if not writable and not path.is_file():
        raise StorageError(f"{source}={hide_password(url)}: no database at {path}")
    if path.exists():
        if not path.is_file() or (writable and not os.access(path, os.W_OK)):
            raise StorageError(f"{source}={hide_password(url)}: {path} is not a writable file")
        _check_sqlite_file(path, url, source)
    elif not os.access(parent, os.W_OK):
        raise StorageError(f"{source}={hide_password(url)}: directory {parent} is not writable")


def _check_sqlite_file(path: Path, url: str, source: str = "storage.url") -> None:
    """Refuse a file that is not a readable SQLite database, through SQLite alone: opening and
    closing the file with plain I/O would drop the POSIX locks that this process's open connections
    hold on it (SQLite's "how to corrupt a database", section 2.2), after which another process may
    checkpoint and remove the WAL under them. The connection only reads (:func:`sqlite_reader`)."""
    try:
        con = sqlite_reader(path)()
        try:
            con.execute("PRAGMA schema_version").fetchone()
        finally:
            con.close()
    except sqlite3.DatabaseError as e:
        if "not a database" in str(e):
            raise StorageError(f"{source}={hide_password(url)}: {path} is not an SQLite database; left untouched") from None
        if "disk I/O error" in str(e) and _free_bytes(path.resolve().parent) < 1 << 16:  # opening a WAL file needs room
            raise StorageError(f"{source}={hide_password(url)}: the disk holding the database is full; nothing stored "
                               "was lost: free some space and run the same command again to continue") from None
        wal, shm = (Path(f"{path.resolve()}{x}").exists() for x in ("-wal", "-shm"))
        why = (f"; its -wal is beside it without its -shm, which this process may not create in {path.resolve().parent}"
               if wal and not shm and not os.access(path.resolve().parent, os.W_OK) else "")
        raise StorageError(f"{source}={hide_password(url)}: {path} is not a readable SQLite database ({e}{why}); "
                           "left untouched") from None


def _free_bytes(directory: Path) -> int:
    """Bytes this user may still write under ``directory`` (a large number where it cannot tell)."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return 1 << 62
    return st.f_bavail * st.f_frsize


def check_sqlite_integrity(path: Path, where: str) -> None:
    """Refuse an SQLite file that fails SQLite's ``PRAGMA quick_check``; raises StorageError naming
    ``where`` (e.g. ``storage.url=sqlite:///x.db``). Read through a plain connection, as
    :func:`_check_sqlite_file` explains."""
    try:
        con = sqlite_reader(path)()
        try:
            result = [r[0] for r in con.execute("PRAGMA quick_check").fetchall()]
        finally:
            con.close()
    except sqlite3.DatabaseError as e:
        result = [str(e)]
    if result != ["ok"]:
        raise StorageError(f"{where}: {path} fails SQLite's integrity check ({result[0]}); "
                           "left untouched, restore it from a backup")


def refuse_foreign_or_newer(where: str, tables: set[str], rev: str | None) -> None:
    """Refuse a database that holds tables other than zhantune's and Optuna's but no zhantune
    schema, or a zhantune schema newer than this zhantune knows; raises StorageError naming
    ``where``; or one of the current revision that lacks one of its tables. ``rev`` is zhantune's
    schema revision (zhantune.storage.migrate.current_revision)."""
    if rev is None and tables - OPTUNA_TABLES:
        raise StorageError(f"{where}: not a zhantune database (it has tables "
                           f"{', '.join(sorted(tables - OPTUNA_TABLES)[:3])}); left untouched")
    from zhantune.storage.orm import Base

    if rev == head_revision() and (missing := sorted(set(Base.metadata.tables) - tables)):  # dropped by hand
        raise StorageError(f"{where}: table {', '.join(missing)} of schema revision {rev} is missing; no zhantune "
                           "run drops it (an edited database?): nothing was read")
    if rev is not None and rev not in known_revisions():
        if _newer(rev):
            raise StorageError(f"{where}: schema revision {rev!r} is newer than this zhantune knows "
                               f"(newest {head_revision()}); use a newer zhantune. The database was left untouched")
        raise StorageError(f"{where}: schema revision {shown(rev)} is none this zhantune knows (0001 to "
                           f"{head_revision()}): a damaged version table, or another program's. The database "
                           "was left untouched")


def _newer(rev: str) -> bool:
    """Whether ``rev`` reads as a zhantune schema revision after this zhantune's newest."""
    return rev.isdigit() and len(rev) == len(head_revision()) and rev > head_revision()


def remove_sqlite_files(path: Path) -> None:
    """Remove an SQLite database this process just failed to create, with its WAL, shared-memory and
    schema-lock files."""
    for suffix in ("", *SQLITE_SIDE_FILES, ".zt-lock"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


@contextlib.contextmanager
def file_lock(lock: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``lock`` that leaves no file behind: the holder unlinks the file
    while it still holds the lock. A process that was waiting on the old file then holds a lock on
    a file no longer at ``lock``; it sees so (the inode at the path differs or is gone) and retries."""
    while True:
        f = open(lock, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                same = os.stat(lock).st_ino == os.fstat(f.fileno()).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                continue  # the previous holder removed this file: lock the one at the path now
            try:
                yield
            finally:
                lock.unlink(missing_ok=True)
            return
        finally:
            f.close()  # closing the file releases the lock


def write_refused(e: Exception) -> bool:
    """A write the database refused for want of permission: PostgreSQL's insufficient_privilege
    (SQLSTATE 42501: a role allowed SELECT only), SQLite's read-only database."""
    orig = getattr(e, "orig", None)
    return getattr(orig, "sqlstate", None) == "42501" or "readonly database" in str(orig)


def users_side(e: Exception, where: str, read_url: str | None) -> str | None:
    """The one line for a failed statement that is the user's database, not a bug (exit code 2), or
    None: a write it refuses (:func:`write_refused`), or, for a database only read (``read_url``, a
    read-only Store's) from an SQLite file read without locks (:func:`read_mode` "immutable"), the
    file found "malformed" after it passed its integrity check when opened: another process wrote
    it during the read (elsewhere "malformed" is damage, with its traceback)."""
    if write_refused(e):
        return f"{where}: the database refuses this user's writes ({first_line(getattr(e, 'orig', e))}); give one it may write to"
    path = sqlite_path(read_url) if read_url else None
    if path is not None and read_mode(path) == "immutable" and "malformed" in str(getattr(e, "orig", "")):
        return (f"{where}: the database changed while this process read it (it may not write the file, so it "
                "reads without SQLite's locks); run the command again")
    return None


@contextlib.contextmanager
def optuna_reads(store: Any) -> Iterator[None]:
    """Optuna's reads of ``store`` (a zhantune Store; only a read-only one is read without locks): a
    read without locks that finds the file "malformed" says so in :func:`users_side`'s one line
    ("the database changed while this process read it", StorageError), named by the store's option,
    as zhantune's own queries do; Optuna wraps SQLAlchemy's error in its StorageInternalError.
    Anything else propagates as it is."""
    from optuna.exceptions import StorageInternalError

    where, read_url = f"{store.option}={redact_url(store.url)}", store.url if store.read_only else None

    try:
        yield
    except (DatabaseError, StorageInternalError) as e:
        cause = e if isinstance(e, DatabaseError) else e.__cause__
        if read_url and isinstance(cause, DatabaseError) and not write_refused(cause) \
                and (msg := users_side(cause, where, read_url)):
            raise StorageError(msg) from None
        raise


def make_engine(url: str, wal: bool = True) -> Engine:
    """A SQLAlchemy engine with zhantune's JSON serializer (and WAL + busy timeout on SQLite;
    ``wal`` False: the file's journal mode is left as it is, for a database only read)."""
    path = sqlite_path(url)
    # a reader of a file it may not write: its connections are not pooled, each session decides again
    # how to open the file (a -wal another process began since is then read, not ignored by an
    # immutable open); one it may write reads through pooled plain connections (no write per session)
    reader = ({} if wal or path is None else
              {"creator": sqlite_reader(path), **({"poolclass": NullPool} if read_mode(path) != "plain" else {})})
    # PostgreSQL: a pooled connection is checked before use, so a server restarted between two
    # statements costs a reconnect, not the run (a helper's restart ended every worker)
    ping = {"pool_pre_ping": True} if url.startswith("postgresql") else {}
    engine = create_engine(url, json_serializer=canonical_json, **ping, **reader)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", sqlite_pragmas if wal else sqlite_read_pragmas)
    return engine


def sqlite_read_pragmas(dbapi_connection: Any, _record: Any) -> None:
    """A busy timeout and foreign keys, for a database only read: switching a file to WAL mode is a
    write (a source sent as one file, journal_mode=DELETE, came back from a merge in WAL mode)."""
    cur = dbapi_connection.cursor()
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    """WAL (readers never block the writer), a busy timeout (writers wait instead of failing),
    synchronous=NORMAL (WAL's usual setting: a commit survives a crashed process; only a power cut
    can lose the last commits, never consistency), foreign keys on."""
    cur = dbapi_connection.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def open_existing(url: str, source: str = "storage.url", allow_newer: bool = False) -> Engine:
    """An engine on an existing database that passes SQLite's quick integrity check (SQLite files)
    and is zhantune's or holds only Optuna's tables (``allow_newer``: a newer zhantune schema too);
    raises StorageError (exit code 2) naming ``source`` otherwise. Nothing is written (the engine's
    first connection switches a SQLite file to WAL mode: :func:`existing_revision` reads only)."""
    existing_revision(url, source, allow_newer)
    return make_engine(url)


def existing_revision(url: str, source: str = "storage.url", allow_newer: bool = False,
                      writable: bool = True) -> str | None:
    """zhantune's schema revision of an existing database (None: only Optuna's tables, or none),
    checked as :func:`open_existing` checks it, read through a plain engine: nothing is written,
    not even SQLite's switch to WAL mode (an older database stays byte for byte as it was).
    ``writable`` False: a read-only SQLite file is fine (check_url)."""
    check_url(url, source, writable)
    path = sqlite_path(url)
    if path is not None:
        if not path.exists():
            raise StorageError(f"{source}={hide_password(url)}: no database at {path}")
        check_sqlite_integrity(path, f"{source}={hide_password(url)}")
    tables, rev = _probe(url, source)
    if not (allow_newer and rev is not None and _newer(rev)):  # `current` reports a newer revision too
        refuse_foreign_or_newer(f"{source}={hide_password(url)}", tables, rev)
    return rev


def holds_zhantune_schema(url: str, source: str = "storage.url", writable: bool = True) -> bool:
    """Whether the database at ``url`` exists and holds zhantune's tables (a schema revision);
    read through a plain engine, nothing is written (an empty PostgreSQL database or SQLite file:
    False). Raises StorageError for a URL check_url refuses (``writable`` as its) or a server that
    cannot be reached."""
    check_url(url, source, writable)
    path = sqlite_path(url)
    if path is not None and not path.exists():
        return False
    return _probe(url, source)[1] is not None


def _probe(url: str, source: str) -> tuple[set[str], str | None]:
    """(table names, zhantune's schema revision) of the database at ``url``, read through a plain
    engine (zhantune's own would switch a SQLite file to WAL mode, a write); raises StorageError
    naming ``source`` when it cannot be opened (a server that cannot be reached, a login refused)."""
    path = sqlite_path(url)
    probe = create_engine(url, **({} if path is None else {"creator": sqlite_reader(path)}))
    try:
        with probe.connect() as conn:
            return table_names(conn), current_revision(conn)
    except OperationalError as e:
        raise StorageError(f"{source}={redact_url(url)}: cannot open the database: {first_line(e)}") from None
    except DatabaseError as e:  # a damaged SQLite file ("database disk image is malformed"): was a traceback
        raise StorageError(f"{source}={redact_url(url)}: not a readable database ({first_line(e)}); "
                           "left untouched") from None
    finally:
        probe.dispose()


def canonical_json(value: Any) -> str:
    """JSON columns (params, configs) are stored canonically: sorted keys, no spaces."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))

"""Reading SQLite files: the file a ``sqlite:///`` URL names, and connections that only read it
without leaving anything beside a file this process may not write (zhantune.storage.engine
checks, read-only Stores, Optuna's readers of a merge's source and compare's history)."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import NullPool

__all__ = ["sqlite_path", "read_mode", "sqlite_reader", "optuna_reader"]


def sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite:///`` URL (None for other engines, in-memory SQLite and a URL that
    does not parse: check_url names what is wrong with it)."""
    try:
        u = make_url(url)
    except (ArgumentError, ValueError):
        return None
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return None
    return Path(u.database)


def read_mode(path: Path) -> str:
    """How :func:`sqlite_reader` opens ``path``: "plain" (this process may write the file and its
    directory), "ro" (it may not, and a -wal or -journal is beside the file) or "immutable" (it may
    not, and none is: read without SQLite's locks)."""
    path = path.resolve()
    if os.access(path, os.W_OK) and os.access(path.parent, os.W_OK):
        return "plain"
    return "ro" if any(Path(f"{path}{s}").exists() for s in ("-wal", "-journal")) else "immutable"


def sqlite_reader(path: Path) -> Callable[[], sqlite3.Connection]:
    """Connections that only read the SQLite file ``path`` (a SQLAlchemy ``creator``; a symbolic
    link is followed first: SQLite keeps the -wal beside the file it opens). Where this process may
    write the file and its directory: a plain connection, whose close checkpoints and removes the
    -wal it used (a read-only open of a WAL database leaves its -wal and -shm behind). Elsewhere (a
    mode-444 file, a read-only directory, another user's file) a plain or read-only open would
    create -wal and -shm files this process cannot remove, owned by it, on which the owner's next
    write fails, or fail for want of them: with no -wal or -journal beside the file it is opened
    ``immutable=1`` (nothing created, no lock taken: a write by another process while a connection
    is open can make a read fail, "database disk image is malformed", which a read-only Store
    reports as the database changing under it), else ``mode=ro`` (the pending WAL read through the
    files that exist)."""
    path = path.resolve()

    def connect() -> sqlite3.Connection:
        mode = read_mode(path)
        if mode == "plain":
            return sqlite3.connect(path, check_same_thread=False)
        return sqlite3.connect(f"file:{quote(str(path))}?{'mode=ro' if mode == 'ro' else 'immutable=1'}",
                               uri=True, check_same_thread=False)
    return connect


def optuna_reader(url: str) -> Any:
    """What Optuna's ``load_study``, ``copy_study`` and ``get_all_study_summaries`` take as the
    storage to read ``url`` from: the URL, or for an SQLite file an RDBStorage whose connections
    come from :func:`sqlite_reader` (Optuna's own would write a read-only file's side files), which
    never creates Optuna's tables (a database of imports only has none: the caller checks)."""
    path = sqlite_path(url)
    if path is None:
        return url
    import optuna

    pool = {"poolclass": NullPool} if read_mode(path) != "plain" else {}
    return optuna.storages.RDBStorage(url, engine_kwargs={"creator": sqlite_reader(path), **pool},
                                      skip_table_creation=True)

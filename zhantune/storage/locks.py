"""The database lock: one process at a time creates a database's schema, or checks what the database
holds and then writes on that check (a Kernel Tuner import, a merge).

A lock file beside an SQLite database (``<database>.zt-lock``, engine.file_lock: it exists only
while a process holds or waits for the lock), an advisory lock on PostgreSQL (``pg_advisory_lock``,
held by one connection for as long as the lock is). Re-entrant within a thread: opening a Store
(which takes the lock to check its schema) inside a held lock does not wait on itself.

Without it, two imports run at once both passed the checks that refuse one run after the other (two
GPUs' recordings under one device name, one recording imported twice), and two merges at once both
added an Optuna study's missing trials (a helper's attack on PostgreSQL, 2026-11-30).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.engine import Engine

from zhantune.errors import StorageError
from zhantune.storage.engine import file_lock, make_engine, redact_url, sqlite_path

__all__ = ["database_lock"]

#: the advisory lock's key on PostgreSQL ("zhan")
PG_LOCK_KEY = 0x7A68616E

#: (url, thread id) -> how many times this thread holds the lock of that database
_HELD: dict[tuple[str, int], int] = {}


@contextlib.contextmanager
def database_lock(url: str, engine: Engine | None = None, option: str = "storage.url") -> Iterator[None]:
    """Hold the database lock of ``url`` (SQLite or PostgreSQL; other databases: no lock) for the
    ``with`` block; ``engine``: one of ``url`` to take the PostgreSQL lock's connection from (else a
    connection of its own, closed after). The SQLite lock needs no database file yet; a lock file
    that cannot be made raises StorageError naming ``option`` (the database's connection errors are
    SQLAlchemy's: check the URL first, as Store does)."""
    held = (url, threading.get_ident())
    if _HELD.get(held):
        _HELD[held] += 1
        try:
            yield
        finally:
            _HELD[held] -= 1
        return
    with _acquired(url, engine, option):
        _HELD[held] = 1
        try:
            yield
        finally:
            del _HELD[held]


@contextlib.contextmanager
def _acquired(url: str, engine: Engine | None, option: str) -> Iterator[None]:
    path = sqlite_path(url)
    if path is not None:
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(file_lock(Path(f"{path}.zt-lock")))
            except OSError as e:
                raise StorageError(f"{option}={redact_url(url)}: cannot open the database: its lock file "
                                   f"{path}.zt-lock: {e.strerror or e}") from None
            yield
        return
    if not url.startswith("postgresql"):
        yield
        return
    own = engine is None
    engine = engine or make_engine(url)
    try:
        with engine.connect() as conn:
            conn.execute(select(func.pg_advisory_lock(PG_LOCK_KEY)))
            conn.commit()
            try:
                yield
            finally:
                conn.execute(select(func.pg_advisory_unlock(PG_LOCK_KEY)))
                conn.commit()
    finally:
        if own:
            engine.dispose()

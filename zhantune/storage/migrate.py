"""Schema versions of zhantune's tables, through Alembic (revisions in zhantune/storage/migrations).

A database is one of: new (no ``zt_`` table: created at the newest revision), current, older
(upgrade with ``python -m zhantune.db upgrade storage.url=...``), or newer than this zhantune
(written by a later release). The first schema predates Alembic: ``zt_`` tables without a
``zt_alembic_version`` table are revision 0001.
"""

from __future__ import annotations

import logging
from pathlib import Path

# Alembic logs every step (and its plugins at import) at INFO; a tune should not print them
logging.getLogger("alembic").setLevel(logging.WARNING)

from alembic import command  # noqa: E402
from alembic.config import Config  # noqa: E402
from alembic.runtime.migration import MigrationContext  # noqa: E402
from alembic.script import ScriptDirectory  # noqa: E402
from sqlalchemy import create_engine, event, inspect  # noqa: E402
from sqlalchemy.engine import Connection, Engine  # noqa: E402

__all__ = ["VERSION_TABLE", "FIRST_REVISION", "head_revision", "current_revision", "upgrade", "stamp"]

VERSION_TABLE = "zt_alembic_version"
FIRST_REVISION = "0001"
_SCRIPTS = Path(__file__).resolve().parent / "migrations"


def _config(connection: Connection) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(_SCRIPTS))
    cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    return ScriptDirectory(str(_SCRIPTS)).get_current_head()


def known_revisions() -> set[str]:
    return {r.revision for r in ScriptDirectory(str(_SCRIPTS)).walk_revisions()}


def current_revision(connection: Connection) -> str | None:
    """The database's revision: None when it has no zt_ table at all (a new database)."""
    tables = set(inspect(connection).get_table_names())
    if not any(t.startswith("zt_") for t in tables):
        return None
    if VERSION_TABLE not in tables:
        return FIRST_REVISION
    rows = connection.exec_driver_sql(f"SELECT version_num FROM {VERSION_TABLE}").fetchall()
    if len(rows) > 1:  # Alembic's "more than one head" traceback in every command (a review's damaged file)
        return f"<{len(rows)} revisions in {VERSION_TABLE}: damaged>"
    ctx = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return ctx.get_current_revision() or FIRST_REVISION


def _transactional(engine: Engine) -> Engine:
    """On SQLite, an engine whose transactions really enclose DDL (BEGIN IMMEDIATE ... COMMIT) with
    foreign keys off while tables are rebuilt, so a failed upgrade leaves the file as it was.
    (pysqlite runs DDL outside any transaction by default; see SQLAlchemy's pysqlite notes.)"""
    if engine.dialect.name != "sqlite":
        return engine
    eng = create_engine(engine.url)

    @event.listens_for(eng, "connect")
    def _connect(dbapi_connection, _record):
        dbapi_connection.isolation_level = None  # we emit BEGIN ourselves
        cur = dbapi_connection.cursor()
        cur.execute("PRAGMA foreign_keys=OFF")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.close()

    @event.listens_for(eng, "begin")
    def _begin(conn):
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return eng


def upgrade(engine: Engine, revision: str = "head") -> tuple[str | None, str]:
    """Upgrade (or create) zhantune's tables in one transaction; returns (revision before, after)."""
    eng = _transactional(engine)
    try:
        with eng.begin() as conn:
            before = current_revision(conn)
            if before is not None and VERSION_TABLE not in inspect(conn).get_table_names():
                command.stamp(_config(conn), FIRST_REVISION)  # the first schema, written before Alembic
            command.upgrade(_config(conn), revision)
            return before, current_revision(conn) or head_revision()
    finally:
        if eng is not engine:  # its pooled connection would keep the SQLite file open (and its WAL)
            eng.dispose()


def stamp(engine: Engine, revision: str) -> None:
    with engine.begin() as conn:
        command.stamp(_config(conn), revision)

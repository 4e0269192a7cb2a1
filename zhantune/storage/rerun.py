"""Errors that are the storage's state, not a bug, and that the same command run again continues
from: one line (exit code 2) instead of a traceback."""

from __future__ import annotations

from zhantune.storage.engine import SQLITE_BUSY_TIMEOUT_MS, redact_url

__all__ = ["locked_out"]


def locked_out(e: BaseException, url: str, where: str = "storage.url", concurrent: bool = False) -> str | None:
    """The one-line message for an error that is the storage's state, not a bug, and that the same
    command run again continues from (anywhere in the chain: Optuna wraps it), else None: SQLite's
    lock held by another writer past the busy timeout ("database is locked": a review held it for
    over 30 s), a full disk (SQLite's "database or disk is full", PostgreSQL's disk_full, SQLSTATE
    53100: a helper's tune on a full tmpfs said Optuna's "invalid data ... exceeding max length"),
    a PostgreSQL server that went away mid-run (shut down, restarted or crashed: SQLSTATE class 08 or
    57P0x; a helper's restart gave every worker, import and merge a traceback of 80 lines), and, with
    ``concurrent`` (a merge or an import, which skip what is there), a unique row another merge or
    import into the database added meanwhile (two merges started 0.2 s apart)."""
    from sqlalchemy.exc import IntegrityError

    seen: BaseException | None = e
    while seen is not None:
        text = str(seen)
        if "database is locked" in text:
            return (f"{where}={redact_url(url)}: the database (or, for a merge, one of its sources) stayed "
                    f"locked by another process (SQLite waits up to {SQLITE_BUSY_TIMEOUT_MS // 1000} s); nothing "
                    "stored was lost: run the same command again to continue")
        if "database or disk is full" in text or getattr(getattr(seen, "orig", seen), "sqlstate", None) == "53100":
            return (f"{where}={redact_url(url)}: the disk holding the database is full; nothing stored was lost: "
                    "free some space and run the same command again to continue")
        state = str(getattr(getattr(seen, "orig", seen), "sqlstate", None) or "")
        if state.startswith(("08", "57P0")) or "server closed the connection unexpectedly" in text:
            return (f"{where}={redact_url(url)}: the database server closed the connection ({text.splitlines()[0][:160]}); "
                    "nothing stored was lost: run the same command again once it is back, to continue")
        orig = getattr(seen, "orig", None)  # a unique row only: a NOT NULL or foreign key would fail every time
        if concurrent and isinstance(seen, IntegrityError) and (
                "UNIQUE constraint failed" in str(orig) or getattr(orig, "sqlstate", None) == "23505"):
            return (f"{where}={redact_url(url)}: another merge or import wrote the same rows at the same time; "
                    "nothing stored was lost: run the same command again to finish this one")
        seen = seen.__cause__ or seen.__context__
    return None

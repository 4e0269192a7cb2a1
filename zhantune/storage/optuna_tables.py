"""Optuna's tables in zhantune's database: their names, how another program's table of one of those
names is told apart, and Optuna's schema revision (optuna/storages/_rdb)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import inspect

from zhantune.errors import StorageError

__all__ = ["OPTUNA_TABLES", "table_names", "refuse_other_optuna_schema"]

#: the tables Optuna's RDB storage keeps in the same database (optuna/storages/_rdb/models.py)
OPTUNA_TABLES = {
    "studies", "study_directions", "study_user_attributes", "study_system_attributes", "trials",
    "trial_user_attributes", "trial_system_attributes", "trial_params", "trial_values",
    "trial_intermediate_values", "trial_heartbeats", "version_info", "alembic_version",
}


def table_names(conn: Any) -> set[str]:
    """The database's table names; one named as Optuna's (:data:`OPTUNA_TABLES`) without Optuna's key
    column (another program's ``studies(id, title)``) as ``"<name> (not Optuna's)"``: another program's."""
    from optuna.storages._rdb.models import BaseModel

    keys = {name: {c.name for c in t.primary_key.columns} for name, t in BaseModel.metadata.tables.items()}
    keys["alembic_version"], inspector = {"version_num"}, inspect(conn)
    return {f"{n} (not Optuna's)" if n in OPTUNA_TABLES and not keys.get(n, set()) <= {c["name"] for c in
            inspector.get_columns(n)} else n for n in inspector.get_table_names()}


def _optuna_script() -> Any:
    """Optuna's own Alembic scripts (optuna/storages/_rdb/alembic), which version its tables."""
    import optuna.storages._rdb as rdb
    from alembic.script import ScriptDirectory

    return ScriptDirectory(str(Path(rdb.__file__).resolve().parent / "alembic"))


def _optuna_head() -> str:
    return _optuna_script().get_current_head()


def _optuna_revisions() -> set[str]:
    return {r.revision for r in _optuna_script().walk_revisions()}


def _optuna_version() -> str:
    import optuna

    return optuna.__version__


def refuse_other_optuna_schema(where: str, optuna_rev: str | None) -> None:
    """Refuse Optuna tables at another schema revision than this Optuna's (``optuna_rev``: the
    revision in their ``alembic_version`` table, None: no Optuna tables); raises StorageError naming
    ``where``. Optuna refuses such a storage only when the study is opened, after a tune has written
    its study row and baselines: this refuses it before anything is written."""
    if optuna_rev is not None and optuna_rev != _optuna_head():
        raise StorageError(f"{where}: Optuna's tables are at schema {optuna_rev!r}, this "
                           f"Optuna ({_optuna_version()}) uses {_optuna_head()!r}; "
                           + ("upgrade them: optuna storage upgrade --storage URL" if optuna_rev in
                              _optuna_revisions() else "use a newer Optuna") + ". Left untouched")

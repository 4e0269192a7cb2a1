"""Alembic environment for zhantune's own tables (``zt_*``).

Optuna keeps its study tables, and its own ``alembic_version`` table, in the same database, so
zhantune's revisions are tracked in ``zt_alembic_version`` and autogenerate only sees ``zt_*``
tables. The connection comes from :func:`zhantune.storage.migrate` (``config.attributes``).
"""

from __future__ import annotations

from alembic import context

from zhantune.storage.orm import Base

VERSION_TABLE = "zt_alembic_version"


def _include(obj, name, type_, reflected, compare_to):
    return type_ != "table" or str(name).startswith("zt_")


connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, version_table=VERSION_TABLE,
                  include_object=_include, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()

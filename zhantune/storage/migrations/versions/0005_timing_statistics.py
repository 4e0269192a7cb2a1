"""Timing statistics and measurement conditions: mean, standard deviation, interquartile range and
coefficient of variation of the timed runs; the machine's state while measuring (load average,
threads, governor, GPU clocks where readable) and whether it was contended.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_COLUMNS = [("mean_us", sa.Float), ("std_us", sa.Float), ("iqr_us", sa.Float), ("cv", sa.Float)]


def upgrade() -> None:
    with op.batch_alter_table("zt_measurement") as batch:
        for name, type_ in _COLUMNS:
            batch.add_column(sa.Column(name, type_, nullable=True))
        batch.add_column(sa.Column("conditions", sa.JSON, nullable=True))
        batch.add_column(sa.Column("contended", sa.Boolean, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("zt_measurement") as batch:
        for name in ("contended", "conditions", *[n for n, _ in reversed(_COLUMNS)]):
            batch.drop_column(name)

"""Longer op names: a Kernel Tuner kernel's name is its problem's ``op`` (and ``lookup_op``), and real
kernels have names over 32 characters (``convolution_kernel_shared_mem_tiled``, 35); both columns
widen from 32 to 128 characters (zhantune.bench.recorded_checks.MAX_KERNEL_NAME: 100, so that
``kerneltuner::<name>`` fits MeasurementRow.template_id's 128).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("zt_problem") as batch:
        for column in ("op", "lookup_op"):
            batch.alter_column(column, type_=sa.String(128), existing_type=sa.String(32), existing_nullable=False)


def downgrade() -> None:
    with op.batch_alter_table("zt_problem") as batch:
        for column in ("op", "lookup_op"):
            batch.alter_column(column, type_=sa.String(32), existing_type=sa.String(128), existing_nullable=False)

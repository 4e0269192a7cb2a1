"""Provenance: an environment table (software and host) referenced by every new measurement.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "zt_environment",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("fingerprint", sa.String(64), nullable=False, unique=True),
        sa.Column("torch", sa.String(64)),
        sa.Column("triton", sa.String(64)),
        sa.Column("cuda", sa.String(32)),
        sa.Column("hip", sa.String(32)),
        sa.Column("driver", sa.String(64)),
        sa.Column("python", sa.String(32)),
        sa.Column("zhantune", sa.String(32)),
        sa.Column("host", sa.String(256)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    with op.batch_alter_table("zt_measurement") as batch:
        batch.add_column(sa.Column("environment_id", sa.Integer, nullable=True))
        batch.create_foreign_key("fk_zt_measurement_environment", "zt_environment", ["environment_id"], ["id"])
        batch.create_index("ix_zt_measurement_study", ["study_id"])


def downgrade() -> None:
    with op.batch_alter_table("zt_measurement") as batch:
        batch.drop_index("ix_zt_measurement_study")
        batch.drop_constraint("fk_zt_measurement_environment", type_="foreignkey")
        batch.drop_column("environment_id")
    op.drop_table("zt_environment")

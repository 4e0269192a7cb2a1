"""Claims: one row per (study, config) a worker is measuring, so two workers never measure one point;
problem FLOPs as a 64-bit integer (a 4096^3 GEMM has 1.4e11; PostgreSQL's INTEGER stops at 2^31).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "zt_claim",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("study_id", sa.Integer, sa.ForeignKey("zt_study.id"), nullable=False),
        sa.Column("config_hash", sa.String(64), nullable=False),
        sa.Column("trial_number", sa.Integer, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("study_id", "config_hash", name="uq_zt_claim"),
    )
    with op.batch_alter_table("zt_problem") as batch:
        batch.alter_column("flops", type_=sa.BigInteger, existing_type=sa.Integer, existing_nullable=False)


def downgrade() -> None:
    with op.batch_alter_table("zt_problem") as batch:
        batch.alter_column("flops", type_=sa.Integer, existing_type=sa.BigInteger, existing_nullable=False)
    op.drop_table("zt_claim")

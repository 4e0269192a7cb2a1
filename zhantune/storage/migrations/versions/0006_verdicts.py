"""Speedup verdicts: a claim over Inductor's default, settled by paired, interleaved rounds
(zhantune.bench.decision), stored so that the exporter ships a tuned entry only for a confirmed claim.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "zt_verdict",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("study_id", sa.Integer, sa.ForeignKey("zt_study.id"), nullable=False),
        sa.Column("device_id", sa.Integer, sa.ForeignKey("zt_device.id"), nullable=False),
        sa.Column("problem_id", sa.Integer, sa.ForeignKey("zt_problem.id"), nullable=False),
        sa.Column("config_hash", sa.String(64), nullable=True),
        sa.Column("ratio", sa.Float, nullable=True),
        sa.Column("ratio_low", sa.Float, nullable=True),
        sa.Column("ratio_high", sa.Float, nullable=True),
        sa.Column("rounds", sa.Integer, nullable=False),
        sa.Column("contended", sa.Integer, nullable=False),
        sa.Column("confirmed", sa.Boolean, nullable=False),
        sa.Column("reason", sa.String(500), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_zt_verdict_device_problem", "zt_verdict", ["device_id", "problem_id"])


def downgrade() -> None:
    op.drop_index("ix_zt_verdict_device_problem", "zt_verdict")
    op.drop_table("zt_verdict")

"""First schema: device, problem, study, measurement (zhantune 0.1, before Alembic).

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "zt_device",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("key", sa.String(256), nullable=False, unique=True),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("properties", sa.JSON, nullable=False),
    )
    op.create_table(
        "zt_problem",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("key", sa.String(512), nullable=False, unique=True),
        sa.Column("op", sa.String(32), nullable=False),
        sa.Column("shape", sa.JSON, nullable=False),
        sa.Column("dtype", sa.String(16), nullable=False),
        sa.Column("activation", sa.String(16)),
        sa.Column("lookup_op", sa.String(32), nullable=False),
        sa.Column("lookup_key", sa.String(2048)),
        sa.Column("flops", sa.Integer, nullable=False),
    )
    op.create_table(
        "zt_study",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(512), nullable=False, unique=True),
        sa.Column("config", sa.JSON, nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.Column("status", sa.String(16), nullable=False),
    )
    op.create_table(
        "zt_measurement",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("study_id", sa.Integer, sa.ForeignKey("zt_study.id"), nullable=False),
        sa.Column("device_id", sa.Integer, sa.ForeignKey("zt_device.id"), nullable=False),
        sa.Column("problem_id", sa.Integer, sa.ForeignKey("zt_problem.id"), nullable=False),
        sa.Column("trial_number", sa.Integer),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("branch", sa.String(128)),
        sa.Column("template_id", sa.String(128)),
        sa.Column("params", sa.JSON, nullable=False),
        sa.Column("config_hash", sa.String(64)),
        sa.Column("template_hash", sa.String(128)),
        sa.Column("lookup_key", sa.String(2048)),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("median_us", sa.Float),
        sa.Column("min_us", sa.Float),
        sa.Column("max_us", sa.Float),
        sa.Column("p20_us", sa.Float),
        sa.Column("p80_us", sa.Float),
        sa.Column("n", sa.Integer),
        sa.Column("timing_method", sa.String(64)),
        sa.Column("tflops", sa.Float),
        sa.Column("error", sa.Float),
        sa.Column("error_text", sa.String(1000)),
        sa.Column("compile_s", sa.Float),
        sa.Column("torch_version", sa.String(64), nullable=False),
        sa.Column("triton_version", sa.String(64)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("study_id", "trial_number", name="uq_zt_measurement_trial"),
    )
    op.create_index("ix_zt_measurement_device_problem", "zt_measurement", ["device_id", "problem_id"])
    op.create_index("ix_zt_measurement_lookup", "zt_measurement", ["device_id", "problem_id", "config_hash"])


def downgrade() -> None:
    for table in ("zt_measurement", "zt_study", "zt_problem", "zt_device"):
        op.drop_table(table)

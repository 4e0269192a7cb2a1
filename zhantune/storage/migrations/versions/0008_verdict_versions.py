"""A verdict's torch and triton: a speedup confirmed in paired rounds holds for the software it ran
with, and a table stamped with another torch must not ship it (zhantune.inductor.builder). Verdicts
stored before this revision take the versions of their config's newest paired re-measurement
stored before them in the same study, device and problem (kind ``remeasure``: the same settle's);
where there is none they stay NULL and count for no torch.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("zt_verdict") as batch:
        batch.add_column(sa.Column("torch_version", sa.String(64), nullable=True))
        batch.add_column(sa.Column("triton_version", sa.String(64), nullable=True))
    for column in ("torch_version", "triton_version"):
        # the settle's own rows: same study, device, problem and config, stored before the verdict
        # (a study re-settled later, under another torch, has newer ones)
        op.execute(f"UPDATE zt_verdict SET {column} = (SELECT r.{column} FROM zt_measurement r "
                   "WHERE r.study_id = zt_verdict.study_id AND r.device_id = zt_verdict.device_id "
                   "AND r.problem_id = zt_verdict.problem_id AND r.config_hash = zt_verdict.config_hash "
                   "AND r.kind = 'remeasure' AND r.created_at <= zt_verdict.created_at "
                   "ORDER BY r.created_at DESC, r.id DESC LIMIT 1)")


def downgrade() -> None:
    with op.batch_alter_table("zt_verdict") as batch:
        batch.drop_column("triton_version")
        batch.drop_column("torch_version")

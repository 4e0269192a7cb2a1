"""Problem weight layout: "kn" (W [K, N], x @ W) or "nk" (nn.Linear's W [N, K] used as W.t()); the
layout is part of Inductor's lookup key (strides), so problems collected from a model keep it.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("zt_problem") as batch:
        batch.add_column(sa.Column("weight_layout", sa.String(8), nullable=False, server_default="kn"))


def downgrade() -> None:
    with op.batch_alter_table("zt_problem") as batch:
        batch.drop_column("weight_layout")

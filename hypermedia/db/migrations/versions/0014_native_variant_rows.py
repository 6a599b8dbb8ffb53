"""variant_jobs.native: rows this service's own photos wrote

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

# A photo added while the engine refused its variant jobs (a spent credit
# budget) leaves its variant_jobs row to the bridge, which then recorded a
# legacy bridge hit for it: seed 004's hits count uses of the legacy surface,
# and there was none.  Rows already there cannot be told apart: they stay
# false, as a legacy producer's.


def upgrade() -> None:
    op.add_column(
        "variant_jobs",
        sa.Column("native", sa.Boolean(), server_default=sa.false(), nullable=False),
    )


def downgrade() -> None:
    with op.batch_alter_table("variant_jobs") as batch:  # SQLite: table rebuilt
        batch.drop_column("native")

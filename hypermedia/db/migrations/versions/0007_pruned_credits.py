"""project_credits.pruned_credits: what pruned jobs had used

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Job retention deletes finished jobs; a project's credit use is summed
    # over its jobs, so the credits of the ones deleted are kept here.
    op.add_column(
        "project_credits",
        sa.Column("pruned_credits", sa.BigInteger(), server_default="0", nullable=False),
    )


def downgrade() -> None:
    with op.batch_alter_table("project_credits") as batch:  # SQLite: table rebuilt
        batch.drop_column("pruned_credits")

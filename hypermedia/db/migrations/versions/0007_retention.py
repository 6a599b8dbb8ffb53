"""job retention: project_credits.pruned_credits, pruned_attempt_durations

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql, postgresql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

TS = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
NOW = sa.func.current_timestamp()


def upgrade() -> None:
    # Job retention deletes finished jobs.  What they counted for stays: a
    # project's credit use (summed over its jobs, plus this column) and the
    # /metrics duration histogram (live attempts plus this table).
    op.add_column(
        "project_credits",
        sa.Column("pruned_credits", sa.BigInteger(), server_default="0", nullable=False),
    )
    op.create_table(
        "pruned_attempt_durations",
        sa.Column("job_type", sa.String(50), nullable=False),
        sa.Column("attempts", sa.BigInteger(), nullable=False),
        sa.Column("sum_ms", sa.BigInteger(), nullable=False),
        sa.Column("buckets", JSON, nullable=False),
        sa.Column("updated_at", TS, server_default=NOW, nullable=False),
        sa.PrimaryKeyConstraint("job_type", name="pk_pruned_attempt_durations"),
    )


def downgrade() -> None:
    op.drop_table("pruned_attempt_durations")
    with op.batch_alter_table("project_credits") as batch:  # SQLite: table rebuilt
        batch.drop_column("pruned_credits")

"""credit fold: processing_jobs.credits_folded, project_credits.settled_credits

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A budget check summed every job the project ever ran (~95 ms at 500,000
    # jobs on PostgreSQL, under the project's lock).  The leader now folds
    # finished jobs' credits into one counter and flags them; the check sums
    # only the unflagged rows, which idx_project's new columns find in order.
    # pruned_credits (0007) becomes that counter: retention's deleted jobs and
    # the folded ones are the same thing, credits no longer summed row by row.
    with op.batch_alter_table("processing_jobs") as batch:
        batch.add_column(
            sa.Column("credits_folded", sa.Boolean(), server_default=sa.false(), nullable=False)
        )
        batch.drop_index("idx_project")
        batch.create_index("idx_project", ["project_id", "credits_folded", "job_id"])
    _rename_counter("pruned_credits", "settled_credits")


def downgrade() -> None:
    # Unfolding is exact: folded credits are the flagged completed jobs' own.
    # Retention's part stays in the counter, which 0007 calls pruned_credits.
    jobs = sa.table(
        "processing_jobs",
        sa.column("project_id", sa.String),
        sa.column("status", sa.String),
        sa.column("estimated_credits", sa.Integer),
        sa.column("actual_credits", sa.Integer),
        sa.column("credits_folded", sa.Boolean),
    )
    credits = sa.table(
        "project_credits",
        sa.column("project_id", sa.String),
        sa.column("settled_credits", sa.BigInteger),
    )
    folded = (
        sa.select(
            sa.func.coalesce(
                sa.func.sum(sa.func.coalesce(jobs.c.actual_credits, jobs.c.estimated_credits)), 0
            )
        )
        .where(
            jobs.c.project_id == credits.c.project_id,
            jobs.c.credits_folded.is_(True),
            jobs.c.status == "completed",
        )
        .scalar_subquery()
    )
    op.execute(sa.update(credits).values(settled_credits=credits.c.settled_credits - folded))
    _rename_counter("settled_credits", "pruned_credits")
    with op.batch_alter_table("processing_jobs") as batch:
        batch.drop_index("idx_project")
        batch.create_index("idx_project", ["project_id"])
        batch.drop_column("credits_folded")


def _rename_counter(old: str, new: str) -> None:
    with op.batch_alter_table("project_credits") as batch:  # SQLite: table rebuilt
        batch.alter_column(
            old,
            new_column_name=new,
            existing_type=sa.BigInteger(),
            existing_nullable=False,
            existing_server_default="0",
        )

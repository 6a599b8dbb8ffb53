"""folds (credits_folded, settled_credits, attempt_fold); objects AUTOINCREMENT on SQLite

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

TS = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


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
    # /metrics read every attempt per scrape (~0.7 s at 1,000,000): the
    # leader now adds finished attempts to pruned_attempt_durations by id.
    op.create_table(
        "attempt_fold",
        sa.Column("name", sa.String(50), nullable=False),
        sa.Column("watermark", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("seen", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("seen_at", TS, nullable=True),
        sa.Column("updated_at", TS, server_default=sa.func.current_timestamp(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_attempt_fold"),
    )
    op.execute("INSERT INTO attempt_fold (name, watermark, seen) VALUES ('durations', 0, 0)")
    _object_ids_never_reused(True)


def downgrade() -> None:
    _object_ids_never_reused(False)
    # The folded attempts' counts go back to being summed from their rows.
    _unfold_attempts()
    op.drop_table("attempt_fold")
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


def _unfold_attempts() -> None:
    """Take the folded attempts' counts out of pruned_attempt_durations:
    below 0008 every attempt row still there is counted from its row."""
    conn = op.get_bind()
    fold = conn.execute(sa.text("SELECT watermark FROM attempt_fold")).scalar()
    if not fold:
        return
    pruned = sa.table(
        "pruned_attempt_durations",
        sa.column("job_type", sa.String),
        sa.column("attempts", sa.BigInteger),
        sa.column("sum_ms", sa.BigInteger),
        sa.column("buckets", sa.JSON),
    )
    attempts = sa.table(
        "job_attempts",
        sa.column("attempt_id"),
        sa.column("job_id"),
        sa.column("duration_ms"),
    )
    jobs = sa.table("processing_jobs", sa.column("job_id"), sa.column("job_type"))
    d = attempts.c.duration_ms
    for row in conn.execute(sa.select(pruned)).mappings().all():
        buckets = {k: int(v) for k, v in dict(row["buckets"]).items()}
        folded = conn.execute(
            sa.select(
                sa.func.count(),
                sa.func.coalesce(sa.func.sum(d), 0),
                *(sa.func.sum(sa.case((d <= float(k), 1), else_=0)) for k in buckets),
            )
            .select_from(attempts.join(jobs, jobs.c.job_id == attempts.c.job_id))
            .where(
                attempts.c.attempt_id <= fold,
                d.is_not(None),
                jobs.c.job_type == row["job_type"],
            )
        ).one()
        n, total, below = int(folded[0]), int(folded[1]), folded[2:]
        left = {k: v - int(b or 0) for (k, v), b in zip(buckets.items(), below, strict=True)}
        conn.execute(
            sa.update(pruned)
            .where(pruned.c.job_type == row["job_type"])
            .values(attempts=row["attempts"] - n, sum_ms=row["sum_ms"] - total, buckets=left)
        )


def _object_ids_never_reused(never: bool) -> None:
    """SQLite gives a new row the highest id left plus one: a new object took
    the id, and so the storage key, of the newest one GC had deleted, and a
    signed URL for that one served it.  AUTOINCREMENT needs the table rebuilt
    (foreign keys are off while migrations run on SQLite: env.py)."""
    if op.get_bind().dialect.name != "sqlite":
        return  # PostgreSQL sequences and InnoDB counters never go back
    with op.batch_alter_table(
        "objects", recreate="always", table_kwargs={"sqlite_autoincrement": never}
    ):
        pass

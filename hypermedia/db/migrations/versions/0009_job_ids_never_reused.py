"""SQLite: job and attempt ids never reused (processing_jobs, job_attempts AUTOINCREMENT)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# SQLite gives a new row the highest id left plus one.  Once retention had
# pruned the newest job (a quiet week on the embedded default), the next job
# took its id: a client still holding that id read another file's job, its
# outputs and its event stream.  PostgreSQL sequences and InnoDB counters
# never go back; only SQLite's tables are rebuilt (foreign keys are off while
# migrations run there: env.py), named CHECKs and indexes carried over.
TABLES = ("processing_jobs", "job_attempts")


def upgrade() -> None:
    _never_reused(True)


def downgrade() -> None:
    _never_reused(False)


def _never_reused(never: bool) -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for table in TABLES:
        with op.batch_alter_table(
            table, recreate="always", table_kwargs={"sqlite_autoincrement": never}
        ):
            pass

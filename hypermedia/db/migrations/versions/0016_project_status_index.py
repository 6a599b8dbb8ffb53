"""idx_project_status (project_id, status, job_id); on SQLite idx_project_job (project_id, job_id)

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06
"""

from __future__ import annotations

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

# GET /v1/jobs is a project's jobs newest first, by job_id, often of one
# status.  No index had job_id right after those columns (idx_status_queue
# has the queue and priority between, idx_project credits_folded), so with a
# million jobs (bench/list_queries.py, docs/benchmarks.md) a page with
# nothing below its cursor walked the primary key: 0.14 s on PostgreSQL,
# 1.1 s on MariaDB; 1-2 ms with idx_project_status.  SQLite, which runs
# without statistics here, read a big project's every job to sort them
# (0.3-1.2 s a page, any filter but a status): idx_project_job gives it the
# order.  Not on the others: they walk the primary key well with their
# statistics, and MariaDB chose (project_id, job_id) for deep pages without
# using the cursor's bound (2 s).  Each index costs the queue's writes a few
# per cent.  A large table is written while they build: upgrade with the
# workers stopped.


def upgrade() -> None:
    op.create_index("idx_project_status", "processing_jobs", ["project_id", "status", "job_id"])
    if op.get_bind().dialect.name == "sqlite":
        op.create_index("idx_project_job", "processing_jobs", ["project_id", "job_id"])


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.drop_index("idx_project_job", table_name="processing_jobs")
    op.drop_index("idx_project_status", table_name="processing_jobs")

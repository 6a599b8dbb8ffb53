"""built-in profiles for the debug job types

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

PROFILES = [
    ("debug-noop", "v1", "debug.noop", "bulk", {}, 0, 60),
    ("debug-sleep", "v1", "debug.sleep", "bulk", {"max_ms": 3_600_000}, 0, 3600),
]


def _table() -> sa.TableClause:
    return sa.table(
        "processing_profiles",
        sa.column("profile_key", sa.String),
        sa.column("profile_version", sa.String),
        sa.column("job_type", sa.String),
        sa.column("queue_name", sa.String),
        sa.column("settings", sa.JSON),
        sa.column("credit_cost_base", sa.Integer),
        sa.column("timeout_seconds", sa.Integer),
        sa.column("is_active", sa.Boolean),
    )


def upgrade() -> None:
    op.bulk_insert(
        _table(),
        [
            {
                "profile_key": key,
                "profile_version": version,
                "job_type": job_type,
                "queue_name": queue,
                "settings": settings,
                "credit_cost_base": cost,
                "timeout_seconds": timeout,
                "is_active": True,
            }
            for key, version, job_type, queue, settings, cost, timeout in PROFILES
        ],
    )


def downgrade() -> None:
    t = _table()
    op.execute(t.delete().where(t.c.profile_key.in_([p[0] for p in PROFILES])))

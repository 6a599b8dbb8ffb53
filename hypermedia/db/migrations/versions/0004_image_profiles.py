"""built-in profiles for the libvips image job types (image.thumbnail, image.preview)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from hypermedia.db.builtin_rows import new_profiles

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# (key, version, job type, queue, settings, credit_cost_base, timeout_seconds)
PROFILES = [
    (
        "image-thumbnail",
        "v1",
        "image.thumbnail",
        "images",
        {
            "width": 200,
            "height": 200,
            "format": "webp",
            "quality": 85,
            "fit": "cover",
            "max_pixels": 100_000_000,
        },
        1,
        120,
    ),
    (
        "image-preview",
        "v1",
        "image.preview",
        "images",
        {
            "width": 1280,
            "height": 1280,
            "format": "webp",
            "quality": 82,
            "fit": "inside",
            "max_pixels": 100_000_000,
        },
        1,
        300,
    ),
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
    table = _table()
    rows = [
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
    ]
    if fresh := new_profiles(op.get_bind(), table, rows):  # an empty insert adds a row
        op.bulk_insert(table, fresh)


def downgrade() -> None:
    t = _table()
    op.execute(
        t.delete().where(
            t.c.profile_key.in_([p[0] for p in PROFILES]),
            t.c.profile_version == "v1",
        )
    )

"""project credit budgets, perceptual hashes of objects, default profiles of seed 000/001

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from hypermedia.db.builtin_rows import new_profiles

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

TS = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
NOW = sa.func.current_timestamp()

# (key, version, job type, queue, settings, base, per MB, per page, per minute, timeout)
PROFILES = [
    (
        "image-compress",
        "v1",
        "image.compress",
        "images",
        {"format": "webp", "quality": 80, "max_width": 4096, "max_height": 4096},
        1, 1, 0, 0, 300,
    ),
    (
        "pdf-preview",
        "v1",
        "pdf.preview",
        "documents",
        {"first_page": 1, "last_page": 1, "width": 1280, "format": "webp", "quality": 85},
        1, 0, 1, 0, 300,
    ),
    (
        "virus-scan",
        "v1",
        "security.virus_scan",
        "bulk",
        {"clamd": "unix:///run/clamav/clamd.ctl", "max_bytes": 104857600},
        1, 0, 0, 0, 300,
    ),
    (
        "dedup-check",
        "v1",
        "storage.dedup_check",
        "bulk",
        {"near": True, "max_distance": 8},
        1, 0, 0, 0, 300,
    ),
]  # fmt: skip


def _profiles() -> sa.TableClause:
    return sa.table(
        "processing_profiles",
        *(
            sa.column(c, t)
            for c, t in (
                ("profile_key", sa.String),
                ("profile_version", sa.String),
                ("job_type", sa.String),
                ("queue_name", sa.String),
                ("settings", sa.JSON),
                ("credit_cost_base", sa.Integer),
                ("credit_cost_per_mb", sa.Integer),
                ("credit_cost_per_page", sa.Integer),
                ("credit_cost_per_minute", sa.Integer),
                ("timeout_seconds", sa.Integer),
                ("is_active", sa.Boolean),
            )
        ),
    )


def upgrade() -> None:
    op.create_table(
        "project_credits",
        sa.Column("project_id", sa.String(64), nullable=False),
        # NULL: no limit.  Enqueueing past the budget is refused.
        sa.Column("budget_credits", sa.BigInteger(), nullable=True),
        sa.Column("created_at", TS, server_default=NOW, nullable=False),
        sa.Column("updated_at", TS, server_default=NOW, nullable=False),
        sa.PrimaryKeyConstraint("project_id", name="pk_project_credits"),
    )
    op.create_table(
        "object_hashes",
        sa.Column("object_id", sa.BigInteger(), nullable=False),
        sa.Column("algorithm", sa.String(32), nullable=False),
        # The library and its version: hashes compare only within one.
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(128), nullable=False),
        sa.Column("project_id", sa.String(64), server_default="", nullable=False),
        sa.Column("created_at", TS, server_default=NOW, nullable=False),
        sa.PrimaryKeyConstraint("object_id", "algorithm", "version", name="pk_object_hashes"),
    )
    op.create_index(
        "object_hashes_project_idx", "object_hashes", ["project_id", "algorithm", "version"]
    )
    op.create_index("objects_checksum_idx", "objects", ["checksum"])
    table = _profiles()
    rows = [
        {
            "profile_key": key,
            "profile_version": version,
            "job_type": job_type,
            "queue_name": queue,
            "settings": settings,
            "credit_cost_base": base,
            "credit_cost_per_mb": per_mb,
            "credit_cost_per_page": per_page,
            "credit_cost_per_minute": per_minute,
            "timeout_seconds": timeout,
            "is_active": True,
        }
        for key, version, job_type, queue, settings, base, per_mb, per_page, per_minute, timeout in PROFILES
    ]
    if fresh := new_profiles(op.get_bind(), table, rows):  # an empty insert adds a row
        op.bulk_insert(table, fresh)


def downgrade() -> None:
    t = _profiles()
    op.execute(t.delete().where(t.c.profile_key.in_([p[0] for p in PROFILES])))
    op.drop_index("objects_checksum_idx", table_name="objects")
    op.drop_table("object_hashes")
    op.drop_table("project_credits")

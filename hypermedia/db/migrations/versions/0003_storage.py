"""storage ledger (seed 002): pools, objects, photos, photo_objects, variant_jobs, bridge_hits

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from hypermedia.db.builtin_rows import new_profiles

# Written out, not imported from hypermedia.db: see 0001.
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
NOW = sa.func.current_timestamp()

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pools",
        sa.Column("pool_id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("backend_url", sa.String(1000), nullable=False),
        sa.Column("project_id", sa.String(64), nullable=True),
        sa.Column("created_at", TS, server_default=NOW, nullable=False),
        sa.PrimaryKeyConstraint("pool_id", name="pk_pools"),
        sa.UniqueConstraint("name", name="uq_pools_name"),
    )
    op.create_table(
        "objects",
        sa.Column("object_id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("pool_id", sa.Integer(), nullable=False),
        sa.Column("storage_key", sa.String(500), nullable=False),
        sa.Column("project_id", sa.String(64), server_default="", nullable=False),
        sa.Column("filename", sa.String(255), server_default="", nullable=False),
        sa.Column("mime_type", sa.String(255), server_default="", nullable=False),
        sa.Column("size", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("width", sa.Integer(), server_default="0", nullable=False),
        sa.Column("height", sa.Integer(), server_default="0", nullable=False),
        sa.Column("pages", sa.Integer(), nullable=True),
        sa.Column("duration_ms", sa.BigInteger(), nullable=True),
        sa.Column("checksum", sa.String(80), server_default="", nullable=False),
        sa.Column("state", sa.String(10), server_default="pending", nullable=False),
        sa.Column("created_at", TS, server_default=NOW, nullable=False),
        sa.Column("updated_at", TS, server_default=NOW, nullable=False),
        sa.CheckConstraint("state IN ('deleting', 'pending', 'ready')", name="ck_objects_state"),
        sa.ForeignKeyConstraint(["pool_id"], ["pools.pool_id"], name="fk_objects_pool_id"),
        sa.PrimaryKeyConstraint("object_id", name="pk_objects"),
        sa.UniqueConstraint("storage_key", name="uq_objects_storage_key"),
    )
    op.create_index("objects_state_created_idx", "objects", ["state", "created_at"])
    op.create_table(
        "photos",
        sa.Column("photo_id", sa.String(36), nullable=False),
        sa.Column("album", sa.String(200), server_default="", nullable=False),
        sa.Column("owner_id", sa.String(64), server_default="", nullable=False),
        sa.Column("project_id", sa.String(64), server_default="", nullable=False),
        sa.Column("title", sa.String(500), server_default="", nullable=False),
        sa.Column("created_at", TS, server_default=NOW, nullable=False),
        sa.Column("updated_at", TS, server_default=NOW, nullable=False),
        sa.PrimaryKeyConstraint("photo_id", name="pk_photos"),
    )
    op.create_index("photos_project_album_idx", "photos", ["project_id", "album"])
    op.create_table(
        "photo_objects",
        sa.Column("photo_id", sa.String(36), nullable=False),
        sa.Column("object_id", sa.BigInteger(), nullable=False),
        sa.Column("role", sa.String(20), nullable=False),
        sa.CheckConstraint(
            "role IN ('original', 'preview', 'thumb')", name="ck_photo_objects_role"
        ),
        sa.ForeignKeyConstraint(
            ["photo_id"],
            ["photos.photo_id"],
            name="fk_photo_objects_photo_id",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["object_id"],
            ["objects.object_id"],
            name="fk_photo_objects_object_id",
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("photo_id", "role", name="pk_photo_objects"),
    )
    op.create_index("photo_objects_object_idx", "photo_objects", ["object_id"])
    op.create_table(
        "variant_jobs",
        sa.Column("photo_id", sa.String(36), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("next_attempt_at", TS, server_default=NOW, nullable=False),
        sa.Column("last_error", sa.Text(), nullable=False, server_default=""),
        sa.Column("adopted_at", TS, nullable=True),
        sa.Column("created_at", TS, server_default=NOW, nullable=False),
        sa.ForeignKeyConstraint(
            ["photo_id"],
            ["photos.photo_id"],
            name="fk_variant_jobs_photo_id",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("photo_id", name="pk_variant_jobs"),
    )
    op.create_index("variant_jobs_due_idx", "variant_jobs", ["next_attempt_at"])
    op.create_table(
        "bridge_hits",
        sa.Column("bridge_id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("provider_id", sa.String(64), nullable=True),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("legacy_surface", sa.String(50), nullable=False),
        sa.Column("operation", sa.String(50), nullable=False),
        sa.Column("safe_reason", sa.String(500), server_default="", nullable=False),
        sa.Column("created_at", TS, server_default=NOW, nullable=False),
        sa.PrimaryKeyConstraint("bridge_id", name="pk_bridge_hits"),
    )
    op.create_index("bridge_hits_job_idx", "bridge_hits", ["job_id"])
    table = _profiles()
    rows = [
        {
            "profile_key": "debug-copy",
            "profile_version": "v1",
            "job_type": "debug.copy",
            "queue_name": "bulk",
            "settings": {},
            "credit_cost_base": 0,
            "timeout_seconds": 600,
            "is_active": True,
        }
    ]
    if fresh := new_profiles(op.get_bind(), table, rows):  # an empty insert adds a row
        op.bulk_insert(table, fresh)


def _profiles() -> sa.TableClause:
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


def downgrade() -> None:
    t = _profiles()
    op.execute(t.delete().where(t.c.profile_key == "debug-copy"))
    for table in ("bridge_hits", "variant_jobs", "photo_objects", "photos", "objects", "pools"):
        op.drop_table(table)

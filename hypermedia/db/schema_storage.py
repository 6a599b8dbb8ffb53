"""Tables of seed 002: pools, the objects ledger, photos and their bindings.

Departures from seed 002, each for a reason:

* ``objects.object_id`` is an integer (seed 002: ``id text``).  Seed 000's job
  tables reference objects by INT (``processing_jobs.object_id``,
  ``job_outputs.object_id``); one id scheme serves both.  Keys stay opaque:
  ``objects/{object_id}/{role}.{ext}``.
* ``pools`` is named by seed 000 (``pool_id`` FK → core.storage pools) but not
  specified; its columns are ours.
* ``objects`` also carries pages and duration (later pipelines), the owning
  project, the pool, a display-only file name, and ``updated_at``.
* ``variant_jobs`` gains ``adopted_at``: when the bridge enqueued its engine jobs.
"""

from __future__ import annotations

import sqlalchemy as sa

from hypermedia.db.schema import NOW, BigId, Timestamp, _in, metadata

OBJECT_STATES = ("pending", "ready", "deleting")
PHOTO_ROLES = ("original", "thumb", "preview")

pools = sa.Table(
    "pools",
    metadata,
    sa.Column("pool_id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", sa.String(64), nullable=False, unique=True),
    # file:///abs/path, file: (HYPERMEDIA_HOME/storage) or s3://bucket?endpoint=…&region=…
    sa.Column("backend_url", sa.String(1000), nullable=False),
    sa.Column("project_id", sa.String(64), nullable=True),  # NULL: shared by every project
    sa.Column("created_at", Timestamp, nullable=False, server_default=NOW),
    # `pools rm` deletes rows: a new pool must never take a removed one's id,
    # which running processes still map to its backend (migration 0011).
    sqlite_autoincrement=True,
)

objects = sa.Table(
    "objects",
    metadata,
    sa.Column("object_id", BigId, primary_key=True, autoincrement=True),
    sa.Column("pool_id", sa.Integer, sa.ForeignKey("pools.pool_id"), nullable=False),
    sa.Column("storage_key", sa.String(500), nullable=False, unique=True),
    sa.Column("project_id", sa.String(64), nullable=False, server_default=""),
    sa.Column("filename", sa.String(255), nullable=False, server_default=""),
    sa.Column("mime_type", sa.String(255), nullable=False, server_default=""),
    sa.Column("size", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("width", sa.Integer, nullable=False, server_default="0"),
    sa.Column("height", sa.Integer, nullable=False, server_default="0"),
    sa.Column("pages", sa.Integer, nullable=True),
    sa.Column("duration_ms", sa.BigInteger, nullable=True),
    sa.Column("checksum", sa.String(80), nullable=False, server_default=""),
    sa.Column("state", sa.String(10), nullable=False, server_default="pending"),
    sa.Column("created_at", Timestamp, nullable=False, server_default=NOW),
    sa.Column("updated_at", Timestamp, nullable=False, server_default=NOW),
    sa.CheckConstraint(_in("state", OBJECT_STATES), name="state"),
    sa.Index("objects_state_created_idx", "state", "created_at"),
    sa.Index("objects_checksum_idx", "checksum"),
    # SQLite would give a new object the id of the newest one GC deleted, and
    # with it the same storage key: a signed or presigned URL for the old
    # object would then serve the new one.  AUTOINCREMENT never reuses ids.
    sqlite_autoincrement=True,
)

photos = sa.Table(
    "photos",
    metadata,
    sa.Column("photo_id", sa.String(36), primary_key=True),
    sa.Column("album", sa.String(200), nullable=False, server_default=""),
    sa.Column("owner_id", sa.String(64), nullable=False, server_default=""),
    sa.Column("project_id", sa.String(64), nullable=False, server_default=""),
    sa.Column("title", sa.String(500), nullable=False, server_default=""),
    sa.Column("created_at", Timestamp, nullable=False, server_default=NOW),
    sa.Column("updated_at", Timestamp, nullable=False, server_default=NOW),
    sa.Index("photos_project_album_idx", "project_id", "album"),
)

photo_objects = sa.Table(
    "photo_objects",
    metadata,
    sa.Column(
        "photo_id",
        sa.String(36),
        sa.ForeignKey("photos.photo_id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column(
        "object_id",
        sa.BigInteger,
        sa.ForeignKey("objects.object_id", ondelete="RESTRICT"),
        nullable=False,
    ),
    sa.Column("role", sa.String(20), primary_key=True),
    sa.CheckConstraint(_in("role", PHOTO_ROLES), name="role"),
    sa.Index("photo_objects_object_idx", "object_id"),
)

variant_jobs = sa.Table(
    "variant_jobs",
    metadata,
    sa.Column(
        "photo_id",
        sa.String(36),
        sa.ForeignKey("photos.photo_id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("next_attempt_at", Timestamp, nullable=False, server_default=NOW),
    sa.Column("last_error", sa.Text, nullable=False, server_default=""),
    sa.Column("adopted_at", Timestamp, nullable=True),
    sa.Column("created_at", Timestamp, nullable=False, server_default=NOW),
    # Written by this service's own photos (add, a copy taking over): when
    # the engine refused them at first, the bridge enqueues them later, and
    # that is no use of the legacy surface.  A legacy producer leaves it false.
    sa.Column("native", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Index("variant_jobs_due_idx", "next_attempt_at"),
)

# Seed 004's "compatibility bridge hit": a diagnostic, never a second job.
bridge_hits = sa.Table(
    "bridge_hits",
    metadata,
    sa.Column("bridge_id", BigId, primary_key=True, autoincrement=True),
    sa.Column("provider_id", sa.String(64), nullable=True),
    sa.Column("job_id", sa.BigInteger, nullable=True),
    sa.Column("legacy_surface", sa.String(50), nullable=False),
    sa.Column("operation", sa.String(50), nullable=False),
    sa.Column("safe_reason", sa.String(500), nullable=False, server_default=""),
    sa.Column("created_at", Timestamp, nullable=False, server_default=NOW),
    sa.Index("bridge_hits_job_idx", "job_id"),
)

# Perceptual (and other) hashes of objects, for duplicate checks.  A hash
# compares only with hashes of the same algorithm and library version.
object_hashes = sa.Table(
    "object_hashes",
    metadata,
    sa.Column("object_id", sa.BigInteger, primary_key=True),
    sa.Column("algorithm", sa.String(32), primary_key=True),
    sa.Column("version", sa.String(64), primary_key=True),
    sa.Column("hash", sa.String(128), nullable=False),
    sa.Column("project_id", sa.String(64), nullable=False, server_default=""),
    sa.Column("created_at", Timestamp, nullable=False, server_default=NOW),
    sa.Index("object_hashes_project_idx", "project_id", "algorithm", "version"),
)

# A project's credit budget (seed 000 credits); NULL means no limit.  Credit
# use is settled_credits (completed jobs the leader folded, or that job
# retention deleted) plus the sum over the project's other jobs.
project_credits = sa.Table(
    "project_credits",
    metadata,
    sa.Column("project_id", sa.String(64), primary_key=True),
    sa.Column("budget_credits", sa.BigInteger, nullable=True),
    sa.Column("settled_credits", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("created_at", Timestamp, nullable=False, server_default=NOW),
    sa.Column("updated_at", Timestamp, nullable=False, server_default=NOW),
)

"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql, postgresql

# Written out here, not imported from hypermedia.db.schema: a migration must
# keep creating the schema of its day however the models change later.
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_attempts",
        sa.Column("attempt_id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("worker_id", sa.String(length=100), nullable=False),
        sa.Column("attempt_number", sa.SmallInteger(), nullable=False),
        sa.Column("status", sa.String(length=20), server_default="started", nullable=False),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("error_code", sa.String(length=50), nullable=True),
        sa.Column("started_at", TS, server_default=sa.func.current_timestamp(), nullable=False),
        sa.Column("finished_at", TS, nullable=True),
        sa.Column("duration_ms", sa.Integer(), nullable=True),
        sa.Column("peak_memory_mb", sa.Integer(), nullable=True),
        sa.Column("cpu_time_ms", sa.Integer(), nullable=True),
        sa.CheckConstraint(
            "status IN ('cancelled', 'completed', 'crashed', 'failed', 'orphaned', 'started', 'timeout')",
            name=op.f("ck_job_attempts_status"),
        ),
        sa.PrimaryKeyConstraint("attempt_id", name=op.f("pk_job_attempts")),
        sa.UniqueConstraint("job_id", "attempt_number", name="uk_job_attempt"),
    )
    op.create_index("idx_attempt_job", "job_attempts", ["job_id"], unique=False)
    op.create_index("idx_attempt_status", "job_attempts", ["status"], unique=False)
    op.create_index("idx_attempt_worker", "job_attempts", ["worker_id"], unique=False)

    op.create_table(
        "job_events",
        sa.Column("event_id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("attempt_number", sa.SmallInteger(), nullable=True),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("from_status", sa.String(length=20), nullable=True),
        sa.Column("to_status", sa.String(length=20), nullable=True),
        sa.Column("code", sa.String(length=50), nullable=True),
        sa.Column("message", sa.String(length=1000), server_default="", nullable=False),
        sa.Column("actor", sa.String(length=100), nullable=True),
        sa.Column("created_at", TS, server_default=sa.func.current_timestamp(), nullable=False),
        sa.CheckConstraint(
            "kind IN ('error', 'event', 'log', 'progress', 'warning')",
            name=op.f("ck_job_events_kind"),
        ),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_job_events")),
    )
    op.create_index("idx_event_job", "job_events", ["job_id", "event_id"], unique=False)

    op.create_table(
        "job_outputs",
        sa.Column("output_id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.BigInteger(), nullable=False),
        sa.Column("output_type", sa.String(length=50), nullable=False),
        sa.Column("object_id", sa.BigInteger(), nullable=True),
        sa.Column("output_key", sa.String(length=500), server_default="", nullable=False),
        sa.Column("output_size_bytes", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("mime_type", sa.String(length=255), nullable=False),
        sa.Column("metadata", JSON, nullable=True),
        sa.Column("profile_version", sa.String(length=50), nullable=False),
        sa.Column("created_at", TS, server_default=sa.func.current_timestamp(), nullable=False),
        sa.Column("deleted_at", TS, nullable=True),
        sa.PrimaryKeyConstraint("output_id", name=op.f("pk_job_outputs")),
        sa.UniqueConstraint("job_id", "output_type", "profile_version", name="uk_job_type_profile"),
    )
    op.create_index("idx_output_job", "job_outputs", ["job_id"], unique=False)
    op.create_index("idx_output_object", "job_outputs", ["object_id"], unique=False)
    op.create_index("idx_output_type", "job_outputs", ["output_type"], unique=False)

    op.create_table(
        "leader_leases",
        sa.Column("name", sa.String(length=50), nullable=False),
        sa.Column("holder", sa.String(length=100), nullable=False),
        sa.Column("acquired_at", TS, nullable=False),
        sa.Column("expires_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_leader_leases")),
    )
    op.create_table(
        "processing_profiles",
        sa.Column("profile_id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("profile_key", sa.String(length=100), nullable=False),
        sa.Column("profile_version", sa.String(length=20), nullable=False),
        sa.Column("job_type", sa.String(length=50), nullable=False),
        sa.Column("queue_name", sa.String(length=50), nullable=False),
        sa.Column("settings", JSON, nullable=False),
        sa.Column("credit_cost_base", sa.Integer(), nullable=False),
        sa.Column("credit_cost_per_mb", sa.Integer(), server_default="0", nullable=False),
        sa.Column("credit_cost_per_page", sa.Integer(), server_default="0", nullable=False),
        sa.Column("credit_cost_per_minute", sa.Integer(), server_default="0", nullable=False),
        sa.Column("timeout_seconds", sa.Integer(), server_default="3600", nullable=False),
        sa.Column("max_input_bytes", sa.BigInteger(), server_default="5368709120", nullable=False),
        sa.Column("is_active", sa.Boolean(), server_default=sa.true(), nullable=False),
        sa.Column("created_at", TS, server_default=sa.func.current_timestamp(), nullable=False),
        sa.PrimaryKeyConstraint("profile_id", name=op.f("pk_processing_profiles")),
        sa.UniqueConstraint("profile_key", "profile_version", name="uk_key_version"),
    )
    op.create_index("idx_active", "processing_profiles", ["is_active"], unique=False)
    op.create_index("idx_job_type", "processing_profiles", ["job_type"], unique=False)

    op.create_table(
        "queue_states",
        sa.Column("queue_name", sa.String(length=50), nullable=False),
        sa.Column("paused", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("updated_at", TS, server_default=sa.func.current_timestamp(), nullable=False),
        sa.PrimaryKeyConstraint("queue_name", name=op.f("pk_queue_states")),
    )
    op.create_table(
        "worker_metrics",
        sa.Column("metric_id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("worker_id", sa.String(length=100), nullable=False),
        sa.Column("cpu_percent", sa.Numeric(precision=5, scale=2), nullable=False),
        sa.Column("memory_percent", sa.Numeric(precision=5, scale=2), nullable=False),
        sa.Column("disk_percent", sa.Numeric(precision=5, scale=2), nullable=False),
        sa.Column("jobs_completed_1m", sa.Integer(), server_default="0", nullable=False),
        sa.Column("jobs_failed_1m", sa.Integer(), server_default="0", nullable=False),
        sa.Column("avg_job_duration_ms", sa.Integer(), server_default="0", nullable=False),
        sa.Column("recorded_at", TS, server_default=sa.func.current_timestamp(), nullable=False),
        sa.PrimaryKeyConstraint("metric_id", name=op.f("pk_worker_metrics")),
    )
    op.create_index("idx_recorded", "worker_metrics", ["recorded_at"], unique=False)
    op.create_index("idx_worker_time", "worker_metrics", ["worker_id", "recorded_at"], unique=False)

    op.create_table(
        "worker_metrics_hourly",
        sa.Column("worker_id", sa.String(length=100), nullable=False),
        sa.Column("hour", TS, nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("cpu_percent_avg", sa.Numeric(precision=5, scale=2), nullable=False),
        sa.Column("cpu_percent_max", sa.Numeric(precision=5, scale=2), nullable=False),
        sa.Column("memory_percent_avg", sa.Numeric(precision=5, scale=2), nullable=False),
        sa.Column("memory_percent_max", sa.Numeric(precision=5, scale=2), nullable=False),
        sa.Column("disk_percent_max", sa.Numeric(precision=5, scale=2), nullable=False),
        sa.Column("jobs_completed", sa.Integer(), nullable=False),
        sa.Column("jobs_failed", sa.Integer(), nullable=False),
        sa.Column("avg_job_duration_ms", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("worker_id", "hour", name=op.f("pk_worker_metrics_hourly")),
    )
    op.create_table(
        "workers",
        sa.Column("worker_id", sa.String(length=100), nullable=False),
        sa.Column("worker_type", sa.String(length=20), server_default="vps", nullable=False),
        sa.Column("status", sa.String(length=20), server_default="active", nullable=False),
        sa.Column("queues", JSON, nullable=False),
        sa.Column("max_concurrency", sa.SmallInteger(), server_default="1", nullable=False),
        sa.Column("current_jobs", sa.SmallInteger(), server_default="0", nullable=False),
        sa.Column("cpu_cores", sa.SmallInteger(), nullable=False),
        sa.Column("memory_mb", sa.Integer(), nullable=False),
        sa.Column("disk_mb", sa.Integer(), nullable=False),
        sa.Column("cost_per_hour_cents", sa.Integer(), server_default="0", nullable=False),
        sa.Column("hostname", sa.String(length=255), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("version", sa.String(length=32), nullable=True),
        sa.Column("last_heartbeat", TS, server_default=sa.func.current_timestamp(), nullable=False),
        sa.Column("started_at", TS, server_default=sa.func.current_timestamp(), nullable=False),
        sa.Column("terminated_at", TS, nullable=True),
        sa.Column("created_at", TS, server_default=sa.func.current_timestamp(), nullable=False),
        sa.CheckConstraint(
            "status IN ('active', 'draining', 'idle', 'terminated', 'unhealthy')",
            name=op.f("ck_workers_status"),
        ),
        sa.CheckConstraint(
            "worker_type IN ('cloud_aws', 'cloud_google', 'cloud_ionos', 'vps')",
            name=op.f("ck_workers_type"),
        ),
        sa.PrimaryKeyConstraint("worker_id", name=op.f("pk_workers")),
    )
    op.create_index("idx_heartbeat", "workers", ["last_heartbeat"], unique=False)
    op.create_index("idx_worker_status", "workers", ["status"], unique=False)
    op.create_index("idx_worker_type", "workers", ["worker_type"], unique=False)

    op.create_table(
        "processing_jobs",
        sa.Column("job_id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("job_uuid", sa.String(length=36), nullable=False),
        sa.Column("object_id", sa.BigInteger(), nullable=True),
        sa.Column("pool_id", sa.Integer(), nullable=True),
        sa.Column("owner_id", sa.String(length=64), nullable=False),
        sa.Column("project_id", sa.String(length=64), nullable=False),
        sa.Column("job_type", sa.String(length=50), nullable=False),
        sa.Column("queue_name", sa.String(length=50), nullable=False),
        sa.Column("priority", sa.SmallInteger(), server_default="5", nullable=False),
        sa.Column("status", sa.String(length=20), server_default="created", nullable=False),
        sa.Column("profile_id", sa.Integer(), nullable=False),
        sa.Column("params", JSON, nullable=True),
        sa.Column("input_key", sa.String(length=500), server_default="", nullable=False),
        sa.Column("input_size_bytes", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("estimated_credits", sa.Integer(), server_default="0", nullable=False),
        sa.Column("actual_credits", sa.Integer(), nullable=True),
        sa.Column("max_attempts", sa.SmallInteger(), server_default="3", nullable=False),
        sa.Column("attempt_count", sa.SmallInteger(), server_default="0", nullable=False),
        sa.Column("timeout_seconds", sa.Integer(), server_default="3600", nullable=False),
        sa.Column("memory_limit_mb", sa.Integer(), nullable=True),
        sa.Column("claimed_by", sa.String(length=100), nullable=True),
        sa.Column("claimed_at", TS, nullable=True),
        sa.Column("visibility_timeout", TS, nullable=True),
        sa.Column("started_at", TS, nullable=True),
        sa.Column("completed_at", TS, nullable=True),
        sa.Column("available_at", TS, server_default=sa.func.current_timestamp(), nullable=False),
        sa.Column("outcome", sa.String(length=30), nullable=True),
        sa.Column("category", sa.String(length=30), nullable=True),
        sa.Column("retryable", sa.Boolean(), nullable=True),
        sa.Column("error_code", sa.String(length=50), nullable=True),
        sa.Column("safe_reason", sa.String(length=500), nullable=True),
        sa.Column("progress", JSON, nullable=True),
        sa.Column("result", JSON, nullable=True),
        sa.Column("idempotency_key", sa.String(length=255), nullable=True),
        sa.Column("created_by", sa.String(length=64), nullable=True),
        sa.Column("updated_by", sa.String(length=64), nullable=True),
        sa.Column("deleted_by", sa.String(length=64), nullable=True),
        sa.Column("created_at", TS, server_default=sa.func.current_timestamp(), nullable=False),
        sa.Column("updated_at", TS, server_default=sa.func.current_timestamp(), nullable=False),
        sa.Column("deleted_at", TS, nullable=True),
        sa.CheckConstraint(
            "category IS NULL OR category IN ('cancellation', 'external_dependency', 'invalid_input', 'permission_denied', 'provider_failure', 'provider_unavailable', 'storage', 'timeout', 'unknown', 'unsupported_operation')",
            name=op.f("ck_processing_jobs_category"),
        ),
        sa.CheckConstraint(
            "outcome IS NULL OR outcome IN ('cancelled', 'completed', 'failed', 'orphaned', 'provider_unavailable', 'timeout')",
            name=op.f("ck_processing_jobs_outcome"),
        ),
        sa.CheckConstraint(
            "status <> 'completed' OR completed_at IS NOT NULL",
            name=op.f("ck_processing_jobs_completed_at"),
        ),
        sa.CheckConstraint(
            "status <> 'processing' OR (claimed_at IS NOT NULL AND started_at IS NOT NULL)",
            name=op.f("ck_processing_jobs_processing_claimed"),
        ),
        sa.CheckConstraint(
            "status IN ('cancel_requested', 'cancelled', 'claimed', 'completed', 'created', 'failed', 'paused', 'processing', 'queued', 'retry_wait')",
            name=op.f("ck_processing_jobs_status"),
        ),
        sa.CheckConstraint(
            "attempt_count >= 0 AND attempt_count <= max_attempts",
            name=op.f("ck_processing_jobs_attempts"),
        ),
        sa.CheckConstraint("max_attempts >= 1", name=op.f("ck_processing_jobs_max_attempts")),
        sa.CheckConstraint("priority BETWEEN 1 AND 10", name=op.f("ck_processing_jobs_priority")),
        sa.ForeignKeyConstraint(
            ["profile_id"],
            ["processing_profiles.profile_id"],
            name=op.f("fk_processing_jobs_profile_id"),
        ),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_processing_jobs")),
        sa.UniqueConstraint("job_uuid", name=op.f("uq_processing_jobs_job_uuid")),
        sa.UniqueConstraint("project_id", "idempotency_key", name="uk_project_idempotency"),
    )
    op.create_index("idx_available", "processing_jobs", ["status", "available_at"], unique=False)
    op.create_index("idx_claimed", "processing_jobs", ["claimed_by", "claimed_at"], unique=False)
    op.create_index("idx_created", "processing_jobs", ["created_at"], unique=False)
    op.create_index("idx_object", "processing_jobs", ["object_id", "status"], unique=False)
    op.create_index("idx_owner", "processing_jobs", ["owner_id"], unique=False)
    op.create_index("idx_project", "processing_jobs", ["project_id"], unique=False)
    op.create_index(
        "idx_status_queue",
        "processing_jobs",
        ["status", "queue_name", "priority", "job_id"],
        unique=False,
    )
    op.create_index("idx_type_status", "processing_jobs", ["job_type", "status"], unique=False)
    op.create_index("idx_visibility", "processing_jobs", ["visibility_timeout"], unique=False)


def downgrade() -> None:
    op.drop_index("idx_visibility", table_name="processing_jobs")
    op.drop_index("idx_type_status", table_name="processing_jobs")
    op.drop_index("idx_status_queue", table_name="processing_jobs")
    op.drop_index("idx_project", table_name="processing_jobs")
    op.drop_index("idx_owner", table_name="processing_jobs")
    op.drop_index("idx_object", table_name="processing_jobs")
    op.drop_index("idx_created", table_name="processing_jobs")
    op.drop_index("idx_claimed", table_name="processing_jobs")
    op.drop_index("idx_available", table_name="processing_jobs")

    op.drop_table("processing_jobs")
    op.drop_index("idx_worker_type", table_name="workers")
    op.drop_index("idx_worker_status", table_name="workers")
    op.drop_index("idx_heartbeat", table_name="workers")

    op.drop_table("workers")
    op.drop_table("worker_metrics_hourly")
    op.drop_index("idx_worker_time", table_name="worker_metrics")
    op.drop_index("idx_recorded", table_name="worker_metrics")

    op.drop_table("worker_metrics")
    op.drop_table("queue_states")
    op.drop_index("idx_job_type", table_name="processing_profiles")
    op.drop_index("idx_active", table_name="processing_profiles")

    op.drop_table("processing_profiles")
    op.drop_table("leader_leases")
    op.drop_index("idx_output_type", table_name="job_outputs")
    op.drop_index("idx_output_object", table_name="job_outputs")
    op.drop_index("idx_output_job", table_name="job_outputs")

    op.drop_table("job_outputs")
    op.drop_index("idx_event_job", table_name="job_events")

    op.drop_table("job_events")
    op.drop_index("idx_attempt_worker", table_name="job_attempts")
    op.drop_index("idx_attempt_status", table_name="job_attempts")
    op.drop_index("idx_attempt_job", table_name="job_attempts")

    op.drop_table("job_attempts")

"""Tables of seed 000 plus what the engine needs, in portable types.

Statuses are plain strings guarded by CHECK constraints, so the same schema runs
on SQLite, PostgreSQL and MariaDB.  Timestamps are naive UTC.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql
from sqlalchemy.ext.compiler import compiles

from hypermedia.errors import CATEGORIES
from hypermedia.queue.states import ATTEMPT_STATUSES, OUTCOMES, STATUSES

metadata = sa.MetaData(
    naming_convention={
        "pk": "pk_%(table_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
    }
)

# SQLite only auto-increments a column declared exactly INTEGER PRIMARY KEY.
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
# MariaDB's DATETIME drops fractions of a second unless asked; leases need them.
Timestamp = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
Json = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


class UtcNow(sa.sql.expression.FunctionElement[datetime]):
    """The database's clock in naive UTC, whatever the session's time zone.

    A column default: rows a legacy producer writes from a session in Tokyo
    took CURRENT_TIMESTAMP in Tokyo time (9 h ahead of every other row), and
    its variant_jobs were adopted 9 h late.  SQLite's CURRENT_TIMESTAMP is UTC.
    """

    type = sa.DateTime()
    inherit_cache = True


@compiles(UtcNow)
def _utc_now(element: UtcNow, compiler: Any, **kw: Any) -> str:
    return "CURRENT_TIMESTAMP"


@compiles(UtcNow, "postgresql")
def _utc_now_pg(element: UtcNow, compiler: Any, **kw: Any) -> str:
    return "timezone('utc', now())"


@compiles(UtcNow, "mysql", "mariadb")
def _utc_now_mysql(element: UtcNow, compiler: Any, **kw: Any) -> str:
    return "UTC_TIMESTAMP(6)"


NOW = UtcNow()


def _in(column: str, values: tuple[str, ...] | frozenset[str]) -> str:
    quoted = ", ".join(f"'{v}'" for v in sorted(values))
    return f"{column} IN ({quoted})"


processing_profiles = sa.Table(
    "processing_profiles",
    metadata,
    sa.Column("profile_id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("profile_key", sa.String(100), nullable=False),
    sa.Column("profile_version", sa.String(20), nullable=False),
    sa.Column("job_type", sa.String(50), nullable=False),
    sa.Column("queue_name", sa.String(50), nullable=False),
    sa.Column("settings", Json, nullable=False),
    sa.Column("credit_cost_base", sa.Integer, nullable=False),
    sa.Column("credit_cost_per_mb", sa.Integer, nullable=False, server_default="0"),
    sa.Column("credit_cost_per_page", sa.Integer, nullable=False, server_default="0"),
    sa.Column("credit_cost_per_minute", sa.Integer, nullable=False, server_default="0"),
    sa.Column("timeout_seconds", sa.Integer, nullable=False, server_default="3600"),
    sa.Column("max_input_bytes", sa.BigInteger, nullable=False, server_default="5368709120"),
    sa.Column("is_active", sa.Boolean, nullable=False, server_default=sa.true()),
    sa.Column("created_at", Timestamp, nullable=False, server_default=NOW),
    sa.UniqueConstraint("profile_key", "profile_version", name="uk_key_version"),
    sa.Index("idx_job_type", "job_type"),
    sa.Index("idx_active", "is_active"),
)

processing_jobs = sa.Table(
    "processing_jobs",
    metadata,
    sa.Column("job_id", BigId, primary_key=True, autoincrement=True),
    # Seed 001 identifies jobs by uuid; the compatibility API uses this column.
    sa.Column("job_uuid", sa.String(36), nullable=False, unique=True),
    # Nullable (seed 000 says NOT NULL): built-in job types take no input object.
    sa.Column("object_id", sa.BigInteger, nullable=True),
    sa.Column("pool_id", sa.Integer, nullable=True),
    sa.Column("owner_id", sa.String(64), nullable=False),
    sa.Column("project_id", sa.String(64), nullable=False),
    sa.Column("job_type", sa.String(50), nullable=False),
    sa.Column("queue_name", sa.String(50), nullable=False),
    sa.Column("priority", sa.SmallInteger, nullable=False, server_default="5"),
    sa.Column("status", sa.String(20), nullable=False, server_default="created"),
    sa.Column(
        "profile_id",
        sa.Integer,
        sa.ForeignKey("processing_profiles.profile_id"),
        nullable=False,
    ),
    sa.Column("params", Json, nullable=True),
    sa.Column("input_key", sa.String(500), nullable=False, server_default=""),
    sa.Column("input_size_bytes", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("estimated_credits", sa.Integer, nullable=False, server_default="0"),
    sa.Column("actual_credits", sa.Integer, nullable=True),
    sa.Column("max_attempts", sa.SmallInteger, nullable=False, server_default="3"),
    sa.Column("attempt_count", sa.SmallInteger, nullable=False, server_default="0"),
    sa.Column("timeout_seconds", sa.Integer, nullable=False, server_default="3600"),
    sa.Column("memory_limit_mb", sa.Integer, nullable=True),
    sa.Column("claimed_by", sa.String(100), nullable=True),
    sa.Column("claimed_at", Timestamp, nullable=True),
    sa.Column("visibility_timeout", Timestamp, nullable=True),
    sa.Column("started_at", Timestamp, nullable=True),
    sa.Column("completed_at", Timestamp, nullable=True),
    sa.Column("available_at", Timestamp, nullable=False, server_default=NOW),
    sa.Column("outcome", sa.String(30), nullable=True),
    sa.Column("category", sa.String(30), nullable=True),
    sa.Column("retryable", sa.Boolean, nullable=True),
    sa.Column("error_code", sa.String(50), nullable=True),
    sa.Column("safe_reason", sa.String(500), nullable=True),
    sa.Column("progress", Json, nullable=True),
    sa.Column("result", Json, nullable=True),
    sa.Column("idempotency_key", sa.String(255), nullable=True),
    sa.Column("created_by", sa.String(64), nullable=True),
    sa.Column("updated_by", sa.String(64), nullable=True),
    sa.Column("deleted_by", sa.String(64), nullable=True),
    sa.Column("created_at", Timestamp, nullable=False, server_default=NOW),
    sa.Column("updated_at", Timestamp, nullable=False, server_default=NOW),
    sa.Column("deleted_at", Timestamp, nullable=True),
    # The leader added this finished job's credits to its project's
    # settled_credits (scheduler/credits.py); credit use sums the rest.
    sa.Column("credits_folded", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.CheckConstraint(_in("status", STATUSES), name="status"),
    sa.CheckConstraint("priority BETWEEN 1 AND 10", name="priority"),
    sa.CheckConstraint("attempt_count >= 0 AND attempt_count <= max_attempts", name="attempts"),
    sa.CheckConstraint("max_attempts >= 1", name="max_attempts"),
    sa.CheckConstraint(f"outcome IS NULL OR {_in('outcome', OUTCOMES)}", name="outcome"),
    sa.CheckConstraint(f"category IS NULL OR {_in('category', CATEGORIES)}", name="category"),
    # Seed 001 invariants, held by the database itself.
    sa.CheckConstraint(
        "status <> 'processing' OR (claimed_at IS NOT NULL AND started_at IS NOT NULL)",
        name="processing_claimed",
    ),
    sa.CheckConstraint("status <> 'completed' OR completed_at IS NOT NULL", name="completed_at"),
    sa.UniqueConstraint("project_id", "idempotency_key", name="uk_project_idempotency"),
    # Seed 000 names (status, queue_name, priority); job_id is appended so the
    # claim's ORDER BY priority, job_id reads straight off the index.
    sa.Index("idx_status_queue", "status", "queue_name", "priority", "job_id"),
    # Seed 001's (file_id, status); its prefix serves seed 000's idx_object.
    sa.Index("idx_object", "object_id", "status"),
    sa.Index("idx_owner", "owner_id"),
    # Seed 000's (project_id); credits_folded appended so a budget check
    # reads only the project's jobs whose credits are not folded yet, and
    # job_id so the fold walks them in order (scheduler/credits.py).
    sa.Index("idx_project", "project_id", "credits_folded", "job_id"),
    sa.Index("idx_claimed", "claimed_by", "claimed_at"),
    sa.Index("idx_visibility", "visibility_timeout"),
    sa.Index("idx_created", "created_at"),
    sa.Index("idx_available", "status", "available_at"),
    sa.Index("idx_type_status", "job_type", "status"),
    # A project's jobs of one status, newest first (GET /v1/jobs?status=,
    # the dashboard's recent failures); and on SQLite, which has no
    # statistics, a project's jobs newest first: migration 0016 says why.
    sa.Index("idx_project_status", "project_id", "status", "job_id"),
    sa.Index("idx_project_job", "project_id", "job_id").ddl_if(dialect="sqlite"),
    # SQLite would give a new job the id of the newest one retention pruned:
    # a client still holding that id would read another job (migration 0009).
    sqlite_autoincrement=True,
)

# A job as it is read and shown: the credit fold's flag is its bookkeeping.
JOB_VIEW = tuple(c for c in processing_jobs.c if c.key != "credits_folded")

job_attempts = sa.Table(
    "job_attempts",
    metadata,
    sa.Column("attempt_id", BigId, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.BigInteger, nullable=False),
    sa.Column("worker_id", sa.String(100), nullable=False),
    sa.Column("attempt_number", sa.SmallInteger, nullable=False),
    sa.Column("status", sa.String(20), nullable=False, server_default="started"),
    sa.Column("error_message", sa.Text, nullable=True),
    sa.Column("error_code", sa.String(50), nullable=True),
    sa.Column("started_at", Timestamp, nullable=False, server_default=NOW),
    sa.Column("finished_at", Timestamp, nullable=True),
    sa.Column("duration_ms", sa.Integer, nullable=True),
    sa.Column("peak_memory_mb", sa.Integer, nullable=True),
    sa.Column("cpu_time_ms", sa.Integer, nullable=True),
    sa.CheckConstraint(_in("status", ATTEMPT_STATUSES), name="status"),
    sa.UniqueConstraint("job_id", "attempt_number", name="uk_job_attempt"),
    sa.Index("idx_attempt_job", "job_id"),
    sa.Index("idx_attempt_worker", "worker_id"),
    sa.Index("idx_attempt_status", "status", "attempt_id"),
    sqlite_autoincrement=True,  # see processing_jobs
)

job_outputs = sa.Table(
    "job_outputs",
    metadata,
    sa.Column("output_id", BigId, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.BigInteger, nullable=False),
    sa.Column("output_type", sa.String(50), nullable=False),
    # Nullable (seed 000 says NOT NULL): verdicts and debug results are data
    # carried in ``metadata``, with no blob behind them.
    sa.Column("object_id", sa.BigInteger, nullable=True),
    sa.Column("output_key", sa.String(500), nullable=False, server_default=""),
    sa.Column("output_size_bytes", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("mime_type", sa.String(255), nullable=False),
    sa.Column("metadata", Json, nullable=True),
    sa.Column("profile_version", sa.String(50), nullable=False),
    sa.Column("created_at", Timestamp, nullable=False, server_default=NOW),
    sa.Column("deleted_at", Timestamp, nullable=True),
    sa.UniqueConstraint("job_id", "output_type", "profile_version", name="uk_job_type_profile"),
    sa.Index("idx_output_job", "job_id"),
    sa.Index("idx_output_object", "object_id"),
    sa.Index("idx_output_type", "output_type"),
)

job_events = sa.Table(
    "job_events",
    metadata,
    sa.Column("event_id", BigId, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.BigInteger, nullable=False),
    sa.Column("attempt_number", sa.SmallInteger, nullable=True),
    sa.Column("kind", sa.String(20), nullable=False),
    sa.Column("from_status", sa.String(20), nullable=True),
    sa.Column("to_status", sa.String(20), nullable=True),
    sa.Column("code", sa.String(50), nullable=True),
    sa.Column("message", sa.String(1000), nullable=False, server_default=""),
    sa.Column("actor", sa.String(100), nullable=True),
    sa.Column("created_at", Timestamp, nullable=False, server_default=NOW),
    sa.CheckConstraint(_in("kind", ("event", "progress", "log", "warning", "error")), name="kind"),
    sa.Index("idx_event_job", "job_id", "event_id"),
)

workers = sa.Table(
    "workers",
    metadata,
    sa.Column("worker_id", sa.String(100), primary_key=True),
    sa.Column("worker_type", sa.String(20), nullable=False, server_default="vps"),
    sa.Column("status", sa.String(20), nullable=False, server_default="active"),
    sa.Column("queues", Json, nullable=False),
    sa.Column("max_concurrency", sa.SmallInteger, nullable=False, server_default="1"),
    sa.Column("current_jobs", sa.SmallInteger, nullable=False, server_default="0"),
    sa.Column("cpu_cores", sa.SmallInteger, nullable=False),
    sa.Column("memory_mb", sa.Integer, nullable=False),
    sa.Column("disk_mb", sa.Integer, nullable=False),
    sa.Column("cost_per_hour_cents", sa.Integer, nullable=False, server_default="0"),
    sa.Column("hostname", sa.String(255), nullable=True),
    sa.Column("pid", sa.Integer, nullable=True),
    sa.Column("version", sa.String(32), nullable=True),
    sa.Column("last_heartbeat", Timestamp, nullable=False, server_default=NOW),
    sa.Column("started_at", Timestamp, nullable=False, server_default=NOW),
    sa.Column("terminated_at", Timestamp, nullable=True),
    sa.Column("created_at", Timestamp, nullable=False, server_default=NOW),
    sa.CheckConstraint(
        _in("worker_type", ("vps", "cloud_aws", "cloud_google", "cloud_ionos")), name="type"
    ),
    sa.CheckConstraint(
        _in("status", ("active", "idle", "draining", "terminated", "unhealthy")), name="status"
    ),
    sa.Index("idx_worker_status", "status"),
    sa.Index("idx_worker_type", "worker_type"),
    sa.Index("idx_heartbeat", "last_heartbeat"),
)

worker_metrics = sa.Table(
    "worker_metrics",
    metadata,
    sa.Column("metric_id", BigId, primary_key=True, autoincrement=True),
    sa.Column("worker_id", sa.String(100), nullable=False),
    sa.Column("cpu_percent", sa.Numeric(5, 2), nullable=False),
    sa.Column("memory_percent", sa.Numeric(5, 2), nullable=False),
    sa.Column("disk_percent", sa.Numeric(5, 2), nullable=False),
    sa.Column("jobs_completed_1m", sa.Integer, nullable=False, server_default="0"),
    sa.Column("jobs_failed_1m", sa.Integer, nullable=False, server_default="0"),
    sa.Column("avg_job_duration_ms", sa.Integer, nullable=False, server_default="0"),
    sa.Column("recorded_at", Timestamp, nullable=False, server_default=NOW),
    sa.Index("idx_worker_time", "worker_id", "recorded_at"),
    sa.Index("idx_recorded", "recorded_at"),
)

# Seed 000: raw metrics are kept 7 days, then aggregated to hourly summaries.
worker_metrics_hourly = sa.Table(
    "worker_metrics_hourly",
    metadata,
    sa.Column("worker_id", sa.String(100), primary_key=True),
    sa.Column("hour", Timestamp, primary_key=True),
    sa.Column("samples", sa.Integer, nullable=False),
    sa.Column("cpu_percent_avg", sa.Numeric(5, 2), nullable=False),
    sa.Column("cpu_percent_max", sa.Numeric(5, 2), nullable=False),
    sa.Column("memory_percent_avg", sa.Numeric(5, 2), nullable=False),
    sa.Column("memory_percent_max", sa.Numeric(5, 2), nullable=False),
    sa.Column("disk_percent_max", sa.Numeric(5, 2), nullable=False),
    sa.Column("jobs_completed", sa.Integer, nullable=False),
    sa.Column("jobs_failed", sa.Integer, nullable=False),
    sa.Column("avg_job_duration_ms", sa.Integer, nullable=False),
)

leader_leases = sa.Table(
    "leader_leases",
    metadata,
    sa.Column("name", sa.String(50), primary_key=True),
    sa.Column("holder", sa.String(100), nullable=False),
    sa.Column("acquired_at", Timestamp, nullable=False),
    sa.Column("expires_at", Timestamp, nullable=False),
)

queue_states = sa.Table(
    "queue_states",
    metadata,
    sa.Column("queue_name", sa.String(50), primary_key=True),
    sa.Column("paused", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("updated_at", Timestamp, nullable=False, server_default=NOW),
)

# What the attempts that job retention deleted, or the attempt fold counted,
# add to /metrics' duration histogram, per job type: the histogram's counters
# must never go down, and a scrape must not read every attempt.
# ``buckets`` holds cumulative counts keyed by bound in milliseconds.
pruned_attempt_durations = sa.Table(
    "pruned_attempt_durations",
    metadata,
    sa.Column("job_type", sa.String(50), primary_key=True),
    sa.Column("attempts", sa.BigInteger, nullable=False),
    sa.Column("sum_ms", sa.BigInteger, nullable=False),
    sa.Column("buckets", Json, nullable=False),
    sa.Column("updated_at", Timestamp, nullable=False, server_default=NOW),
)

# How far the leader's attempt fold (scheduler/attempt_fold.py) has moved
# finished attempts' durations into pruned_attempt_durations: every attempt
# with an id up to ``watermark``.  ``seen`` is the newest attempt id when
# ``seen_at``; the fold never passes an id younger than a minute.
attempt_fold = sa.Table(
    "attempt_fold",
    metadata,
    sa.Column("name", sa.String(50), primary_key=True),
    sa.Column("watermark", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("seen", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("seen_at", Timestamp, nullable=True),
    sa.Column("updated_at", Timestamp, nullable=False, server_default=NOW),
)

# Seed 002's tables and the auth tables live in their own modules; importing
# them registers them here.
from hypermedia.db import schema_auth as _schema_auth  # noqa: E402, F401
from hypermedia.db import schema_storage as _schema_storage  # noqa: E402, F401

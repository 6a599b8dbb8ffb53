"""Timestamp defaults in UTC whatever the session's time zone

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04
"""

from __future__ import annotations

import re

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

# Timestamps are naive UTC, and every column that defaults to "now" took
# CURRENT_TIMESTAMP: in the session's time zone.  The engine writes its own
# times, but a legacy producer relies on the defaults (variant_jobs'
# next_attempt_at, photos' created_at): from a session in Tokyo its rows were
# 9 h in the future, adopted 9 h late and listed as the newest.  SQLite's
# CURRENT_TIMESTAMP is UTC already.  A default is metadata: no row is read.
UTC = {"postgresql": "timezone('utc', now())", "mysql": "(UTC_TIMESTAMP(6))"}
LOCAL = {"postgresql": "CURRENT_TIMESTAMP", "mysql": "CURRENT_TIMESTAMP(6)"}
# Each default as reflected, whole (a text column's 'current_timestamp' is
# a string, not a clock): PostgreSQL "CURRENT_TIMESTAMP" or "now()", MariaDB
# "current_timestamp(6)"; and what this revision set instead.
IS_LOCAL = re.compile(r"\(?(current_timestamp|now)(\(\d*\))?\)?")
IS_UTC = re.compile(r"\(?(timezone\('utc'(::text)?, ?now\(\)\)|utc_timestamp(\(\d*\))?)\)?")
# This schema's tables at 0012: another application's tables in the same
# database keep their defaults (an upgrade once rewrote them, a text
# column's string default and MariaDB's ON UPDATE clause included).
TABLES = (
    "api_tokens", "attempt_fold", "bridge_hits", "dashboard_sessions", "job_attempts",
    "job_events", "job_outputs", "leader_leases", "object_hashes", "objects", "photo_objects",
    "photos", "pools", "processing_jobs", "processing_profiles", "project_credits", "projects",
    "pruned_attempt_durations", "queue_states", "variant_jobs", "worker_metrics",
    "worker_metrics_hourly", "workers",
)  # fmt: skip


def upgrade() -> None:
    _set_defaults(IS_LOCAL, UTC)


def downgrade() -> None:
    _set_defaults(IS_UTC, LOCAL)


def _set_defaults(matches: re.Pattern[str], to: dict[str, str]) -> None:
    conn = op.get_bind()
    dialect = "mysql" if conn.dialect.name in ("mysql", "mariadb") else conn.dialect.name
    if dialect not in to:
        return
    quote = conn.dialect.identifier_preparer.quote
    inspector = sa.inspect(conn)
    for table in inspector.get_table_names():
        if table not in TABLES:
            continue
        for column in inspector.get_columns(table):
            default = str(column.get("default") or "").lower()
            if default and matches.fullmatch(default):
                op.execute(
                    f"ALTER TABLE {quote(table)} ALTER COLUMN {quote(column['name'])} "
                    f"SET DEFAULT {to[dialect]}"
                )

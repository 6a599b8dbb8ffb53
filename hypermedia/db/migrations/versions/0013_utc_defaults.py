"""Timestamp defaults in UTC whatever the session's time zone

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Callable

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


def upgrade() -> None:
    _set_defaults(lambda default: "current_timestamp" in default, UTC)


def downgrade() -> None:
    _set_defaults(lambda default: "utc" in default, LOCAL)


def _set_defaults(matches: Callable[[str], bool], to: dict[str, str]) -> None:
    conn = op.get_bind()
    dialect = "mysql" if conn.dialect.name in ("mysql", "mariadb") else conn.dialect.name
    if dialect not in to:
        return
    quote = conn.dialect.identifier_preparer.quote
    inspector = sa.inspect(conn)
    for table in inspector.get_table_names():
        if table == "alembic_version":
            continue
        for column in inspector.get_columns(table):
            default = str(column.get("default") or "").lower()
            if default and matches(default):
                op.execute(
                    f"ALTER TABLE {quote(table)} ALTER COLUMN {quote(column['name'])} "
                    f"SET DEFAULT {to[dialect]}"
                )

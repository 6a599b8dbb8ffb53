"""MariaDB: text compares exactly (utf8mb4_nopad_bin), as on PostgreSQL and SQLite

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

# Tables took the server's default collation, utf8mb4_general_ci: 'Alpha'
# equalled 'alpha' and 'alpha ' (PAD SPACE), and project isolation is partly
# a WHERE project_id = :p, so a token of project "Alpha" listed "alpha"'s
# photos, objects and jobs; pool names, albums and photo ids matched the same
# way.  utf8mb4_nopad_bin compares code points and counts trailing spaces
# (utf8mb4_bin would not).  The database's default changes too, so tables
# later migrations create inherit it.  The character set stays utf8mb4: no
# column type or index length changes, and the rebuild keeps indexes, CHECKs
# and the json_valid() CHECK of JSON columns.  Case-sensitive keys are
# stricter, so no row can break a unique key.  MariaDB rebuilds the indexes
# on text columns in place, not the rows (3.4 s for 524,288 jobs; 8.7 s for
# 262,144 photos, whose bindings are copied to make their foreign keys again).
NOPAD_BIN = "utf8mb4_nopad_bin"

# MariaDB refuses to change the collation of a column a foreign key joins,
# even with foreign_key_checks off: these are dropped while both ends change
# and made again, which checks every row.  A row that spelt its photo's id in
# another case was a match under general_ci and would not be one now: it
# takes the photo's spelling first.  DDL is not transactional there, so a
# run killed half-way may have dropped the keys already; the next run drops
# only what is left.
TEXT_KEYS = (
    ("fk_photo_objects_photo_id", "photo_objects"),
    ("fk_variant_jobs_photo_id", "variant_jobs"),
)


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name not in ("mysql", "mariadb"):
        return
    quote = conn.dialect.identifier_preparer.quote
    database = conn.exec_driver_sql("SELECT DATABASE()").scalar_one()
    op.execute(f"ALTER DATABASE {quote(database)} CHARACTER SET utf8mb4 COLLATE {NOPAD_BIN}")
    _drop_text_keys(conn)
    for table in _tables(conn):
        op.execute(
            f"ALTER TABLE {quote(table)} CONVERT TO CHARACTER SET utf8mb4 COLLATE {NOPAD_BIN}"
        )
    for name, table in TEXT_KEYS:
        op.create_foreign_key(name, table, "photos", ["photo_id"], ["photo_id"], ondelete="CASCADE")


def downgrade() -> None:
    # Nothing: the code of 0011 runs as well on exact text (it does on
    # PostgreSQL and SQLite), and going back to utf8mb4_general_ci would
    # bring the leak back and fail on rows that now differ only in case
    # ('full' and 'Full' pools) half-way through the tables.
    pass


def _drop_text_keys(conn: sa.Connection) -> None:
    left = _foreign_keys(conn)
    for name, table in TEXT_KEYS:
        op.execute(
            f"UPDATE {table} c JOIN photos p ON c.photo_id = p.photo_id"
            " SET c.photo_id = p.photo_id WHERE BINARY c.photo_id <> BINARY p.photo_id"
        )
        if name in left:
            op.drop_constraint(name, table, type_="foreignkey")


# This schema's tables at 0011 (and Alembic's own): a database shared with
# other applications keeps their tables' collations as they chose them.
TABLES = (
    "alembic_version", "api_tokens", "attempt_fold", "bridge_hits", "dashboard_sessions",
    "job_attempts", "job_events", "job_outputs", "leader_leases", "object_hashes", "objects",
    "photo_objects", "photos", "pools", "processing_jobs", "processing_profiles",
    "project_credits", "projects", "pruned_attempt_durations", "queue_states", "variant_jobs",
    "worker_metrics", "worker_metrics_hourly", "workers",
)  # fmt: skip


def _tables(conn: sa.Connection) -> list[str]:
    q = sa.text(
        "SELECT TABLE_NAME FROM information_schema.TABLES"
        " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_TYPE = 'BASE TABLE'"
    )
    return [t for t in conn.execute(q).scalars() if t in TABLES]


def _foreign_keys(conn: sa.Connection) -> set[str]:
    q = sa.text(
        "SELECT CONSTRAINT_NAME FROM information_schema.TABLE_CONSTRAINTS"
        " WHERE TABLE_SCHEMA = DATABASE() AND CONSTRAINT_TYPE = 'FOREIGN KEY'"
    )
    return set(conn.execute(q).scalars())

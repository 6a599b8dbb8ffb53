"""dashboard sessions: the login cookie holds a session secret, never the token

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

TS = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
NOW = sa.func.current_timestamp()

# A table of its own rather than session rows in api_tokens (parent_id,
# kind): every reader of api_tokens (bearer authentication, `tokens ls`,
# revoke, the first-admin count) would have to learn to skip sessions, and a
# forgotten filter would let a session secret pass as an API token.  Here the
# bearer path never reads this table, so a session secret cannot be one; a
# session keeps no project or scopes of its own but reads its token's through
# token_id at every request, so revoking or expiring the token ends it.
# Only the SHA-256 of the secret is stored, as for tokens.


def upgrade() -> None:
    op.create_table(
        "dashboard_sessions",
        sa.Column("session_id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("token_id", sa.Integer(), nullable=False),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("created_at", TS, server_default=NOW, nullable=False),
        sa.Column("expires_at", TS, nullable=False),
        sa.Column("revoked_at", TS, nullable=True),
        sa.ForeignKeyConstraint(
            ["token_id"],
            ["api_tokens.token_id"],
            name="fk_dashboard_sessions_token_id",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("session_id", name="pk_dashboard_sessions"),
        sa.UniqueConstraint("secret_hash", name="uq_dashboard_sessions_secret_hash"),
    )
    op.create_index("dashboard_sessions_token_idx", "dashboard_sessions", ["token_id"])
    op.create_index("dashboard_sessions_expires_idx", "dashboard_sessions", ["expires_at"])


def downgrade() -> None:
    # The indexes go with the table (MariaDB refuses to drop the token_id
    # index alone: its foreign key needs it).  Everyone is logged out.
    op.drop_table("dashboard_sessions")

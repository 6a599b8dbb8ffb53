"""Projects, their API tokens (DESIGN §9) and dashboard sessions.

A token is shown once; the database keeps its SHA-256 and a short public
prefix to find it by.  Tokens carry enough entropy (190 bits) that a salted
slow hash would add nothing but latency to every request.
"""

from __future__ import annotations

import sqlalchemy as sa

from hypermedia.db.schema import NOW, Json, Timestamp, metadata

projects = sa.Table(
    "projects",
    metadata,
    sa.Column("project_id", sa.String(64), primary_key=True),
    sa.Column("name", sa.String(255), nullable=False, server_default=""),
    sa.Column("owner_id", sa.String(64), nullable=False),
    sa.Column("created_at", Timestamp, nullable=False, server_default=NOW),
)

api_tokens = sa.Table(
    "api_tokens",
    metadata,
    sa.Column("token_id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("project_id", sa.String(64), nullable=False),
    sa.Column("name", sa.String(100), nullable=False, server_default=""),
    # "hm_" + 10 public characters: how a leaked token is recognised and found.
    sa.Column("prefix", sa.String(16), nullable=False, unique=True),
    sa.Column("token_hash", sa.String(64), nullable=False),
    sa.Column("scopes", Json, nullable=False),
    sa.Column("created_by", sa.String(64), nullable=True),
    sa.Column("created_at", Timestamp, nullable=False, server_default=NOW),
    sa.Column("expires_at", Timestamp, nullable=True),
    sa.Column("revoked_at", Timestamp, nullable=True),
    sa.Column("last_used_at", Timestamp, nullable=True),
    sa.Index("api_tokens_project_idx", "project_id"),
)

# A dashboard login (ui/routes.py): the cookie holds a random secret of its
# own, never the token.  Only its SHA-256 is kept; the project and scopes are
# the token's, read through token_id at every request, so revoking or
# expiring the token ends its sessions (migration 0010 says why this is a
# table and not rows of api_tokens).  Logging out sets revoked_at; a row is
# deleted once expired.
dashboard_sessions = sa.Table(
    "dashboard_sessions",
    metadata,
    sa.Column("session_id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column(
        "token_id",
        sa.Integer,
        sa.ForeignKey("api_tokens.token_id", ondelete="CASCADE"),
        nullable=False,
    ),
    sa.Column("secret_hash", sa.String(64), nullable=False, unique=True),
    sa.Column("created_at", Timestamp, nullable=False, server_default=NOW),
    sa.Column("expires_at", Timestamp, nullable=False),
    sa.Column("revoked_at", Timestamp, nullable=True),
    sa.Index("dashboard_sessions_token_idx", "token_id"),
    sa.Index("dashboard_sessions_expires_idx", "expires_at"),
)

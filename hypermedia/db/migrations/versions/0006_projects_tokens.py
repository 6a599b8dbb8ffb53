"""projects and per-project API tokens

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql, postgresql

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

TS = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
NOW = sa.func.current_timestamp()


def upgrade() -> None:
    op.create_table(
        "projects",
        sa.Column("project_id", sa.String(64), nullable=False),
        sa.Column("name", sa.String(255), server_default="", nullable=False),
        sa.Column("owner_id", sa.String(64), nullable=False),
        sa.Column("created_at", TS, server_default=NOW, nullable=False),
        sa.PrimaryKeyConstraint("project_id", name="pk_projects"),
    )
    op.create_table(
        "api_tokens",
        sa.Column("token_id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("project_id", sa.String(64), nullable=False),
        sa.Column("name", sa.String(100), server_default="", nullable=False),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("scopes", JSON, nullable=False),
        sa.Column("created_by", sa.String(64), nullable=True),
        sa.Column("created_at", TS, server_default=NOW, nullable=False),
        sa.Column("expires_at", TS, nullable=True),
        sa.Column("revoked_at", TS, nullable=True),
        sa.Column("last_used_at", TS, nullable=True),
        sa.PrimaryKeyConstraint("token_id", name="pk_api_tokens"),
        sa.UniqueConstraint("prefix", name="uq_api_tokens_prefix"),
    )
    op.create_index("api_tokens_project_idx", "api_tokens", ["project_id"])


def downgrade() -> None:
    op.drop_index("api_tokens_project_idx", table_name="api_tokens")
    op.drop_table("api_tokens")
    op.drop_table("projects")

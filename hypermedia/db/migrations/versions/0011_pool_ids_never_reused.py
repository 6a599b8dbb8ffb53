"""SQLite: pool ids never reused (pools AUTOINCREMENT)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

# `pools rm` deletes a pool's row.  SQLite would give the next pool the
# removed one's id when it was the newest, and a running worker or API keeps
# a client per pool id (Storage.backend): it would go on writing the new
# pool's objects into the old bucket or folder.  As 0009 did for jobs, only
# SQLite's table is rebuilt; sequences never go back elsewhere.


def upgrade() -> None:
    _never_reused(True)


def downgrade() -> None:
    _never_reused(False)


def _never_reused(never: bool) -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    with op.batch_alter_table(
        "pools", recreate="always", table_kwargs={"sqlite_autoincrement": never}
    ):
        pass

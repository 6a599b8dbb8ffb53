"""Executemany updates shared by the named queries."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa


def update_many(
    conn: sa.Connection,
    key: sa.Column[Any],
    guard: sa.ColumnElement[bool],
    rows: Sequence[dict[str, Any]],
) -> int:
    """``UPDATE … SET cols WHERE key = :_id AND guard`` for each row (one executemany).

    Every row carries ``_id`` and the same other columns.  The guard must bind
    plain parameters: SQLAlchemy refuses "expanding" ones (``IN``) under
    executemany, so write a status list as ORed equalities.
    """
    if not rows:
        return 0
    cols = [k for k in rows[0] if k != "_id"]
    stmt = (
        sa.update(key.table)
        .where(key == sa.bindparam("_id"), guard)
        .values({c: sa.bindparam(f"v_{c}") for c in cols})
    )
    params = [{"_id": r["_id"], **{f"v_{c}": r[c] for c in cols}} for r in rows]
    return int(conn.execute(stmt, params).rowcount)

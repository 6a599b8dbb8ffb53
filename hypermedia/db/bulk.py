"""Executemany updates shared by the named queries."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import sqlalchemy as sa

from hypermedia.db import fast


def update_many(
    conn: sa.Connection,
    key: sa.Column[Any],
    guard: sa.ColumnElement[bool] | Callable[[], sa.ColumnElement[bool]],
    rows: Sequence[dict[str, Any]],
    shape: Hashable | None = None,
) -> int:
    """``UPDATE … SET cols WHERE key = :_id AND guard`` for each row (one executemany).

    Every row carries ``_id`` and the same other columns.  The guard must bind
    plain parameters: SQLAlchemy refuses "expanding" ones (``IN``) under
    executemany, so write a status list as ORed equalities.  ``shape`` names
    the guard for the prepared path on SQLite (hot callers; see db/fast.py);
    there ``guard`` may be a function, called only when the shape is new.
    """
    if not rows:
        return 0
    cols = [k for k in rows[0] if k != "_id"]

    def build() -> Any:
        return (
            sa.update(key.table)
            .where(key == sa.bindparam("_id"), guard() if callable(guard) else guard)
            .values({c: sa.bindparam(f"v_{c}") for c in cols})
        )

    params = [{"_id": r["_id"], **{f"v_{c}": r[c] for c in cols}} for r in rows]
    if shape is not None and conn.dialect.name == "sqlite":
        prepared = fast.prepare(conn, ("update_many", key.table.name, shape, tuple(cols)), build)
        return fast.execute_many(conn, prepared, params)
    return int(conn.execute(build(), params).rowcount)

"""The worker's hot statements on SQLite, without SQLAlchemy's per-call work.

A worker repeats a few statement shapes (claim, settle a result, register an
output) thousands of times.  SQLAlchemy builds, keys and compiles each call's
statement anew and wraps its execution: about 0.2-0.3 ms of Python apiece,
where sqlite3 runs the statement in 0.02 ms.  On the embedded default, whose
worker shares two cores with its attempts, that Python was most of the
worker's cost per job.

Here a shape is built with SQLAlchemy Core once, compiled once for the
connection's dialect, and then executed on the sqlite3 cursor of the same
connection (inside the same transaction).  Values go through the columns' own
bind processors and come back through their result processors, so rows hold
exactly what SQLAlchemy would have written and read (datetimes, JSON).

Only SQLite takes this path (sqlite3's qmark parameters are positional):
PostgreSQL's hot writes are already one statement per batch
(pg_batch.apply), and MariaDB is not the embedded case.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

Row = dict[str, Any]
_MISSING = object()


@dataclass(frozen=True)
class Prepared:  # cached_property needs a __dict__: no slots
    sql: str
    names: tuple[str, ...]  # parameter names in placeholder order
    binds: tuple[Callable[[Any], Any] | None, ...]
    defaults: tuple[Any, ...]  # values of parameters the statement itself fixed
    columns: tuple[str, ...]  # result columns (SELECT or RETURNING), else ()
    results: tuple[Callable[[Any], Any] | None, ...]

    # Only the positions that have a processor: most values pass as they are,
    # and this runs for every parameter of every hot statement.
    @functools.cached_property
    def bind_at(self) -> tuple[tuple[int, Callable[[Any], Any]], ...]:
        return tuple((i, f) for i, f in enumerate(self.binds) if f is not None)

    @functools.cached_property
    def result_at(self) -> tuple[tuple[str, Callable[[Any], Any]], ...]:
        return tuple((c, f) for c, f in zip(self.columns, self.results, strict=True) if f)


_CACHE: dict[Hashable, Prepared] = {}
_LOCK = threading.Lock()
_MAX_SHAPES = 2000  # shapes include IN-list lengths; a bound keeps memory flat


def prepare(conn: sa.Connection, key: Hashable, build: Callable[[], Any]) -> Prepared:
    """The statement ``build()`` makes, compiled for ``conn``'s dialect, once per ``key``."""
    found = _CACHE.get(key)
    if found is not None:
        return found
    dialect = conn.dialect
    stmt = build()
    compiled = stmt.compile(dialect=dialect)
    if "POSTCOMPILE" in compiled.string:  # an expanding IN: use id_params / ORed equalities
        raise ValueError(f"statement {key!r} cannot be prepared: it has an expanding IN")
    names = tuple(compiled.positiontup or ())
    binds, defaults = [], []
    for name in names:
        bp = compiled.binds[name]
        binds.append(bp.type.dialect_impl(dialect).bind_processor(dialect))
        defaults.append(_MISSING if bp.required else bp.effective_value)
    columns: list[str] = []
    results: list[Callable[[Any], Any] | None] = []
    for col in _returned(stmt):
        columns.append(col.key)
        results.append(col.type.dialect_impl(dialect).result_processor(dialect, None))
    prepared = Prepared(
        compiled.string, names, tuple(binds), tuple(defaults), tuple(columns), tuple(results)
    )
    with _LOCK:
        if len(_CACHE) >= _MAX_SHAPES:
            _CACHE.clear()
        _CACHE[key] = prepared
    return prepared


def _returned(stmt: Any) -> Sequence[Any]:
    if isinstance(stmt, sa.Select | sa.TextualSelect):
        return list(stmt.selected_columns)
    returning = getattr(stmt, "_returning", ())
    return list(returning)


def _params(p: Prepared, values: Row) -> list[Any]:
    try:
        out = [values[name] for name in p.names]
    except KeyError:  # a parameter the statement fixed, or one missing
        out = [values.get(name, default) for name, default in zip(p.names, p.defaults, strict=True)]
        for name, v in zip(p.names, out, strict=True):
            if v is _MISSING:
                raise KeyError(f"no value for parameter {name!r}") from None
    for i, bind in p.bind_at:
        if out[i] is not None:
            out[i] = bind(out[i])
    return out


@contextmanager
def _cursor_for(conn: sa.Connection, p: Prepared, params: Any) -> Iterator[Any]:
    """The connection's DBAPI cursor; its errors raised as SQLAlchemy's own
    (IntegrityError, OperationalError…), as callers expect from any statement."""
    dbapi = conn.dialect.loaded_dbapi
    cur = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        yield cur
    except dbapi.Error as exc:
        raise sa.exc.DBAPIError.instance(p.sql, params, exc, dbapi.Error) from exc
    finally:
        cur.close()


def rows(conn: sa.Connection, p: Prepared, values: Row) -> list[Row]:
    """Run a SELECT (or a statement with RETURNING); rows as dicts."""
    params = _params(p, values)
    with _cursor_for(conn, p, params) as cur:
        cur.execute(p.sql, params)
        fetched = cur.fetchall()
    out = [dict(zip(p.columns, r, strict=True)) for r in fetched]
    for row in out:
        for name, proc in p.result_at:
            row[name] = proc(row[name])
    return out


def execute(conn: sa.Connection, p: Prepared, values: Row) -> tuple[int, int | None]:
    """Run one statement; its row count and the last inserted row id."""
    params = _params(p, values)
    with _cursor_for(conn, p, params) as cur:
        cur.execute(p.sql, params)
        return cur.rowcount, cur.lastrowid


def execute_many(conn: sa.Connection, p: Prepared, many: Sequence[Row]) -> int:
    """Run one statement per parameter set (sqlite3's executemany); total row count."""
    if not many:
        return 0
    params = [_params(p, v) for v in many]
    with _cursor_for(conn, p, params) as cur:
        cur.executemany(p.sql, params)
        return int(cur.rowcount)


def unindexed(col: sa.Column[Any]) -> sa.ColumnElement[Any]:
    """``+col``: the same value to SQLite, but a term its planner will not
    answer from an index.

    For statements keyed by ids whose other terms only guard (a status, the
    claiming worker): with no statistics SQLite prefers an index on the guard
    column, and then reads every job in that status, or every job the worker
    ever claimed, to find ten.  A claim of ten took 1.4 ms at 20,000 queued
    jobs that way, growing with the queue; by the primary key it is constant.
    """
    return sa.literal_column(f"+{col.table.name}.{col.name}", type_=col.type)


def id_params(ids: Sequence[Any], prefix: str = "id") -> list[Any]:
    """bindparams for an IN list of this length (expanding IN cannot be precompiled)."""
    return [sa.bindparam(f"{prefix}{i}") for i in range(len(ids))]


def id_values(ids: Sequence[Any], prefix: str = "id") -> Row:
    return {f"{prefix}{i}": v for i, v in enumerate(ids)}


def insert_many(conn: sa.Connection, table: sa.Table, many: Sequence[Row]) -> int | None:
    """Insert rows that all have the same keys; the last inserted row id for one row."""
    cols = tuple(many[0])
    prepared = prepare(
        conn,
        ("insert", table.name, cols),
        lambda: sa.insert(table).values({c: sa.bindparam(c) for c in cols}),
    )
    if len(many) == 1:
        return execute(conn, prepared, many[0])[1]
    execute_many(conn, prepared, many)
    return None

"""PostgreSQL's batched writes: many rows, or a worker's batch of
transitions (and its next claim), in one statement and one round trip.

The other databases run the same operations as ordinary SQLAlchemy
statements (``db/queries.py``, ``db/fast.py`` on SQLite); only here is the
SQL written for one dialect, because only here did the generic form cost
more than the database's own work (docs/benchmarks.md).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from hypermedia.db.dialects import CLAIM_COLUMNS, ClaimArgs, claim_pg, pg_claim_ctes
from hypermedia.db.schema import job_attempts as A
from hypermedia.db.schema import job_events as E
from hypermedia.db.schema import processing_jobs as J

# -- PostgreSQL bulk writes ---------------------------------------------------
# SQLAlchemy sends a many-row INSERT as one statement with a placeholder per
# value, which psycopg must parse in Python (about 10 µs a placeholder), or as
# a pipeline of one statement per row.  Passing one array per column to
# unnest() keeps the SQL text small and constant, and psycopg adapts the arrays
# in C: enqueueing thousands of jobs or settling a batch stays one round trip.


@functools.cache
def _pg_type(table: sa.Table, column: str) -> str:
    from sqlalchemy.dialects import postgresql

    return table.c[column].type.compile(dialect=postgresql.dialect())


def _pg_array(table: sa.Table, col: str, name: str) -> str:
    """``CAST(:name AS <type>[])`` for one column's values."""
    typ = _pg_type(table, col)
    if typ in ("JSONB", "JSON"):
        # A dict is not an array element psycopg can guess: send text, cast.
        return f"CAST(:{name} AS TEXT[])::{typ}[]"
    return f"CAST(:{name} AS {typ}[])"


def _pg_values(table: sa.Table, col: str, values: list[Any]) -> list[Any]:
    if _pg_type(table, col) in ("JSONB", "JSON"):
        return [None if v is None else json.dumps(v) for v in values]
    return values


def _pg_arrays(table: sa.Table, rows: Sequence[dict[str, Any]], cols: list[str]):
    """The unnest(...) argument list and its parameters, one array per column."""
    args, params = [], {}
    for i, col in enumerate(cols):
        args.append(_pg_array(table, col, f"a{i}"))
        params[f"a{i}"] = _pg_values(table, col, [r[col] for r in rows])
    return ", ".join(args), params


def bulk_insert(
    conn: sa.Connection,
    table: sa.Table,
    rows: Sequence[dict[str, Any]],
    returning: Sequence[str] = (),
) -> list[dict[str, Any]]:
    cols = list(rows[0])
    args, params = _pg_arrays(table, rows, cols)
    sql = f"INSERT INTO {table.name} ({', '.join(cols)}) SELECT * FROM unnest({args})"
    if returning:
        sql += f" RETURNING {', '.join(returning)}"
        return [dict(r._mapping) for r in conn.execute(sa.text(sql), params)]
    conn.execute(sa.text(sql), params)
    return []


def bulk_update(
    conn: sa.Connection,
    table: sa.Table,
    keys: Sequence[str],
    rows: Sequence[dict[str, Any]],
    guard: str = "",
) -> None:
    """UPDATE table SET col = v.col … FROM unnest(arrays) v WHERE keys match [AND guard]."""
    cols = list(rows[0])
    args, params = _pg_arrays(table, rows, cols)
    sets = ", ".join(f"{c} = v.{c}" for c in cols if c not in keys)
    match = " AND ".join(f"t.{k} = v.{k}" for k in keys)
    sql = (
        f"UPDATE {table.name} AS t SET {sets} FROM unnest({args}) AS v({', '.join(cols)}) "
        f"WHERE {match}{' AND ' + guard if guard else ''}"
    )
    conn.execute(sa.text(sql), params)


# -- PostgreSQL transitions in one statement -------------------------------------
# A worker's batch of transitions (starts, completions, failures) is written
# outside any explicit transaction: one statement updates the jobs, closes
# their attempts and writes their events, so it commits atomically on its own
# and costs one round trip instead of BEGIN + five statements + COMMIT.
# ``Engine.flush_and_claim`` adds a claim to the same statement (its CTEs
# touch only queued rows, the transitions only running ones).  Each job is
# guarded by the exact status the caller decided from (plus attempt number
# and worker): a job that changed meanwhile is left alone and reported
# missing, for the caller to redo under a lock.
#
# The plan must reach the jobs by primary key whatever the statistics say.
# So the ids are also given as "job_id = ANY(...)", and the worker guard
# compares with a column of v: a join condition, which the planner cannot
# apply to a scan of processing_jobs on its own.  As a scan filter
# ("claimed_by = :worker"), stale statistics (claimed_by all NULL after the
# last ANALYZE) made it expect one row and choose a sequential scan nested
# with v: quadratic, hundreds of ms a batch.  Finished jobs keep claimed_by,
# so idx_claimed is no way in either: one worker's entries grow without end.
# For the same reason the
# attempt rows are not also guarded by status = 'started' (idx_attempt_status
# holds an entry per finished attempt until VACUUM): the job guard already
# proves the attempt is the running one.

_EVENT_COLUMNS = (
    "kind", "from_status", "to_status", "attempt_number", "code", "message", "actor", "created_at",
)  # fmt: skip


def _pg_shape_ctes(i: int, job_cols: tuple[str, ...], attempt_cols: tuple[str, ...]) -> str:
    """The CTEs of one shape of transitions: v{i} (the values, one JSON
    parameter), j{i} (the jobs changed, RETURNING their ids), a{i} (their
    attempts), e{i} (their events)."""
    cols = [("k_id", "BIGINT"), ("k_att", "INTEGER"), ("k_seen", "TEXT"), ("k_worker", "TEXT")]
    cols += [(f"j_{c}", _pg_type(J, c)) for c in job_cols]
    cols += [(f"a_{c}", _pg_type(A, c)) for c in attempt_cols]
    cols += [(f"e_{c}", _pg_type(E, c)) for c in _EVENT_COLUMNS]
    sql = f"""v{i} AS (
SELECT * FROM json_to_recordset(CAST(:s{i} AS JSON)) AS v({", ".join(f"{n} {t}" for n, t in cols)})
), j{i} AS (
UPDATE processing_jobs AS t SET {", ".join(f"{c} = v.j_{c}" for c in job_cols)} FROM v{i} AS v
WHERE t.job_id = ANY(CAST(:s{i}_ids AS BIGINT[])) AND t.job_id = v.k_id
AND t.attempt_count = v.k_att AND t.status = v.k_seen
AND (v.k_worker IS NULL OR t.claimed_by = v.k_worker)
RETURNING t.job_id
)"""
    if attempt_cols:
        sql += f""", a{i} AS (
UPDATE job_attempts AS t SET {", ".join(f"{c} = v.a_{c}" for c in attempt_cols)}
FROM v{i} AS v JOIN j{i} AS j ON j.job_id = v.k_id
WHERE t.job_id = v.k_id AND t.attempt_number = v.k_att
)"""
    return (
        sql
        + f""", e{i} AS (
INSERT INTO job_events (job_id, {", ".join(_EVENT_COLUMNS)})
SELECT v.k_id, {", ".join(f"v.e_{c}" for c in _EVENT_COLUMNS)}
FROM v{i} AS v JOIN j{i} AS j ON j.job_id = v.k_id
)"""
    )


def _json_default(v: Any) -> str:
    if isinstance(v, datetime):
        return v.isoformat()
    raise TypeError(f"cannot send {type(v).__name__} as JSON")


_Shape = tuple[tuple[str, ...], tuple[str, ...]]  # (job columns, attempt columns)


@functools.lru_cache(maxsize=256)
def _pg_apply_sql(shapes: tuple[_Shape, ...], claim_n: int | None) -> sa.Executable:
    ctes = [_pg_shape_ctes(i, *shape) for i, shape in enumerate(shapes)]
    changed = " UNION ALL ".join(f"SELECT job_id FROM j{i}" for i in range(len(shapes)))
    if claim_n is None:
        return sa.text(f"WITH {', '.join(ctes)}\nSELECT job_id FROM ({changed}) AS c")
    ctes.append(pg_claim_ctes(claim_n))
    # One row at least (the ids changed), joined with each claimed job if any.
    return sa.text(
        f"WITH {', '.join(ctes)}\n"
        f"SELECT s.settled, c.* FROM (SELECT ARRAY({changed}) AS settled) AS s "
        "LEFT JOIN claimed AS c ON true"
    ).columns(sa.column("settled"), *CLAIM_COLUMNS)


def apply(
    conn: sa.Connection,
    worker_id: str | None,
    items: Sequence[Any],
    claim: ClaimArgs | None = None,
) -> tuple[set[int], list[dict[str, Any]]]:
    """Apply transitions (``Decision``-like: job_id, attempt, seen, job_values,
    attempt_values, event) and, given ``claim``, claim the next jobs: all of
    it one statement, one commit.  Returns the job ids that changed and the
    rows claimed.

    Any two items must be of different jobs (one statement changes a row once).
    """
    shapes: dict[_Shape, list[Any]] = {}
    for d in items:
        attempt_cols = tuple(c for c in d.attempt_values if c not in ("job_id", "attempt_number"))
        shapes.setdefault((tuple(sorted(d.job_values)), attempt_cols), []).append(d)
    if not shapes and claim is None:
        return set(), []
    params: dict[str, Any] = claim.params() if claim is not None else {}
    for i, ((job_cols, attempt_cols), group) in enumerate(shapes.items()):
        # One JSON document per shape: psycopg would adapt one array per
        # column in Python (tens of µs each), and json.dumps runs in C.
        values = [
            {
                "k_id": d.job_id,
                "k_att": d.attempt,
                "k_seen": d.seen,
                "k_worker": worker_id,
                **{f"j_{c}": d.job_values[c] for c in job_cols},
                **{f"a_{c}": d.attempt_values[c] for c in attempt_cols},
                **{f"e_{c}": d.event.get(c) for c in _EVENT_COLUMNS},
            }
            for d in group
        ]
        params[f"s{i}"] = json.dumps(values, default=_json_default)
        params[f"s{i}_ids"] = [d.job_id for d in group]
    if claim is None:
        got = conn.execute(_pg_apply_sql(tuple(shapes), None), params)
        return {r[0] for r in got}, []
    changed: set[int] = set()
    if shapes:
        sql = _pg_apply_sql(tuple(shapes), claim.n)
        rows = [dict(r._mapping) for r in conn.execute(sql, params)]
        changed = set(rows[0].pop("settled"))
        for r in rows[1:]:
            del r["settled"]
        rows = [r for r in rows if r["job_id"] is not None]  # the row of no claim
    else:
        rows = claim_pg(conn, claim.worker_id, claim.queues, claim.n, claim.now, claim.lease_until)
    rows.sort(key=lambda r: (r["priority"], r["job_id"]))
    return changed, rows

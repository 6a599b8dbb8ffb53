"""The few places where SQL differs per database, each saying why.

* claim: how to take ready jobs without two workers taking the same one;
* notify / listen: PostgreSQL can wake idle workers, the others are polled;
* which errors mean "chosen as a deadlock's victim: run the transaction again".
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from hypermedia.db import fast
from hypermedia.db.schema import job_attempts as A
from hypermedia.db.schema import job_events as E
from hypermedia.db.schema import processing_jobs as J

log = logging.getLogger(__name__)

CHANNEL = "hypermedia_jobs"

# What a worker needs to run a claimed job.
CLAIM_COLUMNS = (
    J.c.job_id,
    J.c.job_uuid,
    J.c.job_type,
    J.c.queue_name,
    J.c.priority,
    J.c.params,
    J.c.attempt_count,
    J.c.max_attempts,
    J.c.timeout_seconds,
    J.c.memory_limit_mb,
    J.c.profile_id,
    J.c.object_id,
    J.c.pool_id,
    J.c.input_key,
    J.c.input_size_bytes,
    J.c.project_id,
)


def _claim_values(worker_id: str, now: datetime, lease_until: datetime) -> dict[str, Any]:
    return {
        "status": "claimed",
        "claimed_by": worker_id,
        "claimed_at": now,
        "visibility_timeout": lease_until,
        "attempt_count": J.c.attempt_count + 1,
        "started_at": None,
        "updated_at": now,
    }


def claim(
    conn: sa.Connection,
    dialect: str,
    worker_id: str,
    queues: Sequence[str],
    n: int,
    now: datetime,
    lease_until: datetime,
) -> list[dict[str, Any]]:
    """Claim up to ``n`` ready jobs for ``worker_id``: status, lease, attempt row, event."""
    if dialect == "postgresql":
        rows = _claim_pg(conn, worker_id, queues, n, now, lease_until)
    else:
        fn = _claim_mysql if dialect == "mysql" else _claim_sqlite
        rows = fn(conn, worker_id, queues, n, now, lease_until)
        _record_claims(conn, rows, worker_id, now)
    rows.sort(key=lambda r: (r["priority"], r["job_id"]))
    return rows


def _record_claims(
    conn: sa.Connection, rows: list[dict[str, Any]], worker_id: str, now: datetime
) -> None:
    if not rows:
        return
    attempts = [
        {
            "job_id": r["job_id"],
            "worker_id": worker_id,
            "attempt_number": r["attempt_count"],
            "status": "started",
            "started_at": now,
        }
        for r in rows
    ]
    events = [
        {
            "job_id": r["job_id"],
            "kind": "event",
            "from_status": "queued",
            "to_status": "claimed",
            "attempt_number": r["attempt_count"],
            "message": "",
            "actor": worker_id,
            "created_at": now,
        }
        for r in rows
    ]
    for table, values in ((A, attempts), (E, events)):
        if conn.dialect.name == "sqlite":  # prepared: see db/fast.py
            fast.insert_many(conn, table, values)
        else:
            conn.execute(sa.insert(table), values)


_PG_CLAIM = sa.text(f"""
WITH picked AS (
    -- One index scan per queue, each stopping after n rows; a plain
    -- "queue_name = ANY(...)" would sort every queued row instead.
    SELECT c.job_id FROM unnest(CAST(:queues AS text[])) AS q(name)
    CROSS JOIN LATERAL (
        SELECT job_id, priority FROM processing_jobs
        WHERE status = 'queued' AND queue_name = q.name AND available_at <= :now
        ORDER BY priority, job_id
        LIMIT :n
        FOR UPDATE SKIP LOCKED
    ) AS c
    ORDER BY c.priority, c.job_id
    LIMIT :n
), claimed AS (
    UPDATE processing_jobs AS j
    SET status = 'claimed', claimed_by = :worker, claimed_at = :now,
        visibility_timeout = :until, attempt_count = j.attempt_count + 1,
        started_at = NULL, updated_at = :now
    FROM picked WHERE j.job_id = picked.job_id
    RETURNING {", ".join("j." + c.name for c in CLAIM_COLUMNS)}
), attempts AS (
    INSERT INTO job_attempts (job_id, worker_id, attempt_number, status, started_at)
    SELECT job_id, :worker, attempt_count, 'started', :now FROM claimed
), events AS (
    INSERT INTO job_events (job_id, kind, from_status, to_status, attempt_number,
                            message, actor, created_at)
    SELECT job_id, 'event', 'queued', 'claimed', attempt_count, '', :worker, :now
    FROM claimed
)
SELECT * FROM claimed
""").columns(*CLAIM_COLUMNS)


def _claim_pg(conn, worker_id, queues, n, now, lease_until):
    # One round trip for the whole claim: SKIP LOCKED lets concurrent workers
    # pass over each other's rows, and data-modifying CTEs write the attempt
    # rows and events in the same statement.
    params = {"queues": list(queues), "now": now, "n": n, "worker": worker_id, "until": lease_until}
    return [dict(r._mapping) for r in conn.execute(_PG_CLAIM, params)]


def _ready_ids(
    conn: sa.Connection, queues: Sequence[str], n: int, now: datetime, lock: bool
) -> list[int]:
    """The first ``n`` ready job ids over all queues, one index range scan per queue.

    A single ``queue_name IN (...)`` query would have to sort every queued row
    (the index is ordered by priority within one queue only).
    """
    found: list[tuple[int, int]] = []
    for q in queues:
        sel = (
            sa.select(J.c.priority, J.c.job_id)
            .where(J.c.status == "queued", J.c.queue_name == q, J.c.available_at <= now)
            .order_by(J.c.priority, J.c.job_id)
            .limit(n)
        )
        if lock:
            sel = sel.with_for_update(skip_locked=True)
        found += [(r.priority, r.job_id) for r in conn.execute(sel)]
    return [job_id for _, job_id in sorted(found)[:n]]


def _claim_mysql(conn, worker_id, queues, n, now, lease_until):
    # MariaDB has no UPDATE … RETURNING: lock with SKIP LOCKED, update the
    # locked ids, then read them back, all in one transaction.  Rows locked
    # but not chosen are released at commit.
    ids = _ready_ids(conn, queues, n, now, lock=True)
    if not ids:
        return []
    conn.execute(
        sa.update(J)
        .where(J.c.job_id.in_(ids), J.c.status == "queued")
        .values(_claim_values(worker_id, now, lease_until))
    )
    return [
        dict(r._mapping)
        for r in conn.execute(
            sa.select(*CLAIM_COLUMNS).where(
                J.c.job_id.in_(ids), J.c.claimed_by == worker_id, J.c.status == "claimed"
            )
        )
    ]


def _claim_sqlite(conn, worker_id, queues, n, now, lease_until):
    # SQLite ignores FOR UPDATE; the transaction already holds the database
    # write lock (BEGIN IMMEDIATE), so reading then updating is race-free.
    # Both statements are prepared once per shape (db/fast.py): the claim is
    # a worker's most repeated transaction.
    found: list[tuple[int, int]] = []
    ready = fast.prepare(conn, ("ready",), lambda: _SQLITE_READY)
    for q in queues:
        got = fast.rows(conn, ready, {"q": q, "now": now, "n": n})
        found += [(r["priority"], r["job_id"]) for r in got]
    ids = [job_id for _, job_id in sorted(found)[:n]]
    if not ids:
        return []
    values: dict[str, Any] = {
        name: sa.bindparam(f"v_{name}")
        for name in ("claimed_by", "claimed_at", "visibility_timeout", "updated_at")
    }

    def build() -> Any:
        return (
            sa.update(J)
            .where(J.c.job_id.in_(fast.id_params(ids)), fast.unindexed(J.c.status) == "queued")
            .values(
                status="claimed", attempt_count=J.c.attempt_count + 1, started_at=None, **values
            )
            .returning(*CLAIM_COLUMNS)
        )

    prepared = fast.prepare(conn, ("claim", len(ids)), build)
    params = {
        **fast.id_values(ids),
        "v_claimed_by": worker_id,
        "v_claimed_at": now,
        "v_visibility_timeout": lease_until,
        "v_updated_at": now,
    }
    return fast.rows(conn, prepared, params)


# INDEXED BY: without statistics (no ANALYZE has run, the usual case)
# SQLite's planner prefers idx_available and sorts every queued row for the
# LIMIT: 7 ms a claim at 20,000 queued jobs, growing with the queue.
# idx_status_queue is already in (priority, job_id) order within a queue.
# (SQLAlchemy renders no table hints for SQLite, hence the text.)
_SQLITE_READY = (
    sa.text(
        "SELECT priority, job_id FROM processing_jobs INDEXED BY idx_status_queue "
        "WHERE status = 'queued' AND queue_name = :q AND available_at <= :now "
        "ORDER BY priority, job_id LIMIT :n"
    )
    .bindparams(
        sa.bindparam("q", type_=J.c.queue_name.type),
        sa.bindparam("now", type_=J.c.available_at.type),
        sa.bindparam("n", type_=sa.Integer()),
    )
    .columns(J.c.priority, J.c.job_id)
)


def notify(conn: sa.Connection, dialect: str, queues: set[str]) -> None:
    """Wake idle workers of these queues when the transaction commits (PostgreSQL only)."""
    if dialect != "postgresql":
        return
    for q in sorted(queues):
        conn.execute(sa.select(sa.func.pg_notify(CHANNEL, q)))


def pg_listen(url: str, on_wake: Callable[[str], None], stop: threading.Event) -> None:
    """LISTEN on a dedicated connection; reconnect with backoff if the server goes away.

    Every reconnect also calls ``on_wake("*")``: notifications sent while we were
    disconnected are lost, so the worker must look for work once.
    """
    import psycopg

    conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    delay = 0.2
    while not stop.is_set():
        try:
            with psycopg.connect(conninfo, autocommit=True, connect_timeout=5) as conn:
                conn.execute(f"LISTEN {CHANNEL}")
                delay = 0.2
                on_wake("*")
                while not stop.is_set():
                    for note in conn.notifies(timeout=0.5):
                        on_wake(note.payload)
        except psycopg.Error as exc:
            log.warning("job listener lost its connection (%s); reconnecting", type(exc).__name__)
            stop.wait(delay)
            delay = min(delay * 2, 5.0)
        except Exception:  # pragma: no cover - keep the worker alive whatever happens
            log.exception("job listener failed")
            time.sleep(1)


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


def pg_bulk_insert(
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


def pg_bulk_update(
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
# and costs one round trip instead of BEGIN + five statements + COMMIT.  Each
# job is guarded by the exact status the caller decided from (plus attempt
# number and worker): a job that changed meanwhile is left alone and reported
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


@functools.cache
def _pg_apply_sql(job_cols: tuple[str, ...], attempt_cols: tuple[str, ...]) -> sa.TextClause:
    keys = [
        "CAST(:k_id AS BIGINT[])",
        "CAST(:k_att AS INTEGER[])",
        "CAST(:k_seen AS TEXT[])",
        "CAST(:k_worker AS TEXT[])",
    ]
    args = keys + [_pg_array(J, c, f"j_{c}") for c in job_cols]
    args += [_pg_array(A, c, f"a_{c}") for c in attempt_cols]
    args += [_pg_array(E, c, f"e_{c}") for c in _EVENT_COLUMNS]
    names = ["k_id", "k_att", "k_seen", "k_worker"] + [f"j_{c}" for c in job_cols]
    names += [f"a_{c}" for c in attempt_cols] + [f"e_{c}" for c in _EVENT_COLUMNS]
    sql = f"""
WITH v AS (
    SELECT * FROM unnest({", ".join(args)}) AS v({", ".join(names)})
), j AS (
    UPDATE processing_jobs AS t SET {", ".join(f"{c} = v.j_{c}" for c in job_cols)}
    FROM v
    WHERE t.job_id = ANY(CAST(:k_id AS BIGINT[])) AND t.job_id = v.k_id
      AND t.attempt_count = v.k_att AND t.status = v.k_seen
      AND (v.k_worker IS NULL OR t.claimed_by = v.k_worker)
    RETURNING t.job_id
)"""
    if attempt_cols:
        sql += f""", a AS (
    UPDATE job_attempts AS t SET {", ".join(f"{c} = v.a_{c}" for c in attempt_cols)}
    FROM v JOIN j ON j.job_id = v.k_id
    WHERE t.job_id = v.k_id AND t.attempt_number = v.k_att
)"""
    sql += f""", e AS (
    INSERT INTO job_events (job_id, {", ".join(_EVENT_COLUMNS)})
    SELECT v.k_id, {", ".join(f"v.e_{c}" for c in _EVENT_COLUMNS)}
    FROM v JOIN j ON j.job_id = v.k_id
)
SELECT job_id FROM j"""
    return sa.text(sql)


def pg_apply(conn: sa.Connection, worker_id: str | None, items: Sequence[Any]) -> set[int]:
    """Apply transitions (``Decision``-like: job_id, attempt, seen, job_values,
    attempt_values, event); one statement per shape of values.  Returns the
    job ids that changed."""
    shapes: dict[tuple[tuple[str, ...], tuple[str, ...]], list[Any]] = {}
    for d in items:
        attempt_cols = tuple(c for c in d.attempt_values if c not in ("job_id", "attempt_number"))
        shapes.setdefault((tuple(sorted(d.job_values)), attempt_cols), []).append(d)
    done: set[int] = set()
    for (job_cols, attempt_cols), group in shapes.items():
        params: dict[str, Any] = {
            "k_id": [d.job_id for d in group],
            "k_att": [d.attempt for d in group],
            "k_seen": [d.seen for d in group],
            "k_worker": [worker_id] * len(group),
        }
        for c in job_cols:
            params[f"j_{c}"] = _pg_values(J, c, [d.job_values[c] for d in group])
        for c in attempt_cols:
            params[f"a_{c}"] = _pg_values(A, c, [d.attempt_values[c] for d in group])
        for c in _EVENT_COLUMNS:
            params[f"e_{c}"] = [d.event.get(c) for d in group]
        done.update(r[0] for r in conn.execute(_pg_apply_sql(job_cols, attempt_cols), params))
    return done


# -- deadlock victims ---------------------------------------------------------------
# InnoDB takes a shared lock on the key a failed INSERT collided with; two such
# losers that then UPDATE the row wait on each other, and one is rolled back
# (error 1213).  PostgreSQL reports its own deadlocks as SQLSTATE 40P01.

_DEADLOCK_MYSQL = {1213}
_DEADLOCK_PG = {"40P01"}


def is_deadlock(exc: BaseException) -> bool:
    """Whether ``exc`` rolled the transaction back as a deadlock's victim."""
    orig = getattr(exc, "orig", None)
    if orig is None:
        return False
    if getattr(orig, "sqlstate", None) in _DEADLOCK_PG:
        return True
    args: tuple[Any, ...] = tuple(getattr(orig, "args", ()))
    return bool(args) and args[0] in _DEADLOCK_MYSQL

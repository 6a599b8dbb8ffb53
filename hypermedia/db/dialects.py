"""The few places where SQL differs per database, each saying why.

* claim: how to take ready jobs without two workers taking the same one;
* notify / listen: PostgreSQL can wake idle workers, the others are polled;
* which errors mean "chosen as a deadlock's victim: run the transaction again",
  and which mean "try later" rather than "never";
* how migrations started by several processes at once take turns.

PostgreSQL's batched writes (many rows, or a batch of transitions and the
next claim, in one statement) are in ``db/pg_batch.py``.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from hypermedia.db import fast
from hypermedia.db.schema import job_attempts as A
from hypermedia.db.schema import job_events as E
from hypermedia.db.schema import processing_jobs as J
from hypermedia.db.schema import queue_states

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
    only: Collection[int] | None = None,
) -> list[dict[str, Any]]:
    """Claim up to ``n`` ready jobs for ``worker_id``: status, lease, attempt
    row, event.  ``only``: none but these jobs (a command's own worker)."""
    if only is not None:
        rows = _claim_only(conn, worker_id, queues, only, n, now, lease_until)
    elif dialect == "postgresql":
        rows = claim_pg(conn, worker_id, queues, n, now, lease_until)
    else:
        # Paused queues read in the claim's transaction (PostgreSQL's claim
        # leaves them out in its statement): a pause that answered holds.
        # Not in the locking read itself: MariaDB's FOR UPDATE would lock
        # the switches' rows too, for every claimer.
        queues = unpaused(conn, queues)
        if not queues:
            return []
        fn = _claim_mysql if dialect == "mysql" else _claim_sqlite
        rows = fn(conn, worker_id, queues, n, now, lease_until)
        _record_claims(conn, rows, worker_id, now)
    rows.sort(key=lambda r: (r["priority"], r["job_id"]))
    return rows


def unpaused(conn: sa.Connection, queues: Sequence[str]) -> list[str]:
    if conn.dialect.name == "sqlite":  # prepared: see db/fast.py
        prepared = fast.prepare(conn, ("paused",), lambda: _PAUSED)
        paused = {r["queue_name"] for r in fast.rows(conn, prepared, {})}
    else:
        paused = {r[0] for r in conn.execute(_PAUSED)}
    return [q for q in queues if q not in paused]


_PAUSED = sa.select(queue_states.c.queue_name).where(queue_states.c.paused.is_(True))


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


_PG_CLAIM_CTES = f"""picked AS (
    -- LIMIT {{n}} is a literal (one statement per batch size): PostgreSQL can
    -- then keep one generic plan for the prepared claim, where a parameter
    -- would have it guess 10 % of the queue, so plan the claim afresh each time.
    -- One index scan per queue, each stopping after n rows; a plain
    -- "queue_name = ANY(...)" would sort every queued row instead.
    -- A queue an operator paused is left out here, not only by the worker's
    -- copy of the switches (read once a poll interval): once a pause has
    -- answered, no claim that starts takes a job from it.
    SELECT c.job_id FROM (
        SELECT name FROM unnest(CAST(:queues AS text[])) AS u(name)
        WHERE NOT EXISTS (
            SELECT 1 FROM queue_states s WHERE s.queue_name = u.name AND s.paused
        )
    ) AS q
    CROSS JOIN LATERAL (
        SELECT job_id, priority FROM processing_jobs
        WHERE status = 'queued' AND queue_name = q.name AND available_at <= :now
        ORDER BY priority, job_id
        LIMIT {{n}}
        FOR UPDATE SKIP LOCKED
    ) AS c
    ORDER BY c.priority, c.job_id
    LIMIT {{n}}
), claimed AS (
    UPDATE processing_jobs AS j
    SET status = 'claimed', claimed_by = :worker, claimed_at = :now,
        visibility_timeout = :until, attempt_count = j.attempt_count + 1,
        started_at = NULL, updated_at = :now
    -- By primary key whatever the statistics say (a join with picked may
    -- become a hash join over a sequential scan in a generic plan).
    WHERE j.job_id = ANY(ARRAY(SELECT job_id FROM picked))
    RETURNING {", ".join("j." + c.name for c in CLAIM_COLUMNS)}
), attempts AS (
    INSERT INTO job_attempts (job_id, worker_id, attempt_number, status, started_at)
    SELECT job_id, :worker, attempt_count, 'started', :now FROM claimed
), events AS (
    INSERT INTO job_events (job_id, kind, from_status, to_status, attempt_number,
                            message, actor, created_at)
    SELECT job_id, 'event', 'queued', 'claimed', attempt_count, '', :worker, :now
    FROM claimed
)"""


@functools.lru_cache(maxsize=64)
def pg_claim_ctes(n: int) -> str:
    return _PG_CLAIM_CTES.format(n=int(n))


@functools.lru_cache(maxsize=64)
def _pg_claim_sql(n: int) -> sa.Executable:
    return sa.text(f"WITH {pg_claim_ctes(n)}\nSELECT * FROM claimed").columns(*CLAIM_COLUMNS)


@dataclass(frozen=True)
class ClaimArgs:
    """A claim to run with other writes: up to ``n`` jobs of ``queues``."""

    worker_id: str
    queues: Sequence[str]
    n: int
    now: datetime
    lease_until: datetime

    def params(self) -> dict[str, Any]:
        return {
            "queues": list(self.queues),
            "now": self.now,
            "worker": self.worker_id,
            "until": self.lease_until,
        }


def claim_pg(conn, worker_id, queues, n, now, lease_until):
    # One round trip for the whole claim: SKIP LOCKED lets concurrent workers
    # pass over each other's rows, and data-modifying CTEs write the attempt
    # rows and events in the same statement.
    params = ClaimArgs(worker_id, queues, n, now, lease_until).params()
    return [dict(r._mapping) for r in conn.execute(_pg_claim_sql(n), params)]


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


def _claim_only(conn, worker_id, queues, only, n, now, lease_until):
    # Off the hot path (``hypermedia process`` claims its own few jobs), so
    # one portable form: lock the ready rows among ``only`` (SQLite: the
    # write lock is held), update them by primary key, read them back.
    queues = unpaused(conn, queues)
    ids = sorted(set(only))
    found: list[tuple[int, int]] = []
    for i in range(0, len(ids) if queues else 0, 1000):  # bounded IN lists
        sel = (
            sa.select(J.c.priority, J.c.job_id)
            .where(
                J.c.job_id.in_(ids[i : i + 1000]),
                J.c.status == "queued",
                J.c.queue_name.in_(queues),
                J.c.available_at <= now,
            )
            .order_by(J.c.priority, J.c.job_id)
            .limit(n)
        )
        if conn.dialect.name != "sqlite":
            sel = sel.with_for_update(skip_locked=True)
        found += [(r.priority, r.job_id) for r in conn.execute(sel)]
    picked = [job_id for _, job_id in sorted(found)[:n]]
    rows = _take(conn, picked, worker_id, now, lease_until)
    _record_claims(conn, rows, worker_id, now)
    return rows


def _claim_mysql(conn, worker_id, queues, n, now, lease_until):
    # MariaDB has no UPDATE … RETURNING: lock with SKIP LOCKED, update the
    # locked ids, then read them back, all in one transaction.  Rows locked
    # but not chosen are released at commit.
    ids = _ready_ids(conn, queues, n, now, lock=True)
    return _take(conn, ids, worker_id, now, lease_until)


def _take(
    conn: sa.Connection, ids: list[int], worker_id: str, now: datetime, lease_until: datetime
) -> list[dict[str, Any]]:
    """Claim the locked queued jobs ``ids`` by primary key, and read them back."""
    if not ids:
        return []
    conn.execute(mysql_claim_update(ids).values(_claim_values(worker_id, now, lease_until)))
    return [
        dict(r._mapping)
        for r in conn.execute(
            sa.select(*CLAIM_COLUMNS).where(
                J.c.job_id.in_(ids), J.c.claimed_by == worker_id, J.c.status == "claimed"
            )
        )
    ]


def mysql_claim_update(ids: list[int]) -> sa.Update:
    """The claim's UPDATE of the rows it locked, by primary key.  Forced: when
    it estimates fewer queued rows than ids, InnoDB walks idx_available
    (status, available_at) instead, locking queued rows outside the list,
    other claimers' among them, and two claiming workers deadlocked."""
    return (
        sa.update(J)
        .with_hint("FORCE INDEX (PRIMARY)", dialect_name="mysql")
        .where(J.c.job_id.in_(ids), J.c.status == "queued")
    )


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


# The server's clock now (not the transaction's start), as naive UTC like every
# timestamp we store.
_SERVER_NOW = {
    "postgresql": "SELECT CAST(clock_timestamp() AT TIME ZONE 'UTC' AS timestamp)",
    "mysql": "SELECT UTC_TIMESTAMP(6)",
}


def server_now(conn: sa.Connection, dialect: str) -> datetime:
    """The database server's clock (queue/clock.py); SQLite has none of its own."""
    if dialect not in _SERVER_NOW:
        raise ValueError(f"{dialect} has no server clock")
    value = conn.execute(sa.text(_SERVER_NOW[dialect])).scalar_one()
    if not isinstance(value, datetime):
        raise TypeError(f"the server's clock answered {type(value).__name__}")
    return value


def notify(conn: sa.Connection, dialect: str, queues: set[str]) -> bool:
    """Wake idle workers of these queues when the transaction commits; False
    where the database cannot (all but PostgreSQL: see db/wakeups.py)."""
    if dialect != "postgresql":
        return False
    for q in sorted(queues):
        conn.execute(sa.select(sa.func.pg_notify(CHANNEL, q)))
    return True


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


# -- deadlock victims ---------------------------------------------------------------
# InnoDB takes a shared lock on the key a failed INSERT collided with; two such
# losers that then UPDATE the row wait on each other, and one is rolled back
# (error 1213).  PostgreSQL reports its own deadlocks as SQLSTATE 40P01.

_DEADLOCK_MYSQL = {1213}
_DEADLOCK_PG = {"40P01"}


def _said_by_driver(exc: BaseException) -> tuple[str | None, Any]:
    """(PostgreSQL's SQLSTATE, the first argument: MariaDB's error number or
    SQLite's message) of the driver error SQLAlchemy wraps, or (None, None)."""
    orig = getattr(exc, "orig", None)
    args: tuple[Any, ...] = tuple(getattr(orig, "args", ()))
    return getattr(orig, "sqlstate", None), args[0] if args else None


def is_deadlock(exc: BaseException) -> bool:
    """Whether ``exc`` rolled the transaction back as a deadlock's victim."""
    sqlstate, first = _said_by_driver(exc)
    return sqlstate in _DEADLOCK_PG or first in _DEADLOCK_MYSQL


# A row another transaction holds, asked for with NOWAIT.
_BUSY_PG = {"55P03"}
_BUSY_MYSQL = {1205, 3572}


def is_lock_busy(exc: BaseException) -> bool:
    """Whether ``exc`` says rows asked for with NOWAIT were held by another transaction."""
    sqlstate, first = _said_by_driver(exc)
    return sqlstate in _BUSY_PG or first in _BUSY_MYSQL


# Undefined table or column: a schema older than the code (no `db upgrade` yet).
_NO_SCHEMA_PG = {"42P01", "42703"}
_NO_SCHEMA_MYSQL = {1146, 1054}
_NO_SCHEMA_SQLITE = ("no such table", "no such column")


def is_schema_missing(exc: BaseException) -> bool:
    """Whether ``exc`` says a table or column the code uses is not there."""
    sqlstate, first = _said_by_driver(exc)
    if sqlstate in _NO_SCHEMA_PG or first in _NO_SCHEMA_MYSQL:
        return True
    return isinstance(first, str) and first.startswith(_NO_SCHEMA_SQLITE)


# What the database layer raises, for handlers above the seam (the API's).
ERRORS: tuple[type[Exception], ...] = (sa.exc.SQLAlchemyError,)


def is_transient(exc: BaseException) -> bool:
    """Whether the same statements may go through later: the database was
    away, busy or locked (or chose us as a deadlock's victim), as opposed to
    refusing what it was sent (a value it cannot store, a broken constraint),
    which it will refuse again every time."""
    if isinstance(exc, sa.exc.DBAPIError):
        return exc.connection_invalidated or isinstance(
            exc, sa.exc.OperationalError | sa.exc.InterfaceError
        )
    return isinstance(exc, sa.exc.TimeoutError | OSError)


# -- migrations take turns -------------------------------------------------------

_MIGRATION_LOCK = "hypermedia.migrate"
_MIGRATION_KEY = 0x686D5F6D69677261  # PostgreSQL's advisory locks take a bigint
_MIGRATION_WAIT_S = 3600


@contextlib.contextmanager
def migration_lock(conn: sa.Connection, dialect: str) -> Iterator[None]:
    """Hold the database's migration lock while migrating on ``conn``.

    Replicas of ``serve`` each migrate as they start, and a deploy may run
    ``db upgrade`` beside them: without turns two would both create a table
    (one fails) or, on MariaDB, whose DDL is not transactional, interleave
    half-done steps.  The second waits, then finds the work done.  A session
    lock (PostgreSQL, MariaDB) ends with the connection, so a killed migration
    leaves none behind; SQLite, one file on this machine, takes an flock on a
    file beside it, which the kernel drops with the process."""
    if dialect == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": _MIGRATION_KEY})
        yield
    elif dialect == "mysql":
        q = sa.text("SELECT GET_LOCK(:name, :wait)")
        got = conn.execute(q, {"name": _MIGRATION_LOCK, "wait": _MIGRATION_WAIT_S}).scalar()
        if got != 1:
            raise RuntimeError(f"another migration held the lock for {_MIGRATION_WAIT_S} s")
        yield
    else:
        database = conn.engine.url.database
        if not database or database == ":memory:":
            yield
            return
        with open(f"{database}-migrate.lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield

"""The few places where SQL differs per database, each saying why.

* claim: how to take ready jobs without two workers taking the same one;
* notify / listen: PostgreSQL can wake idle workers, the others are polled.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import make_url

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


def _ready(queues: Sequence[str], now: datetime) -> list[sa.ColumnElement[bool]]:
    return [J.c.status == "queued", J.c.queue_name.in_(queues), J.c.available_at <= now]


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
    """Mark up to ``n`` ready jobs claimed by ``worker_id`` and return them."""
    fn = {"postgresql": _claim_pg, "mysql": _claim_mysql, "sqlite": _claim_sqlite}[dialect]
    rows = fn(conn, worker_id, queues, n, now, lease_until)
    rows.sort(key=lambda r: (r["priority"], r["job_id"]))
    return rows


def _claim_pg(conn, worker_id, queues, n, now, lease_until):  # type: ignore[no-untyped-def]
    # One round trip: SKIP LOCKED lets concurrent workers pass over each
    # other's rows instead of queueing on the row locks.
    picked = (
        sa.select(J.c.job_id)
        .where(*_ready(queues, now))
        .order_by(J.c.priority, J.c.job_id)
        .limit(n)
        .with_for_update(skip_locked=True)
        .cte("picked")
    )
    stmt = (
        sa.update(J)
        .where(J.c.job_id == picked.c.job_id)
        .values(_claim_values(worker_id, now, lease_until))
        .returning(*CLAIM_COLUMNS)
    )
    return [dict(r._mapping) for r in conn.execute(stmt)]


def _claim_mysql(conn, worker_id, queues, n, now, lease_until):  # type: ignore[no-untyped-def]
    # MariaDB has no UPDATE … RETURNING: lock with SKIP LOCKED, then update
    # the locked ids in the same transaction.
    picked = (
        sa.select(*CLAIM_COLUMNS)
        .where(*_ready(queues, now))
        .order_by(J.c.priority, J.c.job_id)
        .limit(n)
        .with_for_update(skip_locked=True)
    )
    rows = [dict(r._mapping) for r in conn.execute(picked)]
    if not rows:
        return []
    ids = [r["job_id"] for r in rows]
    conn.execute(
        sa.update(J)
        .where(J.c.job_id.in_(ids), J.c.status == "queued")
        .values(_claim_values(worker_id, now, lease_until))
    )
    for r in rows:
        r["attempt_count"] += 1
    return rows


def _claim_sqlite(conn, worker_id, queues, n, now, lease_until):  # type: ignore[no-untyped-def]
    # SQLite ignores FOR UPDATE; the transaction already holds the database
    # write lock (BEGIN IMMEDIATE), so a plain subselect is race-free.
    picked = (
        sa.select(J.c.job_id)
        .where(*_ready(queues, now))
        .order_by(J.c.priority, J.c.job_id)
        .limit(n)
        .scalar_subquery()
    )
    stmt = (
        sa.update(J)
        .where(J.c.job_id.in_(picked), J.c.status == "queued")
        .values(_claim_values(worker_id, now, lease_until))
        .returning(*CLAIM_COLUMNS)
    )
    return [dict(r._mapping) for r in conn.execute(stmt)]


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

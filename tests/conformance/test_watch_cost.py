"""What MariaDB's job watch costs the server while a worker is idle.

An idle worker on MariaDB reads the newest job id 20 times a second
(db/wakeups.py, HYPERMEDIA_WATCH_INTERVAL_SECONDS), so every statement a read
takes is multiplied by 20 per worker process.  Through a pooled transaction a
read was three statements (the SELECT, a COMMIT, and the ROLLBACK of the
pool's reset on return: 60 statements a second per idle worker, measured
with ``SHOW GLOBAL STATUS LIKE 'Questions'``); the watch keeps an autocommit
connection of its own instead, and a read is the SELECT alone.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections import Counter
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from hypermedia.db.driver import Driver
from hypermedia.queue.engine import Engine

from ._helpers import new_job

# Only MariaDB watches the newest job id (PostgreSQL has NOTIFY, SQLite a wake file).
pytestmark = pytest.mark.parametrize("database_url", ["mariadb"], indirect=True)


def test_an_idle_watch_reads_without_commits_or_rollbacks(
    driver: Driver, engine: Engine, database_url: str
) -> None:
    assert driver.name == "mysql"
    database = sa.engine.make_url(driver.url).database
    seen: Counter[str] = Counter()

    def ours(dbapi_conn: Any) -> bool:
        name = getattr(dbapi_conn, "db", None)
        return (name.decode() if isinstance(name, bytes) else name) == database

    def on_commit(conn: sa.Connection) -> None:
        if ours(conn.connection.dbapi_connection):
            seen["commit"] += 1

    def on_rollback(conn: sa.Connection) -> None:
        if ours(conn.connection.dbapi_connection):
            seen["rollback"] += 1

    def on_reset(dbapi_conn: Any, _record: Any, _state: Any) -> None:
        if ours(dbapi_conn):
            seen["reset"] += 1

    hooks = [
        (sa.Engine, "commit", on_commit),
        (sa.Engine, "rollback", on_rollback),
        (sa.pool.Pool, "reset", on_reset),
    ]
    watcher = Driver(database_url)  # a worker process's own Driver
    got: queue.Queue[str] = queue.Queue()
    stop = threading.Event()
    listener = threading.Thread(target=watcher.listen, args=(got.put, stop, 0.02), daemon=True)
    try:
        listener.start()
        assert got.get(timeout=10) == "*", "a new listener looks for work once"
        for target, name, fn in hooks:
            event.listen(target, name, fn)
        try:
            time.sleep(1.0)  # about 50 reads of the newest job id
        finally:
            for target, name, fn in hooks:
                event.remove(target, name, fn)
        # (The process's clock may read the server once meanwhile.)
        assert sum(seen.values()) <= 3, f"each watch read ended a transaction: {dict(seen)}"
        # And it still hears a job queued elsewhere.
        new_job(engine, queue="bulk")
        deadline = time.monotonic() + 2
        heard = []
        while time.monotonic() < deadline and "*" not in heard:
            with contextlib.suppress(queue.Empty):
                heard.append(got.get(timeout=0.1))
        assert "*" in heard, "the watch missed a new job"
    finally:
        stop.set()
        listener.join(5)
        watcher.dispose()
    assert not listener.is_alive()

"""A committed job wakes idle listeners without waiting for their next poll.

PostgreSQL does it with LISTEN/NOTIFY from any process.  Elsewhere
hypermedia/db/wakeups.py does: within one process on every database (what
lets ``hypermedia serve`` start a job submitted to its API at once), and
across processes on SQLite through a wake file watched with inotify, on
MariaDB by watching the newest job id.  A listener may also be told ``"*"``
(look at every queue): neither carries queue names, and a new listener looks
once.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hypermedia.db.driver import Driver
from hypermedia.queue.engine import Engine
from tests.harness import hypermedia

from ._helpers import new_job


@pytest.fixture
def heard(driver: Driver) -> Iterator[queue.Queue[str]]:
    got: queue.Queue[str] = queue.Queue()
    stop = threading.Event()
    listener = threading.Thread(target=driver.listen, args=(got.put, stop), daemon=True)
    listener.start()
    assert got.get(timeout=10) == "*", "a new listener looks for work once"
    yield got
    stop.set()
    listener.join(5)
    assert not listener.is_alive(), "the listener did not stop"


def _within(got: queue.Queue[str], seconds: float) -> list[str]:
    """Everything heard within ``seconds``."""
    out, deadline = [], time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            out.append(got.get(timeout=left))
        except queue.Empty:
            break
    return out


def test_a_committed_enqueue_wakes_a_listener_of_its_queue(
    engine: Engine, heard: queue.Queue[str]
) -> None:
    new_job(engine, queue="bulk")
    assert "bulk" in _within(heard, 1.5)


def test_nobody_is_woken_before_the_commit_or_by_a_rollback(
    driver: Driver, heard: queue.Queue[str]
) -> None:
    with pytest.raises(RuntimeError), driver.tx() as tx:
        tx.notify({"images"})
        raise RuntimeError("rolled back")
    assert _within(heard, 0.5) == [], "a rolled-back transaction woke a listener"
    with driver.tx() as tx:
        tx.notify({"bulk"})
        assert _within(heard, 0.5) == [], "woken while the transaction was still open"
    assert "bulk" in _within(heard, 1.5)


def test_a_job_queued_by_another_process(
    driver: Driver, heard: queue.Queue[str], tmp_path: Path
) -> None:
    out = hypermedia("jobs", "submit", "debug.noop", url=driver.url, home=tmp_path)
    assert out.returncode == 0, out.stderr
    # PostgreSQL by its queue's name, SQLite through the wake file, MariaDB
    # by the newest job id; none of them by a poll (the listener never polls).
    got = _within(heard, 2.0)
    assert got and set(got) <= {"*", "bulk"}


def test_the_watch_setting_turns_off_mariadbs_watch_only(driver: Driver, tmp_path: Path) -> None:
    """HYPERMEDIA_WATCH_INTERVAL_SECONDS=0: MariaDB's listener reads no newest
    job id, so another process's job wakes nobody (the worker's poll finds
    it); PostgreSQL (NOTIFY) and SQLite (the wake file) are not watches and
    still wake it."""
    got: queue.Queue[str] = queue.Queue()
    stop = threading.Event()
    listener = threading.Thread(target=driver.listen, args=(got.put, stop, 0.0), daemon=True)
    listener.start()
    try:
        assert got.get(timeout=10) == "*", "a new listener looks for work once"
        out = hypermedia("jobs", "submit", "debug.noop", url=driver.url, home=tmp_path)
        assert out.returncode == 0, out.stderr
        heard = _within(got, 1.5)
        if driver.name == "mysql":
            assert heard == []
        else:
            assert heard and set(heard) <= {"*", "bulk"}
    finally:
        stop.set()
        listener.join(5)
    assert not listener.is_alive()

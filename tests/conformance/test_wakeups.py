"""A job queued in this process wakes this process's listeners once committed.

PostgreSQL does it with LISTEN/NOTIFY (from any process); SQLite and MariaDB
through hypermedia/db/wakeups.py, which is what lets ``hypermedia serve`` start
a job submitted to its API at once instead of at the worker's next poll.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import pytest

from hypermedia.db.driver import Driver
from hypermedia.queue.engine import Engine

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


def test_a_committed_enqueue_wakes_a_listener_of_its_queue(
    engine: Engine, heard: queue.Queue[str]
) -> None:
    new_job(engine, queue="bulk")
    assert heard.get(timeout=5) == "bulk"
    with pytest.raises(queue.Empty):
        heard.get(timeout=0.3)


def test_nobody_is_woken_before_the_commit_or_by_a_rollback(
    driver: Driver, heard: queue.Queue[str]
) -> None:
    with pytest.raises(RuntimeError), driver.tx() as tx:
        tx.notify({"images"})
        raise RuntimeError("rolled back")
    with driver.tx() as tx:
        tx.notify({"bulk"})
        with pytest.raises(queue.Empty):  # the transaction is still open
            heard.get(timeout=0.3)
    assert heard.get(timeout=5) == "bulk"
    with pytest.raises(queue.Empty):  # "images" was rolled back
        heard.get(timeout=0.3)

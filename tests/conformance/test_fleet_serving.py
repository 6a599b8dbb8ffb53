"""Which queues a live worker serves: what ``hypermedia process`` asks before
it runs a worker of its own (``Fleet.serving``), and what a queue summary
says of each queue."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from datetime import timedelta
from typing import Any

from hypermedia.db.driver import Driver
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import NewJob
from hypermedia.queue.queues import Queues
from hypermedia.worker.fleet import Fleet
from tests.conftest import FakeClock


def _worker(driver: Driver, worker_id: str, queues: list[str], **kw: Any) -> None:
    now = kw.pop("heartbeat")
    row = {
        "worker_id": worker_id,
        "status": "active",
        "queues": queues,
        "max_concurrency": 2,
        "cpu_cores": 1,
        "memory_mb": 1024,
        "disk_mb": 1000,
        "hostname": "elsewhere",
        "pid": 1,
        "last_heartbeat": now,
        "started_at": now,
        "created_at": now,
    }
    with driver.tx() as tx:
        tx.insert_worker({**row, **kw})


def test_serving_names_the_queues_a_live_worker_takes(
    engine: Engine, driver: Driver, clock: FakeClock
) -> None:
    fleet, now = Fleet(engine), clock()
    asked = {"images", "documents", "bulk"}
    assert fleet.serving(asked) == set()
    _worker(driver, "w-images", ["images"], heartbeat=now)
    assert fleet.serving(asked) == {"images"}
    # Not serving: draining, terminated, silent past the stale window.
    _worker(driver, "w-draining", ["documents"], heartbeat=now, status="draining")
    _worker(driver, "w-gone", ["documents"], heartbeat=now, status="terminated")
    stale = now - timedelta(seconds=engine.settings.worker_stale_seconds + 1)
    _worker(driver, "w-silent", ["documents"], heartbeat=stale)
    assert fleet.serving(asked) == {"images"}
    _worker(driver, "w-every", ["*"], heartbeat=now)  # every queue
    assert fleet.serving(asked) == asked


def test_an_every_queue_worker_serves_only_the_queues_something_names(
    engine: Engine, driver: Driver, clock: FakeClock
) -> None:
    """QA: a queue only a job named (a typo, "qa-x") read as served while a
    "*" worker ran, which never claims from it; one a profile or an operator
    names it does claim from."""
    fleet = Fleet(engine)
    _worker(driver, "w-every", ["*"], heartbeat=clock())
    assert fleet.serving({"images", "qa-x", "qa-op"}) == {"images"}
    Queues(engine).pause("qa-op")  # an operator's switch names it
    assert fleet.serving({"images", "qa-x", "qa-op"}) == {"images", "qa-op"}
    _worker(driver, "w-both", ["*", "qa-x"], heartbeat=clock())  # and one it lists itself
    assert fleet.serving({"images", "qa-x", "qa-op"}) == {"images", "qa-x", "qa-op"}
    engine.enqueue(NewJob("debug.noop", {}, queue="qa-y"))
    rows = {r["queue_name"]: r["served"] for r in Queues(engine).summary()}
    assert rows["qa-y"] is False and rows["images"] is True


def test_a_worker_of_this_machine_whose_process_is_gone_serves_nothing(
    engine: Engine, driver: Driver, clock: FakeClock
) -> None:
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()  # a pid no process has now (killed a moment ago, its row still fresh)
    host = socket.gethostname()[:255]
    _worker(driver, "w-killed", ["bulk"], heartbeat=clock(), hostname=host, pid=ended.pid)
    assert Fleet(engine).serving({"bulk"}) == set()
    _worker(driver, "w-alive", ["bulk"], heartbeat=clock(), hostname=host, pid=os.getpid())
    assert Fleet(engine).serving({"bulk"}) == {"bulk"}


def test_a_queue_summary_says_whether_a_live_worker_serves_each_queue(
    engine: Engine, driver: Driver, clock: FakeClock
) -> None:
    def served() -> dict[str, bool]:
        return {r["queue_name"]: r["served"] for r in Queues(engine).summary()}

    assert not any(served().values())
    _worker(driver, "w-draining", ["images"], heartbeat=clock(), status="draining")
    assert served()["images"] is False
    _worker(driver, "w-images", ["images"], heartbeat=clock())
    assert served()["images"] is True and served()["bulk"] is False
    clock.advance(engine.settings.worker_stale_seconds + 1)  # silent since
    assert served()["images"] is False

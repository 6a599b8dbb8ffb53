"""A real worker drained by an operator, and the queues/workers CLI as subprocesses."""

from __future__ import annotations

import json
import time

import pytest

from hypermedia.db.driver import Driver
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import NewJob
from hypermedia.worker.fleet import Fleet
from tests.harness import hypermedia
from tests.integration._procs import (
    Procs,
    attempts,
    eventually,
    job,
    sqlite_only,
    submit,
    wait_job,
)

pytestmark = pytest.mark.timeout(90)


def _status(procs: Procs, worker_id: str) -> str:
    (row,) = procs.query("SELECT status FROM workers WHERE worker_id = :w", w=worker_id)
    return str(row.status)


def test_drain_finishes_the_running_job_and_exits_0(
    driver: Driver, live: Engine, procs: Procs
) -> None:
    w = procs.worker("--concurrency", "1", "--no-maintenance")
    running = submit(live, {"ms": 3000})
    wait_job(driver, running, {"processing"}, 20)

    assert Fleet(live).drain(w.worker_id)["status"] == "draining"
    waiting = live.enqueue_many([NewJob("debug.sleep", {"ms": 0})] * 2)
    # Heartbeats (every 0.5 s) go on while the job runs: none undoes the drain.
    time.sleep(1.2)
    assert w.alive(), "a draining worker finishes its running job first"
    assert _status(procs, w.worker_id) == "draining"
    assert job(driver, running)["status"] == "processing"

    assert w.proc.wait(20) == 0
    row = job(driver, running)
    assert row["status"] == "completed"
    assert [a["status"] for a in attempts(driver, running)] == ["completed"]
    for j in waiting:  # claimed into the buffer and handed back, or never claimed
        after = job(driver, j)
        assert (after["status"], after["attempt_count"]) == ("queued", 0)
    assert _status(procs, w.worker_id) == "terminated"


@sqlite_only
def test_queues_and_workers_cli(driver: Driver, live: Engine, procs: Procs) -> None:
    assert "paused" in procs.cli("queues", "pause", "bulk")
    listed = {q["queue_name"]: q for q in json.loads(procs.cli("queues", "ls", "--json"))}
    assert listed["bulk"]["paused"] is True

    w = procs.worker("--concurrency", "1", "--no-maintenance")
    job_id = submit(live, {"ms": 0})
    time.sleep(1.5)  # several poll intervals (0.2 s): a paused queue is not claimed
    assert job(driver, job_id)["status"] == "queued"
    bulk = {q["queue_name"]: q for q in json.loads(procs.cli("queues", "ls", "--json"))}["bulk"]
    assert (bulk["queued"], bulk["paused"]) == (1, True)

    workers = json.loads(procs.cli("workers", "ls", "--json"))
    (mine,) = [x for x in workers if x["worker_id"] == w.worker_id]
    assert mine["status"] in ("active", "idle") and mine["healthy"] is True
    assert mine["queues"] == ["bulk"]
    table = hypermedia("workers", "ls", url=procs.url, home=procs.home, COLUMNS="200")
    assert table.returncode == 0 and w.worker_id in table.stdout  # the Rich table too

    procs.cli("queues", "resume", "bulk")
    assert wait_job(driver, job_id, timeout=10)["status"] == "completed"
    bulk = {q["queue_name"]: q for q in json.loads(procs.cli("queues", "ls", "--json"))}["bulk"]
    assert (bulk["queued"], bulk["paused"], bulk["completed_1h"]) == (0, False, 1)

    procs.cli("workers", "drain", w.worker_id)
    assert w.proc.wait(15) == 0
    eventually(lambda: _status(procs, w.worker_id) == "terminated", 5, "terminated")
    refused = hypermedia("queues", "pause", "Not A Queue", url=procs.url, home=procs.home)
    assert refused.returncode == 2
    assert "queue name" in refused.stderr and "Traceback" not in refused.stderr
    # A well-formed name nothing uses: paused (a profile may name it next), and said.
    typo = hypermedia("queues", "pause", "imagse", url=procs.url, home=procs.home)
    assert typo.returncode == 0 and typo.stdout == "queue imagse paused\n"
    assert "warning: no pipeline, profile or job uses queue imagse (a typo?)" in typo.stderr
    again = hypermedia("queues", "pause", "imagse", url=procs.url, home=procs.home)
    assert again.returncode == 0 and again.stderr == ""  # known now: its switch
    documents = hypermedia("queues", "pause", "documents", url=procs.url, home=procs.home)
    assert documents.stderr == ""  # a built-in pipeline's queue, no job in it yet

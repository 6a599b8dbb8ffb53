"""A real worker drained by an operator, and the queues/workers CLI as subprocesses."""

from __future__ import annotations

import json
import signal
import time
from datetime import timedelta

import pytest

from hypermedia.db.driver import Driver
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import NewJob
from hypermedia.queue.queues import Queues
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
    assert (listed["bulk"]["paused"], listed["bulk"]["served"]) == (True, False)

    w = procs.worker("--concurrency", "1", "--no-maintenance")
    job_id = submit(live, {"ms": 0})
    time.sleep(1.5)  # several poll intervals (0.2 s): a paused queue is not claimed
    assert job(driver, job_id)["status"] == "queued"
    bulk = {q["queue_name"]: q for q in json.loads(procs.cli("queues", "ls", "--json"))}["bulk"]
    assert (bulk["queued"], bulk["paused"], bulk["served"]) == (1, True, True)

    workers = json.loads(procs.cli("workers", "ls", "--json"))
    (mine,) = [x for x in workers if x["worker_id"] == w.worker_id]
    assert mine["status"] in ("active", "idle") and mine["healthy"] is True
    assert mine["queues"] == ["bulk"]
    table = hypermedia("workers", "ls", url=procs.url, home=procs.home, COLUMNS="200")
    assert table.returncode == 0 and w.worker_id in table.stdout  # the Rich table too
    # Who leads maintenance (QA: only the logs or SQL said): none here...
    assert "maintenance leader: none" in table.stdout and mine["leads_maintenance"] is False
    # ...then a scheduler (no worker row), then this worker.
    for holder in ("scheduler-elsewhere-1", w.worker_id):
        with driver.tx() as tx:
            tx.release_lease("maintenance", "scheduler-elsewhere-1")
            assert tx.take_lease(
                "maintenance", holder, live.clock(), live.clock() + timedelta(seconds=60)
            )
        table = hypermedia("workers", "ls", url=procs.url, home=procs.home, COLUMNS="200")
        assert f"maintenance leader: {holder}\n" in table.stdout
        listed = json.loads(procs.cli("workers", "ls", "--json"))
        leads = [x["worker_id"] for x in listed if x["leads_maintenance"]]
        assert leads == ([w.worker_id] if holder == w.worker_id else [])
    with driver.tx() as tx:
        tx.release_lease("maintenance", w.worker_id)

    procs.cli("queues", "resume", "bulk")
    assert wait_job(driver, job_id, timeout=10)["status"] == "completed"
    bulk = {q["queue_name"]: q for q in json.loads(procs.cli("queues", "ls", "--json"))}["bulk"]
    assert (bulk["queued"], bulk["paused"], bulk["completed_1h"]) == (0, False, 1)

    procs.cli("workers", "drain", w.worker_id)
    assert w.proc.wait(15) == 0
    eventually(lambda: _status(procs, w.worker_id) == "terminated", 5, "terminated")
    submit(live, {"ms": 0})  # and nobody left to take it: said
    idle = hypermedia("queues", "ls", url=procs.url, home=procs.home, COLUMNS="200")
    assert idle.returncode == 0 and "no live worker claims from bulk" in idle.stderr
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


def _claimed_ahead(driver: Driver, live: Engine, procs: Procs) -> tuple[int, list[int]]:
    """A worker of one slot running a long job, with more claimed ahead in
    its buffer: a run of short jobs first makes it claim whole batches."""
    procs.cli("queues", "pause", "bulk")
    long = live.enqueue_many([NewJob("debug.sleep", {"ms": 30_000}, priority=9)] * 3)
    live.enqueue_many([NewJob("debug.noop", priority=1)] * 40)
    procs.worker("--concurrency", "1", "--batch", "10", "--no-maintenance")
    procs.cli("queues", "resume", "bulk")

    def placed() -> tuple[int, list[int]] | None:
        status = {j: job(driver, j)["status"] for j in long}
        running = [j for j, s in status.items() if s == "processing"]
        ahead = [j for j, s in status.items() if s == "claimed"]
        return (running[0], ahead) if running and len(ahead) == 2 else None

    return eventually(placed, 30, "one long job running, two claimed ahead")


@sqlite_only
def test_a_job_cancelled_while_claimed_ahead_ends_at_once(
    driver: Driver, live: Engine, procs: Procs
) -> None:
    """It waited in the worker's buffer, cancel_requested, until the slot
    ahead of it was free: behind long attempts, minutes."""
    running, (first, second) = _claimed_ahead(driver, live, procs)
    live.cancel(first)
    row = wait_job(driver, first, timeout=5)
    assert row["status"] == "cancelled"
    assert [(a["status"], a["error_message"]) for a in attempts(driver, first)] == [
        ("cancelled", "cancelled before start")
    ]
    assert job(driver, running)["status"] == "processing"  # the slot ran on
    assert job(driver, second)["status"] == "claimed"
    for j in (running, second):
        live.cancel(j)


@sqlite_only
def test_jobs_claimed_ahead_of_a_pause_go_back_to_their_queue(
    driver: Driver, live: Engine, procs: Procs
) -> None:
    """A pause answered, and the jobs a worker had claimed ahead still
    started after it: they are handed back as the slot comes to them."""
    running, ahead = _claimed_ahead(driver, live, procs)
    procs.cli("queues", "pause", "bulk")
    live.cancel(running)  # the slot comes to the jobs claimed ahead
    wait_job(driver, running, timeout=10)
    for j in ahead:
        row = wait_job(driver, j, {"queued"}, timeout=10)
        assert (row["status"], row["attempt_count"]) == ("queued", 0)
        assert attempts(driver, j) == []
    procs.cli("queues", "resume", "bulk")
    for j in ahead:
        wait_job(driver, j, {"processing"}, timeout=10)
        live.cancel(j)


def test_a_pause_stops_the_jobs_a_worker_claimed_ahead(
    driver: Driver, live: Engine, procs: Procs
) -> None:
    """QA: jobs a worker had claimed ahead (listed claimed) started after the
    pause had answered, until the worker reread the switches a poll interval
    later (5 s here).  Now none of them runs: the pause hands them back."""
    w = procs.worker("--concurrency", "1", "--no-maintenance", HYPERMEDIA_POLL_INTERVAL_SECONDS="5")
    ids = [submit(live, {"ms": 700}) for _ in range(8)]

    def running() -> int | None:
        rows = [job(driver, j) for j in ids]
        busy = [r["job_id"] for r in rows if r["status"] == "processing"]
        return busy[0] if busy and any(r["status"] == "claimed" for r in rows) else None

    eventually(running, 20, "one job running, others claimed ahead")
    # In this process: a CLI's start-up on a loaded machine outlasted the jobs.
    Queues(live).pause("bulk")
    now = {j: job(driver, j)["status"] for j in ids}
    assert "claimed" not in now.values(), now  # handed back by the pause itself
    started = [j for j in ids if now[j] in ("processing", "completed")]
    assert started and len(started) < len(ids), now  # what a slot had taken runs on
    for j in started:
        assert wait_job(driver, j, timeout=20)["status"] == "completed"
    time.sleep(1.5)  # the slot's next take, the monitor's next look
    for j in ids:
        if j not in started:
            after = job(driver, j)
            assert (after["status"], after["attempt_count"]) == ("queued", 0), after
            assert attempts(driver, j) == [], "a job claimed ahead ran after the pause"
    Queues(live).resume("bulk")
    for j in ids:
        assert wait_job(driver, j, timeout=40)["status"] == "completed"
    assert all(len(attempts(driver, j)) == 1 for j in ids)  # each ran once
    w.proc.send_signal(signal.SIGTERM)  # a drain is read only every poll interval
    assert w.proc.wait(15) == 0

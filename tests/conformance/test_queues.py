"""Queues and Fleet use cases on every database: depth, summary, pause/resume, drain."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest

from hypermedia.config import Settings
from hypermedia.db.driver import Driver
from hypermedia.errors import Conflict, InvalidRequest, NotFound
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import NewJob
from hypermedia.queue.profiles import Profiles
from hypermedia.queue.queues import Queues
from hypermedia.worker.fleet import Fleet
from tests.conformance._helpers import drive_to, new_job, race, set_columns
from tests.conftest import FakeClock


@pytest.fixture
def queues(engine: Engine) -> Queues:
    return Queues(engine)


@pytest.fixture
def fleet(engine: Engine) -> Fleet:
    return Fleet(engine)


def _summary(queues: Queues, name: str, project_id: str | None = None) -> dict[str, Any]:
    (row,) = [r for r in queues.summary(project_id) if r["queue_name"] == name]
    return row


def test_depth_counts_open_jobs_by_queue_status_and_priority(
    engine: Engine, driver: Driver, queues: Queues
) -> None:
    # Jobs that get claimed first: a claim takes the oldest ready job.
    drive_to(engine, driver, "retry_wait", priority=7)
    drive_to(engine, driver, "completed")
    drive_to(engine, driver, "cancelled")
    for _ in range(3):
        new_job(engine, priority=2)
    new_job(engine, priority=7)
    new_job(engine, priority=7, project_id="other")

    rows = {(r["queue_name"], r["status"], r["priority"]): r["count"] for r in queues.depth()}
    assert rows == {
        ("bulk", "queued", 2): 3,
        ("bulk", "queued", 7): 2,
        ("bulk", "retry_wait", 7): 1,
    }
    mine = {(r["status"], r["priority"]): r["count"] for r in queues.depth("default")}
    assert mine == {("queued", 2): 3, ("queued", 7): 1, ("retry_wait", 7): 1}
    assert queues.depth("nobody") == []


def test_summary_counts_each_queue_and_the_last_hour(
    engine: Engine, driver: Driver, queues: Queues, clock: FakeClock
) -> None:
    drive_to(engine, driver, "processing", worker="w1")
    drive_to(engine, driver, "cancel_requested", worker="w1")
    drive_to(engine, driver, "retry_wait")
    drive_to(engine, driver, "completed")
    drive_to(engine, driver, "failed")
    drive_to(engine, driver, "failed", project_id="other")
    new_job(engine)
    new_job(engine)

    row = _summary(queues, "bulk")
    assert row == {
        "queue_name": "bulk",
        "paused": False,
        "served": False,
        "queued": 2,
        "running": 2,
        "retry_wait": 1,
        "completed_1h": 1,
        "failed_1h": 2,
    }
    assert _summary(queues, "bulk", "default")["failed_1h"] == 1
    # Queues named only by a profile are known too, with nothing in them.
    names = [r["queue_name"] for r in queues.summary()]
    assert names == sorted(names) and "images" in names
    assert _summary(queues, "images")["queued"] == 0

    clock.advance(3601)
    later = _summary(queues, "bulk")
    assert (later["completed_1h"], later["failed_1h"], later["queued"]) == (0, 0, 2)


def test_a_projects_summary_never_names_another_projects_queues(
    engine: Engine, queues: Queues, clock: FakeClock
) -> None:
    """A queue name is anyone's text: another project's showed on every dashboard."""
    new_job(engine, project_id="other", queue="initech-acquisition")
    new_job(engine, queue="mine")
    queues.pause("ops-only")
    clock.advance(7200)  # older than the last hour's counts
    names = {r["queue_name"] for r in queues.summary("default", everyones=False)}
    assert "mine" in names and "images" in names  # its own, and the profiles'
    assert not {"initech-acquisition", "ops-only"} & names
    assert {"initech-acquisition", "mine", "ops-only"} <= {
        r["queue_name"] for r in queues.summary()
    }
    assert "initech-acquisition" in {
        r["queue_name"] for r in queues.summary("other", everyones=False)
    }


def test_pause_and_resume_switch_a_queue(queues: Queues) -> None:
    assert queues.paused() == set()
    row = queues.pause("images")
    assert (row["queue_name"], row["paused"]) == ("images", True)
    assert queues.pause("images")["paused"] is True  # again: still paused, no error
    queues.pause("never.used-1")
    assert queues.paused() == {"images", "never.used-1"}
    assert _summary(queues, "images")["paused"] is True
    # A switched queue is known even with no job and no profile naming it.
    assert _summary(queues, "never.used-1")["queued"] == 0

    assert queues.resume("images")["paused"] is False
    assert queues.paused() == {"never.used-1"}
    assert _summary(queues, "images")["paused"] is False


def test_no_claim_takes_a_job_from_a_queue_once_its_pause_answered(
    queues: Queues, engine: Engine
) -> None:
    """Workers kept the switches for a poll interval: a job submitted right
    after a pause answered was claimed and run from the paused queue."""
    bulk = [new_job(engine) for _ in range(3)]
    queues.pause("bulk")
    assert engine.claim("w-1", ["bulk"], 10) == []
    assert engine.claim("w-1", ["images", "bulk"], 10) == []
    queues.resume("bulk")
    assert sorted(c.job_id for c in engine.claim("w-1", ["images", "bulk"], 10)) == bulk


def test_a_pause_hands_back_the_jobs_claimed_ahead_from_its_queue(
    queues: Queues, engine: Engine
) -> None:
    """QA: jobs a worker had claimed ahead started up to a poll interval after
    the pause had answered.  Now they are queued again by the pause itself,
    uncharged, and the worker's start of one is refused; started ones run on."""
    ids = [new_job(engine) for _ in range(3)]
    other = new_job(engine, queue="images")
    claimed = {c.job_id: c for c in engine.claim("w-1", ["bulk"], 10)}
    engine.claim("w-2", ["images"], 10)
    running = ids[0]
    assert engine.start("w-1", [(running, claimed[running].attempt)]) == {running}
    queues.pause("bulk")
    for job_id in ids[1:]:
        job = engine.get(job_id)
        assert (job["status"], job["attempt_count"], job["claimed_by"]) == ("queued", 0, None)
        assert job["attempts"] == []  # the attempt never ran: no row of it
        last = job["events"][-1]
        assert (last["from_status"], last["to_status"], last["actor"]) == (
            "claimed",
            "queued",
            "pause",
        )
        assert last["message"] == "handed back unstarted: its queue was paused"
        assert engine.start("w-1", [(job_id, claimed[job_id].attempt)]) == set()
    assert engine.get(running)["status"] == "processing"  # started: runs on
    assert engine.get(other)["status"] == "claimed"  # another queue's: untouched
    queues.resume("bulk")
    again = engine.claim("w-3", ["bulk"], 10)
    assert sorted(c.job_id for c in again) == ids[1:] and {c.attempt for c in again} == {1}


def test_resuming_a_queue_never_switched_writes_nothing(queues: Queues) -> None:
    """The API wrote a switch for any name it was asked to resume: a typo
    ("imagse") became a queue listed from then on."""
    row = queues.resume("imagse")
    assert row == {"queue_name": "imagse", "paused": False, "updated_at": None}
    assert "imagse" not in {r["queue_name"] for r in queues.summary()}
    queues.pause("images")
    queues.resume("images")
    again = queues.resume("images")  # switched once: the switch stays, and moves
    assert again["paused"] is False and again["updated_at"] is not None
    assert _summary(queues, "images")["paused"] is False


@pytest.mark.parametrize("name", ["", "Images", "a b", "a/b", "x" * 51, "é"])
def test_bad_queue_names_are_refused(queues: Queues, name: str) -> None:
    with pytest.raises(InvalidRequest):
        queues.pause(name)
    assert queues.paused() == set()


def test_concurrent_first_pause_of_a_queue_is_one_row(
    database_url: str, settings: Settings, queues: Queues
) -> None:
    # Racing first writes of one new row: on InnoDB two losers of the insert
    # deadlock on its key; the victim's transaction is run again.
    for round_ in range(5):
        name = f"racy{round_}"
        got = race(
            database_url, 6, lambda drv, i, name=name: Queues(Engine(drv, settings)).pause(name)
        )
        assert [g["paused"] if isinstance(g, dict) else g for g in got] == [True] * 6, got
    assert queues.paused() == {f"racy{r}" for r in range(5)}


# -- workers -------------------------------------------------------------------------


def _worker(driver: Driver, worker_id: str, at: datetime, status: str = "active") -> None:
    with driver.tx() as tx:
        tx.insert_worker(
            {
                "worker_id": worker_id,
                "status": status,
                "queues": ["bulk"],
                "cpu_cores": 2,
                "memory_mb": 1024,
                "disk_mb": 2048,
                "last_heartbeat": at,
                "started_at": at,
                "created_at": at,
            }
        )


def _metric(driver: Driver, worker_id: str, at: datetime, cpu: float) -> None:
    with driver.tx() as tx:
        tx.insert_metric(
            {
                "worker_id": worker_id,
                "cpu_percent": cpu,
                "memory_percent": 10,
                "disk_percent": 20,
                "recorded_at": at,
            }
        )


def test_fleet_lists_workers_with_latest_metrics_and_health(
    driver: Driver, fleet: Fleet, engine: Engine
) -> None:
    now = engine.clock()
    _worker(driver, "w-new", now)
    _worker(driver, "w-silent", now - timedelta(minutes=10), status="active")
    _worker(driver, "w-gone", now - timedelta(hours=1), status="terminated")
    _metric(driver, "w-new", now - timedelta(seconds=2), 11.5)
    _metric(driver, "w-new", now - timedelta(seconds=1), 42.25)
    _metric(driver, "w-silent", now - timedelta(minutes=10), 3)

    rows = {w["worker_id"]: w for w in fleet.list()}
    assert set(rows) == {"w-new", "w-silent"}
    assert float(rows["w-new"]["last_metrics"]["cpu_percent"]) == 42.25
    assert float(rows["w-silent"]["last_metrics"]["cpu_percent"]) == 3
    assert rows["w-new"]["healthy"] is True
    assert rows["w-silent"]["healthy"] is False  # heard from beyond the stale window

    every = {w["worker_id"]: w for w in fleet.list(include_terminated=True)}
    assert set(every) == {"w-new", "w-silent", "w-gone"}
    assert every["w-gone"]["last_metrics"] is None
    assert every["w-gone"]["healthy"] is False

    one = fleet.get("w-new")
    assert (one["status"], one["queues"]) == ("active", ["bulk"])
    with pytest.raises(NotFound):
        fleet.get("nope")


def test_drain_is_guarded_and_survives_the_heartbeat(
    driver: Driver, fleet: Fleet, engine: Engine
) -> None:
    now = engine.clock()
    for wid, status in (("w-a", "active"), ("w-i", "idle"), ("w-t", "terminated")):
        _worker(driver, wid, now, status=status)
    _worker(driver, "w-u", now, status="unhealthy")

    assert fleet.drain("w-a")["status"] == "draining"
    assert fleet.drain("w-i")["status"] == "draining"
    assert fleet.drain("w-a")["status"] == "draining"  # again: nothing changes
    for wid in ("w-t", "w-u"):
        with pytest.raises(Conflict):
            fleet.drain(wid)
        assert fleet.get(wid)["status"] != "draining"
    with pytest.raises(NotFound):
        fleet.drain("nope")

    # The worker's heartbeat writes active/idle: it must not undo the drain...
    with driver.tx() as tx:
        tx.update_worker("w-a", {"status": "active", "last_heartbeat": now, "current_jobs": 1})
    assert fleet.get("w-a")["status"] == "draining"
    assert fleet.get("w-a")["current_jobs"] == 1
    # ...while its last word on stopping still lands.
    with driver.tx() as tx:
        tx.update_worker("w-a", {"status": "terminated"})
    assert fleet.get("w-a")["status"] == "terminated"
    assert fleet.counts() == {"draining": 1, "terminated": 2, "unhealthy": 1}


def test_recent_failures_are_the_latest_to_fail_not_the_newest_ids(
    engine: Engine, driver: Driver
) -> None:
    """The dashboard's "recent failures": an old job retried that failed again
    is recent (it was missing: the list went by id)."""
    project = f"recent-{uuid.uuid4().hex[:8]}"
    old, mid, new = (drive_to(engine, driver, "failed", project_id=project) for _ in range(3))
    now = datetime(2026, 12, 3, 12, 0, 0)
    for job_id, ago in ((old, 0), (mid, 20), (new, 10)):
        set_columns(driver, job_id, {"completed_at": now - timedelta(minutes=ago)})
    drive_to(engine, driver, "failed", project_id="someone-else")
    got = [j["job_id"] for j in engine.recent_failures(project, limit=2)]
    assert got == [old, new]


def test_a_deactivated_profiles_queue_is_served_while_its_jobs_wait(engine: Engine) -> None:
    """`*` workers serve the queues active profiles name: a job queued with a
    version deactivated since, on a queue of its own, waited for ever."""
    Profiles(engine).create("retiring", "debug.noop", {}, queue="q-retiring")
    job_id = engine.enqueue(NewJob("debug.noop", profile="retiring"))
    Profiles(engine).deactivate("retiring:v1")
    with engine.db.read() as tx:
        assert "q-retiring" in tx.named_queues()
    [claimed] = engine.claim("w1", ["q-retiring"], 5)
    assert claimed.job_id == job_id
    with engine.db.read() as tx:  # nothing of it waits now: no longer served
        assert "q-retiring" not in tx.named_queues()

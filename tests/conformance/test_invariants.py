"""Seed-001 invariants held by the database, and events written atomically with changes."""

from __future__ import annotations

import itertools
import random
from datetime import timedelta

import pytest
import sqlalchemy as sa

from hypermedia.db.queries import Tx
from hypermedia.db.schema import processing_jobs as J
from hypermedia.queue import states
from hypermedia.queue.models import AttemptResult, NewJob

from ._helpers import (
    W1,
    attempts,
    done,
    drive_to,
    events,
    failed,
    job_row,
    new_job,
    snapshot,
)

# -- CHECK constraints refuse violating writes -------------------------------------------


def _raw_update(driver, job_id: int, **values) -> None:
    with driver.tx() as tx:
        tx.conn.execute(sa.update(J).where(J.c.job_id == job_id).values(**values))


@pytest.mark.parametrize(
    ("status", "values", "constraint"),
    [
        ("queued", {"attempt_count": 4}, "ck_processing_jobs_attempts"),  # max_attempts=3
        ("claimed", {"max_attempts": 0, "attempt_count": 0}, "ck_processing_jobs_max_attempts"),
        ("queued", {"attempt_count": -1}, "ck_processing_jobs_attempts"),
        ("processing", {"started_at": None}, "ck_processing_jobs_processing_claimed"),
        ("processing", {"claimed_at": None}, "ck_processing_jobs_processing_claimed"),
        ("claimed", {"status": "processing"}, "ck_processing_jobs_processing_claimed"),
        ("completed", {"completed_at": None}, "ck_processing_jobs_completed_at"),
        ("processing", {"status": "completed"}, "ck_processing_jobs_completed_at"),
        ("queued", {"status": "running"}, "ck_processing_jobs_status"),
        ("queued", {"priority": 11}, "ck_processing_jobs_priority"),
        ("queued", {"priority": 0}, "ck_processing_jobs_priority"),
        ("failed", {"outcome": "exploded"}, "ck_processing_jobs_outcome"),
        ("failed", {"category": "whatever"}, "ck_processing_jobs_category"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_database_refuses_writes_that_break_invariants(engine, driver, status, values, constraint):
    job_id = drive_to(engine, driver, status)
    before = snapshot(driver, job_id)
    with pytest.raises(sa.exc.DBAPIError, match=constraint):
        _raw_update(driver, job_id, **values)
    assert snapshot(driver, job_id) == before


def test_attempt_count_may_reach_max_attempts(engine, driver):
    job_id = new_job(engine)
    _raw_update(driver, job_id, attempt_count=3)  # equal is fine
    assert job_row(driver, job_id)["attempt_count"] == 3


def test_attempt_numbers_are_unique_per_job(engine, driver):
    job_id = drive_to(engine, driver, "claimed")
    with (
        pytest.raises(sa.exc.DBAPIError, match=r"(?i)uk_job_attempt|unique|duplicate"),
        driver.tx() as tx,
    ):
        tx.insert_attempts(
            [{"job_id": job_id, "worker_id": "w9", "attempt_number": 1, "status": "started"}]
        )
    assert len(attempts(driver, job_id)) == 1


# -- invariants hold after a mixed workload ------------------------------------------------


def _workload(engine, clock, seed: int = 11) -> list[int]:
    """Random but reproducible traffic through every public method."""
    rng = random.Random(seed)
    ids = engine.enqueue_many(
        [
            NewJob(
                "debug.noop",
                priority=rng.randint(1, 10),
                max_attempts=rng.randint(1, 3),
                hold=rng.random() < 0.1,
            )
            for _ in range(60)
        ]
    )
    for _ in range(12):
        for job_id in rng.sample(ids, 6):
            try:
                if rng.random() < 0.5:
                    engine.cancel(job_id)
                elif rng.random() < 0.5:
                    engine.retry(job_id)
                else:
                    engine.release(job_id)
            except Exception as exc:  # refused transitions are part of the traffic
                assert type(exc).__name__ == "StaleTransition"
        worker = rng.choice(["w1", "w2", "w3"])
        claimed = engine.claim(worker, ["bulk"], rng.randint(1, 8))
        started = [(c.job_id, c.attempt) for c in claimed if rng.random() < 0.8]
        results = []
        for c in claimed:
            r = rng.random()
            if r < 0.3:
                results.append(done(c.job_id, c.attempt))
            elif r < 0.6:
                code = rng.choice(["CRASHED", "OOM", "CORRUPT_INPUT", "TIMEOUT"])
                results.append(failed(c.job_id, c.attempt, code))
            elif r < 0.7:
                engine.hand_back(worker, [(c.job_id, c.attempt)])
        engine.flush(worker, started, results)
        clock.advance(rng.choice([0.1, 1, 30, 61]))
        engine.reap()
        engine.promote()
    return ids


def test_invariants_hold_after_mixed_traffic(engine, driver, clock):
    ids = _workload(engine, clock)
    seen = set()
    for job_id in ids:
        row = job_row(driver, job_id)
        seen.add(row["status"])
        # Seed 001 invariants.
        assert 0 <= row["attempt_count"] <= row["max_attempts"]
        if row["status"] == "processing":
            assert row["claimed_at"] and row["started_at"]
        if row["status"] == "completed":
            assert row["completed_at"] is not None
        if row["status"] in states.RUNNING_SIDE:
            assert row["claimed_by"] and row["visibility_timeout"]
        # One attempt row per attempt made, numbered 1..n.
        nums = [a["attempt_number"] for a in attempts(driver, job_id)]
        assert nums == list(range(1, row["attempt_count"] + 1))
        assert all(
            a["status"] != "started"
            for a in attempts(driver, job_id)
            if row["status"] not in states.RUNNING_SIDE
        )
        # Events form an unbroken chain of allowed changes ending at the status.
        chain = [(e["from_status"], e["to_status"]) for e in events(driver, job_id)]
        assert chain[0][0] is None
        for (_, prev_to), (src, dst) in itertools.pairwise(chain):
            assert src == prev_to
            assert states.is_allowed(src, dst), (src, dst)
        assert chain[-1][1] == row["status"]
    assert len(seen) >= 5, seen  # the traffic really was mixed


# -- every change and its event commit together ---------------------------------------------


def _boom(*_a, **_k):
    raise RuntimeError("event store down")


ACTIONS = {
    "enqueue": lambda e, j, a: e.enqueue(NewJob("debug.noop")),
    "release": lambda e, j, a: e.release(j),
    "start": lambda e, j, a: e.start(W1, [(j, a)]),
    "settle": lambda e, j, a: e.settle(W1, [done(j, a)]),
    "fail": lambda e, j, a: e.settle(W1, [failed(j, a, "CORRUPT_INPUT")]),
    "cancel": lambda e, j, a: e.cancel(j),
    "retry": lambda e, j, a: e.retry(j),
    "promote": lambda e, j, a: e.promote(),
    "hand_back": lambda e, j, a: e.hand_back(W1, [(j, a)]),
    "reap": lambda e, j, a: e.reap(),
}
SOURCE = {
    "enqueue": "queued",
    "release": "created",
    "start": "claimed",
    "settle": "processing",
    "fail": "processing",
    "cancel": "processing",
    "retry": "failed",
    "promote": "retry_wait",
    "hand_back": "claimed",
    "reap": "processing",
}


@pytest.mark.parametrize("action", list(ACTIONS))
def test_no_status_change_without_its_event(engine, driver, clock, settings, monkeypatch, action):
    job_id = drive_to(engine, driver, SOURCE[action])
    attempt = job_row(driver, job_id)["attempt_count"]
    clock.advance(settings.lease_seconds + settings.backoff_max_seconds + 1)
    before = snapshot(driver, job_id)
    monkeypatch.setattr(Tx, "insert_events", _boom)
    with pytest.raises(RuntimeError, match="event store down"):
        ACTIONS[action](engine, job_id, attempt)
    monkeypatch.undo()
    assert snapshot(driver, job_id) == before
    assert len(engine.list(limit=100)) == 1  # nor a job without its creation event
    # The same call succeeds once events can be written, and records one.
    ACTIONS[action](engine, job_id, attempt)
    after = snapshot(driver, job_id)
    if action != "enqueue":
        assert after[0]["status"] != before[0]["status"]
        assert len(after[2]) == len(before[2]) + 1


def test_claim_is_all_or_nothing(engine, driver):
    """The claim's status change, attempt row and event commit together.

    (The claim writes its attempt rows and events inside the driver, on
    PostgreSQL in a single statement, so the event store cannot be patched
    out as above.)  A conflicting attempt row makes the attempt insert fail:
    nothing of the claim may remain.
    """
    job_id = new_job(engine)
    other = new_job(engine)
    with driver.tx() as tx:
        tx.insert_attempts(
            [{"job_id": job_id, "worker_id": "ghost", "attempt_number": 1, "status": "failed"}]
        )
    before = snapshot(driver, job_id), snapshot(driver, other)
    with pytest.raises(sa.exc.DBAPIError):
        engine.claim(W1, ["bulk"], 10)
    assert (snapshot(driver, job_id), snapshot(driver, other)) == before


def test_event_timestamps_follow_the_clock(engine, driver, clock):
    job_id = new_job(engine)
    clock.advance(5)
    [c] = engine.claim(W1, ["bulk"], 1)
    clock.advance(5)
    engine.settle(W1, [AttemptResult(job_id=job_id, attempt=c.attempt, status="completed")])
    times = [e["created_at"] for e in events(driver, job_id)]
    start = times[0]
    assert [t - start for t in times] == [timedelta(0), timedelta(seconds=5), timedelta(seconds=10)]

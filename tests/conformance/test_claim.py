"""Claim: order, batch size, queues, readiness, lease and attempt rows, concurrency."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

from hypermedia.db.driver import Driver
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import NewJob

from ._helpers import W1, attempts, events, job_row, new_job, race, snapshot, status_of


def test_claim_orders_by_priority_then_age(engine):
    prios = [5, 1, 10, 1, 5, 3, 10, 1]
    ids = engine.enqueue_many([NewJob("debug.noop", priority=p) for p in prios])
    expected = [i for _, i in sorted(zip(prios, ids, strict=True))]
    got = [c.job_id for c in engine.claim(W1, ["bulk"], 100)]
    assert got == expected


def test_small_batches_take_the_most_urgent_first(engine):
    prios = [9, 2, 7, 2, 1, 5]
    ids = engine.enqueue_many([NewJob("debug.noop", priority=p) for p in prios])
    order = [i for _, i in sorted(zip(prios, ids, strict=True))]
    seen = []
    while batch := engine.claim(W1, ["bulk"], 2):
        assert len(batch) <= 2
        seen.extend(c.job_id for c in batch)
    assert seen == order


def test_older_jobs_first_within_a_priority(engine, clock):
    first = new_job(engine, priority=4)
    clock.advance(1)
    second = new_job(engine, priority=4)
    clock.advance(1)
    urgent = new_job(engine, priority=3)
    assert [c.job_id for c in engine.claim(W1, ["bulk"], 3)] == [urgent, first, second]


def test_batch_size_is_respected(engine):
    engine.enqueue_many([NewJob("debug.noop") for _ in range(7)])
    assert [len(engine.claim(W1, ["bulk"], 3)) for _ in range(4)] == [3, 3, 1, 0]


def test_zero_batch_or_no_queue_claims_nothing(engine, driver):
    job_id = new_job(engine)
    assert engine.claim(W1, ["bulk"], 0) == []
    assert engine.claim(W1, [], 5) == []
    assert status_of(driver, job_id) == "queued"


def test_priming_the_claim_changes_nothing(engine, driver):
    """A worker's dry-run claim (settled, then rolled back) leaves every job as
    it was: no lease, attempt, event or completion; the real claim then takes them."""
    ids = engine.enqueue_many([NewJob("debug.noop") for _ in range(3)])
    before = [snapshot(driver, i) for i in ids]
    engine.prime(W1, ["bulk"], 10)
    assert [snapshot(driver, i) for i in ids] == before
    assert sorted(c.job_id for c in engine.claim(W1, ["bulk"], 10)) == sorted(ids)


def test_only_listed_queues_are_claimed(engine):
    bulk = new_job(engine)
    images = new_job(engine, queue="images")
    docs = new_job(engine, queue="documents")
    assert engine.claim(W1, ["ocr"], 10) == []
    assert [c.job_id for c in engine.claim(W1, ["images"], 10)] == [images]
    assert {c.job_id for c in engine.claim(W1, ["bulk", "documents"], 10)} == {bulk, docs}


def test_jobs_not_yet_available_wait(engine, clock):
    later = new_job(engine, run_at=clock.now + timedelta(seconds=60))
    now = new_job(engine)
    assert [c.job_id for c in engine.claim(W1, ["bulk"], 10)] == [now]
    clock.advance(59)
    assert engine.claim(W1, ["bulk"], 10) == []
    clock.advance(1)
    assert [c.job_id for c in engine.claim(W1, ["bulk"], 10)] == [later]


def test_held_created_jobs_are_not_claimed(engine):
    new_job(engine, hold=True)
    assert engine.claim(W1, ["bulk"], 10) == []


def test_claim_sets_lease_attempt_and_event(engine, driver, settings, clock):
    job_id = new_job(
        engine,
        job_type="debug.sleep",
        params={"ms": 3},
        max_attempts=4,
        input_key="in/k",
        input_size_bytes=9,
        project_id="p",
    )
    clock.advance(2)
    [c] = engine.claim(W1, ["bulk"], 5)
    assert (c.job_id, c.attempt, c.max_attempts, c.params) == (job_id, 1, 4, {"ms": 3})
    assert (c.job_type, c.queue_name, c.input_key, c.input_size_bytes, c.project_id) == (
        "debug.sleep",
        "bulk",
        "in/k",
        9,
        "p",
    )
    assert c.timeout_seconds == 3600 and c.memory_limit_mb is None
    row = job_row(driver, job_id)
    assert row["status"] == "claimed"
    assert row["claimed_by"] == W1 and row["claimed_at"] == clock.now
    assert row["visibility_timeout"] == clock.now + timedelta(seconds=settings.lease_seconds)
    assert row["attempt_count"] == 1 and row["started_at"] is None
    [att] = attempts(driver, job_id)
    assert (att["attempt_number"], att["worker_id"], att["status"]) == (1, W1, "started")
    assert att["started_at"] == clock.now and att["finished_at"] is None
    ev = events(driver, job_id)[-1]
    assert (ev["from_status"], ev["to_status"], ev["attempt_number"], ev["actor"]) == (
        "queued",
        "claimed",
        1,
        W1,
    )


def test_attempt_number_follows_attempt_count_across_retries(engine, driver, clock):
    job_id = new_job(engine, max_attempts=3)
    for n in (1, 2, 3):
        [c] = engine.claim(W1, ["bulk"], 1)
        assert c.attempt == n == job_row(driver, job_id)["attempt_count"]
        engine.settle(W1, [_crash(job_id, n)])
        clock.advance(60)
        engine.promote()
    assert [a["attempt_number"] for a in attempts(driver, job_id)] == [1, 2, 3]
    assert status_of(driver, job_id) == "failed"


def _crash(job_id: int, attempt: int):
    from ._helpers import failed

    return failed(job_id, attempt, "CRASHED", status="crashed")


def test_claimed_jobs_are_not_claimed_again(engine):
    engine.enqueue_many([NewJob("debug.noop") for _ in range(3)])
    first = {c.job_id for c in engine.claim(W1, ["bulk"], 2)}
    second = {c.job_id for c in engine.claim("w2", ["bulk"], 5)}
    assert len(first) == 2 and len(second) == 1 and not first & second


def test_concurrent_claimers_never_share_a_job(engine, driver, database_url, settings, clock):
    """500 jobs, 4 claimers (each its own Engine and pool) batching 10 until empty."""
    total, n_threads = 500, 4
    ids = engine.enqueue_many([NewJob("debug.noop", priority=1 + i % 10) for i in range(total)])
    drivers = [Driver(database_url) for _ in range(n_threads)]
    got: list[list[int]] = [[] for _ in range(n_threads)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(n_threads)

    def claimer(i: int) -> None:
        eng = Engine(drivers[i], settings, clock=clock)
        try:
            barrier.wait()
            # A cap per claimer: draining all 500 then needs every claimer,
            # however the threads happen to be scheduled on a busy machine.
            while len(got[i]) < 130 and (batch := eng.claim(f"t{i}", ["bulk"], 10)):
                assert len(batch) <= 10
                got[i].extend(c.job_id for c in batch)
                time.sleep(0.001)  # a real worker works between claims; let others in
        except BaseException as exc:  # surfaced in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for d in drivers:
        d.dispose()
    assert not errors, errors
    flat = [j for g in got for j in g]
    assert len(flat) == len(set(flat)), "a job was claimed twice"
    assert set(flat) == set(ids)
    assert all(got), "every claimer must have taken a share"
    # The database agrees with what each claimer was told.
    owner = {j: f"t{i}" for i, g in enumerate(got) for j in g}
    rows = engine.list(limit=10_000)
    assert all(r["status"] == "claimed" and r["attempt_count"] == 1 for r in rows)
    assert all(r["claimed_by"] == owner[r["job_id"]] for r in rows)
    with driver.read() as tx:
        n_attempts = tx.conn.exec_driver_sql("SELECT COUNT(*) FROM job_attempts").scalar()
    assert n_attempts == total


def test_a_claim_carries_its_inputs_rows_when_they_are_ready(engine, driver, storage):
    import io

    ready = [storage.put(io.BytesIO(b"x" * (10 + i))) for i in range(3)]
    ids = [engine.enqueue(NewJob("debug.sleep", object_id=o["object_id"])) for o in ready]
    ids.append(engine.enqueue(NewJob("debug.sleep", object_id=ready[0]["object_id"])))
    no_input = engine.enqueue(NewJob("debug.noop"))
    # One input that is no longer ready by the time of the claim.
    gone = storage.put(io.BytesIO(b"y"))
    late = engine.enqueue(NewJob("debug.sleep", object_id=gone["object_id"]))
    with driver.tx() as tx:
        assert tx.update_object(gone["object_id"], ["ready"], {"state": "deleting"})
    got = {c.job_id: c for c in engine.claim(W1, ["bulk"], 10)}
    assert set(got) == {*ids, no_input, late}
    for job_id, obj in zip(ids, [*ready, ready[0]], strict=True):
        assert got[job_id].input_object == {
            "pool_id": obj["pool_id"],
            "storage_key": obj["storage_key"],
            "checksum": obj["checksum"],
        }
    assert got[no_input].input_object is None
    assert got[late].input_object is None  # the worker looks it up, and refuses it


def test_a_claim_restricted_to_some_jobs_takes_none_other(engine, driver, clock):
    """A command's own worker (``process``) claims its jobs only: a stranger's
    job queued ahead of them (more urgent, older) was taken first, run, and
    cut short when the command stopped."""
    stranger = new_job(engine, priority=1)
    mine = [new_job(engine, priority=p) for p in (9, 5, 7)]
    other_queue = new_job(engine, queue="images")
    later = new_job(engine, run_at=clock.now + timedelta(seconds=60))
    only = [*mine, other_queue, later]
    got = engine.claim(W1, ["bulk"], 2, only=only)
    assert [c.job_id for c in got] == [mine[1], mine[2]]  # by priority, n respected
    assert [(a["attempt_number"], a["worker_id"]) for a in attempts(driver, mine[1])] == [(1, W1)]
    assert events(driver, mine[1])[-1]["to_status"] == "claimed"
    assert [c.job_id for c in engine.claim(W1, ["bulk"], 10, only=only)] == [mine[0]]
    assert engine.claim(W1, ["bulk"], 10, only=only) == []  # not the stranger, not later
    assert (status_of(driver, stranger), status_of(driver, later)) == ("queued", "queued")
    assert status_of(driver, other_queue) == "queued"  # its queue was not asked for
    assert engine.claim(W1, ["bulk", "images"], 10, only=[stranger + 10_000]) == []


def test_a_restricted_claim_leaves_paused_queues_alone(engine, driver):
    from hypermedia.queue.queues import Queues

    mine = new_job(engine)
    Queues(engine).pause("bulk")
    assert engine.claim(W1, ["bulk"], 10, only=[mine]) == []
    Queues(engine).resume("bulk")
    assert [c.job_id for c in engine.claim(W1, ["bulk"], 10, only=[mine])] == [mine]


def test_restricted_claimers_never_share_a_job(engine, database_url, settings, clock):
    """Two claimers given the same jobs: each job once (row locks, SKIP LOCKED)."""
    ids = engine.enqueue_many([NewJob("debug.noop") for _ in range(60)])

    def drain(driver: Driver, i: int) -> list[int]:
        eng, got = Engine(driver, settings, clock=clock), []
        while batch := eng.claim(f"t{i}", ["bulk"], 3, only=ids):
            got.extend(c.job_id for c in batch)
        return got

    got = race(database_url, 2, drain)
    assert not [g for g in got if isinstance(g, BaseException)], got
    assert sorted(got[0] + got[1]) == sorted(ids), "a job was claimed twice, or lost"

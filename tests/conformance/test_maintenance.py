"""Reaper, lease renewal, hand-back, promoter limits and the leader lease."""

from __future__ import annotations

from datetime import timedelta

import pytest

from hypermedia.db.driver import Driver
from hypermedia.db.schema import workers
from hypermedia.errors import IdempotencyConflict
from tests.conftest import BACKENDS

from ._helpers import (
    W1,
    attempts,
    claim_one,
    done,
    drive_to,
    events,
    job_row,
    new_job,
    race,
    snapshot,
    status_of,
    transitions,
)


def _running(engine, worker=W1, start=True, **kw):
    job_id = new_job(engine, **kw)
    job_id_, a = claim_one(engine, worker)
    assert job_id_ == job_id
    if start:
        assert engine.start(worker, [(job_id, a)]) == {job_id}
    return job_id, a


def _worker(driver: Driver, worker_id: str, heartbeat, status: str = "active") -> None:
    with driver.tx() as tx:
        tx.insert_worker(
            {
                "worker_id": worker_id,
                "status": status,
                "queues": ["bulk"],
                "max_concurrency": 2,
                "current_jobs": 2,
                "cpu_cores": 1,
                "memory_mb": 1024,
                "disk_mb": 1000,
                "last_heartbeat": heartbeat,
                "started_at": heartbeat,
                "created_at": heartbeat,
            }
        )


def _worker_status(driver: Driver, worker_id: str) -> str:
    with driver.read() as tx:
        return tx.worker(worker_id)["status"]


# -- reaper: expired leases -----------------------------------------------------------


def test_expired_lease_orphans_the_attempt_and_waits_to_retry(engine, driver, settings, clock):
    job_id, _ = _running(engine)
    clock.advance(settings.lease_seconds + 0.5)
    assert engine.reap() == {"unhealthy_workers": 0, "terminated_workers": 0, "released_jobs": 1}
    row = job_row(driver, job_id)
    assert row["status"] == "retry_wait"
    assert (row["error_code"], row["category"]) == ("ORPHANED", "provider_failure")
    assert row["available_at"] > clock.now
    [att] = attempts(driver, job_id)
    assert (att["status"], att["error_code"], att["finished_at"]) == (
        "orphaned",
        "ORPHANED",
        clock.now,
    )
    assert transitions(driver, job_id)[-1] == ("processing", "retry_wait")
    # A second pass finds nothing more to do.
    assert engine.reap()["released_jobs"] == 0


def test_many_expired_leases_are_reaped_in_one_pass(engine, driver, settings, clock):
    held = [_running(engine, max_attempts=1 + i % 2)[0] for i in range(6)]
    fresh = [_running(engine)[0] for _ in range(2)]
    clock.advance(1)
    for job_id in fresh:  # these renew in time
        engine.renew(W1, [(job_id, 1)])
    clock.advance(settings.lease_seconds)
    assert engine.reap()["released_jobs"] == 6
    assert [status_of(driver, j) for j in held] == ["failed", "retry_wait"] * 3
    assert [status_of(driver, j) for j in fresh] == ["processing"] * 2


def test_claimed_but_never_started_job_is_reaped_too(engine, driver, settings, clock):
    job_id, _ = _running(engine, start=False)
    clock.advance(settings.lease_seconds + 1)
    assert engine.reap()["released_jobs"] == 1
    assert transitions(driver, job_id)[-1] == ("claimed", "retry_wait")


def test_a_repeat_still_finds_a_job_whose_unstarted_attempt_was_given_back(
    engine, driver, settings, clock
):
    """The attempt given back raised max_attempts from 3 to 4: the very
    request that made the job was refused as a different one (422
    idempotency_conflict), and one asking for 4, never sent, was taken."""
    job_id, _ = _running(engine, start=False, idempotency_key="given-back")
    clock.advance(settings.lease_seconds + 1)
    assert engine.reap()["released_jobs"] == 1
    assert job_row(driver, job_id)["max_attempts"] == 4
    assert new_job(engine, idempotency_key="given-back") == job_id
    with pytest.raises(IdempotencyConflict):  # more than were ever made or given back
        new_job(engine, idempotency_key="given-back", max_attempts=6)


def test_an_attempt_never_started_is_not_charged(engine, driver, settings, clock):
    """A worker killed with jobs claimed ahead in its buffer: each lost an
    attempt, and one on its last attempt failed ORPHANED without running."""
    job_id, _ = _running(engine, start=False, max_attempts=1)
    started, _ = _running(engine, max_attempts=1)  # its start written: charged
    clock.advance(settings.lease_seconds + 1)
    assert engine.reap()["released_jobs"] == 2
    row = job_row(driver, job_id)
    assert (row["status"], row["attempt_count"], row["max_attempts"]) == ("retry_wait", 1, 2)
    assert "it never started: the attempt is not charged" in events(driver, job_id)[-1]["message"]
    assert [a["status"] for a in attempts(driver, job_id)] == ["orphaned"]
    assert status_of(driver, started) == "failed"
    # It runs again, and completes, as its next attempt.
    clock.advance(60)
    engine.promote()
    got, a2 = claim_one(engine, "w2")
    assert (got, a2) == (job_id, 2)
    assert engine.settle("w2", [done(job_id, a2)]) == {job_id}
    assert status_of(driver, job_id) == "completed"


def test_attempts_given_back_stop_at_the_limit(engine, driver, settings, clock):
    """A job that kills its worker before its start is written, every time,
    runs no more than MAX_GIVEN_BACK_ATTEMPTS."""
    from hypermedia.queue.settle import MAX_GIVEN_BACK_ATTEMPTS

    job_id, _ = _running(engine, start=False, max_attempts=MAX_GIVEN_BACK_ATTEMPTS)
    with driver.tx() as tx:  # as if given back until its last attempt
        tx.update_job(job_id, ["claimed"], {"attempt_count": MAX_GIVEN_BACK_ATTEMPTS}, attempt=None)
    clock.advance(settings.lease_seconds + 1)
    engine.reap()
    assert job_row(driver, job_id)["status"] == "failed"


def test_live_lease_is_left_alone(engine, driver, settings, clock):
    job_id, _ = _running(engine)
    clock.advance(settings.lease_seconds - 1)
    before = snapshot(driver, job_id)
    assert engine.reap()["released_jobs"] == 0
    assert snapshot(driver, job_id) == before


def test_expired_lease_on_last_attempt_fails_orphaned(engine, driver, settings, clock):
    job_id, _ = _running(engine, max_attempts=1)
    clock.advance(settings.lease_seconds + 1)
    engine.reap()
    row = job_row(driver, job_id)
    assert (row["status"], row["outcome"], row["category"]) == (
        "failed",
        "orphaned",
        "provider_failure",
    )
    assert row["completed_at"] == clock.now


def test_expired_cancel_requested_job_is_cancelled(engine, driver, settings, clock):
    job_id, _ = _running(engine)
    engine.cancel(job_id)
    clock.advance(settings.lease_seconds + 1)
    assert engine.reap()["released_jobs"] == 1
    row = job_row(driver, job_id)
    assert (row["status"], row["outcome"]) == ("cancelled", "cancelled")
    assert transitions(driver, job_id)[-1] == ("cancel_requested", "cancelled")
    assert attempts(driver, job_id)[0]["status"] == "orphaned"


def test_reaped_job_runs_again_and_completes(engine, driver, settings, clock):
    job_id, _ = _running(engine)
    clock.advance(settings.lease_seconds + 1)
    engine.reap()
    clock.advance(1)
    engine.promote()
    _, a2 = claim_one(engine, "w2")
    assert engine.settle("w2", [done(job_id, a2)]) == {job_id}
    assert status_of(driver, job_id) == "completed"


# -- reaper: stale workers -----------------------------------------------------------------


def test_stale_worker_becomes_unhealthy_and_its_jobs_are_released(engine, driver, settings, clock):
    stale_at = clock.now - timedelta(seconds=settings.worker_stale_seconds + 1)
    fresh_at = clock.now - timedelta(seconds=settings.worker_stale_seconds - 5)
    _worker(driver, "ghost", stale_at)
    _worker(driver, "alive", fresh_at)
    _worker(driver, "gone", stale_at, status="terminated")
    lost_a, _ = _running(engine, "ghost")
    lost_b, _ = _running(engine, "ghost", start=False)
    kept, _ = _running(engine, "alive")
    kept_before = snapshot(driver, kept)

    # Their leases are all still valid: only the heartbeat marks ghost dead.
    assert engine.reap() == {"unhealthy_workers": 1, "terminated_workers": 0, "released_jobs": 2}
    assert _worker_status(driver, "ghost") == "unhealthy"
    assert _worker_status(driver, "alive") == "active"
    assert _worker_status(driver, "gone") == "terminated"
    # Its jobs are released: the row no longer says it holds any.
    with driver.read() as tx:
        held = {w: tx.worker(w)["current_jobs"] for w in ("ghost", "alive")}
    assert held == {"ghost": 0, "alive": 2}
    for job_id in (lost_a, lost_b):
        assert status_of(driver, job_id) == "retry_wait"
        assert attempts(driver, job_id)[0]["status"] == "orphaned"
        # The reaper ended the attempt, not the dead worker.
        assert (events(driver, job_id)[-1]["actor"], events(driver, job_id)[-1]["code"]) == (
            "reaper",
            "ORPHANED",
        )
    assert snapshot(driver, kept) == kept_before
    # Already unhealthy: not counted again.
    assert engine.reap()["unhealthy_workers"] == 0


def test_a_silent_draining_worker_keeps_its_drain(engine, driver, settings, clock):
    """Marked unhealthy, a stopped worker lost its drain: back, its heartbeat
    wrote active and it went on working."""
    _worker(driver, "paused", clock.now - timedelta(seconds=settings.worker_stale_seconds + 1))
    job_id, _ = _running(engine, "paused")
    with driver.tx() as tx:
        assert tx.set_worker_status("paused", ["active"], "draining")
    assert engine.reap() == {"unhealthy_workers": 1, "terminated_workers": 0, "released_jobs": 1}
    assert _worker_status(driver, "paused") == "draining"
    assert status_of(driver, job_id) == "retry_wait"  # released all the same
    assert engine.reap()["unhealthy_workers"] == 0  # taken once
    with driver.tx() as tx:  # it comes back: its heartbeat does not undo the drain
        tx.update_worker("paused", {"status": "active", "last_heartbeat": clock.now})
    assert _worker_status(driver, "paused") == "draining"
    clock.advance(settings.worker_gone_seconds + 1)  # silent for good this time
    assert engine.reap()["terminated_workers"] == 1
    assert _worker_status(driver, "paused") == "terminated"


def test_a_worker_silent_for_worker_gone_seconds_is_terminated(engine, driver, settings, clock):
    """A kill -9'd worker stayed `unhealthy` in `workers ls` for ever."""
    gone = settings.worker_gone_seconds
    _worker(driver, "killed", clock.now - timedelta(seconds=gone + 1), status="unhealthy")
    _worker(driver, "stopped", clock.now - timedelta(seconds=gone - 5), status="unhealthy")
    _worker(driver, "silent", clock.now - timedelta(seconds=gone + 1))  # live: unhealthy first
    assert engine.reap()["terminated_workers"] == 1
    assert _worker_status(driver, "killed") == "terminated"
    with driver.read() as tx:  # when it was given up, as a clean stop says its own
        assert tx.worker("killed")["terminated_at"] == clock.now
        assert tx.worker("stopped")["terminated_at"] is None
    assert _worker_status(driver, "stopped") == "unhealthy"
    assert _worker_status(driver, "silent") == "unhealthy"
    clock.advance(10)
    assert engine.reap()["terminated_workers"] == 2
    assert {_worker_status(driver, w) for w in ("stopped", "silent")} == {"terminated"}
    with driver.tx() as tx:  # only frozen, it comes back: alive, not "active, terminated at"
        tx.update_worker("killed", {"status": "idle", "last_heartbeat": clock.now})
    with driver.read() as tx:
        back = tx.worker("killed")
    assert (back["status"], back["terminated_at"]) == ("idle", None)


def test_only_this_machines_dead_workers_are_released(engine, driver, settings, clock):
    """A worker whose scratch folder another worker found unheld is released at
    once, but only on the same machine: over a network file system an flock
    may hold on one machine only, and another's live worker would look dead."""
    _worker(driver, W1, clock.now)
    with driver.tx() as tx:
        tx.conn.execute(workers.update().values(hostname="here"))
    job_id, _ = _running(engine, W1)
    assert engine.release_dead([W1], "elsewhere") == 0
    assert (_worker_status(driver, W1), status_of(driver, job_id)) == ("active", "processing")
    assert engine.release_dead([W1], "here") == 1
    assert (_worker_status(driver, W1), status_of(driver, job_id)) == ("unhealthy", "retry_wait")
    assert engine.release_dead([W1], "here") == 0  # taken once


def test_worker_heartbeat_exactly_at_the_limit_is_not_stale(engine, driver, settings, clock):
    _worker(driver, "edge", clock.now - timedelta(seconds=settings.worker_stale_seconds))
    assert engine.reap()["unhealthy_workers"] == 0
    assert _worker_status(driver, "edge") == "active"


# -- renew -----------------------------------------------------------------------------------


def test_renew_extends_the_lease(engine, driver, settings, clock):
    job_id, a = _running(engine)
    clock.advance(settings.lease_seconds * 0.75)
    assert engine.renew(W1, [(job_id, a)]) == {job_id: "processing"}
    assert job_row(driver, job_id)["visibility_timeout"] == clock.now + timedelta(
        seconds=settings.lease_seconds
    )
    # Past the original lease but inside the renewed one: nothing to reap.
    clock.advance(settings.lease_seconds * 0.5)
    assert engine.reap()["released_jobs"] == 0
    assert status_of(driver, job_id) == "processing"


def test_poll_statuses_does_not_extend_the_lease(engine, driver, settings, clock):
    job_id, a = _running(engine)
    before = job_row(driver, job_id)["visibility_timeout"]
    clock.advance(10)
    assert engine.poll_statuses(W1, [(job_id, a)]) == {job_id: "processing"}
    assert job_row(driver, job_id)["visibility_timeout"] == before


def test_renew_by_another_worker_or_attempt_changes_nothing(engine, driver, clock):
    job_id, a = _running(engine)
    before = snapshot(driver, job_id)
    clock.advance(5)
    assert engine.renew("w2", [(job_id, a)]) == {}
    assert engine.renew(W1, [(job_id, a + 1)]) == {}
    assert engine.renew(W1, []) == {}
    assert snapshot(driver, job_id) == before


def test_renew_omits_jobs_no_longer_held(engine, driver, settings, clock):
    kept, ka = _running(engine)
    lost, la = _running(engine)
    # ``lost``'s lease runs out while ``kept`` is renewed in time.
    clock.advance(settings.lease_seconds * 0.75)
    engine.renew(W1, [(kept, ka)])
    clock.advance(settings.lease_seconds * 0.5)
    assert engine.reap()["released_jobs"] == 1
    # Reaped into retry_wait: W1 no longer holds it and must stop its child.
    assert engine.renew(W1, [(kept, ka), (lost, la)]) == {kept: "processing"}
    assert engine.poll_statuses(W1, [(lost, la)]) == {}
    clock.advance(settings.backoff_max_seconds + 1)
    engine.promote()
    claim_one(engine, "w2")
    assert engine.renew(W1, [(kept, ka), (lost, la)]) == {kept: "processing"}
    assert job_row(driver, lost)["claimed_by"] == "w2"


def test_renew_omits_finished_jobs(engine, driver):
    job_id, a = _running(engine)
    engine.settle(W1, [done(job_id, a)])
    assert engine.renew(W1, [(job_id, a)]) == {}


# -- hand back ---------------------------------------------------------------------------------


def test_hand_back_returns_an_unstarted_job_as_if_never_claimed(engine, driver, clock):
    job_id, a = _running(engine, start=False)
    clock.advance(1)
    assert engine.hand_back(W1, [(job_id, a)]) == {job_id}
    row = job_row(driver, job_id)
    assert row["status"] == "queued" and row["attempt_count"] == 0
    assert row["claimed_by"] is None and row["claimed_at"] is None
    assert row["visibility_timeout"] is None
    assert attempts(driver, job_id) == []
    assert transitions(driver, job_id)[-1] == ("claimed", "queued")
    # The next claim is attempt 1 again, without a duplicate attempt row.
    _, a2 = claim_one(engine, "w2")
    assert a2 == 1
    assert [(x["attempt_number"], x["worker_id"]) for x in attempts(driver, job_id)] == [(1, "w2")]


def test_hand_back_of_a_retried_job_keeps_earlier_attempts(engine, driver, clock):
    from ._helpers import failed

    job_id, a = _running(engine)
    engine.settle(W1, [failed(job_id, a, "CRASHED")])
    clock.advance(60)
    engine.promote()
    _, a2 = claim_one(engine)
    assert engine.hand_back(W1, [(job_id, a2)]) == {job_id}
    assert job_row(driver, job_id)["attempt_count"] == 1
    assert [x["attempt_number"] for x in attempts(driver, job_id)] == [1]


def test_a_drain_ends_a_job_whose_cancel_was_asked_before_its_start(engine, driver):
    """It was neither handed back nor cancelled: cancel_requested with an
    open attempt until its lease (no longer renewed) ran out and the reaper
    took it as orphaned."""
    job_id, a = _running(engine, start=False)
    assert engine.cancel(job_id) == "cancel_requested"
    assert engine.hand_back(W1, [(job_id, a)]) == set()  # not back in the queue
    assert engine.confirm_cancels("w2", [(job_id, a)]) == set()  # fenced
    assert engine.confirm_cancels(W1, [(job_id, a)]) == {job_id}  # what a drain does next
    row = job_row(driver, job_id)
    assert (row["status"], row["outcome"]) == ("cancelled", "cancelled")
    assert [(x["attempt_number"], x["status"]) for x in attempts(driver, job_id)] == [
        (a, "cancelled")
    ]
    assert transitions(driver, job_id)[-1] == ("cancel_requested", "cancelled")


def test_hand_back_is_fenced_and_only_for_unstarted_jobs(engine, driver):
    claimed, ca = _running(engine, start=False)
    started, sa_ = _running(engine)
    before = snapshot(driver, claimed), snapshot(driver, started)
    assert engine.hand_back("w2", [(claimed, ca)]) == set()
    assert engine.hand_back(W1, [(claimed, ca + 1)]) == set()
    assert engine.hand_back(W1, [(started, sa_)]) == set()
    assert (snapshot(driver, claimed), snapshot(driver, started)) == before


# -- leader lease --------------------------------------------------------------------------------


def _take(driver: Driver, holder: str, now, seconds: float = 15, name: str = "maint") -> bool:
    with driver.tx() as tx:
        return tx.take_lease(name, holder, now, now + timedelta(seconds=seconds))


def _holder(driver: Driver, now, name: str = "maint") -> str | None:
    with driver.read() as tx:
        return tx.lease_holder(name, now)


def test_leader_lease_one_holder_renewal_and_takeover(driver, clock):
    t0 = clock.now
    assert _holder(driver, t0) is None
    assert _take(driver, "a", t0)
    assert not _take(driver, "b", t0)
    assert _holder(driver, t0) == "a"
    # The holder renews before expiry; b still cannot take it.
    assert _take(driver, "a", t0 + timedelta(seconds=10))
    assert not _take(driver, "b", t0 + timedelta(seconds=20))
    assert _holder(driver, t0 + timedelta(seconds=24)) == "a"
    # a goes quiet; after expiry b takes over and a cannot come back.
    later = t0 + timedelta(seconds=26)
    assert _holder(driver, later) is None
    assert _take(driver, "b", later)
    assert _holder(driver, later) == "b"
    assert not _take(driver, "a", later + timedelta(seconds=1))


def test_leases_are_per_name(driver, clock):
    assert _take(driver, "a", clock.now, name="maint")
    assert _take(driver, "b", clock.now, name="other")
    assert _holder(driver, clock.now, "maint") == "a"
    assert _holder(driver, clock.now, "other") == "b"


def test_release_lease_only_by_holder(driver, clock):
    assert _take(driver, "a", clock.now)
    with driver.tx() as tx:
        tx.release_lease("maint", "b")
    assert _holder(driver, clock.now) == "a"
    with driver.tx() as tx:
        tx.release_lease("maint", "a")
    assert _holder(driver, clock.now) is None
    assert _take(driver, "b", clock.now)
    assert _holder(driver, clock.now) == "b"


def test_racing_candidates_elect_exactly_one_leader(driver, database_url, clock):
    won = race(database_url, 6, lambda drv, i: _take(drv, f"c{i}", clock.now))
    assert all(isinstance(w, bool) for w in won), won
    assert won.count(True) == 1
    assert _holder(driver, clock.now) == f"c{won.index(True)}"


def test_the_reaper_waits_once_per_taking_of_the_lead_and_nothing_else_holds_it(
    engine, monkeypatch
):
    """A new leader (or one whose database came back) gives the workers
    WORKER_GRACE_SECONDS before its reaper judges them; after it, a service
    failing every run (a promoter the database refuses) does not keep the
    reaper from running: it did when any transient failure restarted the grace."""
    import threading
    import time

    import sqlalchemy as sa

    from hypermedia.scheduler import leader as leader_module

    monkeypatch.setattr(leader_module, "WORKER_GRACE_SECONDS", 0.6)
    runs: list[float] = []

    class Reaper:
        name, period, waits_for_workers = "reaper", 0.05, True

        def run_once(self) -> None:
            runs.append(time.monotonic())

    class Promoter:
        name, period = "promoter", 0.05

        def run_once(self) -> None:
            raise sa.exc.OperationalError("UPDATE", {}, Exception("too many connections"))

    stop = threading.Event()
    node = leader_module.Leader(engine, "node-a", stop, services=[Reaper(), Promoter()])
    started = time.monotonic()
    node.start()
    try:
        time.sleep(1.6)
    finally:
        stop.set()
        node.join(5)
    assert node.is_leader or not node.is_alive()
    assert runs, "the reaper never ran"
    assert runs[0] - started >= 0.6  # the grace after taking the lead
    assert len(runs) >= 5  # and then every period, the failing promoter notwithstanding


@pytest.mark.parametrize("database_url", [b for b in BACKENDS if b != "sqlite"], indirect=True)
def test_the_promoter_skips_a_job_another_transaction_holds(engine, driver, clock):
    """One held row (a frozen process mid-transaction) stalled every promotion
    behind it, the leader's other services and its lease with them; a second
    leader then promoted the same jobs again."""
    import sqlalchemy as sa

    held, free = (drive_to(engine, driver, "retry_wait") for _ in range(2))
    clock.advance(3600)
    with driver.tx() as tx:
        tx.conn.execute(
            sa.text("SELECT job_id FROM processing_jobs WHERE job_id = :j FOR UPDATE"),
            {"j": held},
        )
        assert engine.promote() == 1  # at once: not waited for
        assert (status_of(driver, held), status_of(driver, free)) == ("retry_wait", "queued")
    assert engine.promote() == 1 and status_of(driver, held) == "queued"
    assert engine.promote() == 0
    said = [e["message"] for j in (held, free) for e in events(driver, j)]
    assert said.count("backoff over") == 2  # one event each


def test_a_job_waiting_to_retry_names_no_holder(engine, driver, settings, clock):
    """It kept the last attempt's worker and start: a waiting job looked held."""
    job_id, _ = _running(engine)
    clock.advance(settings.lease_seconds + 1)
    engine.reap()
    row = job_row(driver, job_id)
    assert row["status"] == "retry_wait"
    assert (row["claimed_by"], row["claimed_at"], row["started_at"]) == (None, None, None)
    [att] = attempts(driver, job_id)
    assert att["worker_id"] == W1 and att["started_at"] is not None  # history kept

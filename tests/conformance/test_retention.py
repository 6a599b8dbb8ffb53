"""Job retention on every database: finished jobs past their time go with their
history; live and younger jobs, credit use, photos' variants and bound outputs stay."""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from hypermedia.db.driver import Driver
from hypermedia.db.schema import job_attempts, job_events, job_outputs
from hypermedia.db.schema_storage import photo_objects, photos
from hypermedia.errors import InvalidRequest
from hypermedia.photos import Photos
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import AttemptResult, NewJob, Output
from hypermedia.queue.profiles import Credits, Prices, Profiles
from hypermedia.scheduler.maintenance import default_services
from hypermedia.scheduler.retention import JobRetention
from hypermedia.storage.gc import GarbageCollector
from hypermedia.storage.ledger import Storage
from tests.conftest import BACKENDS

from ._helpers import W1, claim_one, done, drive_to, failed, snapshot
from .test_photos import _add, _complete, image_pipelines

DAY = 86400.0
servers_only = pytest.mark.parametrize(
    "database_url", [b for b in BACKENDS if b != "sqlite"], indirect=True
)


@pytest.fixture
def photo_service(engine: Engine, storage: Storage) -> Iterator[Photos]:
    """Photos whose image variant jobs can be enqueued."""
    with image_pipelines(storage.db):
        yield Photos(engine, storage)


def _history(driver: Driver, job_ids: list[int]) -> dict[str, int]:
    """Rows left of these jobs, per table."""
    with driver.read() as tx:
        return {
            t.name: int(
                tx.conn.execute(
                    sa.select(sa.func.count()).select_from(t).where(t.c.job_id.in_(job_ids))
                ).scalar_one()
            )
            for t in (job_attempts, job_events, job_outputs)
        }


def _exists(driver: Driver, job_id: int) -> bool:
    with driver.read() as tx:
        return tx.job(job_id) is not None


def _with_output(engine: Engine, storage: Storage, data: bytes) -> tuple[int, int]:
    """A debug.copy job completed with an output object: (job id, object id)."""
    src = storage.put(io.BytesIO(b"input " + data))
    out = storage.put(io.BytesIO(data), role="copy")
    job_id = engine.enqueue(NewJob("debug.copy", object_id=src["object_id"]))
    got, attempt = claim_one(engine)
    assert got == job_id
    output = Output("copy", "text/plain", object_id=out["object_id"])
    result = AttemptResult(job_id, attempt, "completed", outputs=[output])
    assert engine.flush(W1, [], [result]) == {job_id}
    return job_id, int(out["object_id"])


def _object_state(storage: Storage, object_id: int) -> str | None:
    with storage.db.read() as tx:
        row = tx.object(object_id)
    return row["state"] if row else None


def test_finished_jobs_past_retention_go_with_their_history(engine, driver, clock) -> None:
    old_done = {s: drive_to(engine, driver, s) for s in ("completed", "failed", "cancelled")}
    old_live = {
        s: drive_to(engine, driver, s)
        # Claimable ones last: each recipe claims the first ready job.
        for s in ("claimed", "processing", "retry_wait", "cancel_requested", "created", "queued")
    }
    clock.advance(31 * DAY)
    young = drive_to(engine, driver, "completed", queue="other")  # not behind the old ones
    kept = [*old_live.values(), young]
    before = {j: snapshot(driver, j) for j in kept}
    assert _history(driver, list(old_done.values()))["job_events"] > 0

    assert JobRetention(engine).run_once() == 3
    assert not any(_exists(driver, j) for j in old_done.values())
    assert _history(driver, list(old_done.values())) == {
        "job_attempts": 0,
        "job_events": 0,
        "job_outputs": 0,
    }
    assert {j: snapshot(driver, j) for j in kept} == before
    assert JobRetention(engine).run_once() == 0


def test_a_new_job_never_gets_the_id_of_one_pruned(engine, driver, clock) -> None:
    """SQLite would give the next job the id of the newest one pruned: a
    client still holding that id would read another job's outputs."""
    old = drive_to(engine, driver, "completed")
    with driver.read() as tx:
        attempt = tx.attempts(old)[0]["attempt_id"]
    clock.advance(31 * DAY)
    assert JobRetention(engine).run_once() == 1  # every job gone
    new = drive_to(engine, driver, "completed")
    assert new > old
    with driver.read() as tx:
        assert tx.attempts(new)[0]["attempt_id"] > attempt


def test_retention_counts_from_when_a_job_ended(engine, driver, clock) -> None:
    job_id = drive_to(engine, driver, "failed")
    clock.advance(20 * DAY)
    engine.retry(job_id)  # a new attempt: it has not ended any more
    got, attempt = claim_one(engine)
    assert engine.settle(W1, [failed(got, attempt, "CORRUPT_INPUT")]) == {job_id}
    clock.advance(20 * DAY)  # 40 days since created, 20 since it ended
    assert JobRetention(engine).run_once() == 0 and _exists(driver, job_id)
    clock.advance(11 * DAY)
    assert JobRetention(engine).run_once() == 1 and not _exists(driver, job_id)


def test_zero_days_keeps_every_job(engine, driver, clock, settings) -> None:
    job_id = drive_to(engine, driver, "completed")
    clock.advance(3650 * DAY)
    kept = Engine(driver, settings.with_(job_retention_days=0), clock=clock)
    assert JobRetention(kept).run_once() == 0 and _exists(driver, job_id)
    assert JobRetention(engine, days=0).run_once() == 0 and _exists(driver, job_id)
    assert JobRetention(engine, days=1).run_once() == 1


def test_many_batches(engine, driver, clock, monkeypatch) -> None:
    from hypermedia.scheduler import retention

    monkeypatch.setattr(retention, "BATCH", 4)
    ids = [drive_to(engine, driver, "cancelled") for _ in range(11)]
    clock.advance(31 * DAY)
    assert JobRetention(engine).run_once() == 11
    assert not any(_exists(driver, j) for j in ids)


def test_credit_use_and_budgets_outlive_the_jobs(engine, driver, clock) -> None:
    key = f"c-{uuid.uuid4().hex[:12]}"
    Profiles(engine).create(key, "debug.sleep", {}, credits=Prices(5, 0, 0, 0))
    credits = Credits(engine)
    paid = [engine.enqueue(NewJob("debug.sleep", profile=key, project_id="p1")) for _ in range(2)]
    for _ in paid:
        got, attempt = claim_one(engine)
        assert engine.settle(W1, [done(got, attempt)]) == {got}
    free = engine.enqueue(NewJob("debug.sleep", profile=key, project_id="p1"))
    assert engine.cancel(free) == "cancelled"  # cancelled jobs cost nothing
    credits.set_budget("p1", 12)
    before = credits.show()
    assert [(r["project_id"], r["used"]) for r in before] == [("p1", 10)]
    clock.advance(31 * DAY)

    assert JobRetention(engine).run_once() == 3
    assert credits.show() == before
    with pytest.raises(InvalidRequest, match="credit budget exceeded"):
        engine.enqueue(NewJob("debug.sleep", profile=key, project_id="p1"))
    # A project without a budget row keeps its use too.
    other = engine.enqueue(NewJob("debug.sleep", profile=key, project_id="p2"))
    got, attempt = claim_one(engine)
    assert engine.settle(W1, [done(got, attempt)]) == {other}
    clock.advance(31 * DAY)
    assert JobRetention(engine).run_once() == 1
    assert {r["project_id"]: r["used"] for r in credits.show()} == {"p1": 10, "p2": 5}


def test_outputs_of_pruned_jobs_are_left_to_gc_unless_bound(engine, storage, clock) -> None:
    loose_job, loose = _with_output(engine, storage, b"nobody keeps me")
    bound_job, bound = _with_output(engine, storage, b"a photo keeps me")
    with storage.db.tx() as tx:
        pid = str(uuid.uuid4())
        tx.conn.execute(photos.insert().values(photo_id=pid))
        tx.conn.execute(photo_objects.insert().values(photo_id=pid, object_id=bound, role="thumb"))
    gc = GarbageCollector(Storage(storage.db, storage.settings.with_(gc_unreferenced_seconds=0)))
    gc.run_once()
    assert _object_state(storage, loose) == _object_state(storage, bound) == "ready"

    clock.advance(31 * DAY)
    assert JobRetention(engine).run_once() == 2
    assert not _exists(storage.db, loose_job) and not _exists(storage.db, bound_job)
    gc.run_once()
    assert _object_state(storage, loose) is None
    assert _object_state(storage, bound) == "ready"
    with storage.open(bound) as f:
        assert f.read() == b"a photo keeps me"


def test_jobs_a_photo_still_waits_for_are_kept(
    photo_service: Photos, engine: Engine, driver: Driver, clock: Any
) -> None:
    row = _add(photo_service)
    for c in engine.claim(W1, ["images"], 10):
        assert engine.flush(W1, [], [failed(c.job_id, c.attempt, "CORRUPT_INPUT")]) == {c.job_id}
    assert photo_service.attach_variants()["variants_failed"] == 1
    shown = photo_service.get(row["id"])["variants"]
    unrelated = drive_to(engine, driver, "failed")
    clock.advance(31 * DAY)

    assert JobRetention(engine).run_once() == 1
    assert not _exists(driver, unrelated)
    # The photo's variant_jobs row still names its jobs: they stay, and say why.
    assert photo_service.get(row["id"])["variants"] == shown
    assert {v["status"] for v in shown.values()} == {"failed"}


def test_jobs_kept_for_a_photo_do_not_hold_back_older_ones_behind_them(
    photo_service: Photos, engine: Engine, driver: Driver, clock: Any, monkeypatch: Any
) -> None:
    # A batch of nothing but kept jobs (here both of a photo's, with batches
    # of 2) ended the run: 500 failed variants stopped retention for good.
    from hypermedia.scheduler import retention

    monkeypatch.setattr(retention, "BATCH", 2)
    _add(photo_service)
    kept = [c.job_id for c in engine.claim(W1, ["images"], 10)]
    for job_id in kept:
        assert engine.flush(W1, [], [failed(job_id, 1, "CORRUPT_INPUT")]) == {job_id}
    assert photo_service.attach_variants()["variants_failed"] == 1
    clock.advance(1)
    unrelated = [drive_to(engine, driver, "failed") for _ in range(3)]
    clock.advance(31 * DAY)

    assert JobRetention(engine).run_once() == 3
    assert not any(_exists(driver, j) for j in unrelated)
    assert all(_exists(driver, j) for j in kept) and len(kept) == 2


def test_attached_variants_outlive_their_jobs(
    photo_service: Photos,
    engine: Engine,
    storage: Storage,
    driver: Driver,
    clock: Any,
    tmp_path: Any,
) -> None:
    row = _add(photo_service)
    made = _complete(engine, storage, tmp_path)
    assert photo_service.attach_variants()["variants_done"] == 1
    clock.advance(31 * DAY)

    assert JobRetention(engine).run_once() == 2
    assert not any(_exists(driver, j) for j in made)
    gc = GarbageCollector(Storage(storage.db, storage.settings.with_(gc_unreferenced_seconds=0)))
    gc.run_once()
    shown = photo_service.get(row["id"])
    assert {v["status"] for v in shown["variants"].values()} == {"completed"}
    assert all(_object_state(storage, o) == "ready" for o in made.values())


@servers_only
def test_a_job_another_transaction_holds_is_skipped_not_waited_for(engine, driver, clock) -> None:
    held, free = drive_to(engine, driver, "failed"), drive_to(engine, driver, "failed")
    clock.advance(31 * DAY)
    with driver.tx() as tx:
        tx.conn.execute(
            sa.text("SELECT job_id FROM processing_jobs WHERE job_id = :j FOR UPDATE"),
            {"j": held},
        )
        assert JobRetention(engine).run_once() == 1
    assert _exists(driver, held) and not _exists(driver, free)
    assert JobRetention(engine).run_once() == 1 and not _exists(driver, held)


def test_the_leader_runs_job_retention(engine) -> None:
    services = {s.name: s for s in default_services(engine)}
    assert isinstance(services["job-retention"], JobRetention)
    assert services["job-retention"].period == engine.settings.retention_interval_seconds
    assert services["job-retention"].backlog.budget_seconds is not None
    assert services["gc"].backlog.budget_seconds is not None


def test_a_leader_run_stops_on_its_budget_and_comes_back_soon(engine, driver, clock, monkeypatch):
    from hypermedia.scheduler import budget, retention

    monkeypatch.setattr(retention, "BATCH", 2)
    ids = [drive_to(engine, driver, "cancelled") for _ in range(7)]
    clock.advance(31 * DAY)
    svc = JobRetention(engine, backlog=budget.Backlog(3600, 0.0))  # one batch a run
    assert svc.run_once() == 2 and svc.backlog.behind
    assert svc.period == budget.CATCH_UP_SECONDS
    assert [svc.run_once() for _ in range(3)] == [2, 2, 1]
    assert not svc.backlog.behind and svc.period == 3600
    assert not any(_exists(driver, j) for j in ids)

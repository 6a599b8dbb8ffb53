"""Storage and photo findings of a QA pass on MariaDB, on every database.

* A photo deleted while its variant job runs: the output that arrives after
  is retired, not pinned for the month job retention keeps the job.
* A completion whose output row the pending sweep took is refused and its
  attempt retried; the blob it leaves gets a row for GC to delete it.
  ``HYPERMEDIA_GC_PENDING_SECONDS`` under an hour is refused.
* One ``deleting`` row GC cannot (or must not) delete is kept and said, and
  the run goes on; a referenced one keeps its blob.
* ``pools rm`` is not blocked by a running worker's reservations, and a
  worker that fills one afterwards fails retryably.
* ``jobs retry`` of a job whose input GC collected is a request that is
  wrong in itself (InvalidRequest: exit 2, 422), not Refused (exit 1).
* A variant waiting in ``retry_wait`` says so, and why.
* Users see ``ready`` objects only: a refused upload is gone from the answer on.
"""

from __future__ import annotations

import io
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from hypermedia.config import MIN_GC_PENDING_SECONDS, load_settings
from hypermedia.db.driver import Driver
from hypermedia.db.schema import job_outputs
from hypermedia.db.schema_storage import photo_objects
from hypermedia.db.storage_queries import StorageQueries
from hypermedia.errors import InvalidRequest, NotFound, Refused
from hypermedia.photos import Photos
from hypermedia.photos.service import VARIANTS, variant_key
from hypermedia.queue.engine import LOST_OUTPUT, Engine
from hypermedia.queue.models import AttemptResult, NewJob, Output
from hypermedia.storage.base import StorageUnavailable
from hypermedia.storage.gc import ROW_REFUSED, STILL_REFERENCED, GarbageCollector
from hypermedia.storage.ledger import Storage
from hypermedia.storage.reserve import RESERVE, RESERVE_TTL
from tests.conformance.test_photos import image_pipelines
from tests.conftest import BACKENDS
from tests.media import png

Row = dict[str, Any]

# SQLite runs one writer at a time: there is no interleaving to test there.
servers_only = pytest.mark.parametrize(
    "database_url", [b for b in BACKENDS if b != "sqlite"], indirect=True
)


@pytest.fixture
def image_jobs(driver: Driver) -> Iterator[None]:
    with image_pipelines(driver):
        yield


@pytest.fixture
def photos(engine: Engine, storage: Storage) -> Photos:
    return Photos(engine, storage)


def _gc(
    storage: Storage, *, unreferenced: float = 0.0, pending: float = 3600.0
) -> GarbageCollector:
    s = storage.settings.with_(gc_unreferenced_seconds=unreferenced, gc_pending_seconds=pending)
    return GarbageCollector(Storage(storage.db, s))


def _row(storage: Storage, object_id: int) -> Row | None:
    with storage.db.read() as tx:
        return tx.object(object_id)


def _state(storage: Storage, object_id: int) -> str | None:
    row = _row(storage, object_id)
    return row["state"] if row else None


def _path(storage: Storage, key: str) -> Path:
    return storage.settings.home / "storage" / key


def _file(storage: Storage, data: bytes) -> Path:
    path = storage.settings.home / f"f-{uuid.uuid4().hex}"
    path.write_bytes(data)
    return path


def _output(obj: Row, output_type: str = "copy", mime: str = "text/plain") -> Output:
    return Output(
        output_type,
        mime,
        object_id=obj["object_id"],
        output_key=obj["storage_key"],
        output_size_bytes=obj["size"],
        checksum=obj["checksum"],
    )


def _all_outputs(driver: Driver, job_id: int) -> list[Row]:
    """Every job_outputs row of the job, retired ones too (``tx.outputs`` hides those)."""
    with driver.read() as tx:
        q = sa.select(job_outputs).where(job_outputs.c.job_id == job_id)
        return [dict(r._mapping) for r in tx.conn.execute(q)]


# -- 1. a photo deleted while its variant job runs ---------------------------------


def test_outputs_of_a_deleted_photos_running_variant_job_are_retired(
    photos: Photos, storage: Storage, engine: Engine, driver: Driver, image_jobs: None
) -> None:
    """QA: `photos rm` while the preview was processing; the attempt finished
    anyway, and its output stayed referenced (deleted_at NULL), ready, bound to
    nothing, until job retention pruned the job 30 days later."""
    photo = photos.add(io.BytesIO(png(31, 17)), filename="slow.png")
    claimed = engine.claim("w1", ["images"], 10)
    engine.start("w1", [(c.job_id, c.attempt) for c in claimed])
    photos.delete(photo["id"])
    # Asked to stop, in the delete's own transaction.
    assert {engine.get(c.job_id)["status"] for c in claimed} == {"cancel_requested"}
    made = {}
    for c in claimed:  # the attempts finish anyway
        role = "thumb" if c.job_type == VARIANTS["thumb"] else "preview"
        out = storage.add_output(c.pool_id or 0, role, _file(storage, png(8, 5)), "image/png", "")
        result = AttemptResult(
            c.job_id, c.attempt, "completed", outputs=[_output(out, role, "image/png")]
        )
        assert engine.flush("w1", [], [result]) == {c.job_id}
        made[c.job_id] = out
    for job_id, out in made.items():
        assert engine.get(job_id)["status"] == "completed"
        (row,) = _all_outputs(driver, job_id)
        assert row["object_id"] == out["object_id"] and row["deleted_at"] is not None
        assert _state(storage, out["object_id"]) == "ready"  # made, then pins nothing
    report = _gc(storage).run_once()
    assert report.deleted == 3  # the original and both variants: no photo uses them
    assert {_state(storage, o["object_id"]) for o in made.values()} == {None}
    assert not any(_path(storage, o["storage_key"]).exists() for o in made.values())


def test_a_cancelled_variant_job_of_a_photo_still_there_keeps_its_output(
    photos: Photos, storage: Storage, engine: Engine, image_jobs: None
) -> None:
    """Only a photo that is gone lets its job's outputs go: a completion from
    cancel_requested of a photo that still exists keeps its outputs."""
    photo = photos.add(io.BytesIO(png(31, 17)), filename="sea.png")
    (c, *_) = engine.claim("w1", ["images"], 10)
    engine.start("w1", [(c.job_id, c.attempt)])
    engine.cancel(c.job_id)  # by hand: the photo stays
    out = storage.add_output(c.pool_id or 0, "thumb", _file(storage, png(8, 5)), "image/png", "")
    result = AttemptResult(
        c.job_id, c.attempt, "completed", outputs=[_output(out, "thumb", "image/png")]
    )
    engine.flush("w1", [], [result])
    assert [o["object_id"] for o in engine.get(c.job_id)["outputs"]] == [out["object_id"]]
    assert photos.get(photo["id"])["id"] == photo["id"]


@servers_only
def test_a_delete_waits_for_a_completion_in_flight_and_retires_its_outputs(
    photos: Photos, storage: Storage, engine: Engine, driver: Driver, image_jobs: None
) -> None:
    """The race the delete's job locks close: an attempt completing while the
    photo is deleted.  Read without a lock and stopped after the commit, the
    delete retired the outputs there were (none yet) and the completion then
    committed outputs that pinned their objects."""
    photo = photos.add(io.BytesIO(png(31, 17)), filename="sea.png")
    claimed = engine.claim("w1", ["images"], 10)
    engine.start("w1", [(c.job_id, c.attempt) for c in claimed])
    c = claimed[0]
    out = storage.add_output(c.pool_id or 0, "thumb", _file(storage, png(8, 5)), "image/png", "")
    result = AttemptResult(
        c.job_id, c.attempt, "completed", outputs=[_output(out, "thumb", "image/png")]
    )
    errors: list[BaseException] = []

    def delete() -> None:
        try:
            photos.delete(photo["id"])
        except BaseException as exc:  # pragma: no cover - said by the assert below
            errors.append(exc)

    with driver.tx() as tx:  # the worker's settling transaction, held open
        assert tx.job(c.job_id, lock=True) is not None
        deleting = threading.Thread(target=delete)
        deleting.start()
        deleting.join(0.5)
        assert deleting.is_alive()  # waits for the job row
        assert engine._settle(tx, "w1", [result]) == {c.job_id}
    deleting.join(30)
    assert not deleting.is_alive() and errors == []
    (row,) = _all_outputs(driver, c.job_id)
    assert row["deleted_at"] is not None  # seen and retired by the delete
    assert engine.get(c.job_id)["status"] == "completed"


# -- 2. a completion whose output row the pending sweep took -----------------------


def _copy_job(storage: Storage, engine: Engine) -> tuple[int, Any, Row]:
    src = storage.put(io.BytesIO(b"input"))
    job_id = engine.enqueue(NewJob("debug.copy", object_id=src["object_id"]))
    (c,) = engine.claim("w1", ["bulk"], 1)
    return job_id, c, src


def _refused(engine: Engine, job_id: int) -> None:
    job = engine.get(job_id)
    assert job["status"] == "retry_wait", job["status"]
    assert (job["error_code"], job["safe_reason"]) == ("STORAGE_UNAVAILABLE", LOST_OUTPUT)
    assert job["outputs"] == [] and job["result"] is None
    (attempt,) = job["attempts"]
    assert (attempt["status"], attempt["error_code"]) == ("failed", "STORAGE_UNAVAILABLE")


def test_a_completion_whose_output_row_was_swept_is_retried(
    storage: Storage, engine: Engine
) -> None:
    """QA: `gc run-once` with a pending age of 0 while a worker stored its
    output: the job completed, its job_outputs row named an object with no
    row, and the blob stayed on disk where neither GC nor a scrub looks."""
    job_id, c, src = _copy_job(storage, engine)
    out = storage.add_output(c.pool_id, "copy", _file(storage, b"out"), "text/plain", "")
    sibling = storage.add_output(c.pool_id, "copy", _file(storage, b"two"), "text/plain", "")
    # The sweep took the first output's row before its blob was written, as
    # GC does a pending row (marked, then deleted: nothing was under its prefix).
    with storage.db.tx() as tx:
        tx.mark_deleting([out["object_id"]], "pending", engine.clock())
        assert tx.delete_object_row(out["object_id"])
    blob = _path(storage, out["storage_key"])
    assert blob.exists()  # written after: on no row
    done = AttemptResult(
        job_id, c.attempt, "completed", outputs=[_output(out), _output(sibling, "copy2")]
    )
    assert engine.flush("w1", [], [done]) == {job_id}
    _refused(engine, job_id)
    assert _state(storage, sibling["object_id"]) == "deleting"  # handed to GC at once
    # The blob whose row was gone has a deleting row of its own, for GC.
    (orphan,) = [r for r in storage.list(reserved=True) if r["storage_key"] == out["storage_key"]]
    assert (orphan["state"], orphan["pool_id"]) == ("deleting", c.pool_id)
    assert [r["object_id"] for r in storage.list()] == [src["object_id"]]  # users see the input
    report = _gc(storage, unreferenced=3600).run_once()
    assert report.deleted == 2 and report.kept == 0
    assert not blob.exists() and not _path(storage, sibling["storage_key"]).exists()
    assert storage.list(reserved=True, state="deleting") == []


def test_a_completion_after_a_real_pending_sweep_is_retried(
    storage: Storage, engine: Engine
) -> None:
    """The same through GC itself: it marks and sweeps the reserved row (and
    the blob under its prefix); the completion finds the row gone."""
    job_id, c, _ = _copy_job(storage, engine)
    out = storage.add_output(c.pool_id, "copy", _file(storage, b"out"), "text/plain", "")
    report = _gc(storage, pending=0, unreferenced=3600).run_once()
    assert report.marked_pending == RESERVE and _state(storage, out["object_id"]) is None
    done = AttemptResult(job_id, c.attempt, "completed", outputs=[_output(out)])
    assert engine.flush("w1", [], [done]) == {job_id}
    _refused(engine, job_id)
    _gc(storage, unreferenced=3600).run_once()
    assert not _path(storage, out["storage_key"]).exists()
    assert storage.list(reserved=True, state="deleting") == []


def test_a_completion_whose_output_row_is_marked_deleting_is_retried(
    storage: Storage, engine: Engine
) -> None:
    """GC marked the row but has not swept it yet: refused too, and the
    sweep that follows deletes the blob by the reserved row's prefix."""
    job_id, c, _ = _copy_job(storage, engine)
    out = storage.add_output(c.pool_id, "copy", _file(storage, b"out"), "text/plain", "")
    with storage.db.tx() as tx:
        assert tx.mark_deleting([out["object_id"]], "pending", engine.clock()) == 1
    done = AttemptResult(job_id, c.attempt, "completed", outputs=[_output(out)])
    assert engine.flush("w1", [], [done]) == {job_id}
    _refused(engine, job_id)
    assert _state(storage, out["object_id"]) == "deleting"
    _gc(storage, unreferenced=3600).run_once()
    assert _state(storage, out["object_id"]) is None
    assert not _path(storage, out["storage_key"]).exists()


def test_the_retry_of_a_refused_completion_completes(storage: Storage, engine: Engine) -> None:
    job_id, c, _ = _copy_job(storage, engine)
    out = storage.add_output(c.pool_id, "copy", _file(storage, b"out"), "text/plain", "")
    with storage.db.tx() as tx:
        tx.mark_deleting([out["object_id"]], "pending", engine.clock())
    engine.flush("w1", [], [AttemptResult(job_id, c.attempt, "completed", outputs=[_output(out)])])
    engine.clock.advance(3600)  # type: ignore[attr-defined]
    assert engine.promote() == 1
    (again,) = engine.claim("w1", ["bulk"], 1)
    out = storage.add_output(c.pool_id, "copy", _file(storage, b"out"), "text/plain", "")
    engine.flush(
        "w1", [], [AttemptResult(job_id, again.attempt, "completed", outputs=[_output(out)])]
    )
    assert engine.get(job_id)["status"] == "completed"
    assert storage.get(out["object_id"])["size"] == 3


def test_a_pending_sweep_shorter_than_an_hour_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep assumed hours (storage/reserve.py: a reservation lives 60 s,
    then its upload); nothing enforced it, and 0 took rows in use."""
    assert MIN_GC_PENDING_SECONDS >= 10 * RESERVE_TTL
    for bad in ("0", "60", "3599.5"):
        monkeypatch.setenv("HYPERMEDIA_GC_PENDING_SECONDS", bad)
        with pytest.raises(InvalidRequest, match="GC_PENDING_SECONDS must be at least 3600"):
            load_settings()
    monkeypatch.setenv("HYPERMEDIA_GC_PENDING_SECONDS", "3600")
    assert load_settings().gc_pending_seconds == 3600


# -- 3. one row GC cannot delete -----------------------------------------------------


def test_gc_keeps_a_referenced_deleting_object_and_goes_on(
    photos: Photos, storage: Storage, driver: Driver
) -> None:
    """QA: a binding to a `deleting` object (by hand in SQL): GC deleted the
    bound blob, then failed on the row's foreign key (MariaDB 1451) on this
    and every later run, and no other row was ever swept."""
    bound = storage.put(io.BytesIO(png(4, 4)))
    other = storage.put(io.BytesIO(b"nothing uses me"))
    photo = photos.add(io.BytesIO(png(5, 5)))
    with driver.tx() as tx:
        tx.conn.execute(
            photo_objects.insert().values(
                photo_id=photo["id"], object_id=bound["object_id"], role="thumb"
            )
        )
        for obj in (bound, other):
            tx.update_object(obj["object_id"], ["ready"], {"state": "deleting"})
    for _ in range(2):  # every run alike
        report = _gc(storage, unreferenced=3600).run_once()
        assert report.kept == 1 and report.deleted <= 1
        assert report.kept_rows == {("local", STILL_REFERENCED): [bound["object_id"]]}
        assert _state(storage, bound["object_id"]) == "deleting"
        assert _path(storage, bound["storage_key"]).exists()  # its blob is kept
    assert _state(storage, other["object_id"]) is None  # the rest was swept
    assert not _path(storage, other["storage_key"]).exists()
    (line,) = [ln for ln in report.lines() if "kept" in ln]
    assert line == (
        f"pool local: 1 deleting object(s) kept: {STILL_REFERENCED} (ids {bound['object_id']})"
    )
    assert report.as_dict()["kept_rows"] == [
        {
            "pool": "local",
            "reason": STILL_REFERENCED,
            "count": 1,
            "object_ids": [bound["object_id"]],
        }
    ]


def test_gc_goes_on_past_a_row_the_database_refuses_to_delete(
    storage: Storage, driver: Driver, photos: Photos, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reference the check misses (written between the check and the row's
    delete): the foreign key refuses the row; said, skipped, the run goes on."""
    bound = storage.put(io.BytesIO(png(4, 4)))
    others = [storage.put(io.BytesIO(b"x%d" % i)) for i in range(3)]
    photo = photos.add(io.BytesIO(png(5, 5)))
    with driver.tx() as tx:
        tx.conn.execute(
            photo_objects.insert().values(
                photo_id=photo["id"], object_id=bound["object_id"], role="thumb"
            )
        )
        for obj in (bound, *others):
            tx.update_object(obj["object_id"], ["ready"], {"state": "deleting"})
    monkeypatch.setattr(StorageQueries, "referenced", lambda self, ids: set())
    report = _gc(storage, unreferenced=3600).run_once()
    assert report.deleted == 3 and report.kept == 1
    ((pool, why), ids), *_ = report.kept_rows.items()
    assert pool == "local" and why == ROW_REFUSED and ids == [bound["object_id"]]
    assert _state(storage, bound["object_id"]) == "deleting"
    assert {_state(storage, o["object_id"]) for o in others} == {None}


# -- 4. pools rm and a running worker's reservations -----------------------------------


def test_reservations_do_not_hold_a_pool(storage: Storage, engine: Engine, tmp_path: Path) -> None:
    """QA: "pool 'ro' is in use: 14 object(s) (14 pending)" while `objects ls`
    showed nothing: a running worker's unused reservations."""
    pool = storage.add_pool("ro", f"file://{tmp_path / 'ro'}")
    # A worker whose outputs go to 'ro' (its default pool): it holds the
    # pool's client and a stock of reserved rows there.
    worker = Storage(storage.db, storage.settings.with_(default_pool="ro"))
    eng = Engine(storage.db, worker.settings, clock=engine.clock)
    worker.backend(pool["pool_id"])
    worker.reservations.take(pool["pool_id"], "")
    assert len(storage.list(reserved=True, state="pending")) == RESERVE
    assert storage.list() == []
    storage.remove_pool("ro")  # `pools rm`, in another process
    assert storage.list(reserved=True) == []  # they went with it
    # The worker fills one afterwards: its job's completion is refused and
    # retried, not completed with an output that has no row.
    job_id = eng.enqueue(NewJob("debug.noop"))
    (c,) = eng.claim("w1", ["bulk"], 1)
    out = worker.add_output(pool["pool_id"], "copy", _file(storage, b"late"), "text/plain", "")
    done = AttemptResult(job_id, c.attempt, "completed", outputs=[_output(out)])
    assert eng.flush("w1", [], [done]) == {job_id}
    _refused(eng, job_id)
    assert storage.list(reserved=True) == []  # no row for a pool that is gone
    # Reserving more in the removed pool fails the same retryable way, and so
    # does a process that never held the pool's client.
    worker.reservations.ttl = 0.0
    with pytest.raises(StorageUnavailable):
        worker.add_output(pool["pool_id"], "copy", _file(storage, b"x"), "text/plain", "")
    with pytest.raises(StorageUnavailable):
        Storage(storage.db, storage.settings).add_output(
            pool["pool_id"], "copy", _file(storage, b"x"), "text/plain", ""
        )


def test_a_pool_with_a_real_pending_upload_is_still_in_use(
    storage: Storage, tmp_path: Path
) -> None:
    pool = storage.add_pool("ro", f"file://{tmp_path / 'ro'}")
    storage._pending(
        pool["pool_id"], "original", "text/plain", "", "", 0, 0
    )  # an upload on its way
    storage.reservations.take(pool["pool_id"], "")
    with pytest.raises(Refused, match=r"1 object\(s\) \(1 pending\)"):
        storage.remove_pool("ro")


# -- 5. jobs retry of a job whose input is gone ---------------------------------------


def test_retrying_a_job_whose_input_was_collected_is_a_wrong_request(
    storage: Storage, engine: Engine
) -> None:
    src = storage.put(io.BytesIO(b"input"))
    job_id = engine.enqueue(NewJob("debug.copy", object_id=src["object_id"]))
    engine.cancel(job_id)
    _gc(storage).run_once()
    assert _state(storage, src["object_id"]) is None
    with pytest.raises(InvalidRequest, match="no longer exists") as caught:
        engine.retry(job_id)
    assert not isinstance(caught.value, Refused)  # Refused is the CLI's exit 1
    assert engine.get(job_id)["status"] == "cancelled"


# -- 6. a variant waiting to be retried ---------------------------------------------


def test_a_variant_in_retry_wait_says_so_and_why(
    photos: Photos, engine: Engine, image_jobs: None
) -> None:
    photo = photos.add(io.BytesIO(png(31, 17)), filename="sea.png")
    claimed = {c.job_type: c for c in engine.claim("w1", ["images"], 10)}
    thumb = claimed[VARIANTS["thumb"]]
    failed = AttemptResult(
        thumb.job_id,
        thumb.attempt,
        "failed",
        code="STORAGE_UNAVAILABLE",
        message="could not store an output: the pool is full",
    )
    engine.flush("w1", [], [failed])
    assert engine.get(thumb.job_id)["status"] == "retry_wait"
    shown = photos.get(photo["id"])["variants"]
    assert shown["thumb"] == {
        "status": "retry_wait",
        "job_id": thumb.job_id,
        "error": "could not store an output: the pool is full",
    }
    assert shown["preview"]["status"] == "processing"
    assert variant_key(photo["id"], "thumb") == f"photo:{photo['id']}:thumb"


# -- 7. users see ready objects only -------------------------------------------------


def test_objects_not_ready_are_not_shown(photos: Photos, storage: Storage, driver: Driver) -> None:
    """QA: a refused `POST /v1/photos` (a text file, 422, "nothing is kept")
    left a `deleting` object in `GET /v1/objects` and readable by id until GC."""
    with pytest.raises(InvalidRequest, match="must be an image"):
        photos.add(io.BytesIO(b"just some text"))
    ready = storage.put(io.BytesIO(b"shown"))
    upload = storage._pending(ready["pool_id"], "original", "text/plain", "", "", 0, 0)
    every = storage.list(reserved=True)
    refused = next(r for r in every if r["state"] == "deleting")
    assert {r["state"] for r in every} == {"ready", "pending", "deleting"}
    # As the API and the CLI ask: Storage.list and Storage.get, on these queries.
    assert [r["object_id"] for r in storage.list()] == [ready["object_id"]]
    # Asked for by state, they are listed (an operator's GC backlog), but
    # never a worker's reservations.
    assert [r["object_id"] for r in storage.list(state="deleting")] == [refused["object_id"]]
    assert [r["object_id"] for r in storage.list(state="pending")] == [upload["object_id"]]
    assert storage.list(state="ready") == storage.list()
    for hidden in (refused, upload):
        with pytest.raises(NotFound):
            storage.get(hidden["object_id"])
    assert storage.get(ready["object_id"])["object_id"] == ready["object_id"]
    with driver.read() as tx:
        assert tx.shown_object(refused["object_id"]) is None
        assert tx.shown_object(upload["object_id"]) is None
        assert tx.shown_object(ready["object_id"])["state"] == "ready"  # type: ignore[index]
        assert [r["object_id"] for r in tx.objects()] == [ready["object_id"]]

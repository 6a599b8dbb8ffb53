"""Garbage collection on every database: what goes, what stays."""

from __future__ import annotations

import io
import uuid

from hypermedia.queue.models import AttemptResult, NewJob, Output
from hypermedia.storage.gc import GarbageCollector
from hypermedia.storage.ledger import Storage
from tests.harness import checksum_of


def _gc(storage: Storage, **settings: float) -> GarbageCollector:
    s = storage.settings.with_(
        gc_unreferenced_seconds=settings.get("unreferenced", 0.0),
        gc_pending_seconds=settings.get("pending", 0.0),
    )
    return GarbageCollector(Storage(storage.db, s))


def _blob(storage: Storage, row: dict) -> bool:  # type: ignore[type-arg]
    return (storage.settings.home / "storage" / row["storage_key"]).exists()


def _state(storage: Storage, object_id: int) -> str | None:
    with storage.db.read() as tx:
        row = tx.object(object_id)
    return row["state"] if row else None


def test_unreferenced_objects_go_blob_then_row(storage: Storage) -> None:
    row = storage.put(io.BytesIO(b"orphan"))
    report = _gc(storage).run_once()
    assert (report.marked_unreferenced, report.deleted) == (1, 1)
    assert _state(storage, row["object_id"]) is None
    assert not _blob(storage, row)


def test_young_unreferenced_objects_stay(storage: Storage) -> None:
    row = storage.put(io.BytesIO(b"fresh"))
    _gc(storage, unreferenced=3600).run_once()
    assert _state(storage, row["object_id"]) == "ready" and _blob(storage, row)


def test_referenced_objects_stay(storage: Storage, engine) -> None:  # type: ignore[no-untyped-def]
    bound = storage.put(io.BytesIO(b"bound to a photo"))
    live_input = storage.put(io.BytesIO(b"input of a queued job"))
    done_input = storage.put(io.BytesIO(b"input of a finished job"))
    output = storage.put(io.BytesIO(b"a job's output"), role="copy")
    with storage.db.tx() as tx:
        from hypermedia.db.schema_storage import photo_objects, photos

        pid = str(uuid.uuid4())
        tx.conn.execute(photos.insert().values(photo_id=pid))
        tx.conn.execute(
            photo_objects.insert().values(
                photo_id=pid, object_id=bound["object_id"], role="original"
            )
        )
    engine.enqueue(NewJob("debug.copy", object_id=live_input["object_id"]))
    done = engine.enqueue(NewJob("debug.copy", object_id=done_input["object_id"]))
    # Run the second job to completion by hand, with an output object.
    claimed = engine.claim("w1", ["bulk"], 10)
    assert {c.job_id for c in claimed} >= {done}
    attempt = next(c.attempt for c in claimed if c.job_id == done)
    engine.flush(
        "w1",
        [],
        [
            AttemptResult(
                done,
                attempt,
                "completed",
                outputs=[Output("copy", "text/plain", object_id=output["object_id"])],
            )
        ],
    )
    _gc(storage).run_once()
    assert _state(storage, bound["object_id"]) == "ready"
    assert _state(storage, output["object_id"]) == "ready"
    assert _state(storage, done_input["object_id"]) is None  # its job is over
    # The other job is claimed (live): its input stays.
    assert _state(storage, live_input["object_id"]) == "ready"


def test_stale_pending_objects_are_swept(storage: Storage) -> None:
    obj = storage._pending(storage.pool()["pool_id"], "original", "text/plain", "", "", 0, 0)
    path = storage.settings.home / "storage" / obj["storage_key"]
    path.parent.mkdir(parents=True)
    path.write_bytes(b"half an upload")
    _gc(storage, pending=3600).run_once()
    assert _state(storage, obj["object_id"]) == "pending"
    report = _gc(storage, pending=0).run_once()
    assert report.marked_pending == 1 and report.deleted == 1
    assert _state(storage, obj["object_id"]) is None and not path.exists()


def test_outputs_of_a_completing_job_become_ready(storage: Storage, engine) -> None:  # type: ignore[no-untyped-def]
    src = storage.put(io.BytesIO(b"in"))
    job_id = engine.enqueue(NewJob("debug.copy", object_id=src["object_id"]))
    (c,) = engine.claim("w1", ["bulk"], 1)
    out = storage.add_output(src["pool_id"], "copy", _tmpfile(storage, b"out"), "text/plain", "")
    assert out["state"] == "pending"
    stale = storage.add_output(src["pool_id"], "copy", _tmpfile(storage, b"x"), "text/plain", "")
    # A superseded attempt's output never becomes ready.
    engine.flush(
        "w1",
        [],
        [AttemptResult(job_id, c.attempt + 1, "completed", outputs=[_out(stale)])],
    )
    # Until the job completes, the row holds no size or checksum: the
    # completing transaction writes them with the promotion.
    assert (storage.get(out["object_id"])["checksum"], out["size"]) == ("", 3)
    engine.flush("w1", [], [AttemptResult(job_id, c.attempt, "completed", outputs=[_out(out)])])
    assert _state(storage, out["object_id"]) == "ready"
    ready = storage.get(out["object_id"])
    assert ready["size"] == 3
    assert ready["checksum"] == checksum_of(b"out")
    with storage.open(out["object_id"]) as f:  # a verified read: the checksum is right
        assert f.read() == b"out"
    assert _state(storage, stale["object_id"]) == "pending"
    report = _gc(storage, pending=0, unreferenced=3600).run_once()
    assert report.marked_pending == 1
    assert _state(storage, stale["object_id"]) is None


def _out(row: dict) -> Output:  # type: ignore[type-arg]
    return Output(
        "copy",
        "text/plain",
        object_id=row["object_id"],
        output_key=row["storage_key"],
        output_size_bytes=row["size"],
        checksum=row["checksum"],
    )


def _tmpfile(storage: Storage, data: bytes):  # type: ignore[no-untyped-def]
    path = storage.settings.home / f"f-{uuid.uuid4().hex}"
    path.write_bytes(data)
    return path

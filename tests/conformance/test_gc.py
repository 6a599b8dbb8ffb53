"""Garbage collection on every database: what goes, what stays."""

from __future__ import annotations

import dataclasses
import io
import os
import uuid
from pathlib import Path

import pytest

from hypermedia.errors import InvalidRequest, JobError, NotFound, Refused
from hypermedia.queue.models import AttemptResult, NewJob, Output
from hypermedia.storage.gc import GarbageCollector
from hypermedia.storage.ledger import Storage
from hypermedia.storage.reserve import RESERVE
from hypermedia.worker.files import fetch_input
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


def test_unfinished_uploads_swept_are_counted(storage: Storage) -> None:
    # They were removed and the report said nothing of them.
    storage.put(io.BytesIO(b"kept"))  # the default pool's row, made by its first upload
    tmp = storage.settings.home / "storage" / ".tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    old, young = tmp / "dead-upload", tmp / "live-upload"
    old.write_bytes(b"x")
    young.write_bytes(b"y")
    os.utime(old, (0, 0))
    report = _gc(storage, pending=3600).run_once()
    assert report.uploads_swept == 1 and report.as_dict()["uploads_swept"] == 1
    assert not old.exists() and young.exists()


def test_unreferenced_objects_go_blob_then_row(storage: Storage) -> None:
    row = storage.put(io.BytesIO(b"orphan"))
    report = _gc(storage).run_once()
    assert (report.marked_unreferenced, report.deleted) == (1, 1)
    assert _state(storage, row["object_id"]) is None
    assert not _blob(storage, row)


def test_a_collected_objects_hashes_go_with_it(storage: Storage) -> None:
    """Its duplicate-check hashes outlived it, read by every later check."""
    gone, kept = storage.put(io.BytesIO(b"collected")), storage.put(io.BytesIO(b"kept"))
    with storage.db.tx() as tx:
        for obj in (gone, kept):
            row = {"object_id": obj["object_id"], "algorithm": "dhash64", "version": "v"}
            tx.store_object_hash({**row, "hash": "00ff", "project_id": "p"})
    _gc(storage, unreferenced=3600).run_once()  # kept: young
    with storage.db.tx() as tx:
        tx.mark_deleting([gone["object_id"]], "ready", storage.clock())
    assert _gc(storage, unreferenced=3600).run_once().deleted == 1
    with storage.db.read() as tx:
        assert tx.object_hash(gone["object_id"], "dhash64", "v") is None
        assert tx.object_hash(kept["object_id"], "dhash64", "v") == "00ff"


def test_young_unreferenced_objects_stay(storage: Storage) -> None:
    row = storage.put(io.BytesIO(b"fresh"))
    _gc(storage, unreferenced=3600).run_once()
    assert _state(storage, row["object_id"]) == "ready" and _blob(storage, row)


def test_a_pool_whose_folder_is_broken_does_not_stop_the_run(
    storage: Storage, tmp_path: Path
) -> None:
    """A local pool whose folder is a file (a dead mount alike): its uploads
    cannot be swept, and that is said; the other pools' objects still go
    (a NotADirectoryError ended the whole run)."""
    (broken := tmp_path / "not-a-folder").write_text("x")
    name = f"broken-{uuid.uuid4().hex[:6]}"
    storage.add_pool(name, f"file://{broken}", check=False)
    orphan = storage.put(io.BytesIO(b"unreferenced"))
    report = _gc(storage).run_once()
    assert report.uploads_not_swept == {name: "local storage failed (Not a directory)"}
    assert report.deleted == 1 and _state(storage, orphan["object_id"]) is None


def test_a_pool_given_up_is_read_no_more_and_the_others_are_swept(
    storage: Storage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pool whose store fails is given up after three failures; its other
    rows were still read, batch after batch from the lowest id (40,000 took
    a run 20 s, and the leader's budget never reached the healthy pools)."""
    from hypermedia.db import storage_queries
    from hypermedia.storage import gc

    (broken := tmp_path / "not-a-folder").write_text("x")
    pool = storage.add_pool(f"broken-{uuid.uuid4().hex[:6]}", f"file://{broken}", check=False)
    now, n = storage.clock(), 3 * gc.BATCH + 17
    dead = [
        {"pool_id": pool["pool_id"], "storage_key": f"objects/x{i}/original.bin",
         "project_id": "default", "filename": "x", "mime_type": "application/octet-stream",
         "width": 0, "height": 0, "state": "deleting", "created_at": now, "updated_at": now}
        for i in range(n)
    ]  # fmt: skip
    with storage.db.tx() as tx:
        tx.insert_objects(dead)
    orphan = storage.put(io.BytesIO(b"unreferenced, after them all"))
    reads = []
    real = storage_queries.StorageQueries.deleting_objects

    def counted(self, *args, **kw):  # type: ignore[no-untyped-def]
        reads.append(args)
        return real(self, *args, **kw)

    monkeypatch.setattr(storage_queries.StorageQueries, "deleting_objects", counted)
    report = _gc(storage).run_once()
    assert report.deleted == 1 and _state(storage, orphan["object_id"]) is None
    assert report.failed == n and sum(report.failures.values()) == n
    assert len(reads) <= 3, reads  # the given-up pool's rows read once, in the first batch


def test_discarded_uploads_are_marked_unless_something_uses_them(storage: Storage, engine) -> None:  # type: ignore[no-untyped-def]
    """Storage.discard (process, refused after its upload): the unused ones
    are handed to GC now; one a job took meanwhile stays ready."""
    unused = storage.put(io.BytesIO(b"refused input"))
    taken = storage.put(io.BytesIO(b"someone's input"))
    engine.enqueue(NewJob("debug.noop", object_id=taken["object_id"]))
    assert storage.discard([unused["object_id"], taken["object_id"]]) == 1
    assert _state(storage, unused["object_id"]) == "deleting"
    assert _state(storage, taken["object_id"]) == "ready"
    _gc(storage, unreferenced=3600).run_once()  # swept, however young
    assert _state(storage, unused["object_id"]) is None and not _blob(storage, unused)


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


def test_a_finished_job_whose_input_was_collected_is_not_retried(
    storage: Storage,
    engine,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    obj = storage.put(io.BytesIO(b"input of a job that ended"))
    job_id = engine.enqueue(NewJob("debug.copy", object_id=obj["object_id"]))
    claimed = engine.claim("w1", ["bulk"], 1)[0]
    engine.cancel(job_id)  # cancel_requested: the attempt still holds its input
    engine.flush("w1", [], [AttemptResult(job_id, claimed.attempt, "cancelled")])
    assert engine.get(job_id)["can_retry"] is True
    _gc(storage).run_once()  # over: its input goes
    assert _state(storage, obj["object_id"]) is None
    # Retried, its attempts would only fail: refused, the job left as it was,
    # and said so beforehand (can_retry, the dashboard's Retry button).
    with pytest.raises(InvalidRequest, match="no longer exists") as refused:
        engine.retry(job_id)
    # Wrong in itself, as an enqueue naming a gone object: the CLI's exit 2
    # (Refused, "may pass later", is exit 1), the API's 422.
    assert not isinstance(refused.value, Refused)
    assert engine.get(job_id)["status"] == "cancelled"
    assert engine.get(job_id)["can_retry"] is False
    # And an attempt that meets a collected input (it was claimed without its
    # row) fails for good with a reason, not as a crash of the worker.
    gone = dataclasses.replace(claimed, input_object=None)
    with pytest.raises(JobError) as caught:
        fetch_input(storage, gone, tmp_path)
    assert (caught.value.code, caught.value.reason) == (
        "CORRUPT_INPUT",
        "the input object no longer exists",
    )


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
    # Until the job completes, the row is a reserved one: no key of its own,
    # size or checksum; the completing transaction writes them as it promotes it.
    with storage.db.read() as tx:  # not by Storage.get: not an object to show yet
        pending = tx.object(out["object_id"])
    assert (pending["checksum"], out["size"]) == ("", 3)
    assert pending["storage_key"].startswith("pending/") and out["storage_key"].startswith(
        f"objects/{out['object_id']}/copy."
    )
    engine.flush("w1", [], [AttemptResult(job_id, c.attempt, "completed", outputs=[_out(out)])])
    assert _state(storage, out["object_id"]) == "ready"
    ready = storage.get(out["object_id"])
    assert ready["size"] == 3
    assert ready["checksum"] == checksum_of(b"out")
    assert (ready["storage_key"], ready["mime_type"]) == (out["storage_key"], "text/plain")
    with storage.open(out["object_id"]) as f:  # a verified read: the checksum is right
        assert f.read() == b"out"
    # The refused result's output went to GC at once, not to the pending
    # sweep hours later.
    assert _state(storage, stale["object_id"]) == "deleting"
    report = _gc(storage, pending=0, unreferenced=3600).run_once()
    assert report.marked_pending == RESERVE - 2  # the unused reservations
    assert _state(storage, stale["object_id"]) is None
    assert _state(storage, out["object_id"]) == "ready"


def test_outputs_share_a_reserving_transaction(storage: Storage) -> None:
    pool_id = storage.pool()["pool_id"]
    first = storage.add_output(pool_id, "copy", _tmpfile(storage, b"1"), "text/plain", "")
    pending = storage.list(state="pending", reserved=True)
    assert len(pending) == RESERVE  # one transaction reserved a batch of rows
    for i in range(RESERVE - 1):
        storage.add_output(pool_id, "copy", _tmpfile(storage, b"%d" % i), "text/plain", "")
    assert len(storage.list(state="pending", reserved=True)) == RESERVE  # all taken from it
    storage.add_output(pool_id, "copy", _tmpfile(storage, b"x"), "text/plain", "")
    assert len(storage.list(state="pending", reserved=True)) == 2 * RESERVE
    assert first["object_id"] in {r["object_id"] for r in pending}
    # Not an object yet: listed by nobody, and not found by id.
    assert first["object_id"] not in {r["object_id"] for r in storage.list()}
    with pytest.raises(NotFound):
        storage.get(first["object_id"])


def test_unused_reservations_are_deleted(storage: Storage) -> None:
    pool_id = storage.pool()["pool_id"]
    storage.reservations.ttl = 0.0  # every reservation is stale at once
    a = storage.add_output(pool_id, "copy", _tmpfile(storage, b"a"), "text/plain", "")
    b = storage.add_output(pool_id, "copy", _tmpfile(storage, b"b"), "text/plain", "")
    # The second output found the first batch stale: its unused rows went with
    # the next reservation; the taken one stays.
    assert _state(storage, a["object_id"]) == "pending" and a["object_id"] != b["object_id"]
    assert len(storage.list(state="pending", reserved=True)) == 1 + RESERVE
    storage.reservations.release()  # a worker that stops
    pending = storage.list(state="pending", reserved=True)
    assert {r["object_id"] for r in pending} == {a["object_id"], b["object_id"]}
    assert storage.list(state="deleting", reserved=True) == []


def test_a_reserved_row_whose_worker_died_takes_its_blob_along(storage: Storage) -> None:
    """A worker killed after writing an output blob, before its job completed:
    the row still has its placeholder key; GC finds the blob by the row's id."""
    pool_id = storage.pool()["pool_id"]
    out = storage.add_output(pool_id, "copy", _tmpfile(storage, b"blob"), "text/plain", "")
    assert _blob(storage, out)  # written under objects/{id}/
    report = _gc(storage, pending=0).run_once()
    assert report.deleted == RESERVE  # the output's row and the unused ones
    assert _state(storage, out["object_id"]) is None
    assert not _blob(storage, out)
    assert not (storage.settings.home / "storage" / "objects" / str(out["object_id"])).exists()


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


def test_a_leader_run_stops_on_its_budget_and_comes_back_soon(
    storage: Storage, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    from hypermedia.scheduler import budget
    from hypermedia.storage import gc

    monkeypatch.setattr(gc, "BATCH", 3)
    ids = [storage.put(io.BytesIO(b"orphan %d" % i))["object_id"] for i in range(8)]
    s = storage.settings.with_(gc_unreferenced_seconds=0.0)
    svc = GarbageCollector(Storage(storage.db, s), backlog=budget.Backlog(60, 0.0))
    first = svc.run_once()
    # A run marks a batch at least, and sweeps a blob at least (the budget is
    # checked after each: a store that hangs takes a call's time each).
    assert (first.marked_unreferenced, first.deleted) == (3, 1)
    assert svc.backlog.behind and svc.period == budget.CATCH_UP_SECONDS
    runs = 1
    while svc.backlog.behind:
        svc.run_once()
        runs += 1
        assert runs < 12
    assert svc.period == 60 and runs == 9  # the ninth finds nothing left: not behind
    assert [_state(storage, i) for i in ids] == [None] * 8


def test_an_upload_swept_while_on_its_way_leaves_no_blob(
    storage: Storage, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """GC sweeps a pending row older than its age; an upload that was still
    writing then left its blob under no row, where GC (working from rows)
    never looks.  A batch of files said KeyError."""
    from hypermedia.db.schema_storage import objects
    from hypermedia.storage.base import StorageUnavailable

    backend = storage.backend(storage.pool()["pool_id"])
    root = Path(storage.settings.home) / "storage"

    def swept(keys: list[str]) -> None:  # what GC does to stale pending rows
        with storage.db.tx() as tx:
            tx.conn.execute(objects.delete().where(objects.c.storage_key.in_(keys)))

    real_put, real_put_files = backend.put, backend.put_files  # type: ignore[attr-defined]

    def put(key: str, src):  # type: ignore[no-untyped-def]
        stored = real_put(key, src)
        swept([key])
        return stored

    def put_files(items):  # type: ignore[no-untyped-def]
        stored = real_put_files(items)
        swept([items[1][0]])  # the second of the batch only
        return stored

    monkeypatch.setattr(backend, "put", put)
    monkeypatch.setattr(backend, "put_files", put_files)
    before = {p for p in root.rglob("*") if p.is_file()}
    with pytest.raises(StorageUnavailable, match="took too long and was swept"):
        storage.put(io.BytesIO(b"late bytes"))
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"first")
    b.write_bytes(b"second")
    with pytest.raises(StorageUnavailable, match="took too long and was swept"):
        storage.put_files([a, b])
    left = {p for p in root.rglob("*") if p.is_file()} - before
    # The first file of the batch is a ready object (GC's, unreferenced); no
    # blob without a row.
    assert [p.read_bytes() for p in left] == [b"first"]


def test_an_upload_swept_while_its_bytes_are_written_says_swept(
    storage: Storage, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """GC's sweep deletes the stale row's key, and with it the empty
    objects/{id}/ the upload had made: its rename then failed, "could not
    write to local storage (No such file or directory)", blaming a disk that
    was fine."""
    from hypermedia.db.schema_storage import objects
    from hypermedia.storage import local
    from hypermedia.storage.base import StorageUnavailable

    backend = storage.backend(storage.pool()["pool_id"])
    real = local._copy_hashing

    def swept_meanwhile(*args, **kw):  # type: ignore[no-untyped-def]
        copied = real(*args, **kw)
        (row,) = storage.list(state="pending", reserved=True)
        with storage.db.tx() as tx:  # what GC's sweep does: the row, then its key
            tx.conn.execute(objects.delete().where(objects.c.object_id == row["object_id"]))
        backend.delete(row["storage_key"])
        assert not (storage.settings.home / "storage" / row["storage_key"]).parent.exists()
        return copied

    monkeypatch.setattr(local, "_copy_hashing", swept_meanwhile)
    path = tmp_path / "big.bin"
    path.write_bytes(b"x" * 100_000)
    with pytest.raises(StorageUnavailable, match="took too long and was swept"):
        storage.put_file(path)
    blobs = (storage.settings.home / "storage" / "objects").rglob("*")
    assert [b for b in blobs if b.is_file()] == []

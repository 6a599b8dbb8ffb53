"""The storage findings of a QA pass as the CLI shows them (real subprocesses;
the database logic is checked on every backend in
tests/conformance/test_storage_qa.py)."""

from __future__ import annotations

import io
import json

import pytest

from hypermedia.config import Settings
from hypermedia.db.schema_storage import photo_objects
from hypermedia.photos import Photos
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import AttemptResult, NewJob
from hypermedia.storage.gc import STILL_REFERENCED
from hypermedia.storage.ledger import Storage
from tests.conformance.test_photos import image_pipelines
from tests.harness import hypermedia
from tests.media import png

SQLITE_ONLY = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


@SQLITE_ONLY
def test_jobs_retry_of_a_job_whose_input_was_collected_exits_2(
    storage: Storage, engine: Engine, settings: Settings
) -> None:
    """QA: exit 1, "may succeed later"; no retry of it ever can."""
    src = storage.put(io.BytesIO(b"input"))
    job_id = engine.enqueue(NewJob("debug.copy", object_id=src["object_id"]))
    engine.cancel(job_id)
    gc = hypermedia(
        "gc",
        "run-once",
        url=settings.url,
        home=settings.home,
        HYPERMEDIA_GC_UNREFERENCED_SECONDS="0",
    )
    assert gc.returncode == 0, gc.stderr
    done = hypermedia("jobs", "retry", str(job_id), url=settings.url, home=settings.home)
    assert done.returncode == 2, done.stderr
    assert f"input object {src['object_id']} no longer exists" in done.stderr


@SQLITE_ONLY
def test_gc_run_once_says_which_deleting_objects_it_kept(
    storage: Storage, engine: Engine, settings: Settings
) -> None:
    photo = Photos(engine, storage).add(io.BytesIO(png(5, 5)))
    bound = storage.put(io.BytesIO(png(4, 4)))
    other = storage.put(io.BytesIO(b"nothing uses me"))
    with storage.db.tx() as tx:  # a binding written by hand
        tx.conn.execute(
            photo_objects.insert().values(
                photo_id=photo["id"], object_id=bound["object_id"], role="thumb"
            )
        )
        for obj in (bound, other):
            tx.update_object(obj["object_id"], ["ready"], {"state": "deleting"})
    text = hypermedia("gc", "run-once", url=settings.url, home=settings.home)
    assert text.returncode == 1
    kept = f"pool local: 1 deleting object(s) kept: {STILL_REFERENCED} (ids {bound['object_id']})"
    assert kept in text.stdout
    assert "deleted: 1" in text.stdout and "kept: 1" in text.stdout
    assert "1 deleting object(s) kept: see why above" in text.stderr
    as_json = hypermedia("gc", "run-once", "--json", url=settings.url, home=settings.home)
    assert as_json.returncode == 1
    report = json.loads(as_json.stdout)
    assert (report["deleted"], report["kept"]) == (0, 1)
    assert report["kept_rows"] == [
        {
            "pool": "local",
            "reason": STILL_REFERENCED,
            "count": 1,
            "object_ids": [bound["object_id"]],
        }
    ]
    assert (storage.settings.home / "storage" / bound["storage_key"]).exists()


@SQLITE_ONLY
def test_a_pending_sweep_under_an_hour_is_refused_at_start(settings: Settings) -> None:
    done = hypermedia(
        "gc", "run-once", url=settings.url, home=settings.home, HYPERMEDIA_GC_PENDING_SECONDS="0"
    )
    assert done.returncode == 2
    assert "HYPERMEDIA_GC_PENDING_SECONDS must be at least 3600" in done.stderr


@SQLITE_ONLY
def test_pools_rm_is_not_held_by_reservations(storage: Storage, settings: Settings) -> None:
    pool = storage.add_pool("ro", f"file://{settings.home / 'ro'}")
    storage.reservations.take(pool["pool_id"], "")  # a running worker's stock
    done = hypermedia("pools", "rm", "ro", url=settings.url, home=settings.home)
    assert done.returncode == 0, done.stderr


@SQLITE_ONLY
def test_a_refused_photo_leaves_nothing_to_see(storage: Storage, settings: Settings) -> None:
    text = settings.home / "note.txt"
    text.write_text("just some text")
    added = hypermedia("photos", "add", str(text), url=settings.url, home=settings.home)
    assert added.returncode == 2 and "must be an image" in added.stderr
    (row,) = storage.list(reserved=True)
    assert row["state"] == "deleting"  # GC's to delete
    listed = hypermedia("objects", "ls", "--json", url=settings.url, home=settings.home)
    assert listed.returncode == 0 and json.loads(listed.stdout) == []
    shown = hypermedia(
        "objects", "show", str(row["object_id"]), url=settings.url, home=settings.home
    )
    assert shown.returncode == 2 and "not found" in shown.stderr


@SQLITE_ONLY
def test_photos_show_says_a_variant_waits_for_a_retry_and_why(
    storage: Storage, engine: Engine, settings: Settings
) -> None:
    with image_pipelines(storage.db):
        photo = Photos(engine, storage).add(io.BytesIO(png(31, 17)))
        (c, *_) = engine.claim("w1", ["images"], 10)
        failed = AttemptResult(
            c.job_id, c.attempt, "failed", code="STORAGE_UNAVAILABLE", message="the pool is full"
        )
        engine.flush("w1", [], [failed])
        shown = hypermedia("photos", "show", photo["id"], url=settings.url, home=settings.home)
    assert shown.returncode == 0, shown.stderr
    assert f"retry_wait (job {c.job_id}): the pool is full" in shown.stdout

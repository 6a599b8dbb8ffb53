"""Pools checked before they are stored, removed only when nothing uses them,
and a bucket that is gone: GC and scrubs against a real SeaweedFS server.

* ``pools add`` stores and deletes a probe blob first: a missing bucket, a
  wrong secret, an endpoint that does not answer or a folder that cannot be
  made is refused with a message naming no secret (``--no-check`` skips it).
* ``pools rm`` refuses while an object row (any state) or an unfinished job
  refers to the pool, and for the default pool.
* GC drops ``deleting`` rows whose bucket S3 says does not exist
  (``NoSuchBucket``), and keeps them on any other error.
* ``gc run-once`` sums its failures per pool and kind; ``objects verify
  --json`` prints a report even when the store goes away mid-scrub.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from hypermedia.config import Settings
from hypermedia.db.driver import Driver
from hypermedia.errors import NotFound, Refused
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import NewJob
from hypermedia.scheduler.budget import Backlog
from hypermedia.scheduler.leader import Leader
from hypermedia.storage import scrub
from hypermedia.storage.base import (
    BlobMissing,
    BucketMissing,
    StorageError,
    StorageUnavailable,
)
from hypermedia.storage.gc import GarbageCollector
from hypermedia.storage.ledger import Storage
from hypermedia.storage.s3 import S3Backend
from tests.harness import hypermedia
from tests.integration._procs import eventually
from tests.ports import free_port
from tests.storage.conftest import SeaweedServer, drop_bucket
from tests.storage.seaweed import _client

pytestmark = pytest.mark.timeout(180)
SQLITE_ONLY = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

Row = dict[str, Any]


def _s3_url(endpoint: str, bucket: str) -> str:
    return f"s3://{bucket}?endpoint={endpoint}&region=us-east-1"


def _bucket(s3_endpoint: dict[str, str]) -> str:
    """A fresh, existing bucket (dropped by the caller)."""
    name = f"p-{os.urandom(4).hex()}"
    backend = S3Backend(
        name,
        endpoint=s3_endpoint["endpoint"],
        access_key_id=s3_endpoint["access_key_id"],
        secret_access_key=s3_endpoint["secret_access_key"],
    )
    backend.ensure_bucket()
    backend.close()
    return name


def _keys(s3_endpoint: dict[str, str], bucket: str) -> list[str]:
    client = _client(
        s3_endpoint["endpoint"], s3_endpoint["access_key_id"], s3_endpoint["secret_access_key"]
    )
    try:
        listed = client.list_objects_v2(Bucket=bucket)
        return [o["Key"] for o in listed.get("Contents", [])]
    finally:
        client.close()


def _names(storage: Storage) -> set[str]:
    return {p["name"] for p in storage.pools()}


def _creds(s: Settings) -> dict[str, str]:
    """The S3 credentials of ``s`` as the environment of a CLI command."""
    return {
        "HYPERMEDIA_S3_ACCESS_KEY_ID": s.s3_access_key_id,
        "HYPERMEDIA_S3_SECRET_ACCESS_KEY": s.s3_secret_access_key,
    }


def _state(storage: Storage, object_id: int, state: str) -> None:
    with storage.db.tx() as tx:
        row = tx.object(object_id)
        assert row is not None
        assert tx.update_object(object_id, [row["state"]], {"state": state})


def _secrets(s3_endpoint: dict[str, str]) -> tuple[str, str]:
    return s3_endpoint["secret_access_key"], s3_endpoint["access_key_id"]


# -- pools add ---------------------------------------------------------------


@SQLITE_ONLY
def test_an_s3_pool_is_checked_before_it_is_stored(
    storage: Storage, s3_settings: Settings, s3_endpoint: dict[str, str]
) -> None:
    st = Storage(storage.db, s3_settings)
    endpoint = s3_endpoint["endpoint"]
    bucket = _bucket(s3_endpoint)
    try:
        st.add_pool("good", _s3_url(endpoint, bucket))
        assert _keys(s3_endpoint, bucket) == []  # the probe blob was deleted again

        refused = {
            "missing": (
                st,
                _s3_url(endpoint, "p-nosuchbucket"),
                "bucket 'p-nosuchbucket' does not exist",
            ),
            "denied": (
                Storage(storage.db, s3_settings.with_(s3_secret_access_key="wrong-" + "x" * 20)),
                _s3_url(endpoint, bucket),
                "access denied",
            ),
            "away": (st, _s3_url(f"http://127.0.0.1:{free_port()}", bucket), "could not reach"),
        }
        for name, (who, url, said) in refused.items():
            with pytest.raises(StorageError, match=said) as info:
                who.add_pool(name, url)
            for secret in (*_secrets(s3_endpoint), "wrong-"):
                assert secret not in str(info.value), name
        with pytest.raises(BucketMissing):  # told apart from the other failures
            st.add_pool("m", _s3_url(endpoint, "p-nosuchbucket"))
        assert _names(st) == {"good"}
        # Made before its bucket, on purpose: stored unchecked.
        st.add_pool("later", _s3_url(endpoint, "p-notmadeyet"), check=False)
        assert _names(st) == {"good", "later"}
    finally:
        drop_bucket(s3_endpoint, bucket)


def test_a_local_pool_is_checked_before_it_is_stored(storage: Storage, tmp_path: Path) -> None:
    storage.add_pool("deep", f"file://{tmp_path / 'a' / 'b' / 'pool'}")
    root = tmp_path / "a" / "b" / "pool"
    assert root.is_dir() and not (root / "probes").exists()  # made, probe gone
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(StorageUnavailable, match="local storage is not writable") as info:
        storage.add_pool("bad", f"file://{blocker / 'pool'}")
    assert str(tmp_path) not in str(info.value)  # no host paths in the message
    assert "bad" not in _names(storage)
    storage.add_pool("bad", f"file://{blocker / 'pool'}", check=False)
    assert "bad" in _names(storage)


@SQLITE_ONLY
def test_pools_add_command_refuses_an_unusable_pool(
    driver: Driver, tmp_path: Path, s3_endpoint: dict[str, str]
) -> None:
    creds = {
        "HYPERMEDIA_S3_ACCESS_KEY_ID": s3_endpoint["access_key_id"],
        "HYPERMEDIA_S3_SECRET_ACCESS_KEY": s3_endpoint["secret_access_key"],
    }
    url = _s3_url(s3_endpoint["endpoint"], "p-nosuchbucket")
    home = tmp_path / "home"
    done = hypermedia("pools", "add", "media", url, url=driver.url, home=home, **creds)
    assert done.returncode == 1, done.stderr
    assert "pool 'media' not added: bucket 'p-nosuchbucket' does not exist" in done.stderr
    assert "--no-check" in done.stderr and "Traceback" not in done.stderr
    for secret in _secrets(s3_endpoint):
        assert secret not in done.stderr + done.stdout
    listed = hypermedia("pools", "ls", "--json", url=driver.url, home=home)
    assert "media" not in {p["name"] for p in json.loads(listed.stdout)}
    done = hypermedia(
        "pools", "add", "media", url, "--no-check", url=driver.url, home=home, **creds
    )
    assert done.returncode == 0, done.stderr
    blocker = tmp_path / "file"
    blocker.write_text("x")
    done = hypermedia("pools", "add", "f", f"file://{blocker}/p", url=driver.url, home=home)
    assert done.returncode == 1 and "local storage is not writable" in done.stderr


# -- pools rm ----------------------------------------------------------------


def test_a_pool_in_use_is_not_removed(storage: Storage, tmp_path: Path) -> None:
    storage.add_pool("archive", f"file://{tmp_path / 'archive'}")
    row = storage.put(io.BytesIO(b"kept"), pool="archive")
    for state in ("ready", "pending", "deleting"):  # any state: a deleting blob needs its pool
        _state(storage, row["object_id"], state)
        with pytest.raises(Refused, match=f"1 object\\(s\\) \\(1 {state}\\)"):
            storage.remove_pool("archive")
    with pytest.raises(Refused, match="default pool"):
        storage.remove_pool("local")
    with pytest.raises(NotFound):
        storage.remove_pool("nope")
    with storage.db.tx() as tx:
        assert tx.delete_object_row(row["object_id"])
    storage.remove_pool("archive")
    assert "archive" not in _names(storage)
    storage.add_pool("archive", f"file://{tmp_path / 'again'}")  # the name is free again
    assert storage.put(io.BytesIO(b"x"), pool="archive")["state"] == "ready"


def test_a_pool_an_unfinished_job_reads_from_is_not_removed(
    storage: Storage, engine: Engine, tmp_path: Path
) -> None:
    storage.add_pool("archive", f"file://{tmp_path / 'archive'}")
    row = storage.put(io.BytesIO(b"input"), pool="archive")
    job_id = engine.enqueue(NewJob("debug.copy", object_id=row["object_id"]))
    with storage.db.tx() as tx:  # the object gone, as if by hand: the job still names the pool
        tx.update_object(row["object_id"], ["ready"], {"state": "deleting"})
        tx.delete_object_row(row["object_id"])
    with pytest.raises(Refused, match="1 unfinished job"):
        storage.remove_pool("archive")
    engine.cancel(job_id)
    storage.remove_pool("archive")
    assert "archive" not in _names(storage)


def test_a_removed_pools_id_is_never_given_again(storage: Storage, tmp_path: Path) -> None:
    # The newest pool removed: SQLite without AUTOINCREMENT gave its id to the
    # next pool, which running processes still mapped to the old backend.
    removed = storage.add_pool("old", f"file://{tmp_path / 'old'}")["pool_id"]
    storage.remove_pool("old")
    added = storage.add_pool("new", f"file://{tmp_path / 'new'}")["pool_id"]
    assert added > removed


def test_pools_rm_command(storage: Storage, settings: Settings, tmp_path: Path) -> None:
    storage.add_pool("archive", f"file://{tmp_path / 'archive'}")
    storage.add_pool("empty", f"file://{tmp_path / 'empty'}")
    storage.put(io.BytesIO(b"kept"), pool="archive")
    url, home = settings.url, settings.home

    done = hypermedia("pools", "rm", "archive", url=url, home=home)
    assert done.returncode == 1
    assert "pool 'archive' is in use: 1 object(s) (1 ready)" in done.stderr
    done = hypermedia("pools", "rm", "local", url=url, home=home)
    assert done.returncode == 1 and "default pool" in done.stderr
    done = hypermedia("pools", "rm", "nope", url=url, home=home)
    assert done.returncode == 2 and "no pool named 'nope'" in done.stderr
    done = hypermedia("pools", "rm", "empty", url=url, home=home)
    assert done.returncode == 0, done.stderr
    assert "pool empty removed" in done.stdout
    assert _names(storage) == {"archive"}


# -- GC and a bucket that is gone ----------------------------------------------


@SQLITE_ONLY
def test_gc_drops_rows_whose_bucket_does_not_exist(
    s3_storage: Storage, s3_endpoint: dict[str, str]
) -> None:
    pool = s3_storage.pool("s3")
    bucket = s3_storage.backend(pool["pool_id"]).bucket  # type: ignore[attr-defined]
    plain = s3_storage.put(io.BytesIO(b"a"), pool="s3")
    reserved = s3_storage.put(io.BytesIO(b"b"), pool="s3")
    _state(s3_storage, plain["object_id"], "deleting")
    with s3_storage.db.tx() as tx:  # a reserved output row: swept by prefix (a listing)
        tx.update_object(
            reserved["object_id"], ["ready"], {"state": "deleting", "storage_key": "pending/x1"}
        )
    drop_bucket(s3_endpoint, bucket)

    assert not s3_storage.reachable()  # /readyz: a HEAD of a key said "no such blob"
    report = GarbageCollector(s3_storage).run_once()
    assert (report.deleted, report.failed) == (2, 0)
    assert report.bucket_missing == {"s3": 2}
    assert s3_storage.list(reserved=True) == []


@SQLITE_ONLY
def test_gc_keeps_rows_when_access_is_denied(
    s3_storage: Storage, s3_endpoint: dict[str, str]
) -> None:
    row = s3_storage.put(io.BytesIO(b"a"), pool="s3")
    _state(s3_storage, row["object_id"], "deleting")
    wrong = s3_storage.settings.with_(s3_secret_access_key="wrong-" + "y" * 20)
    report = GarbageCollector(Storage(s3_storage.db, wrong)).run_once()
    assert (report.deleted, report.failed, report.bucket_missing) == (0, 1, {})
    ((pool, error),) = report.failures
    assert pool == "s3" and "access denied" in error and "wrong-" not in error
    assert [r["state"] for r in s3_storage.list(reserved=True)] == ["deleting"]
    # Right credentials: the blob and the row go.
    assert GarbageCollector(s3_storage).run_once().deleted == 1


@SQLITE_ONLY
def test_gc_run_once_sums_failures_while_the_store_is_away(
    s3_storage: Storage, seaweed: SeaweedServer
) -> None:
    rows = [s3_storage.put(io.BytesIO(os.urandom(100)), pool="s3") for _ in range(4)]
    for r in rows:
        _state(s3_storage, r["object_id"], "deleting")
    s = s3_storage.settings
    creds = _creds(s)
    with seaweed.down():
        text = hypermedia("gc", "run-once", url=s.url, home=s.home, **creds)
        as_json = hypermedia("gc", "run-once", "--json", url=s.url, home=s.home, **creds)
    assert text.returncode == 1 and as_json.returncode == 1
    lines = [ln for ln in (text.stdout + text.stderr).splitlines() if ln.strip()]
    where = f"127.0.0.1:{seaweed.s3_port}"
    said = [ln for ln in lines if where in ln]
    # Per pool and kind of failure, not one per object; after three failures
    # in a row the store is not asked again in this run (a hung one waited
    # out its timeout twice for every row, hours for a thousand).
    assert len(said) == 3, lines
    assert said[0].startswith("pool s3: 3 blob(s) not deleted, kept for the next run: could")
    assert said[1].startswith("pool s3: 1 blob(s) not deleted, kept for the next run: not tried")
    assert said[2].startswith("pool s3: unfinished uploads not swept: not tried after 3 fail")
    assert "4 blob(s) could not be deleted; will retry" in text.stderr
    report = json.loads(as_json.stdout)
    assert report["failed"] == 4 and report["deleted"] == 0
    tried, untried = sorted(report["failures"], key=lambda f: f["error"].startswith("not tried"))
    assert (tried["pool"], tried["count"], untried["count"]) == ("s3", 3, 1)
    assert where in tried["error"] and where in untried["error"]
    assert where not in as_json.stderr  # all of it in the report
    assert where in report["uploads_not_swept"]["s3"]
    assert [r["state"] for r in s3_storage.list(reserved=True)] == ["deleting"] * 4
    assert GarbageCollector(s3_storage).run_once().deleted == 4  # back: all go


def test_a_pool_that_cannot_be_opened_stops_no_other_and_set_url_fixes_it(
    s3_storage: Storage, s3_endpoint: dict[str, str]
) -> None:
    """A region botocore refuses, stored before `pools add` checked it: it
    made /readyz a 500 and failed every GC run for every pool, and its
    `deleting` rows kept `pools rm` away for ever."""
    good = s3_storage.pool("s3")
    url = good["backend_url"]
    stuck = s3_storage.add_pool("odd", url, check=False)
    with s3_storage.db.tx() as tx:  # as an older release stored it
        tx.set_pool_url(stuck["pool_id"], url.replace("us-east-1", "us-east-1;rm"))
    fresh = Storage(s3_storage.db, s3_storage.settings)  # no backend opened yet
    with pytest.raises(StorageUnavailable, match=r"pool 'odd' cannot be opened .*pools set-url"):
        fresh.backend(stuck["pool_id"])
    assert not fresh.reachable()  # /readyz: 503, not a 500
    # The bad pool's row is kept and said; the good pool's is deleted.
    other = fresh.put(io.BytesIO(b"a"), pool="s3")
    _state(fresh, other["object_id"], "deleting")
    with fresh.db.tx() as tx:
        tx.insert_objects(
            [{"pool_id": stuck["pool_id"], "storage_key": "objects/x/original.bin",
              "project_id": "default", "filename": "", "mime_type": "application/octet-stream",
              "width": 0, "height": 0, "state": "deleting",
              "created_at": fresh.clock(), "updated_at": fresh.clock()}]
        )  # fmt: skip
    report = GarbageCollector(fresh).run_once()
    assert (report.deleted, report.failed) == (1, 1), report.as_dict()
    ((pool, error),) = report.failures
    assert pool == "odd" and "cannot be opened" in error
    with pytest.raises(Refused, match="in use"):
        fresh.remove_pool("odd")
    # The way out: the right URL, checked like `pools add`, then GC works.
    nowhere = url.replace(fresh.backend(good["pool_id"]).bucket, "no-such-bucket-here")  # type: ignore[attr-defined]
    with pytest.raises(StorageError, match="does not exist"):
        fresh.set_pool_url("odd", nowhere)
    assert fresh.pool("odd")["backend_url"].endswith("us-east-1;rm")  # unchanged
    assert fresh.set_pool_url("odd", url)["backend_url"] == url
    assert GarbageCollector(fresh).run_once().deleted == 1
    fresh.remove_pool("odd")


def test_a_hung_store_holds_up_no_other_maintenance(
    s3_storage: Storage, seaweed: SeaweedServer, engine: Engine
) -> None:
    """GC on an S3 that takes connections and never answers: the leader's
    other services go on meanwhile (its lease, the reaper, the promoter and
    the photo bridge waited behind every hung call), and the GC run ends
    within its budget plus the call in flight."""
    rows = [s3_storage.put(io.BytesIO(os.urandom(100)), pool="s3") for _ in range(8)]
    for r in rows:
        _state(s3_storage, r["object_id"], "deleting")
    quick = Storage(s3_storage.db, s3_storage.settings.with_(s3_timeout_seconds=1.0))
    gc = GarbageCollector(quick, backlog=Backlog(60.0, 2.0), log_failures=False)
    ticks: list[float] = []

    class Tick:
        name, period = "tick", 0.1

        def run_once(self) -> None:
            ticks.append(time.monotonic())

    stop = threading.Event()
    leader = Leader(engine, "node-a", stop, services=[gc, Tick()])
    try:
        with seaweed.hung():
            leader.start()
            eventually(lambda: len(ticks) >= 1, 10, "the leader runs its services")
            started = time.monotonic()
            time.sleep(3)  # GC is inside a hung call, or several
            during = [started, *(t for t in ticks if t >= started), time.monotonic()]
            gaps = [b - a for a, b in itertools.pairwise(during)]
            assert max(gaps) < 1.0, gaps  # every 0.1 s, never a hung call's seconds
            assert leader.is_leader
            gc_thread = leader._detached["gc"]
            # Its budget (2 s) plus one call of two 1 s tries and a backoff.
            gc_thread.join(15)
            assert not gc_thread.is_alive()
            assert time.monotonic() - started < 15
        assert gc.report.failed >= 1 and gc.backlog.behind  # stopped on its budget
    finally:
        stop.set()
        leader.join(10)


# -- objects verify --json when the store goes away ----------------------------


@SQLITE_ONLY
def test_verify_json_reports_a_store_that_went_away(
    s3_storage: Storage, seaweed: SeaweedServer
) -> None:
    s = s3_storage.settings
    local = [s3_storage.put(io.BytesIO(os.urandom(1000))) for _ in range(2)]
    remote = [s3_storage.put(io.BytesIO(os.urandom(1000)), pool="s3") for _ in range(2)]
    (s.home / "storage" / local[1]["storage_key"]).unlink()  # a finding before the outage
    creds = _creds(s)
    with seaweed.down():
        done = hypermedia("objects", "verify", "--json", url=s.url, home=s.home, **creds)
        text = hypermedia("objects", "verify", url=s.url, home=s.home, **creds)
        with pytest.raises(scrub.ScrubStopped) as info:
            scrub.scrub(s3_storage)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)  # one valid document, saying what failed
    assert report["checked"] == 2 and report["last_object_id"] == local[1]["object_id"]
    assert [f["object_id"] for f in report["findings"]] == [local[1]["object_id"]]
    error = report["error"]
    assert error["code"] == "STORAGE_UNAVAILABLE"
    assert error["object_id"] == remote[0]["object_id"]
    assert error["resume_after"] == local[1]["object_id"]
    assert f"127.0.0.1:{seaweed.s3_port}" in error["message"]
    assert s.s3_secret_access_key not in done.stdout + done.stderr
    assert text.returncode == 1
    assert f"object {local[1]['object_id']}: missing" in text.stdout
    assert f"go on with --after {local[1]['object_id']}" in text.stderr
    assert info.value.report.error == error
    # A run that ends normally says there was no error.
    healthy = hypermedia("objects", "verify", "--json", url=s.url, home=s.home, **creds)
    assert json.loads(healthy.stdout)["error"] is None


def test_another_process_sees_a_new_pool_url_within_the_recheck(
    storage: Storage, driver: Driver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`pools set-url` changed the row; a running worker or server kept
    writing to the store it had opened until it restarted."""
    from hypermedia.storage import ledger

    old_root, new_root = tmp_path / "old", tmp_path / "new"
    pool = storage.add_pool("moving", f"file://{old_root}")
    other = Storage(driver, storage.settings)  # another process's ledger
    before = other.put(io.BytesIO(b"written before the move"), pool="moving")
    assert (old_root / before["storage_key"]).is_file()
    new_root.mkdir()
    os.rename(old_root / "objects", new_root / "objects")  # the operator moves the store
    storage.set_pool_url("moving", f"file://{new_root}")
    with pytest.raises(BlobMissing), other.open(before["object_id"]):
        pass  # within the recheck: still the old store
    monkeypatch.setattr(ledger, "POOL_RECHECK_SECONDS", 0.0)
    with other.open(before["object_id"]) as f:
        assert f.read() == b"written before the move"
    after = other.put(io.BytesIO(b"written after"), pool="moving")
    assert (new_root / after["storage_key"]).is_file()
    assert not (old_root / after["storage_key"]).exists()
    assert pool["pool_id"] == after["pool_id"]
    # The database away at a recheck: the store is not, and the backend stays.
    opened = other.backend(pool["pool_id"])

    def away() -> Any:
        raise ConnectionError("the database is restarting")

    monkeypatch.setattr(other.db, "read", away)
    assert other.backend(pool["pool_id"]) is opened


@SQLITE_ONLY
def test_gc_run_once_exits_1_when_a_pools_uploads_could_not_be_swept(
    s3_storage: Storage, seaweed: SeaweedServer
) -> None:
    """With nothing to delete, a store that is away was said and the run
    exited 0: a cron job never heard of it."""
    s3_storage.put(io.BytesIO(b"x" * 100), pool="s3")  # nothing to collect
    s = s3_storage.settings
    creds = _creds(s)
    with seaweed.down():
        down = hypermedia("gc", "run-once", url=s.url, home=s.home, **creds)
    assert down.returncode == 1, down.stdout + down.stderr
    assert "1 pool(s) not swept of unfinished uploads: see why above" in down.stderr
    assert "pool s3: unfinished uploads not swept" in down.stdout
    back = hypermedia("gc", "run-once", url=s.url, home=s.home, **creds)
    assert back.returncode == 0, back.stdout + back.stderr

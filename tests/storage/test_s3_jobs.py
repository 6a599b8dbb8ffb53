"""The ledger and jobs on a real S3 store (SeaweedFS), including outages.

The oracle of the outage tests: nothing becomes ``ready`` while the store is
away, the job waits in ``retry_wait`` with STORAGE_UNAVAILABLE, and it
completes once the store is back, with one output.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from hypermedia.config import Settings
from hypermedia.db.driver import Driver
from hypermedia.errors import NotFound
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import NewJob
from hypermedia.storage.base import StorageUnavailable
from hypermedia.storage.gc import GarbageCollector
from hypermedia.storage.ledger import Storage
from tests.harness import checksum_of, hypermedia
from tests.integration._procs import Procs, sqlite_only, wait_job
from tests.storage.conftest import SeaweedServer
from tests.storage.seaweed import _client

pytestmark = pytest.mark.timeout(180)


def _s3_worker(procs: Procs, s3_settings: Settings, concurrency: int, **env: Any) -> None:
    """A worker with the store's credentials and ``env``."""
    procs.worker(
        "--concurrency",
        str(concurrency),
        HYPERMEDIA_S3_ACCESS_KEY_ID=s3_settings.s3_access_key_id,
        HYPERMEDIA_S3_SECRET_ACCESS_KEY=s3_settings.s3_secret_access_key,
        **env,
    )


def test_objects_round_trip_and_presigned_urls(s3_storage: Storage) -> None:
    data = os.urandom(20 * 1024 * 1024 + 5)  # multipart
    row = s3_storage.put(io.BytesIO(data), pool="s3", filename="big.bin")
    assert row["state"] == "ready"
    assert row["checksum"] == checksum_of(data)
    with s3_storage.open(row["object_id"]) as f:
        assert f.read() == data
    url = s3_storage.signed_url(row["object_id"])
    assert "X-Amz-Signature" in url or "Signature" in url
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.read() == data
    # GC deletes the blob on S3, then the row.
    s = s3_storage.settings.with_(gc_unreferenced_seconds=0.0)
    assert GarbageCollector(Storage(s3_storage.db, s)).run_once().deleted == 1
    backend = s3_storage.backend(row["pool_id"])
    assert not backend.exists(row["storage_key"])


def test_an_upload_while_s3_is_down_never_becomes_ready(
    s3_storage: Storage, seaweed: SeaweedServer
) -> None:
    s3_storage.pool("s3")
    with seaweed.down(), pytest.raises(StorageUnavailable) as err:
        s3_storage.put(io.BytesIO(b"x" * 100_000), pool="s3")
    assert s3_storage.settings.s3_secret_access_key not in str(err.value)
    assert [r["state"] for r in s3_storage.list(reserved=True)] == ["deleting"]
    # GC sweeps it once S3 is back (the blob never existed: the delete is a no-op).
    report = GarbageCollector(s3_storage).run_once()
    assert report.deleted == 1 and s3_storage.list(reserved=True) == []


def test_a_job_waits_out_an_s3_outage_and_completes(
    driver: Driver,
    s3_storage: Storage,
    s3_settings: Settings,
    seaweed: SeaweedServer,
    procs: Procs,
) -> None:
    data = os.urandom(300_000)
    src = s3_storage.put(io.BytesIO(data), pool="s3")
    eng = Engine(driver, s3_settings)
    seaweed.stop()
    job_id = eng.enqueue(NewJob("debug.copy", object_id=src["object_id"], max_attempts=20))
    _s3_worker(
        procs,
        s3_settings,
        1,
        HYPERMEDIA_BACKOFF_BASE_SECONDS="0.5",
        HYPERMEDIA_BACKOFF_MAX_SECONDS="2",
    )
    row = wait_job(driver, job_id, {"retry_wait"}, timeout=60)
    assert row["error_code"] == "STORAGE_UNAVAILABLE"
    assert s3_settings.s3_secret_access_key not in (row["safe_reason"] or "")
    assert [o["state"] for o in s3_storage.list()] == ["ready"]  # only the input
    seaweed.start()
    done = wait_job(driver, job_id, timeout=90)
    assert done["status"] == "completed", (done["error_code"], done["safe_reason"])
    with driver.read() as tx:
        outputs = tx.outputs(job_id)
    assert len(outputs) == 1
    with s3_storage.open(outputs[0]["object_id"]) as f:
        assert f.read() == data


@sqlite_only  # the worker's own logic: one database shows it
def test_queued_jobs_keep_their_attempts_while_s3_is_away(
    driver: Driver,
    s3_storage: Storage,
    s3_settings: Settings,
    seaweed: SeaweedServer,
    procs: Procs,
) -> None:
    """A worker claimed and failed every queued job while the store was down:
    a 75 s restart failed 58 of 188 for good, none of which had run.  Now it
    claims one job at a time, with pauses, until the store answers again."""
    src = s3_storage.put(io.BytesIO(os.urandom(1000)), pool="s3")
    eng = Engine(driver, s3_settings)
    seaweed.stop()
    ids = [eng.enqueue(NewJob("debug.copy", object_id=src["object_id"])) for _ in range(20)]
    # The default back-off: a failed job waits 15-30 s, so each probe takes
    # another queued job.
    _s3_worker(
        procs,
        s3_settings,
        2,
        HYPERMEDIA_BACKOFF_BASE_SECONDS="2",
        HYPERMEDIA_BACKOFF_MAX_SECONDS="600",
    )
    wait_job(driver, ids[0], {"retry_wait", "failed"}, timeout=30)
    time.sleep(8)
    with driver.read() as tx:
        tried = sum(len(tx.attempts(i)) for i in ids)
        failed = [i for i in ids if tx.job(i)["status"] == "failed"]  # type: ignore[index]
    # The first claim's jobs, then about one probe per pause (1, 2, 4 s);
    # without the pauses, every queued job was tried at once.
    assert tried <= 10, tried
    assert failed == []
    seaweed.start()
    for job_id in ids:
        done = wait_job(driver, job_id, timeout=120)
        assert done["status"] == "completed", (done["error_code"], done["safe_reason"])


def test_uploads_naming_no_pool_go_to_the_default_pool(
    driver: Driver, s3_storage: Storage, s3_settings: Settings, tmp_path: Path
) -> None:
    """Scaled out, the API and the workers have HOMEs of their own: an upload
    that names no pool (the API, photos, process) went to ``local``, the API
    machine's HOME/storage, and every job on it failed on a worker elsewhere
    with CORRUPT_INPUT ("the input object's bytes are missing").
    HYPERMEDIA_DEFAULT_POOL names the pool such uploads go to."""
    s3_id = s3_storage.pool("s3")["pool_id"]
    api_home = tmp_path / "api-machine"
    api = Storage(driver, s3_settings.with_(home=api_home, default_pool="s3"))
    data = os.urandom(50_000)
    row = api.put(io.BytesIO(data), filename="a.bin")  # as POST /v1/objects does
    assert row["pool_id"] == s3_id
    assert not (api_home / "storage").exists()
    creds = {
        "HYPERMEDIA_S3_ACCESS_KEY_ID": s3_settings.s3_access_key_id,
        "HYPERMEDIA_S3_SECRET_ACCESS_KEY": s3_settings.s3_secret_access_key,
        "HYPERMEDIA_DEFAULT_POOL": "s3",
    }
    # The CLI reads the setting too.
    src = tmp_path / "b.bin"
    src.write_bytes(data)
    put = hypermedia("objects", "put", str(src), "--json", url=driver.url, home=api_home, **creds)
    assert put.returncode == 0, put.stderr
    assert json.loads(put.stdout)["pool_id"] == s3_id
    # A worker on another machine (another HOME) reads the input from S3.
    worker_machine = Procs(driver, tmp_path / "worker-machine")
    try:
        worker_machine.worker("--concurrency", "1", **creds)
        job_id = Engine(driver, s3_settings).enqueue(
            NewJob("debug.copy", object_id=row["object_id"])
        )
        done = wait_job(driver, job_id, timeout=60)
    finally:
        worker_machine.close()
    assert done["status"] == "completed", (done["error_code"], done["safe_reason"])
    # A default pool that does not exist is the service's fault, said as such.
    nowhere = Storage(driver, s3_settings.with_(default_pool="nope"))
    with pytest.raises(StorageUnavailable, match="HYPERMEDIA_DEFAULT_POOL"):
        nowhere.put(io.BytesIO(b"x"))
    assert api.reachable() and not nowhere.reachable()  # /readyz: not ready for uploads
    with pytest.raises(NotFound):  # a pool the caller names is still the caller's
        nowhere.put(io.BytesIO(b"x"), pool="nope")
    bad = hypermedia(
        "objects",
        "put",
        str(src),
        url=driver.url,
        home=api_home,
        **{**creds, "HYPERMEDIA_DEFAULT_POOL": "nope"},
    )
    assert bad.returncode == 1 and "HYPERMEDIA_DEFAULT_POOL" in bad.stderr, bad.stderr


def test_without_presigning_s3_downloads_stream_through_the_checked_route(
    s3_storage: Storage, s3_endpoint: dict[str, str]
) -> None:
    """HYPERMEDIA_S3_PRESIGN=false: an S3 object's link is the service's own
    /content route, whose bytes are checked against the checksum; a presigned
    link hands a blob changed behind the ledger's back out whole, with a 200."""
    from fastapi.testclient import TestClient

    from hypermedia.api.app import create_app
    from hypermedia.services import Services

    settings = s3_storage.settings.with_(s3_presign=False)
    svc = Services.from_engine(Engine(s3_storage.db, settings))
    data = os.urandom(3 * 1024 * 1024)  # past the 1 MiB read whole before the headers
    row = svc.storage.put(io.BytesIO(data), pool="s3", filename="doc.bin")
    url = svc.storage.signed_url(row["object_id"])
    assert url.startswith(f"/v1/objects/{row['object_id']}/content?expires=")
    with TestClient(create_app(svc)) as client:
        r = client.get(url)
        assert r.status_code == 200 and r.content == data
        assert r.headers["content-disposition"].startswith("attachment")
        # A part comes from the store as a ranged GET: just those bytes.
        part = client.get(url, headers={"Range": "bytes=1048570-2097160"})
        assert part.status_code == 206 and part.content == data[1048570:2097161]
        assert part.headers["content-range"] == f"bytes 1048570-2097160/{len(data)}"
        # The blob changed in the store: the body is cut short, never whole.
        bucket = svc.storage.backend(row["pool_id"]).bucket  # type: ignore[attr-defined]
        _client(**s3_endpoint).put_object(
            Bucket=bucket, Key=row["storage_key"], Body=data[:-1] + bytes([data[-1] ^ 1])
        )
        got = b""
        with client.stream("GET", url) as streamed:
            assert streamed.status_code == 200  # the headers go before the damage is known
            with contextlib.suppress(Exception):  # then the body is cut
                for chunk in streamed.iter_bytes():
                    got += chunk
        # What came is the object's own bytes, and it stops short of the end.
        assert 0 < len(got) < len(data) and data.startswith(got), len(got)
        # Cut behind the ledger's back: a part is refused, its size is not the ledger's.
        _client(**s3_endpoint).put_object(Bucket=bucket, Key=row["storage_key"], Body=data[:10])
        refused = client.get(url, headers={"Range": "bytes=0-4"})
        assert refused.status_code == 500 and refused.json()["code"] == "object_corrupt"
        refused = client.get(url, headers={"Range": "bytes=100-200"})  # past the blob's end
        assert refused.status_code == 500 and refused.json()["code"] == "object_corrupt"


def test_a_file_that_shrinks_while_it_uploads_is_refused_at_once(
    s3_storage: Storage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A part asks the file for bytes it no longer has: the request had
    announced the part's length, and SeaweedFS waited for the missing bytes
    until the client's read timeout, twice (121 s), then the upload was
    blamed on the store ("could not upload to S3 storage … ReadTimeoutError")."""
    from hypermedia.errors import Conflict
    from hypermedia.storage import s3_streams

    src = tmp_path / "shrinking.bin"
    src.write_bytes(os.urandom(40 * 1024 * 1024))  # multipart: parts of 8 MiB
    opened = s3_streams.WholeChunks.open_file_chunk_reader_from_fileobj

    def then_cut(self, fileobj, *args, **kw):  # type: ignore[no-untyped-def]
        chunk = opened(self, fileobj, *args, **kw)
        os.truncate(src, 1024 * 1024)  # another writer cuts the file meanwhile
        return chunk

    monkeypatch.setattr(s3_streams.WholeChunks, "open_file_chunk_reader_from_fileobj", then_cut)
    started = time.monotonic()
    with pytest.raises(Conflict, match=r"^shrinking\.bin changed while it was stored: nothing"):
        s3_storage.put_file(src, pool="s3")
    assert time.monotonic() - started < 30
    assert [r["state"] for r in s3_storage.list(reserved=True)] == ["deleting"]

"""`objects verify`, the scrub: every ready object read back against its
ledger row, on a local pool (every database) and a real S3 store.  The
blobs are damaged the ways disks and people damage them: a flipped byte, a
truncated file, a deleted one, a key overwritten behind our back."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from hypermedia.config import Settings
from hypermedia.db.driver import Driver
from hypermedia.storage import scrub
from hypermedia.storage.base import StorageUnavailable
from hypermedia.storage.ledger import Storage
from tests.harness import hypermedia
from tests.storage.conftest import SeaweedServer, drop_bucket

pytestmark = pytest.mark.timeout(120)


def _put(storage: Storage, sizes: list[int], pool: str | None = None) -> list[dict]:  # type: ignore[type-arg]
    return [storage.put(io.BytesIO(os.urandom(n)), pool=pool) for n in sizes]


def _blob(storage: Storage, row: dict) -> Path:  # type: ignore[type-arg]
    assert storage.pool()["backend_url"] == "file:"  # the default pool, under the home
    return Path(storage.settings.home) / "storage" / row["storage_key"]


def test_a_healthy_pool_has_no_findings(storage: Storage) -> None:
    rows = _put(storage, [0, 1, 300_000, 2 * 1024 * 1024 + 3])
    seen: list[int] = []
    report = scrub.scrub(storage, on_checked=lambda r: seen.append(r["object_id"]))
    assert (report.checked, report.findings) == (4, [])
    assert report.bytes == sum(r["size"] for r in rows)
    assert seen == sorted(r["object_id"] for r in rows) and report.last_object_id == seen[-1]


def test_damaged_blobs_are_found_and_named(storage: Storage) -> None:
    ok, flipped, truncated, deleted, grown = _put(storage, [4096] * 5)
    path = _blob(storage, flipped)
    data = bytearray(path.read_bytes())
    data[1000] ^= 0xFF
    path.write_bytes(bytes(data))
    with open(_blob(storage, truncated), "r+b") as f:
        f.truncate(100)
    _blob(storage, deleted).unlink()
    with open(_blob(storage, grown), "ab") as f:
        f.write(b"appended behind the ledger's back")

    report = scrub.scrub(storage)
    found = {f.object_id: (f.problem, f.detail) for f in report.findings}
    assert found == {
        flipped["object_id"]: ("checksum", "the bytes do not match the ledger's checksum"),
        truncated["object_id"]: ("size", "100 bytes stored, the ledger says 4096"),
        deleted["object_id"]: ("missing", "no blob under its key"),
        grown["object_id"]: ("size", "more bytes stored than the ledger's 4096"),
    }
    assert report.checked == 5
    # What was read, not the ledger's sizes: none of the missing blob (its
    # 4096 were counted), 100 of the truncated one (4096 were), all of the
    # grown one.
    assert report.bytes == 4096 + 4096 + 100 + 0 + 4096 + len(b"appended behind the ledger's back")
    # Resumable and bounded: the two after the first, then the rest.
    part = scrub.scrub(storage, after=ok["object_id"], limit=2)
    assert part.checked == 2 and part.last_object_id == truncated["object_id"]
    assert {f.object_id for f in part.findings} == {flipped["object_id"], truncated["object_id"]}
    rest = scrub.scrub(storage, after=part.last_object_id)
    assert [f.object_id for f in rest.findings] == [deleted["object_id"], grown["object_id"]]


def test_a_blob_that_is_no_file_is_a_finding_and_the_scrub_goes_on(
    storage: Storage, settings: Settings, tmp_path: Path
) -> None:
    """A symlink planted in the pool's folder stopped the scrub (an unsafe key,
    the findings so far lost); a folder where the file should be was said to
    be "the database is unavailable"."""
    truncated, linked, folder, last = _put(storage, [3000] * 4)
    with open(_blob(storage, truncated), "r+b") as f:
        f.truncate(3)
    (outside := tmp_path / "elsewhere").write_bytes(b"not ours")
    _blob(storage, linked).unlink()
    _blob(storage, linked).symlink_to(outside)
    _blob(storage, folder).unlink()
    _blob(storage, folder).mkdir()
    _blob(storage, last).unlink()
    report = scrub.scrub(storage)
    found = {f.object_id: (f.problem, f.detail) for f in report.findings}
    assert found == {
        truncated["object_id"]: ("size", "3 bytes stored, the ledger says 3000"),
        linked["object_id"]: ("unreadable", "unsafe storage key: a symlink is on its path"),
        folder["object_id"]: ("unreadable", "unsafe storage key: the blob is not a regular file"),
        last["object_id"]: ("missing", "no blob under its key"),
    }
    assert (report.checked, report.error) == (4, None)
    done = hypermedia("objects", "verify", "--json", url=settings.url, home=settings.home)
    assert done.returncode == 1 and len(json.loads(done.stdout)["findings"]) == 4
    got = hypermedia(
        "objects", "get", str(folder["object_id"]), url=settings.url, home=settings.home
    )
    assert got.returncode == 1
    said = f"error: object {folder['object_id']}: unsafe storage key: the blob is not a regular "
    said += f"file (pool local, key {folder['storage_key']}); `hypermedia objects verify`"
    assert got.stderr.startswith(said), got.stderr


def test_an_object_collected_meanwhile_is_not_a_finding(storage: Storage) -> None:
    (row,) = _put(storage, [2048])
    stale = dict(row)  # read as ready by the scrub, then collected by GC
    with storage.db.tx() as tx:
        assert tx.update_object(row["object_id"], ["ready"], {"state": "deleting"})
    _blob(storage, row).unlink()
    assert scrub.check(storage, stale) is None
    with storage.db.tx() as tx:
        tx.update_object(row["object_id"], ["deleting"], {"state": "ready"})
    assert scrub.check(storage, stale) is not None  # still ready: a real loss


def test_the_command_reports_and_exits_1(storage: Storage, settings: Settings) -> None:
    good, bad = _put(storage, [1000, 1000])
    _blob(storage, bad).unlink()
    done = hypermedia("objects", "verify", url=settings.url, home=settings.home)
    assert done.returncode == 1, done.stderr
    # The key is named, as --json does (and docs/storage.md says): a restore needs it.
    said = f"object {bad['object_id']}: missing: no blob under its key"
    assert f"{said} (pool local, key {bad['storage_key']})" in done.stdout
    assert "checked 2 objects (1,000 bytes)" in done.stdout  # the bytes read: not the missing
    done = hypermedia(
        "objects", "verify", "--json", "--limit", "1", url=settings.url, home=settings.home
    )
    assert done.returncode == 0, done.stderr  # the first one is fine
    report = json.loads(done.stdout)
    assert (report["checked"], report["findings"]) == (1, [])
    assert report["last_object_id"] == good["object_id"]


def test_an_s3_pool_edited_behind_our_back(s3_storage: Storage) -> None:
    _put(s3_storage, [10])  # the local pool: not scrubbed with --pool s3
    pool = s3_storage.pool("s3")
    _, overwritten, deleted = _put(s3_storage, [5000, 5000, 6 * 1024 * 1024], pool="s3")
    s3 = s3_storage.backend(pool["pool_id"])
    s3.put(overwritten["storage_key"], io.BytesIO(os.urandom(5000)))  # same size, other bytes
    s3.delete(deleted["storage_key"])
    report = scrub.scrub(s3_storage, pool_id=pool["pool_id"])
    assert report.checked == 3
    assert {(f.object_id, f.problem) for f in report.findings} == {
        (overwritten["object_id"], "checksum"),
        (deleted["object_id"], "missing"),
    }


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_objects_in_a_bucket_that_is_gone_are_missing_and_the_scrub_goes_on(
    s3_storage: Storage, s3_endpoint: dict[str, str]
) -> None:
    """It stopped at the first of them, and "go on with --after N" met the
    same object every time: the pools after it were never checked."""
    pool = s3_storage.pool("s3")
    gone = _put(s3_storage, [100, 100], pool="s3")
    (after,) = _put(s3_storage, [10])  # the local pool, later ids
    drop_bucket(s3_endpoint, s3_storage.backend(pool["pool_id"]).bucket)  # type: ignore[attr-defined]
    report = scrub.scrub(s3_storage)
    assert report.last_object_id >= after["object_id"]
    assert {(f.object_id, f.problem, f.detail) for f in report.findings} == {
        (o["object_id"], "missing", "its pool's bucket does not exist") for o in gone
    }


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)  # one restart is enough
def test_a_store_that_is_away_stops_the_scrub(s3_storage: Storage, seaweed: SeaweedServer) -> None:
    _put(s3_storage, [100, 100], pool="s3")
    seaweed.stop()
    with pytest.raises(StorageUnavailable):
        scrub.scrub(s3_storage, pool_id=s3_storage.pool("s3")["pool_id"])


@pytest.mark.parametrize("database_url", ["postgresql", "mariadb"], indirect=True)
def test_a_database_that_goes_away_mid_scrub_still_gets_a_report(
    driver: Driver, settings: Settings
) -> None:
    """The scrub's database session is killed after its first object (a
    server restart, a failover): the report so far comes back with an error
    saying so and where to go on from, as when the store goes away."""
    own = Driver(settings.url)  # a pool of its own: only its session is killed
    storage = Storage(own, settings)
    first, second = _put(storage, [100, 100])

    def kill_my_session(row: dict) -> None:  # type: ignore[type-arg]
        if row["object_id"] != first["object_id"]:
            return  # the second is checked from the page already read
        with own.read() as tx:  # the scrub's one pooled connection
            me = tx.conn.exec_driver_sql(_WHO_AM_I[driver.name]).scalar()
        with driver.tx() as tx:
            tx.conn.exec_driver_sql(_KILL[driver.name].format(me))

    try:
        with pytest.raises(scrub.ScrubStopped) as info:
            scrub.scrub(storage, on_checked=kill_my_session)
    finally:
        own.dispose()
    report = info.value.report
    # Both were checked; the next page's read found the database gone.
    assert (report.checked, report.last_object_id) == (2, second["object_id"])
    error = report.error or {}
    assert error["code"] == "DATABASE_UNAVAILABLE"
    assert error["message"].startswith("the database is unavailable (")
    assert (error["object_id"], error["resume_after"]) == (None, second["object_id"])
    assert settings.url not in error["message"]


_WHO_AM_I = {"postgresql": "SELECT pg_backend_pid()", "mysql": "SELECT CONNECTION_ID()"}
_KILL = {"postgresql": "SELECT pg_terminate_backend({})", "mysql": "KILL {}"}

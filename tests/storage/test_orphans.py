"""`gc orphans`: blobs in a pool's store that no row leads to, found and
deleted through GC, on a local pool (every database) and a real S3 store;
never a blob a row has, nor an output's blob whose row is not keyed yet."""

from __future__ import annotations

import io
import json
import os
import threading
import time
from pathlib import Path

import pytest

from hypermedia.config import Settings
from hypermedia.storage.ledger import Storage
from hypermedia.storage.orphans import find_orphans
from hypermedia.storage.reserve import placeholder
from tests.harness import hypermedia

pytestmark = pytest.mark.timeout(120)

DAY = 24 * 3600


def _local(storage: Storage, key: str, data: bytes, age: float = 2 * DAY) -> Path:
    """A blob written into the local pool's folder behind the ledger's back."""
    path = Path(storage.settings.home) / "storage" / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    then = time.time() - age
    os.utime(path, (then, then))
    return path


def _reserved(storage: Storage) -> int:
    """An output's row as a worker reserves it: pending, its key a placeholder."""
    now = storage.clock()
    pool_id = storage.pool()["pool_id"]
    with storage.db.tx() as tx:
        return int(
            tx.insert_object(
                {
                    "pool_id": pool_id,
                    "storage_key": placeholder(),
                    "project_id": "",
                    "state": "pending",
                    "created_at": now,
                    "updated_at": now,
                }
            )
        )


def test_orphans_are_found_and_deleted_and_nothing_else(storage: Storage) -> None:
    kept = [storage.put(io.BytesIO(os.urandom(n))) for n in (10, 2000, 30_000)]
    gone = _local(storage, "objects/9000001/original.bin", b"x" * 700)
    # A second blob under a live object's folder: its row leads to the other.
    stray = _local(storage, f"objects/{kept[0]['object_id']}/thumb.webp", b"y" * 50)
    young = _local(storage, "objects/9000002/original.bin", b"z" * 60, age=60)
    output = _local(storage, f"objects/{_reserved(storage)}/output.webp", b"o" * 80)
    foreign = _local(storage, "objects/not-an-id/notes.txt", b"n")

    report = find_orphans(storage)
    (local,) = report.pools
    assert (local.listed, local.orphans, local.orphan_bytes) == (8, 2, 750)
    assert (local.too_young, local.unrecognised, local.handed_to_gc) == (1, 1, 0)
    assert sorted(local.keys) == sorted(
        ["objects/9000001/original.bin", f"objects/{kept[0]['object_id']}/thumb.webp"]
    )
    assert gone.exists() and stray.exists(), "a look deletes nothing"

    report = find_orphans(storage, delete=True)
    assert report.pools[0].handed_to_gc == 2 and report.deleted == 2
    assert not gone.exists() and not stray.exists()
    assert young.exists() and output.exists() and foreign.exists()
    for row in kept:  # every object still there, whole
        with storage.open(row["object_id"]) as src:
            assert len(src.read()) == row["size"]
    with storage.db.read() as tx:  # GC removed the rows it was handed, blob then row
        assert tx.deleting_objects(100, 0, []) == []
    assert find_orphans(storage).pools[0].orphans == 0


def test_a_pool_mostly_orphans_is_refused_unless_forced(storage: Storage) -> None:
    """Pointed at the wrong database, every blob looks like an orphan."""
    storage.put(io.BytesIO(b"mine"))
    blobs = [_local(storage, f"objects/{9100000 + i}/original.bin", b"b") for i in range(3)]
    report = find_orphans(storage, delete=True)
    assert report.pools[0].refused and "3 of its 4 blobs have no row" in report.pools[0].refused
    assert report.pools[0].handed_to_gc == 0 and all(b.exists() for b in blobs)
    report = find_orphans(storage, delete=True, force=True)
    assert report.deleted == 3 and not any(b.exists() for b in blobs)


def test_young_blobs_and_foreign_names_do_not_dilute_the_refusal(storage: Storage) -> None:
    """QA: against an empty database, 4 old blobs beside 5 new ones (or
    beside 4 names that are no key) went without --force: 4 of 9 listed."""
    old = [_local(storage, f"objects/{9500000 + i}/original.jpg", b"o") for i in range(4)]
    for i in range(5):
        _local(storage, f"objects/{9600000 + i}/original.jpg", b"n", age=60)
    for i in range(4):
        _local(storage, f"objects/{9500000 + i}/README", b"r")
    storage.put(io.BytesIO(b"the one row"))
    report = find_orphans(storage, delete=True)
    (local,) = report.pools
    assert (local.listed, local.orphans, local.too_young, local.unrecognised) == (14, 4, 5, 4)
    assert local.refused and "9 of its 10 blobs have no row" in local.refused
    assert all(b.exists() for b in old) and report.deleted == 0


def test_names_the_service_never_makes_are_left_alone(storage: Storage, tmp_path: Path) -> None:
    """Leading zeros, id 0, a file beside the folders, a folder inside
    one, a symlinked folder: counted as no key of ours, never deleted."""
    storage.put(io.BytesIO(b"a row, so that the pool has one"))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "original.jpg").write_bytes(b"not ours")
    left = [
        _local(storage, "objects/007/original.jpg", b"z"),
        _local(storage, "objects/0/original.jpg", b"z"),
        _local(storage, "objects/top.jpg", b"t"),
        _local(storage, "objects/902/sub/deep.jpg", b"d"),
    ]
    (Path(storage.settings.home) / "storage/objects/903").symlink_to(outside)
    (local,) = find_orphans(storage, delete=True, force=True).pools
    assert (local.orphans, local.unrecognised, local.handed_to_gc) == (0, 5, 0)
    assert all(p.exists() for p in left) and (outside / "original.jpg").exists()


def test_a_store_that_lists_nothing_for_ready_objects_is_an_error(
    storage: Storage, settings: Settings, tmp_path: Path
) -> None:
    """An unmounted volume looked like an empty pool: 0 listed, exit 0."""
    storage.add_pool("mounted", f"file://{tmp_path / 'mnt'}", check=False)
    row = storage.put(io.BytesIO(b"on the volume"), pool="mounted")
    assert find_orphans(storage, pool="mounted").pools[0].error is None
    (tmp_path / "mnt" / row["storage_key"]).unlink()  # the volume "unmounted"
    (found,) = find_orphans(storage, pool="mounted").pools
    assert found.error and "lists no blob, yet the ledger has 1 ready object(s)" in found.error


def test_the_command_refuses_what_makes_no_sense(tmp_path: Path) -> None:
    run = {"url": "", "home": tmp_path / "fresh"}  # embedded, nothing stored yet
    assert hypermedia("db", "upgrade", **run).returncode == 0  # type: ignore[arg-type]
    done = hypermedia("gc", "orphans", **run)  # type: ignore[arg-type]
    assert done.returncode == 0 and "no pools (nothing stored yet)" in done.stdout
    done = hypermedia("gc", "orphans", "--pool", "", **run)  # type: ignore[arg-type]
    assert done.returncode == 2 and "--pool needs a pool's name" in done.stderr
    done = hypermedia("gc", "orphans", "--force", **run)  # type: ignore[arg-type]
    assert done.returncode == 2 and "--force goes with --delete" in done.stderr


def test_two_runs_at_once_hand_each_orphan_over_once(storage: Storage) -> None:
    """QA: on PostgreSQL the loser said a raw unique-key error, on MariaDB a
    deadlock, and printed no report."""
    storage.put(io.BytesIO(b"row"))
    for i in range(150):
        _local(storage, f"objects/{9700000 + i}/original.bin", b"x")
    results: list[object] = []

    def run() -> None:
        try:
            results.append(find_orphans(storage, delete=True, force=True))
        except Exception as exc:  # the failure is what is asserted
            results.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(not isinstance(r, Exception) for r in results), results
    # Each one at least once (one run may hand over a blob another's sweep
    # has just deleted, listed before it went: its delete is a no-op).
    handed = sum(r.pools[0].handed_to_gc for r in results)  # type: ignore[union-attr]
    assert handed >= 150
    assert find_orphans(storage).pools[0].orphans == 0
    assert len(list(Path(storage.settings.home, "storage", "objects").iterdir())) == 1
    with storage.db.read() as tx:
        assert tx.deleting_objects(100, 0, []) == []


def test_the_command_lists_deletes_and_says_a_refusal(storage: Storage, settings: Settings) -> None:
    row = storage.put(io.BytesIO(b"kept"))
    blobs = [_local(storage, f"objects/{9200000 + i}/original.jpg", b"j" * 10) for i in (0, 1)]
    run = {"url": settings.url, "home": settings.home}
    done = hypermedia("gc", "orphans", **run)  # type: ignore[arg-type]
    assert done.returncode == 0, done.stderr
    assert "pool local: 3 blob(s) listed, 2 orphan(s) (20 bytes)" in done.stdout
    assert "objects/9200001/original.jpg" in done.stdout
    done = hypermedia("gc", "orphans", "--delete", **run)  # type: ignore[arg-type]
    assert done.returncode == 1, done.stdout
    assert "pool local: none deleted: 2 of its 3 blobs have no row" in done.stdout
    assert "orphans not deleted in pool(s) local" in done.stderr
    assert all(b.exists() for b in blobs)
    done = hypermedia("gc", "orphans", "--delete", "--force", "--json", **run)  # type: ignore[arg-type]
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["deleted"], report["pools"][0]["handed_to_gc"]) == (2, 2)
    assert not any(b.exists() for b in blobs)
    assert storage.get(row["object_id"])["state"] == "ready"
    done = hypermedia("gc", "orphans", "--older-than-hours", "-1", **run)  # type: ignore[arg-type]
    assert done.returncode == 2 and "--older-than-hours must be 0 or more" in done.stderr
    done = hypermedia("gc", "orphans", "--pool", "nope", **run)  # type: ignore[arg-type]
    assert done.returncode == 2 and "nope" in done.stderr


def test_orphans_in_s3(s3_storage: Storage) -> None:
    pool = s3_storage.pool("s3")
    kept = s3_storage.put(io.BytesIO(os.urandom(5000)), pool="s3")
    other = s3_storage.put(io.BytesIO(os.urandom(10)), pool="s3")
    backend = s3_storage.backend(pool["pool_id"])
    backend.put("objects/9300000/original.bin", io.BytesIO(b"late put"))

    report = find_orphans(s3_storage, pool="s3", grace_seconds=0)
    assert [(p.pool, p.listed, p.orphans, p.orphan_bytes) for p in report.pools] == [
        ("s3", 3, 1, 8)
    ]
    assert find_orphans(s3_storage, pool="s3").pools[0].too_young == 1  # LastModified: now

    report = find_orphans(s3_storage, pool="s3", grace_seconds=0, delete=True)
    assert report.deleted == 1 and not backend.exists("objects/9300000/original.bin")
    for row in (kept, other):
        assert backend.exists(row["storage_key"])


def test_a_pool_that_cannot_be_listed_is_said_and_the_others_are_listed(
    storage: Storage, settings: Settings, tmp_path: Path
) -> None:
    """A pool's folder that is a file (a mount gone wrong): said for that
    pool, and the command exits 1; the default pool is still looked at."""
    not_a_folder = tmp_path / "plain-file"
    not_a_folder.write_bytes(b"")
    storage.add_pool("broken", f"file://{not_a_folder}", check=False)
    _local(storage, "objects/9400000/original.bin", b"q" * 3)
    storage.put(io.BytesIO(b"a"))
    storage.put(io.BytesIO(b"b"))
    report = find_orphans(storage, delete=True)
    by = {p.pool: p for p in report.pools}
    assert by["broken"].error and "could not list local storage" in by["broken"].error
    assert str(tmp_path) not in by["broken"].error, "no path shown"
    assert (by["local"].orphans, report.deleted) == (1, 1)
    done = hypermedia("gc", "orphans", url=settings.url, home=settings.home)
    assert done.returncode == 1 and "pool broken: not listed to the end" in done.stdout

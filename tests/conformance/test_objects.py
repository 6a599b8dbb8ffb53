"""The objects ledger on every database, over the local pool."""

from __future__ import annotations

import hashlib
import io
import os
import time
import urllib.parse
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from hypermedia.errors import Conflict, InvalidRequest, NotFound
from hypermedia.queue.models import NewJob
from hypermedia.storage.base import ChecksumMismatch, StorageUnavailable
from hypermedia.storage.ledger import CalledOff, Storage, Ticket
from tests.harness import checksum_of
from tests.media import png


def test_put_makes_a_ready_object_with_facts_from_the_bytes(storage: Storage) -> None:
    data = png(31, 17)
    row = storage.put(io.BytesIO(data), filename="../../holiday/IMG 1.PNG")
    assert row["state"] == "ready"
    assert row["size"] == len(data)
    assert row["checksum"] == checksum_of(data)
    assert (row["mime_type"], row["width"], row["height"]) == ("image/png", 31, 17)
    assert row["storage_key"] == f"objects/{row['object_id']}/original.png"
    assert row["filename"] == "IMG 1.PNG"  # display only, never part of the key
    path = storage.settings.home / "storage" / row["storage_key"]
    assert path.read_bytes() == data


def test_keys_ignore_hostile_names(storage: Storage) -> None:
    for name in ("../../../etc/passwd", "/abs/x.png", "a\x00b.png", "\u202egnp.exe", "..\\..\\x"):
        row = storage.put(io.BytesIO(b"hello"), filename=name)
        assert row["storage_key"] == f"objects/{row['object_id']}/original.txt"
        assert "/" not in row["filename"] and "\x00" not in row["filename"]
    assert not (storage.settings.home / "etc").exists()
    assert not (storage.settings.home.parent / "etc" / "passwd").exists()


def test_open_streams_and_verifies(storage: Storage) -> None:
    data = bytes(range(256)) * 9000  # > 2 MiB: several chunks
    row = storage.put(io.BytesIO(data))
    with storage.open(row["object_id"]) as f:
        assert f.read() == data
    # Flip one byte behind the ledger's back: reading it is an error, not data.
    path = storage.settings.home / "storage" / row["storage_key"]
    tampered = bytearray(data)
    tampered[123456] ^= 0xFF
    path.write_bytes(bytes(tampered))
    with pytest.raises(ChecksumMismatch), storage.open(row["object_id"]) as f:
        while f.read(65536):
            pass


class _Failing(io.RawIOBase):
    """A stream of "x" that raises ``error`` once more than ``after`` bytes went."""

    def __init__(self, after: int, error: BaseException) -> None:
        self.sent, self.after, self.error = 0, after, error

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:  # type: ignore[no-untyped-def]
        if self.sent > self.after:
            raise self.error
        buf[: len(buf)] = b"x" * len(buf)
        self.sent += len(buf)
        return len(buf)


def test_an_upload_that_fails_never_becomes_ready(storage: Storage) -> None:
    with pytest.raises(StorageUnavailable):
        storage.put(_Failing(3 * 1024 * 1024, OSError(5, "Input/output error")))  # type: ignore[arg-type]
    assert storage.list() == []  # users see no object
    rows = storage.list(reserved=True)  # the ledger: a row for GC
    assert [r["state"] for r in rows] == ["deleting"]
    assert not (storage.settings.home / "storage" / rows[0]["storage_key"]).exists()
    assert list((storage.settings.home / "storage" / ".tmp").iterdir()) == []


def test_a_row_an_upload_left_behind_names_its_file(storage: Storage, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`objects ls --state pending|deleting` is how an operator finds these:
    the file name was written only once the row was ready ("")."""
    path = tmp_path / "holiday.jpg"
    path.write_bytes(b"some bytes")
    local = storage.backend(storage.pool()["pool_id"])

    def interrupted(*args, **kw):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    local.put_file = interrupted  # type: ignore[attr-defined]
    with pytest.raises(KeyboardInterrupt):
        storage.put_file(path)
    with pytest.raises(KeyboardInterrupt):
        storage.put_file(path, filename="named.jpg")
    rows = storage.list(reserved=True)
    assert [(r["state"], r["filename"]) for r in rows] == [
        ("deleting", "named.jpg"),
        ("deleting", "holiday.jpg"),
    ]


def test_an_upload_called_off_keeps_nothing(storage: Storage, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The API calls an upload off when the server's stop cuts its request
    short (its client is told "not kept"): before its row exists, or while its
    bytes are copied, nothing of it turns ready and no blob is left."""
    path = tmp_path / "a.bin"
    path.write_bytes(b"some bytes")
    early = Ticket()
    storage.call_off(early)  # before the row: none is made ready
    with pytest.raises(CalledOff):
        storage.put_file(path, ticket=early)
    local = storage.backend(storage.pool()["pool_id"])
    copy, late = local.put_file, Ticket()

    def called_off_meanwhile(*args, **kw):  # type: ignore[no-untyped-def]
        stored = copy(*args, **kw)  # the real copy, then the call-off as it ends
        storage.call_off(late)
        return stored

    local.put_file = called_off_meanwhile  # type: ignore[attr-defined]
    with pytest.raises(CalledOff):
        storage.put_file(path, ticket=late)
    assert [r["state"] for r in storage.list(reserved=True)] == ["deleting"] * 2
    blobs = (storage.settings.home / "storage" / "objects").rglob("*")
    assert [b for b in blobs if b.is_file()] == []
    # Called off just after it was made ready (before its answer): not kept either.
    local.put_file = copy  # type: ignore[attr-defined]
    done = Ticket()
    kept = storage.put_file(path, ticket=done)
    storage.call_off(done)
    assert [r["state"] for r in storage.list(reserved=True)] == ["deleting"] * 3
    assert kept["object_id"] not in {r["object_id"] for r in storage.list()}


def test_an_upload_interrupted_by_ctrl_c_goes_to_gc_at_once(storage: Storage, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Ctrl-C (KeyboardInterrupt, no Exception) in the middle of an upload:
    its row was left `pending` for the 6 h sweep."""
    with pytest.raises(KeyboardInterrupt):  # past the head sniffed before the row exists
        storage.put(_Failing(1024 * 1024, KeyboardInterrupt()))  # type: ignore[arg-type]
    files = [tmp_path / "a.bin", tmp_path / "b.bin"]
    for f in files:
        f.write_bytes(b"some bytes")
    local = storage.backend(storage.pool()["pool_id"])

    def interrupted(items):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    local.put_files = interrupted  # type: ignore[attr-defined]
    with pytest.raises(KeyboardInterrupt):
        storage.put_files(files)
    assert [r["state"] for r in storage.list(reserved=True)] == ["deleting"] * 3


def test_a_file_that_changes_while_it_is_stored_is_refused(storage: Storage, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A file written to while it uploads: its row turned `ready` with the
    checksum of bytes the file no longer held, and every read then failed."""
    local = storage.backend(storage.pool()["pool_id"])
    real_one, real_many = local.put_file, local.put_files  # type: ignore[attr-defined]
    src = tmp_path / "growing.log"
    src.write_bytes(b"first lines\n")

    def written_meanwhile(path: Path) -> None:
        with open(path, "ab") as f:  # a writer appending while the upload read it
            f.write(b"a line more\n")

    def one(key, path, **kw):  # type: ignore[no-untyped-def]
        stored = real_one(key, path, **kw)
        written_meanwhile(path)
        return stored

    def many(items):  # type: ignore[no-untyped-def]
        stored = real_many(items)
        written_meanwhile(items[-1][1])
        return stored

    local.put_file, local.put_files = one, many  # type: ignore[attr-defined]
    with pytest.raises(Conflict, match=r"growing\.log changed while it was stored"):
        storage.put_file(src)
    other = tmp_path / "still.bin"
    other.write_bytes(b"nobody writes here")
    with pytest.raises(Conflict, match=r"growing\.log changed while it was stored"):
        storage.put_files([other, src])
    assert storage.list() == []
    assert [r["state"] for r in storage.list(reserved=True)] == ["deleting"] * 3
    # Left alone, the same file is stored, and reads back whole.
    local.put_file, local.put_files = real_one, real_many  # type: ignore[attr-defined]
    row = storage.put_file(src)
    with storage.open(row["object_id"]) as f:
        assert f.read() == src.read_bytes()


def test_a_file_that_goes_away_while_it_is_stored_is_named(storage: Storage, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Deleted (or made unreadable) between the command's start and its copy:
    "could not write to local storage (No such file or directory)" blamed a
    disk that was fine."""
    local = storage.backend(storage.pool()["pool_id"])
    real_one, real_many = local.put_file, local.put_files  # type: ignore[attr-defined]
    keep, lost = tmp_path / "keep.bin", tmp_path / "lost.png"

    def one(key, path, **kw):  # type: ignore[no-untyped-def]
        lost.unlink(missing_ok=True)
        return real_one(key, path, **kw)

    def many(items):  # type: ignore[no-untyped-def]
        lost.unlink(missing_ok=True)
        return real_many(items)

    local.put_file, local.put_files = one, many  # type: ignore[attr-defined]
    try:
        for store in (lambda: storage.put_file(lost), lambda: storage.put_files([keep, lost])):
            keep.write_bytes(b"here to stay")
            lost.write_bytes(b"about to go")
            with pytest.raises(Conflict) as info:
                store()
            assert str(info.value) == (
                "lost.png could not be read while it was stored (No such file or directory): "
                "nothing was kept"
            )
    finally:
        local.put_file, local.put_files = real_one, real_many  # type: ignore[attr-defined]
    assert storage.list() == []
    assert {r["state"] for r in storage.list(reserved=True)} == {"deleting"}


def test_pools(storage: Storage, tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert storage.pool()["name"] == "local"  # made on first use
    other = tmp_path / "elsewhere"
    storage.add_pool("archive", f"file://{other}")
    row = storage.put(io.BytesIO(b"abc"), pool="archive")
    assert (other / row["storage_key"]).read_bytes() == b"abc"
    with pytest.raises(Conflict):
        storage.add_pool("archive", "file:")
    with pytest.raises(NotFound):
        storage.put(io.BytesIO(b"abc"), pool="nope")
    # A pool with an owner project holds that project's objects only.
    storage.add_pool("p1-only", f"file://{tmp_path / 'p1'}", project_id="p1")
    assert storage.put(io.BytesIO(b"p1's"), pool="p1-only", project_id="p1")["state"] == "ready"
    before = len(storage.list())
    src = tmp_path / "theirs.bin"
    src.write_bytes(b"not p1's")
    for put in (
        lambda: storage.put(io.BytesIO(b"x"), pool="p1-only", project_id="p2"),
        lambda: storage.put_file(src, pool="p1-only"),
        lambda: storage.put_files([src, src], pool="p1-only", project_id="p2"),
    ):
        with pytest.raises(InvalidRequest, match="belongs to another project"):
            put()
    assert len(storage.list()) == before
    for bad in (
        "http://example.com/x",
        "file://host/x",
        "file:relative/path",
        "s3://key:secret@bucket",
        "s3://bucket/prefix",
        "s3://bucket?endpoint=http://x&color=blue",
        # Credentials inside the endpoint were stored and shown in every
        # presigned link; bucket names S3 refuses were accepted.
        "s3://media?endpoint=http://AKIA:secret@127.0.0.1:8333&region=us-east-1",
        "s3://media?endpoint=ftp://127.0.0.1:8333",
        "s3://media?endpoint=http://127.0.0.1:8333/path",
        "s3://media?endpoint=127.0.0.1:8333",
        "s3://Bad_Bucket!?endpoint=http://127.0.0.1:8333",
        "s3://media:99?endpoint=http://127.0.0.1:8333",
    ):
        with pytest.raises(InvalidRequest):
            storage.add_pool("bad", bad)
    assert "bad" not in {p["name"] for p in storage.pools()}


def test_signed_urls_for_local_objects(storage: Storage) -> None:
    row = storage.put(io.BytesIO(b"payload"))
    url = storage.signed_url(row["object_id"], "http://h")
    q = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    expires, sig = int(q["expires"][0]), q["sig"][0]
    assert url.startswith(f"http://h/v1/objects/{row['object_id']}/content?")
    assert storage.check_signature(row["object_id"], expires, sig)
    assert not storage.check_signature(row["object_id"] + 1, expires, sig)
    assert not storage.check_signature(row["object_id"], expires + 1, sig)
    assert not storage.check_signature(row["object_id"], int(time.time()) - 1, sig)
    # The signing key persists in HOME: a second Storage (another process) agrees.
    again = Storage(storage.db, storage.settings)
    assert again.check_signature(row["object_id"], expires, sig)


def test_signed_urls_expire_by_the_storage_clock(storage: Storage) -> None:
    """The storage clock is the database server's on PostgreSQL and MariaDB
    (queue/clock.py): an API node whose own clock is off signs URLs that
    expire when every other node says so."""
    row = storage.put(io.BytesIO(b"payload"))
    skewed = {"now": datetime(2030, 1, 1)}  # far from this machine's clock
    node = Storage(storage.db, storage.settings, clock=lambda: skewed["now"])
    q = urllib.parse.parse_qs(urllib.parse.urlsplit(node.signed_url(row["object_id"])).query)
    expires, sig = int(q["expires"][0]), q["sig"][0]
    ttl = storage.settings.signed_url_seconds
    assert expires == int(datetime(2030, 1, 1, tzinfo=UTC).timestamp()) + ttl
    assert node.check_signature(row["object_id"], expires, sig)
    skewed["now"] += timedelta(seconds=ttl + 1)
    assert not node.check_signature(row["object_id"], expires, sig)


def test_jobs_take_their_input_from_the_ledger(storage: Storage, engine) -> None:  # type: ignore[no-untyped-def]
    row = storage.put(io.BytesIO(b"input bytes"))
    job_id = engine.enqueue(NewJob("debug.copy", object_id=row["object_id"]))
    job = engine.get(job_id)
    assert (job["object_id"], job["pool_id"]) == (row["object_id"], row["pool_id"])
    assert (job["input_key"], job["input_size_bytes"]) == (row["storage_key"], 11)
    with pytest.raises(InvalidRequest, match="does not exist"):
        engine.enqueue(NewJob("debug.copy", object_id=row["object_id"] + 1000))
    with storage.db.tx() as tx:
        tx.update_object(row["object_id"], ["ready"], {"state": "deleting"})
    with pytest.raises(InvalidRequest, match="deleting"):
        engine.enqueue(NewJob("debug.copy", object_id=row["object_id"]))


def test_put_file_and_download_verify(storage: Storage, tmp_path) -> None:  # type: ignore[no-untyped-def]
    data = os.urandom(5 * 1024 * 1024 + 3)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    row = storage.put_file(src, filename="my file.bin")
    assert (row["state"], row["size"], row["filename"]) == ("ready", len(data), "my file.bin")
    assert row["checksum"] == checksum_of(data)
    dst = tmp_path / "back.bin"
    storage.download(row, dst)
    assert dst.read_bytes() == data
    blob = storage.settings.home / "storage" / row["storage_key"]
    blob.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))  # "!" was the last byte 1 in 256
    again = tmp_path / "again.bin"
    with pytest.raises(ChecksumMismatch):
        storage.download(row, again)
    assert not again.exists()  # no unverified bytes left behind


def test_objects_recorded_with_sha256_are_still_verified(storage: Storage, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Rows written before BLAKE3 became the default carry "sha256:" checksums:
    read and downloaded with that algorithm, and corruption still caught."""
    data = os.urandom(5 * 1024 * 1024 + 3)
    row = storage.put(io.BytesIO(data))
    legacy = "sha256:" + hashlib.sha256(data).hexdigest()
    row = _with_checksum(storage, row, legacy)
    assert row["checksum"] == legacy
    with storage.open(row["object_id"]) as f:
        assert f.read() == data
    storage.download(row, tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == data
    # The same bytes, another (wrong) SHA-256.
    _refused(storage, _with_checksum(storage, row, "sha256:" + "0" * 64), tmp_path / "again.bin")


def test_an_unknown_checksum_algorithm_is_never_read_unverified(storage: Storage, tmp_path) -> None:  # type: ignore[no-untyped-def]
    row = storage.put(io.BytesIO(b"abc"))
    _refused(storage, _with_checksum(storage, row, "blake4:" + "0" * 64), tmp_path / "back.bin")


def _with_checksum(storage: Storage, row: dict[str, Any], checksum: str) -> dict[str, Any]:
    """The ready object ``row`` as if the ledger had recorded ``checksum`` for it."""
    with storage.db.tx() as tx:
        assert tx.update_object(row["object_id"], ["ready"], {"checksum": checksum})
    return storage.get(row["object_id"])


def _refused(storage: Storage, row: dict[str, Any], dst: Path) -> None:
    """Neither a stream nor a download hands over the object's bytes."""
    with pytest.raises(ChecksumMismatch), storage.open(row["object_id"]) as f:
        f.read()
    with pytest.raises(ChecksumMismatch):
        storage.download(row, dst)
    assert not dst.exists()


def test_put_files_registers_many_at_once(storage: Storage, tmp_path) -> None:  # type: ignore[no-untyped-def]
    blobs = [os.urandom(50_000 + i) for i in range(20)]
    paths = []
    for i, b in enumerate(blobs):
        paths.append(tmp_path / f"f{i}.bin")
        paths[-1].write_bytes(b)
    paths.append(tmp_path / "pic.png")
    paths[-1].write_bytes(png(5, 4))
    rows = storage.put_files(paths)
    assert [r["state"] for r in rows] == ["ready"] * 21
    for row, b in zip(rows, blobs, strict=False):
        assert row["checksum"] == checksum_of(b)
        assert row["storage_key"] == f"objects/{row['object_id']}/original.bin"
        with storage.open(row["object_id"]) as f:
            assert f.read() == b
    assert (rows[-1]["mime_type"], rows[-1]["width"], rows[-1]["height"]) == ("image/png", 5, 4)
    assert rows[-1]["filename"] == "pic.png"


def test_put_files_that_fail_leave_nothing_ready(storage: Storage, tmp_path) -> None:  # type: ignore[no-untyped-def]
    ok = tmp_path / "ok.bin"
    ok.write_bytes(b"fine")
    gone = tmp_path / "gone.bin"
    gone.write_bytes(b"soon gone")
    local = storage.backend(storage.pool()["pool_id"])
    real = local.put_files  # type: ignore[attr-defined]

    def vanish_then_store(items):  # type: ignore[no-untyped-def]
        gone.unlink()  # the file disappears between registration and upload
        return real(items)

    local.put_files = vanish_then_store  # type: ignore[attr-defined]
    with pytest.raises(Conflict, match=r"gone\.bin could not be read while it was stored"):
        storage.put_files([ok, gone])
    assert storage.list() == []
    assert sorted(r["state"] for r in storage.list(reserved=True)) == ["deleting", "deleting"]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_worker_outputs_are_fsynced_in_one_batch_before_they_may_become_ready(
    storage: Storage,
    tmp_path,
    monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    from hypermedia.storage import local

    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(local.os, "fsync", fsync)
    pool_id = storage.pool()["pool_id"]
    rows = []
    for i in range(3):
        src = tmp_path / f"out{i}.txt"
        src.write_bytes(b"x" * (i + 1))
        rows.append(storage.add_output(pool_id, "thumb", src, "text/plain", "p", durable=False))
    assert synced == []  # nothing on the slot's way
    storage.make_durable()
    root = storage.settings.home / "storage"
    blobs = {str((root / r["storage_key"]).resolve()) for r in rows}
    dirs = {str((root / r["storage_key"]).resolve().parent) for r in rows}
    assert blobs <= set(synced) and dirs <= set(synced)
    # objects/ once for the whole batch, not once per output.
    assert synced.count(str((root / "objects").resolve())) == 1
    synced.clear()
    storage.make_durable()  # nothing left to sync
    assert synced == []
    # The default stays durable on its own (put_file, uploads through the API).
    src = tmp_path / "again.txt"
    src.write_bytes(b"y")
    row = storage.add_output(pool_id, "thumb", src, "text/plain", "p")
    assert any("/.tmp/" in p for p in synced)  # the blob, fsynced before its rename
    assert str((root / row["storage_key"]).resolve().parent) in synced


def test_an_object_never_gets_the_id_of_one_deleted(storage, driver) -> None:
    """SQLite would hand the newest deleted row's id (and so its storage key)
    to the next object: a signed URL for the old one would serve the new."""
    import io as _io

    import sqlalchemy as _sa

    from hypermedia.db.schema_storage import objects as _objects

    first = storage.put(_io.BytesIO(b"first"))["object_id"]
    newest = storage.put(_io.BytesIO(b"newest"))["object_id"]
    with driver.tx() as tx:  # what GC's last step does to the newest row
        tx.conn.execute(_sa.delete(_objects).where(_objects.c.object_id == newest))
    again = storage.put(_io.BytesIO(b"after"))["object_id"]
    assert first < newest < again

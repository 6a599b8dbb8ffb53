"""One conformance suite for every storage backend: local folders and S3 (SeaweedFS).

Each test runs against the real thing: files under tmp_path, and a real
SeaweedFS server for S3 (see conftest.py).  Nothing of boto3 is mocked.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import subprocess
import time
import traceback
import tracemalloc
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, cast
from urllib.parse import quote

import blake3
import pytest

from hypermedia.storage.base import (
    Backend,
    BlobMissing,
    ChecksumMismatch,
    StorageUnavailable,
    Stored,
    UnsafeKey,
    VerifyingReader,
)
from hypermedia.storage.local import LocalBackend
from hypermedia.storage.s3 import SMALL_BODY, S3Backend
from tests.harness import checksum_of, small_tmpfs
from tests.storage.conftest import SeaweedServer, drop_bucket

MiB = 1024 * 1024
KEY = "objects/1/original.bin"


@pytest.fixture(params=["local", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "local":
        return LocalBackend(tmp_path / "pool")
    return cast(Backend, request.getfixturevalue("s3_backend"))


def _bytes(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


def _read_all(backend: Backend, key: str) -> bytes:
    with backend.open(key) as f:
        return f.read()


def _hash_stream(f: BinaryIO) -> tuple[int, str]:
    digest, size = blake3.blake3(), 0
    while chunk := f.read(MiB):
        digest.update(chunk)
        size += len(chunk)
    return size, "blake3:" + digest.hexdigest()


class GeneratedStream:
    """A readable stream fed by a generator of chunks, never holding the whole body.

    ``read(n)`` hands out at most one chunk's worth, as a socket or a pipe does;
    what it hands out is hashed here, independently of the backend.
    """

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._rest = b""
        self.size = 0
        self._hash = blake3.blake3()

    def read(self, n: int = -1) -> bytes:
        if not self._rest:
            self._rest = next(self._chunks, b"")
        if n < 0 or n >= len(self._rest):
            data, self._rest = self._rest, b""
        else:
            data, self._rest = self._rest[:n], self._rest[n:]
        self.size += len(data)
        self._hash.update(data)
        return data

    def readable(self) -> bool:
        return True

    @property
    def checksum(self) -> str:
        return "blake3:" + self._hash.hexdigest()


def _chunks(total: int, chunk: int = MiB, fail_after: int = -1) -> Iterator[bytes]:
    sent, i = 0, 0
    while sent < total:
        if fail_after >= 0 and sent >= fail_after:
            raise SourceFailed("the client went away")
        n = min(chunk, total - sent)
        block = hashlib.sha256(i.to_bytes(8, "big")).digest()
        yield (block * (n // len(block) + 1))[:n]
        sent, i = sent + n, i + 1


class SourceFailed(Exception):
    pass


class ShortReads(io.RawIOBase):
    """Returns fewer bytes than asked, at random, like a slow network upload."""

    def __init__(self, data: bytes, seed: int = 1) -> None:
        self._data = memoryview(data)
        self._rng = random.Random(seed)

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        n = min(len(buf), len(self._data), self._rng.randint(1, 300_000))
        buf[:n] = self._data[:n]
        self._data = self._data[n:]
        return n


# -- round trips ---------------------------------------------------------------


@pytest.mark.parametrize(
    "size",
    [0, 1, 1000, SMALL_BODY - 1, SMALL_BODY, SMALL_BODY + 1, 2 * SMALL_BODY + 12345],
    ids=["empty", "1B", "1kB", "small-1", "small", "small+1", "multipart"],
)
def test_put_open_round_trip(backend: Backend, size: int) -> None:
    data = _bytes(size, seed=size)
    stored = backend.put(KEY, io.BytesIO(data))
    assert stored == Stored(size, checksum_of(data))
    assert _read_all(backend, KEY) == data
    assert backend.size(KEY) == size  # type: ignore[attr-defined]
    # Reading in small pieces gives the same bytes, then EOF for good.
    with backend.open(KEY) as f:
        pieces = []
        while chunk := f.read(65536):
            pieces.append(chunk)
        assert f.read(65536) == b""
    assert b"".join(pieces) == data


def test_put_replaces(backend: Backend) -> None:
    backend.put(KEY, io.BytesIO(b"first"))
    stored = backend.put(KEY, io.BytesIO(b"second"))
    assert stored.size == 6
    assert _read_all(backend, KEY) == b"second"


def test_short_reads_make_full_parts(backend: Backend) -> None:
    # A source whose read(n) returns less than n (S3 rejects short parts but the last).
    data = _bytes(3 * SMALL_BODY + 7, seed=3)
    stored = backend.put(KEY, cast(BinaryIO, ShortReads(data)))
    assert stored == Stored(len(data), checksum_of(data))
    assert _read_all(backend, KEY) == data


def test_large_put_streams_in_flat_memory(backend: Backend) -> None:
    total = 64 * MiB
    src = GeneratedStream(_chunks(total))
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        stored = backend.put(KEY, cast(BinaryIO, src))
        _, put_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        with backend.open(KEY) as f:
            size, digest = _hash_stream(f)
        _, get_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert src.size == total
    assert stored == Stored(total, src.checksum)
    assert (size, digest) == (total, src.checksum)
    assert put_peak < 32 * MiB, f"put peaked at {put_peak / MiB:.1f} MiB"
    assert get_peak < 32 * MiB, f"open/read peaked at {get_peak / MiB:.1f} MiB"


def test_a_failing_source_is_not_a_storage_error(backend: Backend) -> None:
    # The caller's stream breaks mid-upload (a client went away): its own error
    # comes out, and no blob is left under the key.
    src = GeneratedStream(_chunks(40 * MiB, fail_after=20 * MiB))
    with pytest.raises(SourceFailed):
        backend.put(KEY, cast(BinaryIO, src))
    assert not backend.exists(KEY)
    with pytest.raises(SourceFailed):
        backend.put(KEY, cast(BinaryIO, GeneratedStream(_chunks(MiB, fail_after=0))))
    assert not backend.exists(KEY)
    if isinstance(backend, S3Backend):  # the multipart upload was aborted, not left to bill
        uploads = backend._client.list_multipart_uploads(Bucket=backend.bucket)
        assert not uploads.get("Uploads")


# -- files on disk: put_file, put_files, get_file ------------------------------------
#
# The ledger calls these when a backend has them (uploads of files, job inputs):
# local pools copy in the kernel, S3 sends parts in parallel; both hash on the way.

FILE_SIZES = [0, 1000, SMALL_BODY, SMALL_BODY + 1, 4 * MiB + 1, 3 * SMALL_BODY + 12345]
FILE_IDS = ["empty", "1kB", "small", "small+1", "threaded-get", "multipart"]


def _file(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("size", FILE_SIZES, ids=FILE_IDS)
def test_put_file_get_file_round_trip(backend: Backend, tmp_path: Path, size: int) -> None:
    data = _bytes(size, seed=size + 1)
    checksum = checksum_of(data)
    files: Any = backend
    stored = files.put_file(KEY, _file(tmp_path, "src.bin", data))
    assert stored == Stored(size, checksum)
    assert _read_all(backend, KEY) == data
    assert backend.size(KEY) == size  # type: ignore[attr-defined]
    if isinstance(backend, S3Backend):  # recorded for every size, as by put
        assert backend.stored_checksum(KEY) == checksum
    dst = tmp_path / "back.bin"
    files.get_file(KEY, dst, checksum)
    assert dst.read_bytes() == data


@pytest.mark.parametrize("size", [1000, 3 * SMALL_BODY + 5], ids=["small", "threaded"])
def test_get_file_refuses_bytes_that_do_not_match(
    backend: Backend, tmp_path: Path, size: int
) -> None:
    data = _bytes(size, seed=21)
    files: Any = backend
    files.put_file(KEY, _file(tmp_path, "src.bin", data))
    # The blob changes behind our back (bit rot, another writer): same size.
    backend.put(KEY, io.BytesIO(data[:-1] + bytes([data[-1] ^ 1])))
    dst = tmp_path / "back.bin"
    with pytest.raises(ChecksumMismatch):
        files.get_file(KEY, dst, checksum_of(data))
    assert not dst.exists()  # no unverified bytes left behind


@pytest.mark.parametrize("size", [1000, 3 * SMALL_BODY + 5], ids=["small", "threaded"])
@pytest.mark.parametrize("link", [False, True], ids=["copy", "link"])
def test_blobs_checked_against_a_sha256_checksum(
    backend: Backend, tmp_path: Path, size: int, link: bool
) -> None:
    """A "sha256:" checksum (objects recorded before BLAKE3) verifies with SHA-256."""
    data = _bytes(size, seed=23)
    files: Any = backend
    backend.put(KEY, io.BytesIO(data))
    legacy = "sha256:" + hashlib.sha256(data).hexdigest()
    dst = tmp_path / "back.bin"
    files.get_file(KEY, dst, legacy, link=link)
    assert dst.read_bytes() == data
    dst.unlink()
    with VerifyingReader(backend.open(KEY), legacy) as r:
        assert r.read() == data and r.read() == b""
    backend.put(KEY, io.BytesIO(data[:-1] + bytes([data[-1] ^ 1])))
    with pytest.raises(ChecksumMismatch):
        files.get_file(KEY, dst, legacy, link=link)
    assert not dst.exists()
    with pytest.raises(ChecksumMismatch), VerifyingReader(backend.open(KEY), legacy) as r:
        while r.read(MiB):
            pass


def test_an_unknown_checksum_algorithm_is_refused(backend: Backend, tmp_path: Path) -> None:
    files: Any = backend
    backend.put(KEY, io.BytesIO(b"abc"))
    dst = tmp_path / "back.bin"
    for bad in ("md5:900150983cd24fb0d6963f7d28e17f72", "blake4:" + "0" * 64):
        with pytest.raises(ChecksumMismatch):
            files.get_file(KEY, dst, bad)
        assert not dst.exists()
        with pytest.raises(ChecksumMismatch):
            VerifyingReader(io.BytesIO(b"abc"), bad)


def test_get_file_missing_and_existing_destination(backend: Backend, tmp_path: Path) -> None:
    files: Any = backend
    dst = tmp_path / "back.bin"
    with pytest.raises(BlobMissing):
        files.get_file("objects/404/original.bin", dst, "0" * 64)
    assert not dst.exists()
    backend.put(KEY, io.BytesIO(b"abc"))
    dst.write_bytes(b"the caller's file")
    with pytest.raises(FileExistsError):
        files.get_file(KEY, dst, checksum_of(b"abc"))
    assert dst.read_bytes() == b"the caller's file"  # not ours: left as it was


@pytest.mark.parametrize("size", [0, 1000, 4 * MiB + 1], ids=["empty", "1kB", "large"])
def test_a_job_input_is_a_verified_hard_link_on_a_local_pool(tmp_path: Path, size: int) -> None:
    backend = LocalBackend(tmp_path / "pool")
    data = _bytes(size, seed=size + 7)
    checksum = backend.put(KEY, io.BytesIO(data)).checksum
    dst = tmp_path / "input.bin"
    backend.get_file(KEY, dst, checksum, link=True)
    assert dst.read_bytes() == data
    assert os.stat(dst).st_ino == os.stat(tmp_path / "pool" / KEY).st_ino  # no copy made
    # Bit rot under a link is caught like under a copy, and the link is gone.
    dst.unlink()
    with open(tmp_path / "pool" / KEY, "r+b") as f:
        f.write(b"\x00" if size == 0 else bytes([data[0] ^ 1]))
    with pytest.raises(ChecksumMismatch):
        backend.get_file(KEY, dst, checksum, link=True)
    assert not dst.exists()


def test_make_durable_syncs_each_blob_and_the_directories_its_write_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hypermedia.storage import local

    backend = LocalBackend(tmp_path / "pool")
    backend.put("objects/1/original.bin", io.BytesIO(b"first"))  # objects/ exists now
    src = _file(tmp_path, "out.bin", b"output")
    backend.put_file("objects/2/thumb.bin", src, durable=False)
    synced: list[str] = []
    monkeypatch.setattr(local, "_fsync_dir", lambda d: synced.append(str(d)))
    backend.make_durable(["objects/2/thumb.bin"])
    root = str(tmp_path / "pool")
    # The new objects/2/ (its entry for the file) and objects/ (its entry for
    # objects/2/), deepest first; not the root, whose entries did not change.
    assert synced == [f"{root}/objects/2", f"{root}/objects"]
    synced.clear()
    backend.make_durable(["objects/1/original.bin"])  # no record: every level up
    assert synced == [f"{root}/objects/1", f"{root}/objects", root]


def test_an_output_moved_into_a_local_pool_is_taken_not_copied(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "pool")
    src = _file(tmp_path, "thumb.webp", b"thumbnail bytes")
    inode = os.stat(src).st_ino
    stored = backend.put_file("objects/3/thumb.webp", src, durable=False, move=True)
    assert not src.exists()  # taken
    dst = tmp_path / "pool" / "objects" / "3" / "thumb.webp"
    assert os.stat(dst).st_ino == inode  # the same file: no copy made
    assert (stored.size, stored.checksum) == (15, checksum_of(b"thumbnail bytes"))
    assert list((tmp_path / "pool" / ".tmp").iterdir()) == []
    backend.make_durable(["objects/3/thumb.webp"])  # recorded for the flusher's sync


def test_an_output_swapped_for_a_symlink_is_not_moved_in(tmp_path: Path) -> None:
    """A child that takes over its decoder could replace its output with a link
    to a host file after the worker checked it: the pool never stores a link."""
    backend = LocalBackend(tmp_path / "pool")
    secret = _file(tmp_path, "secret", b"host file")
    link = tmp_path / "thumb.webp"
    link.symlink_to(secret)
    with pytest.raises(StorageUnavailable):
        backend.put_file("objects/4/thumb.webp", link, durable=False, move=True)
    assert not (tmp_path / "pool" / "objects" / "4" / "thumb.webp").exists()
    assert not [p for p in (tmp_path / "pool").rglob("*") if p.is_symlink()]
    assert secret.read_bytes() == b"host file"


def test_an_output_moved_across_file_systems_is_copied(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second file system to move across")
    src = shm / f"hm-test-{os.getpid()}-out.webp"
    src.write_bytes(b"thumbnail bytes")
    try:
        backend = LocalBackend(tmp_path / "pool")
        stored = backend.put_file("objects/5/thumb.webp", src, durable=True, move=True)
        assert stored.checksum == checksum_of(b"thumbnail bytes")
        assert (tmp_path / "pool" / "objects" / "5" / "thumb.webp").read_bytes() == (
            b"thumbnail bytes"
        )
    finally:
        src.unlink(missing_ok=True)


def test_a_job_input_across_file_systems_is_a_copy(tmp_path: Path) -> None:
    """/dev/shm is another file system than tmp_path here: the link fails, a copy is made."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second file system to copy across")
    backend = LocalBackend(tmp_path / "pool")
    checksum = backend.put(KEY, io.BytesIO(b"across" * 1000)).checksum
    dst = shm / f"hm-test-{os.getpid()}-input.bin"
    try:
        backend.get_file(KEY, dst, checksum, link=True)
        assert dst.read_bytes() == b"across" * 1000
        assert os.stat(dst).st_nlink == 1
    finally:
        dst.unlink(missing_ok=True)


def test_put_files_stores_a_batch_in_order(backend: Backend, tmp_path: Path) -> None:
    sizes = [0, 1, 50_000, 50_001, SMALL_BODY + 1, *range(1000, 1030)]
    datas = [_bytes(n, seed=i) for i, n in enumerate(sizes)]
    items = [
        (f"objects/{i}/original.bin", _file(tmp_path, f"f{i}.bin", d)) for i, d in enumerate(datas)
    ]
    files: Any = backend
    stored = files.put_files(items)
    assert stored == [Stored(len(d), checksum_of(d)) for d in datas]
    for (key, _), d in zip(items, datas, strict=True):
        assert _read_all(backend, key) == d
    assert files.put_files([]) == []


def test_put_files_with_a_missing_file_fails(backend: Backend, tmp_path: Path) -> None:
    items = [
        (f"objects/{i}/original.bin", _file(tmp_path, f"f{i}.bin", _bytes(1000, seed=i)))
        for i in range(6)
    ]
    items[3][1].unlink()
    files: Any = backend
    with pytest.raises((FileNotFoundError, StorageUnavailable)):
        files.put_files(items)
    assert not backend.exists(items[3][0])


def test_put_file_unsafe_key_reads_nothing(backend: Backend, tmp_path: Path) -> None:
    files: Any = backend
    src = _file(tmp_path, "src.bin", b"payload")
    for key in ("../x", "objects/1/..", "/etc/passwd"):
        with pytest.raises(UnsafeKey):
            files.put_file(key, src)
        with pytest.raises(UnsafeKey):
            files.put_files([(KEY, src), (key, src)])
        with pytest.raises(UnsafeKey):
            files.get_file(key, tmp_path / "x.bin", "0" * 64)
    assert not (tmp_path / "x.bin").exists()


def test_file_transfers_run_in_flat_memory(backend: Backend, tmp_path: Path) -> None:
    total = 64 * MiB
    src = tmp_path / "big.bin"
    with open(src, "wb") as f:
        for chunk in _chunks(total):
            f.write(chunk)
    files: Any = backend
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        stored = files.put_file(KEY, src)
        _, put_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        files.get_file(KEY, tmp_path / "back.bin", stored.checksum)
        _, get_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert stored.size == total
    assert put_peak < 32 * MiB, f"put_file peaked at {put_peak / MiB:.1f} MiB"
    assert get_peak < 32 * MiB, f"get_file peaked at {get_peak / MiB:.1f} MiB"


# -- missing, delete, exists -----------------------------------------------------


def test_open_missing_key(backend: Backend) -> None:
    with pytest.raises(BlobMissing):
        backend.open("objects/404/original.bin")


def test_delete_is_idempotent(backend: Backend) -> None:
    backend.put(KEY, io.BytesIO(b"abc"))
    other = "objects/1/thumb.jpg"
    backend.put(other, io.BytesIO(b"def"))
    backend.delete(KEY)
    backend.delete(KEY)
    backend.delete("objects/2/never-written.bin")
    assert not backend.exists(KEY)
    with pytest.raises(BlobMissing):
        backend.open(KEY)
    assert _read_all(backend, other) == b"def"  # its neighbour is untouched


def test_delete_prefix_removes_one_objects_blobs_only(backend: Backend) -> None:
    for key in ("objects/7/thumb.webp", "objects/7/preview.webp", "objects/70/thumb.webp"):
        backend.put(key, io.BytesIO(key.encode()))
    backend.delete_prefix("objects/7/")
    assert not backend.exists("objects/7/thumb.webp")
    assert not backend.exists("objects/7/preview.webp")
    assert _read_all(backend, "objects/70/thumb.webp") == b"objects/70/thumb.webp"
    if isinstance(backend, LocalBackend):
        assert not (backend.root / "objects" / "7").exists()  # its directory goes too
    backend.delete_prefix("objects/7/")  # nothing left: no error
    backend.delete_prefix("objects/404/")
    with pytest.raises(UnsafeKey):
        backend.delete_prefix("objects/../")


def test_exists(backend: Backend) -> None:
    assert not backend.exists(KEY)
    backend.put(KEY, io.BytesIO(b""))
    assert backend.exists(KEY)
    assert not backend.exists("objects/1")  # a prefix is no blob
    assert not backend.exists("objects/1/original.bi")


@pytest.mark.parametrize("size", [100, SMALL_BODY + 1], ids=["put-object", "multipart"])
def test_stored_checksum(backend: Backend, size: int) -> None:
    data = _bytes(size, seed=5)
    stored = backend.put(KEY, io.BytesIO(data))
    if isinstance(backend, S3Backend):
        assert backend.stored_checksum(KEY) == checksum_of(data)
        # Recording it rewrote metadata only: the bytes are those written.
        assert _read_all(backend, KEY) == data
        assert backend.size(KEY) == stored.size
    else:
        assert backend.stored_checksum(KEY) is None


# -- presigned URLs --------------------------------------------------------------


def _get(url: str) -> tuple[int, bytes, Any]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=30) as resp:
            return resp.status, resp.read(), resp.headers
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read(), exc.headers


def test_s3_reads_the_bare_sha256_of_older_blobs(s3_backend: S3Backend) -> None:
    digest = hashlib.sha256(b"old").hexdigest()
    s3_backend._client.put_object(
        Bucket=s3_backend.bucket, Key=KEY, Body=b"old", Metadata={"sha256": digest}
    )
    assert s3_backend.stored_checksum(KEY) == f"sha256:{digest}"


def test_presign(backend: Backend) -> None:
    data = _bytes(5000, seed=7)
    backend.put(KEY, io.BytesIO(data))
    url = backend.presign(KEY, 300)
    if isinstance(backend, LocalBackend):
        assert url is None  # the service signs local downloads
        return
    assert url is not None
    status, body, headers = _get(url)
    assert (status, body) == (200, data)
    # Never shown inline by the store's origin, name or not.
    assert headers["Content-Disposition"] == "attachment"

    name = 'résumé 2024 "final";.pdf'
    status, body, headers = _get(backend.presign(KEY, 300, filename=name) or "")
    assert (status, body) == (200, data)
    assert headers["Content-Disposition"] == (
        'attachment; filename="resume 2024 _final__.pdf"; '
        f"filename*=UTF-8''{quote(name, safe='')}"
    )
    # The ledger's type, whatever the store kept (a multipart upload: none).
    status, _, headers = _get(backend.presign(KEY, 300, mime="image/jpeg") or "")
    assert (status, headers["Content-Type"]) == (200, "image/jpeg")

    short = backend.presign(KEY, 1) or ""
    time.sleep(2)
    status, body, _ = _get(short)
    assert status == 403
    assert data not in body


# -- unsafe keys ---------------------------------------------------------------------

UNSAFE = [
    "../x",
    "/etc/passwd",
    "a/../../b",
    "a\x00b",
    "objects/1/..",
    "objects/ü/x",
    "objects//x",
    "C:\\x",
    "",
    "objects/1/.",
]


@pytest.mark.parametrize("key", UNSAFE)
def test_unsafe_keys_are_refused(backend: Backend, key: str, tmp_path: Path) -> None:
    src = io.BytesIO(b"payload")
    with pytest.raises(UnsafeKey):
        backend.put(key, src)
    assert src.tell() == 0  # refused before reading a byte
    with pytest.raises(UnsafeKey):
        backend.open(key)
    with pytest.raises(UnsafeKey):
        backend.delete(key)
    with pytest.raises(UnsafeKey):
        backend.exists(key)
    if isinstance(backend, S3Backend):  # LocalBackend.presign signs nothing: always None
        with pytest.raises(UnsafeKey):
            backend.presign(key, 60)
        with pytest.raises(UnsafeKey):
            backend.stored_checksum(key)


def test_local_symlinks_do_not_lead_out(tmp_path: Path) -> None:
    root = tmp_path / "pool"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.bin").write_bytes(b"secret")
    backend = LocalBackend(root)
    backend.put("objects/9/original.bin", io.BytesIO(b"mine"))

    # A directory symlink planted inside the root.
    (root / "objects" / "1").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafeKey):
        backend.open("objects/1/secret.bin")
    with pytest.raises(UnsafeKey):
        backend.put("objects/1/new.bin", io.BytesIO(b"x"))
    with pytest.raises(UnsafeKey):
        backend.delete("objects/1/secret.bin")

    # A file symlink planted where a blob would be.
    (root / "objects" / "2").mkdir()
    (root / "objects" / "2" / "original.bin").symlink_to(outside / "secret.bin")
    with pytest.raises(UnsafeKey):
        backend.open("objects/2/original.bin")
    with pytest.raises(UnsafeKey):
        backend.put("objects/2/original.bin", io.BytesIO(b"overwritten"))

    assert sorted(p.name for p in outside.iterdir()) == ["secret.bin"]
    assert (outside / "secret.bin").read_bytes() == b"secret"
    assert _read_all(backend, "objects/9/original.bin") == b"mine"


def test_local_put_files_replace_leftovers_without_writing_through_them(tmp_path: Path) -> None:
    # put_files writes in place: what an upload that died left under a key is
    # replaced, and a link planted there is never written through.
    root = tmp_path / "pool"
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"not yours")
    backend = LocalBackend(root)
    (root / "objects" / "1").mkdir(parents=True)
    (root / "objects" / "1" / "original.bin").write_bytes(b"half an upload")
    (root / "objects" / "2").mkdir()
    os.link(outside, root / "objects" / "2" / "original.bin")
    src = tmp_path / "new.bin"
    src.write_bytes(b"new bytes")
    keys = ["objects/1/original.bin", "objects/2/original.bin"]
    stored = backend.put_files([(k, src) for k in keys])
    assert stored == [Stored(9, checksum_of(b"new bytes"))] * 2
    assert [_read_all(backend, k) for k in keys] == [b"new bytes"] * 2
    assert outside.read_bytes() == b"not yours"
    # A symlink planted where a blob goes is refused before anything is written.
    (root / "objects" / "3").mkdir()
    (root / "objects" / "3" / "original.bin").symlink_to(outside)
    with pytest.raises(UnsafeKey):
        backend.put_files([("objects/3/original.bin", src)])
    assert outside.read_bytes() == b"not yours"
    assert not (root / ".tmp").exists() or not list((root / ".tmp").iterdir())


# -- S3 failures ---------------------------------------------------------------------


def _backend_at(endpoint: dict[str, str], bucket: str, secret: str = "") -> S3Backend:
    """Another S3Backend on the test server (its own client and pool)."""
    return S3Backend(
        bucket,
        endpoint=endpoint["endpoint"],
        access_key_id=endpoint["access_key_id"],
        secret_access_key=secret or endpoint["secret_access_key"],
    )


def _assert_clean(exc: BaseException, *secrets: str) -> None:
    text = str(exc)
    whole = "".join(traceback.format_exception(exc))
    for secret in secrets:
        assert secret not in text
        assert secret not in whole
    assert "X-Amz-Signature" not in whole
    assert "botocore" not in type(exc).__module__


def test_s3_outage_is_storage_unavailable(
    s3_backend: S3Backend, seaweed: SeaweedServer, s3_endpoint: dict[str, str], tmp_path: Path
) -> None:
    s3_backend.put(KEY, io.BytesIO(b"before the outage"))
    big = "objects/2/original.bin"
    s3_backend.put(big, io.BytesIO(_bytes(SMALL_BODY + 1)))
    small_file = _file(tmp_path, "small.bin", b"during")
    big_file = _file(tmp_path, "big.bin", _bytes(3 * SMALL_BODY))
    secret, access = s3_endpoint["secret_access_key"], s3_endpoint["access_key_id"]
    seaweed.stop()
    calls = {
        "put_file": lambda: s3_backend.put_file(KEY, small_file),
        "put_file-multipart": lambda: s3_backend.put_file(KEY, big_file),
        "put_files": lambda: s3_backend.put_files([(KEY, small_file), (big, small_file)]),
        "get_file": lambda: s3_backend.get_file(KEY, tmp_path / "back.bin", "0" * 64),
        "put": lambda: s3_backend.put(KEY, io.BytesIO(b"during")),
        "put-multipart": lambda: s3_backend.put(
            KEY, cast(BinaryIO, GeneratedStream(_chunks(3 * SMALL_BODY)))
        ),
        "open": lambda: s3_backend.open(KEY),
        "exists": lambda: s3_backend.exists(KEY),
        "stored_checksum": lambda: s3_backend.stored_checksum(KEY),
        "delete": lambda: s3_backend.delete(KEY),
    }
    for name, call in calls.items():
        started = time.monotonic()
        with pytest.raises(StorageUnavailable) as info:
            call()
        assert time.monotonic() - started < 30, name
        _assert_clean(info.value, secret, access)
        assert f"127.0.0.1:{seaweed.s3_port}" in str(info.value), name

    assert not (tmp_path / "back.bin").exists()
    seaweed.start()
    # What was written before the outage is still there, and writes work again.
    assert _read_all(s3_backend, KEY) == b"before the outage"
    assert s3_backend.stored_checksum(big) is not None
    s3_backend.put(KEY, io.BytesIO(b"after"))
    assert _read_all(s3_backend, KEY) == b"after"


def test_a_hung_store_fails_within_the_s3_timeout(
    s3_endpoint: dict[str, str], seaweed: SeaweedServer, tmp_path: Path
) -> None:
    """HYPERMEDIA_S3_TIMEOUT_SECONDS bounds a request to a store that takes
    the connection and never answers: it held a job or an upload 2-3 minutes
    (botocore's 60 s, twice, with a retry's wait)."""
    backend = S3Backend(
        f"t-{os.urandom(4).hex()}",
        endpoint=s3_endpoint["endpoint"],
        access_key_id=s3_endpoint["access_key_id"],
        secret_access_key=s3_endpoint["secret_access_key"],
        timeout=1.0,
    )
    backend.ensure_bucket()
    backend.put(KEY, io.BytesIO(b"before"))
    small_file = _file(tmp_path, "small.bin", b"during")
    try:
        with seaweed.hung():
            for name, call in {
                "exists": lambda: backend.exists(KEY),
                "put_file": lambda: backend.put_file(KEY, small_file),
                "get_file": lambda: backend.get_file(KEY, tmp_path / "back.bin", "0" * 64),
            }.items():
                started = time.monotonic()
                try:
                    got = call()
                except StorageUnavailable:
                    pass
                else:  # (seen once in CI, unexplained: say which call and what came)
                    took = time.monotonic() - started
                    pytest.fail(f"{name} answered {got!r} in {took:.2f} s from a hung store")
                # Two tries of 1 s and a backoff of at most 2 s, with room for a busy machine.
                assert time.monotonic() - started < 12, name
        # Answered again once resumed.  The PUT that timed out may have been
        # applied then (its bytes sat in the socket): a timeout says nothing
        # of whether a write happened, only that no answer came in time.
        assert _read_all(backend, KEY) in (b"before", b"during")
    finally:
        backend.close()
        drop_bucket(s3_endpoint, backend.bucket)


def test_s3_outage_during_a_read(s3_backend: S3Backend, seaweed: SeaweedServer) -> None:
    data = _bytes(48 * MiB, seed=11)
    s3_backend.put(KEY, io.BytesIO(data))
    with s3_backend.open(KEY) as f:
        assert f.read(MiB) == data[:MiB]
        seaweed.stop()
        with pytest.raises(StorageUnavailable) as info:
            while f.read(MiB):
                pass
    _assert_clean(info.value)


def test_s3_refuses_small_bodies_corrupted_on_the_way(
    s3_backend: S3Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The Content-MD5 of a small PutObject is what makes the store check the
    # bytes: SeaweedFS does not check the signed x-amz-content-sha256.  Small
    # bodies go the lean way (s3_lean.py), so the bytes are flipped there.
    assert s3_backend._lean is not None
    lean_send = s3_backend._lean.send

    def flip_last_byte(method: str, url: str, headers: dict[str, str], body: Any) -> Any:
        if method == "PUT":
            body = body[:-1] + bytes([body[-1] ^ 1])
        return lean_send(method, url, headers, body)

    monkeypatch.setattr(s3_backend._lean, "send", flip_last_byte)
    data = _bytes(50_000, seed=31)
    src = _file(tmp_path, "src.bin", data)
    for put in (
        lambda: s3_backend.put(KEY, io.BytesIO(data)),
        lambda: s3_backend.put_file(KEY, src),
        lambda: s3_backend.put_files([(KEY, src)]),
    ):
        with pytest.raises(StorageUnavailable, match="BadDigest"):
            put()
        assert not s3_backend.exists(KEY)


def test_s3_small_requests_skip_botocore_and_read_back_with_their_checksum(
    s3_backend: S3Backend, tmp_path: Path
) -> None:
    sent: list[str] = []
    events = s3_backend._client.meta.events
    count = lambda **kw: sent.append(kw["event_name"])  # noqa: E731
    key = "objects/12/thumb_200-x.webp"
    for op in ("PutObject", "GetObject"):
        events.register(f"before-send.s3.{op}", count)
    try:
        data = _bytes(50_000, seed=7)
        stored = s3_backend.put_file(key, _file(tmp_path, "s.bin", data))
        s3_backend.get_file(key, tmp_path / "back.bin", stored.checksum)
        s3_backend.get_file(key, tmp_path / "again.bin", stored.checksum)  # a reused connection
        with pytest.raises(BlobMissing):
            s3_backend.get_file("objects/12/none.bin", tmp_path / "none.bin", stored.checksum)
    finally:
        for op in ("PutObject", "GetObject"):
            events.unregister(f"before-send.s3.{op}", count)
    assert sent == []  # not through the client
    assert stored.checksum == checksum_of(data)
    assert s3_backend.stored_checksum(key) == stored.checksum
    assert (tmp_path / "back.bin").read_bytes() == data == (tmp_path / "again.bin").read_bytes()
    assert not (tmp_path / "none.bin").exists()


def test_s3_without_the_lean_path_puts_through_the_client(
    s3_endpoint: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A proxy in the environment is honoured by botocore, not by our pool.
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    backend = _backend_at(s3_endpoint, "t-proxied")
    try:
        assert backend._lean is None
        backend.ensure_bucket()
        data = _bytes(1000, seed=8)
        stored = backend.put_file(KEY, _file(tmp_path, "p.bin", data))
        assert backend.stored_checksum(KEY) == stored.checksum
        backend.get_file(KEY, tmp_path / "back.bin", stored.checksum)
        assert (tmp_path / "back.bin").read_bytes() == data
    finally:
        backend.close()


def test_s3_get_file_of_an_object_replaced_midway_fails(
    s3_backend: S3Backend, s3_endpoint: dict[str, str], tmp_path: Path
) -> None:
    # A large download is several ranged GETs: if the object is replaced
    # between them, the download fails rather than mixing two versions.
    old, new = _bytes(3 * SMALL_BODY, seed=41), _bytes(3 * SMALL_BODY, seed=42)
    s3_backend.put(KEY, io.BytesIO(old))
    other = _backend_at(s3_endpoint, s3_backend.bucket)
    replaced = []

    def replace_once(params: dict[str, Any], **_: Any) -> None:
        if not replaced and not str(params.get("Range", "bytes=0-")).startswith("bytes=0-"):
            replaced.append(True)
            other.put(KEY, io.BytesIO(new))

    events = s3_backend._client.meta.events
    events.register("before-parameter-build.s3.GetObject", replace_once)
    dst = tmp_path / "back.bin"
    try:
        with pytest.raises(StorageUnavailable, match="PreconditionFailed"):
            s3_backend.get_file(KEY, dst, checksum_of(old))
    finally:
        events.unregister("before-parameter-build.s3.GetObject", replace_once)
        other.close()
    assert replaced
    assert not dst.exists()
    s3_backend.get_file(KEY, dst, checksum_of(new))
    assert dst.read_bytes() == new


def test_s3_get_file_from_a_store_that_ignores_ranges(
    s3_backend: S3Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _bytes(2 * SMALL_BODY + 3, seed=43)
    s3_backend.put(KEY, io.BytesIO(data))

    # The first GET goes the lean way (s3_lean.py): its Range is dropped there.
    assert s3_backend._lean is not None
    lean_get = s3_backend._lean.get

    def drop_range(key: str, headers: dict[str, str]) -> dict[str, Any]:
        return lean_get(key, {k: v for k, v in headers.items() if k != "Range"})

    monkeypatch.setattr(s3_backend._lean, "get", drop_range)
    s3_backend.get_file(KEY, tmp_path / "back.bin", checksum_of(data))
    assert (tmp_path / "back.bin").read_bytes() == data


def test_s3_wrong_secret_is_access_denied(
    s3_backend: S3Backend, s3_endpoint: dict[str, str], tmp_path: Path
) -> None:
    wrong = "wrong-" + os.urandom(8).hex()
    intruder = _backend_at(s3_endpoint, s3_backend.bucket, wrong)
    big = tmp_path / "big.bin"  # a multipart upload: s3transfer wraps S3's answer
    big.write_bytes(_bytes(SMALL_BODY + 1, seed=3))
    try:
        for call in (
            lambda: intruder.put(KEY, io.BytesIO(b"x")),
            lambda: intruder.put_file(KEY, big),
            lambda: intruder.open(KEY),
        ):
            with pytest.raises(StorageUnavailable, match="access denied") as info:
                call()
            _assert_clean(info.value, wrong)
    finally:
        intruder.close()
    assert not s3_backend.exists(KEY)


def test_s3_missing_bucket_is_not_a_missing_blob(s3_endpoint: dict[str, str]) -> None:
    # A pool pointed at the wrong bucket must not make the ledger think blobs are lost.
    nowhere = _backend_at(s3_endpoint, "t-nosuchbucket")
    try:
        with pytest.raises(StorageUnavailable, match="does not exist"):
            nowhere.open(KEY)
        with pytest.raises(StorageUnavailable, match="does not exist"):
            nowhere.put(KEY, io.BytesIO(b"x"))
    finally:
        nowhere.close()


def test_s3_ensure_bucket_is_idempotent(s3_backend: S3Backend) -> None:
    s3_backend.ensure_bucket()
    s3_backend.ensure_bucket()
    s3_backend.put(KEY, io.BytesIO(b"x"))
    assert s3_backend.exists(KEY)


def test_s3_unfinished_multipart_uploads_are_aborted(s3_backend: S3Backend) -> None:
    """A killed upload left its parts in the bucket for ever: GC's
    sweep_incomplete now aborts those older than the pending age."""
    client = s3_backend._client
    key = "objects/999999/original.bin"
    up = client.create_multipart_upload(Bucket=s3_backend.bucket, Key=key)
    client.upload_part(
        Bucket=s3_backend.bucket, Key=key, UploadId=up["UploadId"], PartNumber=1, Body=b"x" * 1024
    )

    def unfinished() -> list[str]:
        listed = client.list_multipart_uploads(Bucket=s3_backend.bucket, Prefix="objects/")
        return [u["UploadId"] for u in listed.get("Uploads", [])]

    assert up["UploadId"] in unfinished()
    assert s3_backend.sweep_incomplete(3600) == 0  # young: may still be going on
    assert up["UploadId"] in unfinished()
    time.sleep(1.1)
    assert s3_backend.sweep_incomplete(1) >= 1
    assert up["UploadId"] not in unfinished()


def test_a_read_only_local_pool_is_not_ready(tmp_path: Path) -> None:
    """/readyz asks ``ping``: a pool on a file system remounted read-only
    answered ready while every upload was refused."""
    with small_tmpfs(tmp_path / "disk", 8) as disk:
        fresh = LocalBackend(disk / "storage")
        fresh.ping()  # no folder yet: where it will be made is writable
        fresh.put("objects/1/original.bin", io.BytesIO(b"x"))
        fresh.ping()
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        try:
            with pytest.raises(StorageUnavailable, match="cannot be written"):
                fresh.ping()
            with pytest.raises(StorageUnavailable, match="cannot be written"):
                LocalBackend(disk / "elsewhere").ping()  # nor can it be made
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True)
        fresh.ping()


def test_a_local_pool_whose_folder_is_a_file_is_not_ready(tmp_path: Path) -> None:
    """It answered ready (a file can be written), while every upload and GC failed."""
    (blocker := tmp_path / "hello.txt").write_text("x")
    for root in (blocker, blocker / "below"):
        with pytest.raises(StorageUnavailable, match="local storage is not a folder"):
            LocalBackend(root).ping()
    LocalBackend(tmp_path / "not-yet" / "made").ping()  # made at the first upload


def test_a_symlink_planted_as_a_blob_is_deleted_not_followed(tmp_path: Path) -> None:
    """GC kept such a row for ever (unsafe key on every run). The link goes,
    never what it points to; a symlink on the way to the blob still refuses."""
    backend = LocalBackend(tmp_path / "pool")
    backend.put("objects/7/original.bin", io.BytesIO(b"x"))
    (outside := tmp_path / "theirs.txt").write_text("keep me")
    blob = tmp_path / "pool" / "objects" / "7" / "original.bin"
    blob.unlink()
    blob.symlink_to(outside)
    backend.delete("objects/7/original.bin")
    assert not blob.is_symlink() and outside.read_text() == "keep me"
    (elsewhere := tmp_path / "elsewhere").mkdir()
    (elsewhere / "original.bin").write_text("not ours")
    (tmp_path / "pool" / "objects" / "8").symlink_to(elsewhere)
    with pytest.raises(UnsafeKey):
        backend.delete("objects/8/original.bin")
    assert (elsewhere / "original.bin").read_text() == "not ours"

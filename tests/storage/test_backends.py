"""One conformance suite for every storage backend: local folders and S3 (SeaweedFS).

Each test runs against the real thing: files under tmp_path, and a real
SeaweedFS server for S3 (see conftest.py).  Nothing of boto3 is mocked.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import time
import traceback
import tracemalloc
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, cast
from urllib.parse import quote

import pytest

from hypermedia.storage.base import (
    Backend,
    BlobMissing,
    StorageUnavailable,
    Stored,
    UnsafeKey,
)
from hypermedia.storage.local import LocalBackend
from hypermedia.storage.s3 import SMALL_BODY, S3Backend
from tests.storage.conftest import SeaweedServer

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
    digest, size = hashlib.sha256(), 0
    while chunk := f.read(MiB):
        digest.update(chunk)
        size += len(chunk)
    return size, digest.hexdigest()


class GeneratedStream:
    """A readable stream fed by a generator of chunks, never holding the whole body.

    ``read(n)`` hands out at most one chunk's worth, as a socket or a pipe does;
    what it hands out is hashed here, independently of the backend.
    """

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._rest = b""
        self.size = 0
        self._hash = hashlib.sha256()

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
    def sha256(self) -> str:
        return self._hash.hexdigest()


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
    assert stored == Stored(size, hashlib.sha256(data).hexdigest())
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
    assert stored == Stored(len(data), hashlib.sha256(data).hexdigest())
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
            size, sha256 = _hash_stream(f)
        _, get_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert src.size == total
    assert stored == Stored(total, src.sha256)
    assert (size, sha256) == (total, src.sha256)
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
        assert backend.stored_checksum(KEY) == hashlib.sha256(data).hexdigest()
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


def test_presign(backend: Backend) -> None:
    data = _bytes(5000, seed=7)
    backend.put(KEY, io.BytesIO(data))
    url = backend.presign(KEY, 300)
    if isinstance(backend, LocalBackend):
        assert url is None  # the service signs local downloads
        return
    assert url is not None
    status, body, _ = _get(url)
    assert (status, body) == (200, data)

    name = 'résumé 2024 "final";.pdf'
    status, body, headers = _get(backend.presign(KEY, 300, filename=name) or "")
    assert (status, body) == (200, data)
    assert headers["Content-Disposition"] == (
        f"attachment; filename*=UTF-8''{quote(name, safe='')}"
    )

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


# -- S3 failures ---------------------------------------------------------------------


def _assert_clean(exc: BaseException, *secrets: str) -> None:
    text = str(exc)
    whole = "".join(traceback.format_exception(exc))
    for secret in secrets:
        assert secret not in text
        assert secret not in whole
    assert "X-Amz-Signature" not in whole
    assert "botocore" not in type(exc).__module__


def test_s3_outage_is_storage_unavailable(
    s3_backend: S3Backend, seaweed: SeaweedServer, s3_endpoint: dict[str, str]
) -> None:
    s3_backend.put(KEY, io.BytesIO(b"before the outage"))
    big = "objects/2/original.bin"
    s3_backend.put(big, io.BytesIO(_bytes(SMALL_BODY + 1)))
    secret, access = s3_endpoint["secret_access_key"], s3_endpoint["access_key_id"]
    seaweed.stop()
    calls = {
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

    seaweed.start()
    # What was written before the outage is still there, and writes work again.
    assert _read_all(s3_backend, KEY) == b"before the outage"
    assert s3_backend.stored_checksum(big) is not None
    s3_backend.put(KEY, io.BytesIO(b"after"))
    assert _read_all(s3_backend, KEY) == b"after"


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


def test_s3_wrong_secret_is_access_denied(
    s3_backend: S3Backend, s3_endpoint: dict[str, str]
) -> None:
    wrong = "wrong-" + os.urandom(8).hex()
    intruder = S3Backend(
        s3_backend.bucket,
        endpoint=s3_endpoint["endpoint"],
        access_key_id=s3_endpoint["access_key_id"],
        secret_access_key=wrong,
    )
    try:
        for call in (
            lambda: intruder.put(KEY, io.BytesIO(b"x")),
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
    nowhere = S3Backend(
        "t-nosuchbucket",
        endpoint=s3_endpoint["endpoint"],
        access_key_id=s3_endpoint["access_key_id"],
        secret_access_key=s3_endpoint["secret_access_key"],
    )
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

"""What every storage backend offers, and the errors they raise.

A backend moves bytes for opaque keys; it knows nothing of the ledger.  Every
transfer streams in chunks (memory stays flat whatever the file size), and
every write computes the checksum (``storage/checksum.py``) on the way.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO, Protocol

from hypermedia.errors import HypermediaError
from hypermedia.storage import checksum as cs

CHUNK = 1024 * 1024


class StorageError(HypermediaError):
    """Base class: ``str()`` is safe to show (no credentials, no host paths)."""


class StorageUnavailable(StorageError):
    """The backend could not be reached or failed; trying again may work."""


class StorageFull(StorageUnavailable):
    """No room left where the blob goes: freeing space helps, trying at once does not."""


class BucketMissing(StorageUnavailable):
    """The pool's bucket does not exist (S3's ``NoSuchBucket``).  For reads and
    writes a misconfigured pool, never a lost blob; for a delete, proof that
    the blob is gone (GC drops the row)."""


def unavailable(what: str, exc: OSError) -> StorageUnavailable:
    """``what`` failed with ``exc``: StorageFull when the disk or quota is full."""
    kind = StorageFull if exc.errno in (errno.ENOSPC, errno.EDQUOT) else StorageUnavailable
    return kind(f"{what} ({exc.strerror or 'I/O error'})")


class SourceChanged(StorageError):
    """The file being stored changed (shrank, grew) while it was read."""

    def __init__(self, message: str, path: str | os.PathLike[str] | None = None) -> None:
        super().__init__(message)
        self.path = path


class BlobMissing(StorageError):
    """No blob under this key."""


class ChecksumMismatch(StorageError):
    """The bytes read back are not the bytes written."""


class ChecksumMissing(ChecksumMismatch):
    """The object's row holds no checksum (a legacy producer's): its bytes
    cannot be verified, so they are not returned, and the error says why."""


class BlobGrown(ChecksumMismatch):
    """The blob holds more bytes than its ledger row records."""


def algorithm_of(checksum: str) -> str:
    """The algorithm of a stored checksum.  One this version cannot compute is
    refused as a mismatch: bytes that cannot be verified are never returned."""
    if not checksum:
        raise ChecksumMissing("the object has no checksum to verify its bytes against")
    try:
        return cs.algorithm_of(checksum)
    except cs.UnknownAlgorithm:
        raise ChecksumMismatch("the stored checksum's algorithm is unknown here") from None


class UnsafeKey(StorageError):
    """A key that could escape its pool (``..``, absolute, NUL, odd characters)."""


@dataclass(frozen=True)
class Stored:
    size: int
    checksum: str  # "<algorithm>:<lowercase hex>", see storage/checksum.py


@dataclass(frozen=True)
class Listed:
    """A blob as a store lists it: its key, size and when it was last written
    (seconds since the epoch)."""

    key: str
    size: int
    modified: float


class Backend(Protocol):
    def put(self, key: str, src: BinaryIO) -> Stored:
        """Stream ``src`` to ``key``; return once the blob is durable."""

    def open(self, key: str) -> BinaryIO:
        """A streaming reader of the blob; raises BlobMissing."""

    def open_range(self, key: str, start: int, length: int) -> tuple[BinaryIO, int]:
        """``length`` bytes from ``start`` (both within the blob), and the
        blob's whole size as the store has it."""
        ...

    def stored_checksum(self, key: str) -> str | None:
        """The checksum the backend recorded at write time (tagged), if it keeps one."""

    def delete(self, key: str) -> None:
        """Remove the blob; no error if it is already gone."""

    def delete_prefix(self, prefix: str) -> None:
        """Remove every blob under ``prefix`` (``keys.object_prefix``: one object's)."""

    def exists(self, key: str) -> bool: ...

    def list_blobs(self, prefix: str) -> Iterator[Listed]:
        """Every blob under ``prefix`` (``objects/``), in no promised order."""
        ...

    def check_writable(self) -> None:
        """Raise StorageError unless the pool answers and takes a write (``pools add``)."""

    def ping(self) -> None:
        """Raise StorageError unless the pool answers (cheap: /readyz)."""

    def presign(
        self, key: str, expires_seconds: int, filename: str = "", mime: str = ""
    ) -> str | None:
        """A URL anyone can GET until it expires, or None if the service must sign."""


class HashingReader:
    """Wraps a readable stream: counts and hashes what passes through."""

    def __init__(self, src: BinaryIO) -> None:
        self.src = src
        self.size = 0
        self._hash = cs.new()

    def read(self, n: int = -1) -> bytes:
        data = self.src.read(n)
        self.size += len(data)
        self._hash.update(data)
        return data

    def readinto(self, buf: bytearray | memoryview) -> int:
        data = self.read(len(buf))
        buf[: len(data)] = data
        return len(data)

    def readable(self) -> bool:
        return True

    @property
    def checksum(self) -> str:
        return cs.tagged(cs.DEFAULT, self._hash.hexdigest())


class VerifyingReader:
    """Reads a blob and raises ChecksumMismatch at its end if its checksum differs.

    With ``size`` (the ledger's), the end is known before the stream says so:
    the read that reaches it is checked before its bytes are returned, and a
    blob that grew is refused before a byte past ``size`` is.  A download that
    sends each chunk only once the next was read (the API's) then never sends
    the last one of a damaged blob, whichever way it was damaged.
    """

    def __init__(self, src: BinaryIO, expected: str, size: int | None = None) -> None:
        self.src = src
        self.algorithm = algorithm_of(expected)
        self.expected = cs.split(expected)[1]
        self.size = size
        self._seen = 0
        self._hash = cs.new(self.algorithm)
        self._checked = False

    def read(self, n: int = -1) -> bytes:
        data = self.src.read(n)
        self._took(data)
        # An empty read is the end; so is a read of "everything" (n < 0),
        # which must not hand over unverified bytes without a later read.
        if (n is None or n < 0 or not data) and n != 0:
            self._check()
        return data

    def readinto(self, buf: bytearray | memoryview) -> int:
        """``read`` into a buffer the caller reuses: no allocation per chunk."""
        n = int(self.src.readinto(buf) or 0)  # type: ignore[attr-defined]
        self._took(memoryview(buf)[:n])
        if not n:
            self._check()
        return n

    @property
    def seen(self) -> int:
        """Bytes read so far (those of a refused read included)."""
        return self._seen

    def _took(self, data: bytes | memoryview) -> None:
        if not data:
            return
        self._seen += len(data)
        if self.size is not None and self._seen > self.size:
            self._checked = True
            raise BlobGrown("the stored bytes are longer than their recorded size")
        self._hash.update(data)
        if self._seen == self.size:
            self._check()

    def _check(self) -> None:
        if self._checked:
            return
        self._checked = True
        if self._hash.hexdigest() != self.expected:
            raise ChecksumMismatch("the stored bytes do not match their checksum")

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self.src.close()

    def __enter__(self) -> VerifyingReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ExactReader:
    """A part of a blob, read to exactly ``length`` bytes.

    A part cannot be checked against the whole blob's checksum; what can be
    checked is that it is all there: a blob cut since its size was read ends
    in BlobMissing at the read that finds it short, never in a short part
    passed off as complete.
    """

    def __init__(self, src: BinaryIO, length: int) -> None:
        self.src = src
        self.left = length

    def read(self, n: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        want = self.left if n is None or n < 0 else min(n, self.left)
        data = self.src.read(want)
        if not data:
            raise BlobMissing("the stored bytes ended before the part asked for")
        self.left -= len(data)
        return data

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self.src.close()

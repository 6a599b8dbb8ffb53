"""Streams under the S3 backend (s3.py): full-size reads for multipart parts,
a response body that reports its failures as StorageUnavailable, the
bookkeeping of a download fetched in ranges while a thread hashes it, and
file parts that say so when their file shrank under them.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import os
import threading
from typing import Any, BinaryIO

import botocore.exceptions
import urllib3.exceptions
from boto3.exceptions import Boto3Error
from s3transfer.utils import OSUtils, ReadFileChunk

from hypermedia.storage import checksum as cs
from hypermedia.storage.base import CHUNK, SourceChanged, StorageUnavailable

# Bytes asked of the socket at a time.  Every read returns a new bytes object;
# reading 1 MiB at a time, a 200 MB download in a VM went from 0.07 to 0.4 s of
# system time over ten runs (most likely a fresh mmap() and page faults per
# block, dearer as guest memory fills up); at 256 KiB, as s3transfer reads,
# it stays flat.
NET_READ = 256 * 1024

# Exceptions of the transport and of boto itself: anything here means "the
# store did not do it", never a bug of the caller.
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    botocore.exceptions.BotoCoreError,
    Boto3Error,
    urllib3.exceptions.HTTPError,
    http.client.HTTPException,
    OSError,
)


class SourceError(Exception):
    """The caller's stream failed: carried through s3transfer, re-raised as it was."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(type(original).__name__)
        self.original = original


class FullReader:
    """``read(n)`` returns n bytes unless the stream ends (S3 parts must be full).

    Bytes handed back with ``unread`` come first.  A source that already
    returns full reads costs no copy.
    """

    def __init__(self, src: BinaryIO) -> None:
        self._src = src
        self._pending: list[bytes] = []

    def unread(self, *chunks: bytes) -> None:
        self._pending = [c for c in chunks if c] + self._pending

    def readable(self) -> bool:
        return True

    def read(self, n: int | None = -1) -> bytes:
        want = n if n is not None and n >= 0 else -1
        first = self._next(want)
        if (want >= 0 and len(first) >= want) or not first:
            return first  # the common case: no copy at all
        # Short pieces: gather them in a BytesIO, which grows in place and hands
        # its buffer over without a copy (b"".join would hold twice the part).
        buf = io.BytesIO()
        got = buf.write(first)
        del first
        while want < 0 or got < want:
            piece = self._next(want - got if want >= 0 else -1)
            if not piece:
                break
            got += buf.write(piece)
            del piece
        return buf.getvalue()

    def _next(self, n: int) -> bytes:
        """The next piece, at most n bytes (any size if n < 0)."""
        if self._pending:
            piece = self._pending.pop(0)
            if 0 <= n < len(piece):
                self._pending.insert(0, piece[n:])
                piece = piece[:n]
            return piece
        return self._read_src(n if n >= 0 else CHUNK)

    def _read_src(self, n: int) -> bytes:
        try:
            return self._src.read(n)
        except Exception as exc:
            raise SourceError(exc) from exc


class Body(io.RawIOBase):
    """A GetObject body whose transport errors come out as StorageUnavailable."""

    def __init__(self, body: Any, where: str) -> None:
        self._body = body
        self._where = where

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        try:
            return bytes(self._body.read(None if size is None or size < 0 else size))
        except TRANSPORT_ERRORS as exc:
            raise StorageUnavailable(
                f"lost the connection to S3 storage at {self._where} ({type(exc).__name__})"
            ) from exc

    def readinto(self, buf: Any) -> int:
        view = memoryview(buf).cast("B")
        data = self.read(min(len(view), NET_READ))  # a short read is fine: see NET_READ
        view[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            with contextlib.suppress(Exception):  # a broken connection: nothing to close
                self._body.close()
        super().close()


def total_size(answer: Any) -> int:
    """The object's size from a (ranged) GetObject answer."""
    content_range = str(answer.get("ContentRange") or "")  # "bytes 0-4194303/209715200"
    if "/" in content_range and not content_range.endswith("/*"):
        return int(content_range.rsplit("/", 1)[1])
    return int(answer.get("ContentLength") or 0)  # the whole object (Range ignored)


def stream_hashing(body: Body, fd: int, algorithm: str) -> str:
    """The whole body into ``fd`` from offset 0, hashed on the way."""
    digest, offset = cs.new(algorithm), 0
    while chunk := body.read(NET_READ):
        pwrite_all(fd, chunk, offset)
        digest.update(chunk)
        offset += len(chunk)
    return cs.tagged(algorithm, digest.hexdigest())


def pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


class Prefix:
    """Byte ranges written so far, and how far from 0 they are contiguous."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._prefix = 0
        self._pending: dict[int, int] = {}  # start -> end, all past the prefix
        self.failed = False

    def add(self, start: int, end: int) -> None:
        with self._cond:
            if start > self._prefix:
                self._pending[start] = max(end, self._pending.get(start, 0))
                return
            self._prefix = max(self._prefix, end)
            # Ranges arrive in order within each thread: a finished piece starts
            # exactly where an earlier one (possibly of another thread) ended.
            while (nxt := self._pending.pop(self._prefix, None)) is not None:
                self._prefix = max(self._prefix, nxt)
            self._cond.notify_all()

    def fail(self) -> None:
        with self._cond:
            self.failed = True
            self._cond.notify_all()

    def wait_past(self, position: int) -> int | None:
        """The contiguous prefix once it is past ``position``; None after a failure."""
        with self._cond:
            while self._prefix <= position and not self.failed:
                self._cond.wait()
            return None if self.failed else self._prefix


# -- a file's parts, uploaded by s3transfer ----------------------------------------------


class _WholeChunk(ReadFileChunk):
    """A part of a file that ends before the part does raises: the request
    announced the part's length, the file could no longer fill it, and the
    store waited for the missing bytes until its timeout, twice (2 minutes,
    then blamed on the store)."""

    shrunk: threading.Event  # set by WholeChunks: botocore wraps what read() raises

    def read(self, amount: int | None = None) -> bytes:
        left = max(len(self) - self.tell(), 0)
        want = left if amount is None or amount < 0 else min(left, amount)
        data: bytes = super().read(amount)
        if len(data) < want:
            self.shrunk.set()
            raise SourceChanged("the file shrank while it was uploaded")
        return data


class WholeChunks(OSUtils):
    """s3transfer's file access, with parts that raise rather than end early;
    ``shrunk`` is set once one has."""

    def __init__(self) -> None:
        self.shrunk = threading.Event()

    def open_file_chunk_reader(
        self, filename: str, start_byte: int, size: int, callbacks: Any
    ) -> ReadFileChunk:
        chunk = _WholeChunk.from_filename(
            filename, start_byte, size, callbacks, enable_callbacks=False
        )
        chunk.shrunk = self.shrunk
        return chunk

    def open_file_chunk_reader_from_fileobj(
        self,
        fileobj: Any,
        chunk_size: int,
        full_file_size: int,
        callbacks: Any,
        close_callbacks: Any = None,
    ) -> ReadFileChunk:
        chunk = _WholeChunk(
            fileobj,
            chunk_size,
            full_file_size,
            callbacks=callbacks,
            enable_callbacks=False,
            close_callbacks=close_callbacks,
        )
        chunk.shrunk = self.shrunk
        return chunk

"""Blobs in an S3-compatible object store (AWS, SeaweedFS, MinIO, …).

Path-style addressing, so any endpoint works without wildcard DNS.  Credentials
come from the settings (or, when none are set, boto3's default chain); they
never appear in an error message, and neither does a signed URL.

Writes stream: a body of at most ``SMALL_BODY`` bytes is read whole, hashed and
sent in one ``PutObject`` carrying its checksum (BLAKE3, see ``checksum.py``;
and Content-MD5, so the server checks the bytes: SeaweedFS refuses a body that
does not match its Content-MD5 but, unlike AWS, accepts one that does not
match the signed ``x-amz-content-sha256``).  That request, and the first GET
of a download, skip botocore's per-call machinery (``s3_lean.py``: half the
CPU per small object).  A larger body goes out as a multipart upload with a
few parts in memory at a time, hashed on the way; the checksum is only known at
the end, so the object is then copied onto itself with
``MetadataDirective=REPLACE`` to record it (a metadata-only operation on
SeaweedFS and AWS).  A store that refuses that self-copy keeps the blob without
the checksum: ``stored_checksum`` returns None for it and the ledger's checksum
is the only one, as for local pools.  ``put`` returns once
``PutObject``/``CompleteMultipartUpload`` succeeded, which S3 defines as durable.

Files on disk (``put_file``, ``put_files``, ``get_file``, which the ledger uses
when present) go faster: parts of a large file are sent by several threads
while another thread hashes the file; a batch keeps a few small uploads in
flight; a download streams to the file while a thread hashes, and is verified
against the ledger's checksum before it returns.

Every failure of the store or the network is a ``StorageUnavailable`` whose
text names only the host and port; a missing key is ``BlobMissing``.  No
botocore or urllib3 exception leaves this module except as a ``__cause__``.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import logging
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, NoReturn, cast
from urllib.parse import urlsplit

import boto3
import botocore.exceptions
from boto3.s3.transfer import S3Transfer, TransferConfig
from botocore.config import Config
from botocore.credentials import Credentials

from hypermedia.storage import checksum as cs
from hypermedia.storage.base import (
    CHUNK,
    BlobMissing,
    BucketMissing,
    ChecksumMismatch,
    HashingReader,
    Listed,
    SourceChanged,
    StorageError,
    StorageUnavailable,
    Stored,
    algorithm_of,
)
from hypermedia.storage.keys import attachment, check_key, probe_key
from hypermedia.storage.s3_lean import LeanS3
from hypermedia.storage.s3_streams import (
    NET_READ,
    TRANSPORT_ERRORS,
    Body,
    FullReader,
    Prefix,
    SourceError,
    WholeChunks,
    pwrite_all,
    stream_hashing,
    total_size,
)

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

MiB = 1024 * 1024
SMALL_BODY = 8 * MiB  # at most this much goes in one PutObject, read whole
PART = 8 * MiB  # multipart part size; memory holds about IN_MEMORY_PARTS of them
IN_MEMORY_PARTS = 2
MAX_COPY_OBJECT = 5 * 1024 * MiB  # S3's limit for a single CopyObject

_TRANSFER = TransferConfig(
    multipart_threshold=PART,
    multipart_chunksize=PART,
    max_concurrency=IN_MEMORY_PARTS,
    use_threads=True,
    preferred_transfer_client="classic",  # the CRT client would ignore the memory bound
)
# s3transfer's knob, not in boto3's constructor: parts read but not yet sent
# (default 10, i.e. 80 MiB for one upload of a stream that cannot seek).
_TRANSFER.max_in_memory_upload_chunks = IN_MEMORY_PARTS
# Files on disk (``put_file``): s3transfer reads each part from the file when
# it sends it, so threads cost no memory beyond the parts in flight.
FILE_THREADS = 4
_FILE_TRANSFER = TransferConfig(
    multipart_threshold=PART,
    multipart_chunksize=PART,
    max_concurrency=FILE_THREADS,
    use_threads=True,
    preferred_transfer_client="classic",
)
_FILE_CONFIG = cast(Any, _FILE_TRANSFER)  # boto3's TransferConfig, typed as s3transfer's
# ``get_file`` reads an object of at most this size in one request, a larger
# one by ranges of PART bytes on FILE_THREADS threads.
SMALL_GET = 4 * MiB
# Small objects of one batch (``put_files``) in flight at once.
BATCH_THREADS = 4
# Recording the checksum of a blob over 5 GiB takes a multipart copy.
_BIG_COPY = TransferConfig(
    multipart_threshold=MAX_COPY_OBJECT,
    multipart_chunksize=512 * MiB,
    max_concurrency=IN_MEMORY_PARTS,
)

_MISSING = {"404", "NoSuchKey", "NotFound", "NoSuchVersion"}
_DENIED = {
    "403",
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "InvalidToken",
    "ExpiredToken",
    "AllAccessDisabled",
}
# A bucket in another region than the pool says: the lean requests hand over
# to the boto3 client, which follows the redirect.
_REDIRECTS = {"PermanentRedirect", "TemporaryRedirect", "AuthorizationHeaderMalformed"}
# A store that cannot rewrite an object's metadata in place answers one of these.
_NO_SELF_COPY = {"NotImplemented", "InvalidRequest", "501"}


def _client_config(timeout: float) -> Config:
    base: dict[str, Any] = {
        "s3": {"addressing_style": "path"},
        "signature_version": "s3v4",
        "retries": {"total_max_attempts": 2, "mode": "standard"},  # tried twice, not 3 times
        "connect_timeout": min(5.0, timeout),
        "read_timeout": timeout,  # HYPERMEDIA_S3_TIMEOUT_SECONDS
        # put_files runs BATCH_THREADS put_file at once, each up to FILE_THREADS parts.
        "max_pool_connections": BATCH_THREADS * FILE_THREADS,
    }
    try:
        # botocore >= 1.36 adds CRC checksums to every upload by default, which
        # several S3-compatible stores reject; send them only when required.
        return Config(
            **base,
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
    except TypeError:  # an older botocore: it never sent them
        return Config(**base)


class S3Backend:
    def __init__(
        self,
        bucket: str,
        *,
        endpoint: str | None = None,
        region: str | None = None,
        access_key_id: str = "",
        secret_access_key: str = "",
        timeout: float = 60.0,
    ) -> None:
        self.bucket = bucket
        self.batch_threads = BATCH_THREADS
        self.endpoint = endpoint or None
        self.region = region or "us-east-1"
        if self.endpoint:
            parts = urlsplit(self.endpoint)
            self._where = parts.hostname or "?"
            if parts.port:
                self._where += f":{parts.port}"
        else:
            self._where = f"s3.{self.region}.amazonaws.com"
        # Both empty: boto3's default chain (environment, profile, instance role).
        explicit = bool(access_key_id or secret_access_key)
        # A session of our own: boto3's default session is not thread-safe to
        # create clients from, a client is safe to share between threads.
        session = boto3.session.Session()
        self._client: S3Client = session.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=self.region,
            aws_access_key_id=access_key_id if explicit else None,
            aws_secret_access_key=secret_access_key if explicit else None,
            config=_client_config(timeout),
        )
        # Small requests skip botocore's request machinery (see s3_lean.py).
        self._lean = LeanS3.of(
            self._client,
            (lambda: Credentials(access_key_id, secret_access_key))
            if explicit
            else session.get_credentials,
            bucket,
            self.region,
            BATCH_THREADS * FILE_THREADS,
        )

    def __repr__(self) -> str:
        return f"S3Backend(bucket={self.bucket!r}, at={self._where!r})"

    # -- the Backend protocol -------------------------------------------------

    def put(self, key: str, src: BinaryIO) -> Stored:
        check_key(key)
        try:
            return self._put(key, FullReader(src))
        except SourceError as exc:  # the caller's stream failed, not the store
            raise exc.original from None

    def open(self, key: str) -> BinaryIO:
        check_key(key)
        with self._errors("read from"):
            response = self._client.get_object(Bucket=self.bucket, Key=key)
        return io.BufferedReader(Body(response["Body"], self._where), CHUNK)

    def open_range(self, key: str, start: int, length: int) -> tuple[BinaryIO, int]:
        check_key(key)
        span = f"bytes={start}-{start + length - 1}"
        with self._errors("read from"):
            try:
                response = self._client.get_object(Bucket=self.bucket, Key=key, Range=span)
            except botocore.exceptions.ClientError as exc:
                if _code(exc) == "InvalidRange":  # the blob is shorter than the ledger says
                    raise ChecksumMismatch("the stored bytes are shorter than their size") from exc
                raise
        return io.BufferedReader(Body(response["Body"], self._where), CHUNK), total_size(response)

    def stored_checksum(self, key: str) -> str | None:
        check_key(key)
        with self._errors("read from"):
            head = self._client.head_object(Bucket=self.bucket, Key=key)
        meta = head.get("Metadata", {})
        if meta.get("checksum"):
            return str(meta["checksum"])
        # Blobs written before checksums were tagged recorded a bare SHA-256.
        return cs.tagged("sha256", meta["sha256"]) if meta.get("sha256") else None

    def delete(self, key: str) -> None:
        check_key(key)
        with self._errors("delete from"):
            try:
                self._client.delete_object(Bucket=self.bucket, Key=key)
            except botocore.exceptions.ClientError as exc:
                if _code(exc) not in _MISSING:  # S3 itself says 204; some stores 404
                    raise

    def delete_prefix(self, prefix: str) -> None:
        check_key(prefix.rstrip("/"))
        with self._errors("delete from"):
            pages = self._client.get_paginator("list_objects_v2")
            for page in pages.paginate(Bucket=self.bucket, Prefix=prefix):
                for item in page.get("Contents", []):
                    self.delete(item["Key"])

    def list_blobs(self, prefix: str) -> Iterator[Listed]:
        check_key(prefix.rstrip("/"))
        with self._errors("list"):
            pages = self._client.get_paginator("list_objects_v2")
            for page in pages.paginate(Bucket=self.bucket, Prefix=prefix):
                for item in page.get("Contents", []):
                    modified = item["LastModified"].timestamp()
                    yield Listed(item["Key"], int(item["Size"]), modified)

    def exists(self, key: str) -> bool:
        check_key(key)
        try:
            with self._errors("read from"):
                self._client.head_object(Bucket=self.bucket, Key=key)
        except BlobMissing:
            return False
        return True

    def check_writable(self) -> None:
        """``ping``, then store and delete a probe blob under ``probes/``:
        these credentials may write and delete in the bucket."""
        self.ping()
        key = probe_key()
        self.put(key, io.BytesIO(b"probe"))
        self.delete(key)

    def ping(self) -> None:
        """HEAD the bucket: the endpoint answers and the bucket exists
        (/readyz; a HEAD of a key said "no such blob" for a missing bucket)."""
        with self._errors("reach"):
            try:
                self._client.head_bucket(Bucket=self.bucket)
            except botocore.exceptions.ClientError as exc:
                # A HEAD answer has no body, so no error code: for a bucket
                # (no key involved) a 404 can only mean there is no such bucket.
                if _status(exc) == 404:
                    raise BucketMissing(
                        f"bucket {self.bucket!r} does not exist at {self._where}"
                    ) from exc
                raise

    def presign(
        self, key: str, expires_seconds: int, filename: str = "", mime: str = ""
    ) -> str | None:
        check_key(key)
        # Always an attachment, as the local pools' downloads are: without a
        # name, an uploaded HTML or SVG was shown inline by the store's origin.
        disposition = attachment(filename)
        params: dict[str, str] = {
            "Bucket": self.bucket,
            "Key": key,
            "ResponseContentDisposition": disposition,
        }
        if mime:  # the ledger's: a multipart upload stored binary/octet-stream
            params["ResponseContentType"] = mime
        # SigV4 presigned URLs cannot live longer than 7 days.
        ttl = max(1, min(int(expires_seconds), 7 * 24 * 3600))
        with self._errors("sign a URL for"):
            return self._client.generate_presigned_url("get_object", Params=params, ExpiresIn=ttl)

    # -- files on disk (the ledger uses these when they exist) ----------------

    def put_file(self, key: str, path: Path) -> Stored:
        """Like ``put`` for a file on disk, faster: parts go out in parallel.

        A file of at most ``SMALL_BODY`` is one ``PutObject`` as in ``put``.
        A larger one is handed to s3transfer by name (``upload_file``: parts
        read from the file by ``FILE_THREADS`` threads, nothing buffered but
        the parts in flight) while another thread hashes the file; the hash
        and the sockets release the GIL, so the checksum costs little time.
        It is then recorded with the self-copy, as in ``put``.

        A file changed while it is stored gets a checksum that its bytes do
        not match: reads then fail, never return silently different data.  A
        file whose size changed is refused.  Errors of the source file (gone,
        unreadable) come out as they are, as for ``put``'s stream.
        """
        check_key(key)
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size <= SMALL_BODY:
                body = f.read(SMALL_BODY + 1)
                if len(body) <= SMALL_BODY:
                    return self._put_small(key, body)
        result: dict[str, Any] = {}
        failed = threading.Event()

        def hash_file() -> None:
            try:
                with open(path, "rb", buffering=0) as f:
                    # One core: the uploading threads need the other.
                    digest = cs.new()
                    buf = bytearray(CHUNK)
                    view = memoryview(buf)
                    total = 0
                    while (n := f.readinto(buf) or 0) and not failed.is_set():
                        digest.update(view[:n])
                        total += n
                result["stored"] = Stored(total, cs.tagged(cs.DEFAULT, digest.hexdigest()))
            except BaseException as exc:  # re-raised in the caller's thread
                result["error"] = exc

        hasher = threading.Thread(target=hash_file, name="s3-hash", daemon=True)
        hasher.start()
        files = WholeChunks()
        try:
            with self._errors("upload to"), S3Transfer(self._client, _FILE_CONFIG, files) as s3:
                s3.upload_file(str(path), self.bucket, key)
        except BaseException:
            failed.set()  # the hash is of no use now
            if not files.shrunk.is_set():
                raise
        finally:
            hasher.join()
        if "error" in result:
            self._discard(key)
            raise result["error"]
        stored: Stored = result["stored"]
        if files.shrunk.is_set() or stored.size != size:
            self._discard(key)
            raise SourceChanged("the file changed size while it was uploaded", path)
        self._record_checksum(key, stored.size, stored.checksum)
        return stored

    def put_files(self, items: list[tuple[str, Path]]) -> list[Stored]:
        """``put_file`` for many files, ``batch_threads`` at a time; results in order.

        Small objects cost a request round trip each, much of it waiting: a few
        in flight at once hide it.  If one fails, the uploads not started yet
        are cancelled and the error is raised once the started ones have ended
        (the ledger then abandons the whole batch; GC removes what was stored).
        """
        if len(items) <= 1:
            return [self.put_file(k, p) for k, p in items]
        with ThreadPoolExecutor(self.batch_threads, thread_name_prefix="s3-put") as pool:
            futures = [pool.submit(self.put_file, k, p) for k, p in items]
            for done in as_completed(futures):
                if done.exception() is not None:
                    # No point sending the rest: the ledger abandons the whole batch.
                    pool.shutdown(wait=True, cancel_futures=True)
                    break
        for future in futures:
            if not future.cancelled() and (exc := future.exception()) is not None:
                raise exc
        return [f.result() for f in futures]

    def get_file(self, key: str, dst: Path, checksum: str, *, link: bool = False) -> None:
        """Download a blob to a new file ``dst`` and check it against ``checksum`` (tagged).

        ``link`` (a local pool's hard link for job inputs) has no S3
        counterpart: a remote blob is always downloaded.

        The first request asks for the first ``SMALL_GET`` bytes, which is the
        whole of a small object (one request, as a plain GET).  A larger one
        is fetched as s3transfer would, byte ranges on ``FILE_THREADS``
        threads, each written in place as it arrives; a second thread hashes
        the file in order, reading back (from the page cache) whatever prefix
        is complete.  Memory stays flat: a chunk per thread.  The ranges carry
        ``If-Match`` with the first answer's ETag, so an object replaced
        meanwhile fails instead of mixing versions.

        A mismatch raises ChecksumMismatch; on it and on any failure ``dst``
        is removed, so no unverified bytes are left behind.  An existing
        ``dst`` raises FileExistsError and is left alone.
        """
        check_key(key)
        algorithm = algorithm_of(checksum)
        with self._errors("read from"):
            try:
                first = self._get(key, {"Range": f"bytes=0-{SMALL_GET - 1}"})
            except botocore.exceptions.ClientError as exc:
                if _code(exc) != "InvalidRange":
                    raise
                first = self._get(key, {})  # an empty object has no byte 0
        body = Body(first["Body"], self._where)
        total = total_size(first)
        try:
            # As open(dst, "xb") would (the umask decides), but readable: see _get_ranges.
            fd = os.open(dst, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        except BaseException:
            body.close()
            raise
        try:
            try:
                if total <= SMALL_GET:
                    with body:
                        data = body.read()
                    pwrite_all(fd, data, 0)
                    actual = cs.of_bytes(data, algorithm)
                elif not first.get("ContentRange"):  # a store that ignores Range
                    with body:
                        actual = stream_hashing(body, fd, algorithm)
                else:
                    etag = str(first.get("ETag") or "")
                    actual = self._get_ranges(key, etag, body, fd, total, algorithm)
            finally:
                os.close(fd)
            if actual != checksum:
                raise ChecksumMismatch("the stored bytes do not match their checksum")
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(dst)
            raise

    def _get_ranges(
        self, key: str, etag: str, first: Body, fd: int, total: int, algorithm: str
    ) -> str:
        """Fetch [SMALL_GET, total) by ranges into ``fd`` (``first`` streams the
        start) while a thread hashes the complete prefix; return the checksum."""
        done = Prefix()
        digest = cs.new(algorithm)

        def fetch(start: int, end: int, body: Body | None) -> None:
            if body is None:
                with self._errors("read from"):
                    extra: dict[str, Any] = {"IfMatch": etag} if etag else {}
                    answer = self._client.get_object(
                        Bucket=self.bucket, Key=key, Range=f"bytes={start}-{end - 1}", **extra
                    )
                body = Body(answer["Body"], self._where)
            with body:
                pos = start
                while pos < end and not done.failed:
                    chunk = body.read(min(NET_READ, end - pos))
                    if not chunk:
                        raise StorageUnavailable(
                            f"S3 storage at {self._where} sent a short answer; try again"
                        )
                    pwrite_all(fd, chunk, pos)
                    done.add(pos, pos + len(chunk))
                    pos += len(chunk)

        def hash_prefix() -> None:
            buf = bytearray(CHUNK)  # one buffer, reused: see NET_READ
            view = memoryview(buf)
            hashed = 0
            while hashed < total:
                upto = done.wait_past(hashed)
                if upto is None:
                    return  # a range failed: the hash is of no use
                while hashed < upto:
                    n = os.preadv(fd, [view[: min(CHUNK, upto - hashed)]], hashed)
                    if not n:
                        return
                    digest.update(view[:n])
                    hashed += n

        hasher = threading.Thread(target=hash_prefix, name="s3-verify", daemon=True)
        hasher.start()
        ranges = [(start, min(start + PART, total)) for start in range(SMALL_GET, total, PART)]
        try:
            with ThreadPoolExecutor(FILE_THREADS, thread_name_prefix="s3-get") as pool:
                futures = [pool.submit(fetch, 0, SMALL_GET, first)]
                futures += [pool.submit(fetch, s, e, None) for s, e in ranges]
                for future in as_completed(futures):
                    if future.exception() is not None:
                        done.fail()
                        pool.shutdown(wait=True, cancel_futures=True)
                        break
            for future in futures:
                if not future.cancelled() and (exc := future.exception()) is not None:
                    raise exc
        except BaseException:
            done.fail()
            first.close()
            raise
        finally:
            hasher.join()
        return cs.tagged(algorithm, digest.hexdigest())

    # -- more ------------------------------------------------------------------

    def size(self, key: str) -> int:
        check_key(key)
        with self._errors("read from"):
            head = self._client.head_object(Bucket=self.bucket, Key=key)
        return int(head["ContentLength"])

    def ensure_bucket(self) -> None:
        """Create the bucket if it does not exist yet."""
        with self._errors("reach"):
            try:
                self._client.head_bucket(Bucket=self.bucket)
                return
            except botocore.exceptions.ClientError as exc:
                if _code(exc) not in _MISSING | {"NoSuchBucket"}:
                    raise
            try:
                if self.region == "us-east-1":
                    self._client.create_bucket(Bucket=self.bucket)
                else:
                    self._client.create_bucket(
                        Bucket=self.bucket,
                        CreateBucketConfiguration={
                            "LocationConstraint": self.region  # type: ignore[typeddict-item]
                        },
                    )
            except botocore.exceptions.ClientError as exc:
                code = _code(exc)
                if code == "BucketAlreadyExists":
                    # Made meanwhile by us (some stores say so) or someone else's:
                    # only ours can be reached.
                    self._client.head_bucket(Bucket=self.bucket)
                elif code != "BucketAlreadyOwnedByYou":
                    raise

    def sweep_incomplete(self, older_than_seconds: float) -> int:
        """Abort multipart uploads under ``objects/`` begun longer ago than
        this (a killed process or a store that went away mid-upload leaves
        them): their parts are stored, billed and listed by no one else."""
        cutoff = time.time() - older_than_seconds
        aborted = 0
        with self._errors("list the unfinished uploads of"):
            pages = self._client.get_paginator("list_multipart_uploads").paginate(
                Bucket=self.bucket, Prefix="objects/"
            )
            for page in pages:
                for up in page.get("Uploads", []):
                    if up["Initiated"].timestamp() >= cutoff:
                        continue
                    with contextlib.suppress(botocore.exceptions.ClientError):
                        self._client.abort_multipart_upload(
                            Bucket=self.bucket, Key=up["Key"], UploadId=up["UploadId"]
                        )
                        aborted += 1
        return aborted

    def close(self) -> None:
        """Close the connection pool (a dropped backend would leave sockets open)."""
        self._client.close()
        if self._lean is not None:
            self._lean.close()

    # -- internals -------------------------------------------------------------

    def _discard(self, key: str) -> None:
        """Remove a blob whose upload went wrong; the ledger's GC would anyway."""
        with contextlib.suppress(StorageError):
            self.delete(key)

    def _put(self, key: str, reader: FullReader) -> Stored:
        head = reader.read(SMALL_BODY)
        more = reader.read(1) if len(head) == SMALL_BODY else b""
        if not more:
            return self._put_small(key, head)
        reader.unread(head, more)
        del head
        hashing = HashingReader(reader)  # type: ignore[arg-type]
        with self._errors("upload to"):
            self._client.upload_fileobj(
                hashing,  # type: ignore[arg-type]
                self.bucket,
                key,
                Config=_TRANSFER,
            )
        self._record_checksum(key, hashing.size, hashing.checksum)
        return Stored(hashing.size, hashing.checksum)

    def _get(self, key: str, headers: dict[str, str]) -> dict[str, Any]:
        """GetObject's answer (Body, ContentLength, ContentRange, ETag), the lean way if we can."""
        lean = self._lean  # once: another thread may step aside meanwhile
        if lean is not None:
            try:
                return lean.get(key, headers)
            except botocore.exceptions.ClientError as exc:
                self._step_aside(exc)
        if "Range" in headers:
            return dict(
                self._client.get_object(Bucket=self.bucket, Key=key, Range=headers["Range"])
            )
        return dict(self._client.get_object(Bucket=self.bucket, Key=key))

    def _put_small(self, key: str, body: bytes) -> Stored:
        checksum = cs.of_bytes(body)
        md5 = base64.b64encode(hashlib.md5(body, usedforsecurity=False).digest()).decode()
        with self._errors("upload to"):
            lean = self._lean  # once: another thread may step aside meanwhile
            if lean is not None:
                try:
                    lean.put(key, body, {"Content-MD5": md5, "x-amz-meta-checksum": checksum})
                    return Stored(len(body), checksum)
                except botocore.exceptions.ClientError as exc:
                    self._step_aside(exc)
            self._client.put_object(
                Bucket=self.bucket,
                Key=key,
                Body=body,
                ContentMD5=md5,
                Metadata={"checksum": checksum},
            )
        return Stored(len(body), checksum)

    def _step_aside(self, exc: botocore.exceptions.ClientError) -> None:
        """Re-raise a lean request's error, unless it was a redirect: then the
        boto3 client, which follows a bucket into its region, sends this
        request and every later one."""
        if _code(exc) not in _REDIRECTS and _status(exc) not in (301, 307):
            raise exc
        log.info("S3 storage at %s redirects; leaving the lean path", self._where)
        lean, self._lean = self._lean, None
        if lean is not None:
            lean.close()

    def _record_checksum(self, key: str, size: int, checksum: str) -> None:
        source = {"Bucket": self.bucket, "Key": key}
        meta = {"checksum": checksum}
        with self._errors("upload to"):
            try:
                if size <= MAX_COPY_OBJECT:
                    self._client.copy_object(
                        Bucket=self.bucket,
                        Key=key,
                        CopySource=source,  # type: ignore[arg-type]
                        Metadata=meta,
                        MetadataDirective="REPLACE",
                    )
                else:
                    self._client.copy(
                        source,  # type: ignore[arg-type]
                        self.bucket,
                        key,
                        ExtraArgs={"Metadata": meta, "MetadataDirective": "REPLACE"},
                        Config=_BIG_COPY,
                    )
            except botocore.exceptions.ClientError as exc:
                # The blob is stored and durable; only the spare checksum is lost.
                if _code(exc) not in _NO_SELF_COPY:
                    raise

    @contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        """Turn boto's exceptions into ours, with no URL or credential in the text."""
        try:
            yield
        except StorageError:
            raise
        except botocore.exceptions.ClientError as exc:
            _raise_for_client_error(exc, action, self.bucket, self._where)
        except botocore.exceptions.NoCredentialsError as exc:
            raise StorageUnavailable(
                f"no S3 credentials to {action} {self._where} (set HYPERMEDIA_S3_ACCESS_KEY_ID "
                "and HYPERMEDIA_S3_SECRET_ACCESS_KEY)"
            ) from exc
        except boto3.exceptions.S3UploadFailedError as exc:
            # s3transfer wraps the ClientError of a multipart upload (a bad
            # secret, a missing bucket): say what S3 said, as for a small one.
            cause = exc.__context__
            if isinstance(cause, botocore.exceptions.ClientError):
                _raise_for_client_error(cause, action, self.bucket, self._where)
            raise StorageUnavailable(
                f"could not {action} S3 storage at {self._where} ({type(exc).__name__})"
            ) from exc
        except TRANSPORT_ERRORS as exc:
            raise StorageUnavailable(
                f"could not {action} S3 storage at {self._where} ({type(exc).__name__})"
            ) from exc


def _code(exc: botocore.exceptions.ClientError) -> str:
    error = exc.response.get("Error", {})
    code = str(error.get("Code") or "")
    if not code:
        code = str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    return code


def _status(exc: botocore.exceptions.ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def _raise_for_client_error(
    exc: botocore.exceptions.ClientError, action: str, bucket: str, where: str
) -> NoReturn:
    code, status = _code(exc), _status(exc)
    if code == "NoSuchBucket":
        # A misconfigured pool, not a lost blob: never let it pass for BlobMissing.
        # Told by S3's error code only: a 404 alone (a HEAD's) may be a key's.
        raise BucketMissing(f"bucket {bucket!r} does not exist at {where}") from exc
    if code in _MISSING or status == 404:
        raise BlobMissing("no blob under this key") from exc
    if code in _DENIED or status == 403:
        raise StorageUnavailable(f"access denied by S3 storage at {where} ({code})") from exc
    if status >= 500 or code in {"SlowDown", "ServiceUnavailable", "InternalError"}:
        raise StorageUnavailable(
            f"S3 storage at {where} failed ({code or status}); try again later"
        ) from exc
    raise StorageUnavailable(f"could not {action} S3 storage at {where} ({code})") from exc

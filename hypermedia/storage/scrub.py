"""Scrubbing: every ready object's blob read back and checked against its
ledger row, size and checksum, as a file system scrubs its disks.

Reads already verify what passes through them, but a blob nobody reads is
never checked: bit rot, a truncated or deleted file, a bucket edited behind
the service's back would surface only when a user's download or a job trips
over it.  ``hypermedia objects verify`` (run it from cron) finds them first
and says which objects to restore.  It only reads: a finding changes no row.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from hypermedia.db.dialects import is_transient
from hypermedia.redact import brief
from hypermedia.storage import checksum
from hypermedia.storage.base import (
    BlobGrown,
    BlobMissing,
    BucketMissing,
    ChecksumMismatch,
    StorageUnavailable,
    UnsafeKey,
)
from hypermedia.storage.ledger import Storage

Row = dict[str, Any]
PAGE = 500  # ledger rows read per query
# Read errors that are the blob's own (a directory where its file should be,
# a bad sector, a file made unreadable): findings, and the scrub goes on.
_BLOB_FAULTS = {errno.EISDIR, errno.EIO, errno.EACCES, errno.EPERM, errno.ELOOP, errno.EINVAL}


@dataclass(frozen=True)
class Finding:
    object_id: int
    pool_id: int
    storage_key: str
    problem: str  # "missing", "size", "checksum" or "unreadable"
    detail: str


@dataclass
class Report:
    checked: int = 0
    bytes: int = 0
    last_object_id: int = 0  # pass as ``after`` to go on from here
    findings: list[Finding] = field(default_factory=list)
    # Why the scrub stopped short (the store or the database went away), or
    # None: see ScrubStopped.
    error: Row | None = None

    def as_json(self) -> Row:
        return {**asdict(self), "findings": [asdict(f) for f in self.findings]}


class ScrubStopped(StorageUnavailable):
    """The store or the database went away mid-scrub.  ``report`` holds what
    was checked before, and its ``error`` says why, which object's read
    failed (None when the database did) and where to go on from
    (``resume_after``): a report for programs even then."""

    def __init__(
        self, message: str, report: Report, row: Row | None, code: str = "STORAGE_UNAVAILABLE"
    ) -> None:
        super().__init__(message)
        self.report = report
        report.error = {
            "code": code,
            "message": message,  # storage errors and brief() name no secret and no path
            "object_id": int(row["object_id"]) if row else None,
            "pool_id": int(row["pool_id"]) if row else None,
            "resume_after": report.last_object_id,
        }


def scrub(
    storage: Storage,
    *,
    pool_id: int | None = None,
    after: int = 0,
    limit: int | None = None,
    on_checked: Callable[[Row], None] | None = None,
) -> Report:
    """Check up to ``limit`` ready objects with ids above ``after``, oldest
    first; ``on_checked(row)`` after each.  A store or a database that is
    away raises ScrubStopped (a StorageUnavailable) with the report so far:
    the objects are not at fault."""
    report = Report(last_object_id=after)
    _scrub(storage, report, pool_id, limit, on_checked)
    return report


@contextmanager
def _database(report: Report) -> Iterator[None]:
    """Around the scrub's reads of the ledger only: a blob's read error is the
    blob's (it said "the database is unavailable" for a directory where a
    file should be)."""
    try:
        yield
    except Exception as exc:
        if not is_transient(exc):
            raise
        # The database went away: what was checked still stands (--json).
        why = f"the database is unavailable ({brief(exc)})"
        raise ScrubStopped(why, report, None, "DATABASE_UNAVAILABLE") from exc


def _scrub(
    storage: Storage,
    report: Report,
    pool_id: int | None,
    limit: int | None,
    on_checked: Callable[[Row], None] | None,
) -> None:
    buf = bytearray(checksum.READ_CHUNK)  # one for the run: hashed while in the CPU's cache
    while limit is None or report.checked < limit:
        want = PAGE if limit is None else min(PAGE, limit - report.checked)
        with _database(report), storage.db.read() as tx:
            rows = tx.ready_objects_after(report.last_object_id, want, pool_id)
        if not rows:
            break
        for row in rows:
            try:
                with _database(report):
                    finding, read = _checked(storage, row, buf)
            except StorageUnavailable as exc:  # the objects are not at fault
                if isinstance(exc, ScrubStopped):
                    raise
                raise ScrubStopped(str(exc), report, row) from exc
            report.checked += 1
            # Bytes read, not the ledger's size: a blob that is not there (its
            # bucket gone) counted 101 MB "checked" where nothing was, and one
            # cut to 5 bytes counted its 50 MB.
            report.bytes += read
            report.last_object_id = int(row["object_id"])
            if finding is not None:
                report.findings.append(finding)
            if on_checked is not None:
                on_checked(row)


def check(storage: Storage, row: Row, buf: bytearray | None = None) -> Finding | None:
    """What is wrong with ``row``'s blob, or None.  A blob that went away
    because its object did (GC deleted it meanwhile) is not a finding."""
    return _checked(storage, row, buf)[0]


def _checked(storage: Storage, row: Row, buf: bytearray | None) -> tuple[Finding | None, int]:
    """``check``, and how many bytes of the blob were read."""
    problem, detail = "", ""
    buf = buf if buf is not None else bytearray(checksum.READ_CHUNK)
    reader: Any = None

    def read() -> int:
        return int(reader.seen) if reader is not None else 0

    try:
        with storage.open_row(row) as reader:
            while reader.readinto(buf):
                pass
    except BlobMissing:
        problem, detail = "missing", "no blob under its key"
    except BucketMissing:
        # No blob can be in a bucket that does not exist (GC drops such rows
        # too).  Stopping there, the scrub's "go on with --after N" met the
        # same object every time and never reached the pools after it.
        problem, detail = "missing", "its pool's bucket does not exist"
    except BlobGrown:  # refused before it was read to its end: no stored size to tell
        grown = f"more bytes stored than the ledger's {row['size']}"
        return _still(storage, row, "size", grown), read()
    except ChecksumMismatch:
        problem, detail = "checksum", "the bytes do not match the ledger's checksum"
    except UnsafeKey as exc:  # a symlink or a folder planted in a local pool: never followed
        return _still(storage, row, "unreadable", str(exc)), 0
    except OSError as exc:
        if exc.errno not in _BLOB_FAULTS:
            raise
        why = f"the blob cannot be read ({exc.strerror})"
        return _still(storage, row, "unreadable", why), read()
    size = read()
    if problem != "missing" and size != int(row["size"]):  # truncated
        problem, detail = "size", f"{size} bytes stored, the ledger says {row['size']}"
    return (_still(storage, row, problem, detail) if problem else None), size


def _still(storage: Storage, row: Row, problem: str, detail: str) -> Finding | None:
    """The finding, unless the object went away meanwhile (GC: not a finding)."""
    if not _still_ready(storage, row):
        return None
    return Finding(int(row["object_id"]), int(row["pool_id"]), row["storage_key"], problem, detail)


def _still_ready(storage: Storage, row: Row) -> bool:
    with storage.db.read() as tx:
        now = tx.object(int(row["object_id"]))
    return now is not None and now["state"] == "ready" and now["storage_key"] == row["storage_key"]

"""Garbage collection of objects, in two phases.

1. **Mark**: ``ready`` objects nothing references (no photo binding, no job
   output, no input of a live job) and untouched for ``gc_unreferenced_seconds``,
   and ``pending`` objects older than ``gc_pending_seconds`` (abandoned uploads,
   outputs of attempts that never completed) become ``deleting``.
2. **Sweep**: for each ``deleting`` object, delete the blob, then the row.  A
   crash between the two only repeats the (idempotent) blob delete next time.

Never a referenced object: candidates are locked (skipping rows a binding
transaction holds), then their references are checked again by a fresh
statement, which sees every binding committed before the lock was taken.
Binding an object (photo copy, job enqueue) locks the object row and refuses
one that is not ``ready``, so a binding either commits first (and the re-check
sees it) or finds the object already ``deleting``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, ClassVar

from hypermedia.scheduler.budget import Backlog, Backlogged
from hypermedia.storage.base import BucketMissing, StorageError
from hypermedia.storage.keys import object_prefix
from hypermedia.storage.ledger import Storage
from hypermedia.storage.reserve import is_placeholder

log = logging.getLogger(__name__)

BATCH = 200


@dataclass
class GcReport:
    marked_unreferenced: int = 0
    marked_pending: int = 0
    deleted: int = 0
    failed: int = 0
    # (pool name, what went wrong) -> blobs not deleted for that reason: a
    # store that is away fails every object alike, and says so once.
    failures: dict[tuple[str, str], int] = field(default_factory=dict)
    # pool name -> rows removed because the pool's bucket does not exist
    bucket_missing: dict[str, int] = field(default_factory=dict)
    # pool name -> why its unfinished uploads could not be swept
    uploads_not_swept: dict[str, str] = field(default_factory=dict)

    COUNTS: ClassVar[tuple[str, ...]] = (
        "marked_unreferenced",
        "marked_pending",
        "deleted",
        "failed",
    )

    def counts(self) -> dict[str, int]:
        return {k: int(getattr(self, k)) for k in self.COUNTS}

    def as_dict(self) -> dict[str, Any]:
        failures = [
            {"pool": pool, "error": error, "count": n}
            for (pool, error), n in sorted(self.failures.items())
        ]
        return {
            **self.counts(),
            "failures": failures,
            "bucket_missing": self.bucket_missing,
            "uploads_not_swept": self.uploads_not_swept,
        }

    def lines(self) -> list[str]:
        """One line per pool and kind of failure, and per pool whose bucket is gone."""
        said = [
            f"pool {pool}: {n} blob(s) not deleted, kept for the next run: {error}"
            for (pool, error), n in sorted(self.failures.items())
        ]
        said += [
            f"pool {pool}: its bucket does not exist: {n} row(s) removed (no blob can be there)"
            for pool, n in sorted(self.bucket_missing.items())
        ]
        said += [
            f"pool {pool}: unfinished uploads not swept: {error}"
            for pool, error in sorted(self.uploads_not_swept.items())
        ]
        return said


@dataclass
class GarbageCollector(Backlogged):
    storage: Storage
    name: str = "gc"
    report: GcReport = field(default_factory=GcReport)
    # The leader's runs have a time budget (scheduler/budget.py): each phase
    # does a batch at least, then stops once it is spent, and the next run
    # comes soon.  Without one (``hypermedia gc run-once``) a run does it all.
    backlog: Backlog = field(default_factory=lambda: Backlog(60.0))
    # The leader logs a run's failures (one line per pool and kind); the CLI
    # prints the report itself instead.
    log_failures: bool = True
    # It waits on stores: the leader runs it in a thread of its own.
    detached: ClassVar[bool] = True

    def run_once(self) -> GcReport:
        self.report = GcReport()
        self.backlog.start()
        self.mark()
        self.sweep()
        self.sweep_uploads()
        if self.log_failures:
            for line in self.report.lines():
                log.warning("gc: %s", line)
        return self.report

    def mark(self) -> None:
        s = self.storage.settings
        now = self.storage.clock()
        rounds = (
            ("ready", s.gc_unreferenced_seconds, True),
            ("pending", s.gc_pending_seconds, False),
        )
        for state, age, unreferenced in rounds:
            while True:
                seen, marked = self._mark(state, now - timedelta(seconds=age), unreferenced)
                if unreferenced:
                    self.report.marked_unreferenced += marked
                else:
                    self.report.marked_pending += marked
                # Stop on a short batch, or when a whole batch was kept (all
                # referenced after all): the next round would see it again.
                if seen < BATCH or not marked or self.backlog.spent():
                    break

    def _mark(self, state: str, before: datetime, unreferenced: bool) -> tuple[int, int]:
        """One locked batch: (rows seen, rows marked deleting)."""
        with self.storage.db.tx() as tx:
            ids = tx.collectable(state, before, BATCH, unreferenced=unreferenced)
            keep = tx.referenced(ids) if unreferenced and ids else set()
            chosen = [i for i in ids if i not in keep]
            tx.mark_deleting(chosen, state, self.storage.clock())
            return len(ids), len(chosen)

    def sweep_uploads(self) -> None:
        """Temporary files of uploads whose process died, as old as stale pending objects."""
        for pool in self.storage.pools():
            try:
                backend = self.storage.backend(pool["pool_id"])
                sweep = getattr(backend, "sweep_incomplete", None)
                if sweep is not None:
                    sweep(self.storage.settings.gc_pending_seconds)
            except (StorageError, OSError) as exc:  # said with the run's other failures
                # OSError: a local pool's folder that is a file, a dead NFS
                # mount; it ended the whole run, and the pools after it.
                why = str(exc) if isinstance(exc, StorageError) else _os_error(exc)
                self.report.uploads_not_swept[pool["name"]] = why

    def sweep(self) -> None:
        skip: set[int] = set()
        names = {p["pool_id"]: p["name"] for p in self.storage.pools()}
        while True:
            with self.storage.db.read() as tx:
                found = tx.deleting_objects(BATCH + len(skip))
            rows = [r for r in found if r["object_id"] not in skip]
            if not rows:
                return
            for row in rows:
                if not self._delete_blob(row, names.get(row["pool_id"], str(row["pool_id"]))):
                    skip.add(row["object_id"])  # kept for the next round
                elif self._delete_row(row):
                    self.report.deleted += 1
                if self.backlog.spent():  # per blob: a store that hangs takes a call each
                    return
            if len(rows) < BATCH:
                return

    def _delete_row(self, row: dict[str, Any]) -> bool:
        with self.storage.db.tx() as tx:
            return bool(tx.delete_object_row(row["object_id"]))

    def _delete_blob(self, row: dict[str, Any], pool: str) -> bool:
        """Delete a ``deleting`` row's blob; False (and counted) if it may still be there."""
        try:
            backend = self.storage.backend(row["pool_id"])
            if is_placeholder(row["storage_key"]):
                # A reserved output row: its blob, if any, is under its id.
                backend.delete_prefix(object_prefix(row["object_id"]))
            else:
                backend.delete(row["storage_key"])
        except BucketMissing:
            # S3 said NoSuchBucket (its error code, not a bare 404): no blob
            # can be in a bucket that does not exist, and retrying would keep
            # the row, and every GC pass busy with it, for ever.
            gone = self.report.bucket_missing
            gone[pool] = gone.get(pool, 0) + 1
            return True
        except (StorageError, OSError) as exc:
            # The store is away, or refuses (access denied): keep the row.
            kind = str(exc) if isinstance(exc, StorageError) else _os_error(exc)
            key = (pool, kind)
            self.report.failures[key] = self.report.failures.get(key, 0) + 1
            self.report.failed += 1
            return False
        return True


def _os_error(exc: OSError) -> str:
    """A local store's error without its path (paths are not shown to people)."""
    return f"local storage failed ({exc.strerror or type(exc).__name__})"

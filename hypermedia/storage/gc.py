"""Garbage collection of objects, in two phases.

1. **Mark**: ``ready`` objects nothing references (no photo binding, no job
   output, no input of a live job) and untouched for ``gc_unreferenced_seconds``,
   and ``pending`` objects older than ``gc_pending_seconds`` (abandoned uploads,
   outputs of attempts that never completed) become ``deleting``.
2. **Sweep**: for each ``deleting`` object, delete the blob, then the row.  A
   crash between the two only repeats the (idempotent) blob delete next time.
   A ``deleting`` row that something still references (only a write behind
   the service's back makes one: a binding is refused for a row that is not
   ``ready``) keeps its blob and its row, and is reported; so is a row the
   database will not delete.  Either is skipped, not the end of the run.

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

from hypermedia.errors import Conflict
from hypermedia.scheduler.budget import Backlog, Backlogged
from hypermedia.storage.base import BucketMissing, StorageError
from hypermedia.storage.keys import object_prefix
from hypermedia.storage.ledger import Storage
from hypermedia.storage.reserve import is_placeholder

log = logging.getLogger(__name__)

BATCH = 200
# Why the sweep leaves a ``deleting`` row (GcReport.kept).
STILL_REFERENCED = (
    "still referenced (a photo binding, a job's output or a live job's input); blob not deleted"
)
ROW_REFUSED = "the database refused to delete the row"
# Failures in a row after which a run asks a pool's store no more: each call
# to a store that hangs waits out its timeout twice (HYPERMEDIA_S3_TIMEOUT_SECONDS),
# and `gc run-once` spent 2 minutes on each of a pool's rows, hours on a thousand.
GIVE_UP = 3
# Object ids a report line names at most, for someone to look at.
SHOWN_IDS = 10


@dataclass
class GcReport:
    marked_unreferenced: int = 0
    marked_pending: int = 0
    deleted: int = 0
    failed: int = 0
    kept: int = 0
    # Temporary files (local) and multipart uploads (S3) of uploads that died.
    uploads_swept: int = 0
    # (pool name, what went wrong) -> blobs not deleted for that reason: a
    # store that is away fails every object alike, and says so once.
    failures: dict[tuple[str, str], int] = field(default_factory=dict)
    # pool name -> rows removed because the pool's bucket does not exist
    bucket_missing: dict[str, int] = field(default_factory=dict)
    # pool name -> why its unfinished uploads could not be swept
    uploads_not_swept: dict[str, str] = field(default_factory=dict)
    # (pool name, why) -> ids of ``deleting`` rows the sweep left as they are
    # (still referenced, or refused by the database): every run meets them
    # again until someone fixes them, and the rest of the run goes on.
    kept_rows: dict[tuple[str, str], list[int]] = field(default_factory=dict)

    COUNTS: ClassVar[tuple[str, ...]] = (
        "marked_unreferenced",
        "marked_pending",
        "deleted",
        "failed",
        "kept",
        "uploads_swept",
    )

    def counts(self) -> dict[str, int]:
        return {k: int(getattr(self, k)) for k in self.COUNTS}

    def as_dict(self) -> dict[str, Any]:
        failures = [
            {"pool": pool, "error": error, "count": n}
            for (pool, error), n in sorted(self.failures.items())
        ]
        kept = [
            {"pool": pool, "reason": why, "count": len(ids), "object_ids": ids[:SHOWN_IDS]}
            for (pool, why), ids in sorted(self.kept_rows.items())
        ]
        return {
            **self.counts(),
            "failures": failures,
            "bucket_missing": self.bucket_missing,
            "uploads_not_swept": self.uploads_not_swept,
            "kept_rows": kept,
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
        said += [
            f"pool {pool}: {len(ids)} deleting object(s) kept: {why} (ids {_ids(ids)})"
            for (pool, why), ids in sorted(self.kept_rows.items())
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
    # pool name -> (failures in a row this run, the last one's words); at
    # GIVE_UP the pool is not asked again until the next run (_delete_blob).
    _failing: dict[str, tuple[int, str]] = field(default_factory=dict)

    def run_once(self) -> GcReport:
        self.report = GcReport()
        self._failing = {}
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
            if (gave_up := self._given_up(pool["name"])) is not None:
                self.report.uploads_not_swept[pool["name"]] = gave_up
                continue
            try:
                backend = self.storage.backend(pool["pool_id"])
                sweep = getattr(backend, "sweep_incomplete", None)
                if sweep is not None:  # (it said nothing of what it removed)
                    self.report.uploads_swept += sweep(self.storage.settings.gc_pending_seconds)
            except (StorageError, OSError) as exc:  # said with the run's other failures
                # OSError: a local pool's folder that is a file, a dead NFS
                # mount; it ended the whole run, and the pools after it.
                why = str(exc) if isinstance(exc, StorageError) else os_error(exc)
                self.report.uploads_not_swept[pool["name"]] = why

    def sweep(self) -> None:
        """Each ``deleting`` row once a run, in id order.  A pool given up
        (its store failing) is left out of the reads from then on, its rows
        left counted: the rows after it were read again batch after batch
        (a run of 40,000 took 20 s, the leader's budget went on them, and
        the other pools' rows were never reached)."""
        names = {p["pool_id"]: p["name"] for p in self.storage.pools()}
        after, excluded = 0, set[int]()
        while True:
            with self.storage.db.read() as tx:
                rows = tx.deleting_objects(BATCH, after, sorted(excluded))
                # Checked before any blob goes: a blob something still uses is kept.
                used = tx.referenced([r["object_id"] for r in rows])
            if not rows:
                return
            for row in rows:
                pool = names.get(row["pool_id"], str(row["pool_id"]))
                if row["object_id"] in used:
                    self._kept(row, pool, STILL_REFERENCED)
                elif self._delete_blob(row, pool) and self._delete_row(row, pool):
                    self.report.deleted += 1
                if self.backlog.spent():  # per blob: a store that hangs takes a call each
                    return
            after = rows[-1]["object_id"]
            self._leave_out_given_up(names, excluded, after)
            if len(rows) < BATCH:
                return

    def _leave_out_given_up(self, names: dict[int, str], excluded: set[int], after: int) -> None:
        """Pools given up in this batch: their rows past it counted as not
        tried, and no more read."""
        for pool_id, pool in names.items():
            if pool_id in excluded or (gave_up := self._given_up(pool)) is None:
                continue
            excluded.add(pool_id)
            with self.storage.db.read() as tx:
                rest = tx.deleting_count(pool_id, after)
            if rest:
                key = (pool, gave_up)
                self.report.failures[key] = self.report.failures.get(key, 0) + rest
                self.report.failed += rest

    def _delete_row(self, row: dict[str, Any], pool: str) -> bool:
        """Delete a swept row; False (and said) if the database refuses, as it
        will every time: the run goes on with the other rows."""
        try:
            with self.storage.db.tx() as tx:
                return bool(tx.delete_object_row(row["object_id"]))
        except Conflict:  # a foreign key; a database away still ends the run
            self._kept(row, pool, ROW_REFUSED)
            return False

    def _kept(self, row: dict[str, Any], pool: str, why: str) -> None:
        """A row the sweep leaves as it is: reported with its id (someone has
        to look at it), and the sweep goes on with the others."""
        self.report.kept_rows.setdefault((pool, why), []).append(row["object_id"])
        self.report.kept += 1

    def _given_up(self, pool: str) -> str | None:
        """Why the run asks this pool's store no more, if it does not."""
        n, last = self._failing.get(pool, (0, ""))
        return f"not tried after {n} failures in a row: {last}" if n >= GIVE_UP else None

    def _delete_blob(self, row: dict[str, Any], pool: str) -> bool:
        """Delete a ``deleting`` row's blob; False (and counted) if it may still be there."""
        if (gave_up := self._given_up(pool)) is not None:
            key = (pool, gave_up)
            self.report.failures[key] = self.report.failures.get(key, 0) + 1
            self.report.failed += 1
            return False
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
            kind = str(exc) if isinstance(exc, StorageError) else os_error(exc)
            key = (pool, kind)
            self.report.failures[key] = self.report.failures.get(key, 0) + 1
            self.report.failed += 1
            self._failing[pool] = (self._failing.get(pool, (0, ""))[0] + 1, kind)
            return False
        self._failing.pop(pool, None)
        return True


def _ids(ids: list[int]) -> str:
    shown = ", ".join(map(str, ids[:SHOWN_IDS]))
    return shown + (", …" if len(ids) > SHOWN_IDS else "")


def os_error(exc: OSError) -> str:
    """A local store's error without its path (paths are not shown to people)."""
    return f"local storage failed ({exc.strerror or type(exc).__name__})"

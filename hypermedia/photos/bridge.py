"""The compatibility bridge for ``variant_jobs`` (seeds 002 and 004).

Legacy producers insert a row into ``variant_jobs`` and expect variants to
appear.  The bridge adopts each such row: it enqueues the engine jobs with the
idempotency keys ``Photos.add`` uses (so work the native path already
enqueued is never enqueued twice), marks the row adopted and records a
compatibility bridge hit -- a diagnostic, never a second user-visible job.
Then it binds finished variants to their photos.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from hypermedia.db.dialects import is_transient
from hypermedia.errors import HypermediaError
from hypermedia.photos.service import BRIDGE, NATIVE, Photos, backoff, variants_known
from hypermedia.redact import brief, redact
from hypermedia.scheduler.budget import BUDGET_SECONDS

log = logging.getLogger(__name__)

SURFACE = "variant_jobs"
# An unreadable row is tried again after the longest backoff (an hour).
UNREADABLE_ATTEMPTS = 99


@dataclass
class PhotoBridge:
    photos: Photos
    name: str = BRIDGE
    period: float = 10.0
    batch: int = 100  # rows adopted per run at most
    # Seconds a run may spend binding variants: the leader runs its services
    # one after another in the thread that renews its lease (scheduler/budget.py),
    # and every row still waiting for its variants is looked at on each run.
    # What is left is taken up by the next run, where this one stopped.
    budget_seconds: float | None = BUDGET_SECONDS
    _quiet: bool = field(default=False, repr=False)
    _resume_after: str = field(default="", repr=False)

    def run_once(self) -> dict[str, int]:
        counts = {"adopted": 0, "refused": 0}
        if variants_known():
            self._quiet = False
            self._adopt_all(counts)
        elif not self._quiet:
            # Expected while the image pipelines are not installed: rows wait.
            log.debug("photo-bridge: image variant job types unknown; rows left waiting")
            self._quiet = True
        deadline = None if self.budget_seconds is None else time.monotonic() + self.budget_seconds
        attached, resume = self.photos.attach_variants_from(self._resume_after, deadline)
        self._resume_after = resume or ""
        counts.update(attached)
        return counts

    def _adopt_all(self, counts: dict[str, int]) -> None:
        skip: list[str] = []  # rows tried this run: not again until the next one
        while counts["adopted"] + counts["refused"] < self.batch:
            current: list[str] = []
            try:
                if not self._adopt_one(skip, current, counts):
                    return
            except Exception as exc:  # a database error on this row: defer it, go on
                if not current:
                    log.warning("photo-bridge: adoption failed (%s)", brief(exc))
                    return
                if is_transient(exc):
                    log.warning(
                        "photo-bridge: adoption of photo %s failed (%s)", current[0], brief(exc)
                    )
                else:  # a value no driver reads, say: named once, the others go on
                    self.photos.unreadable(current[0], exc)
                self._defer(current[0], f"adoption failed: {type(exc).__name__}")
                counts["refused"] += 1
            skip.extend(current)

    def _adopt_one(self, skip: list[str], current: list[str], counts: dict[str, int]) -> bool:
        """Adopt the next due row in one transaction; False when none is due."""
        engine = self.photos.engine
        now = engine.clock()
        with engine.db.tx() as tx:
            due = tx.due_variant_jobs(now, 1, exclude=skip)
            if not due:
                return False
            current.append(due[0])
            row = tx.variant_job(due[0])  # may be unreadable: deferred by the caller
            if row is None:
                return True
            native = bool(row["native"])
            actor = NATIVE if native else BRIDGE
            try:
                ids = self.photos.adopt(row["photo_id"], now, tx, actor=actor)
            except HypermediaError as exc:
                reason = redact(exc, 500)
                tx.variant_failed(row["photo_id"], reason, now + backoff(row["attempts"]))
                counts["refused"] += 1
                return True
            if ids is None:  # its photo is gone (a foreign key would have taken the row)
                tx.delete_variant_job(row["photo_id"])
                return True
            # Our own photo's row, retried after a refusal: no legacy use to count.
            targets: list[int | None] = [] if native else [*ids] or [None]
            for job_id in targets:
                tx.insert_bridge_hit(_hit(job_id, row["photo_id"], now, done=not ids))
            counts["adopted"] += 1
            return True

    def _defer(self, photo_id: str, reason: str) -> None:
        engine = self.photos.engine
        now = engine.clock()
        try:
            with engine.db.tx() as tx:
                row = tx.variant_job(photo_id)
                if row is not None and row["adopted_at"] is None:
                    tx.variant_failed(photo_id, reason, now + backoff(row["attempts"]))
            return
        except Exception as exc:
            if is_transient(exc):  # the database is away: the next run tries again
                log.warning("photo-bridge: could not defer a row (%s)", brief(exc))
                return
        try:  # a row that cannot be read is still written: pushed back the longest
            with engine.db.tx() as tx:
                tx.variant_failed(photo_id, reason, now + backoff(UNREADABLE_ATTEMPTS))
        except Exception as exc:
            log.warning("photo-bridge: could not defer a row (%s)", brief(exc))


def _hit(job_id: int | None, photo_id: str, now: Any, *, done: bool) -> dict[str, Any]:
    what = "already had its variants" if done else "adopted by the engine"
    return {
        "provider_id": None,
        "job_id": job_id,
        "legacy_surface": SURFACE,
        "operation": "adopt",
        "safe_reason": redact(f"variant_jobs row of photo {photo_id} {what}", 500),
        "created_at": now,
    }

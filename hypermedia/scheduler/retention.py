"""Job retention (DESIGN §3 maintenance): finished jobs are deleted after a while.

A job that ended (completed, failed or cancelled) more than
``job_retention_days`` ago is deleted with its attempts, events and output
rows, a batch per transaction.  What that lets go of:

* its outputs: objects nothing else references (no photo binding, no other
  job's output, no live job's input) are then collected by GC after
  ``gc_unreferenced_seconds``, as any unreferenced object is;
* its idempotency key: the same key makes a new job afterwards.

What it keeps: the project's credit use (a deleted completed job's credits,
unless the leader folded them already, move to
``project_credits.settled_credits`` in the same transaction), the
counts of /metrics' attempt duration histogram (``pruned_attempt_durations``,
queue/durations.py), and the jobs of a photo whose variants are not
attached yet (their ``variant_jobs`` row still points at them by key).
``job_retention_days = 0`` keeps every job.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from hypermedia.photos.service import photo_of_variant_key
from hypermedia.queue import durations
from hypermedia.queue.engine import Engine
from hypermedia.scheduler.budget import Backlog, Backlogged

BATCH = 500


@dataclass
class JobRetention(Backlogged):
    engine: Engine
    name: str = "job-retention"
    # None: the engine's settings (job_retention_days).
    days: float | None = None
    # The leader's runs have a time budget (scheduler/budget.py); without
    # one (``hypermedia jobs prune``) a run goes on until it is done.
    backlog: Backlog = field(default_factory=lambda: Backlog(3600.0))

    def run_once(self, now: datetime | None = None) -> int:
        """Delete the jobs that ended before the cutoff; return how many."""
        days = self.engine.settings.job_retention_days if self.days is None else self.days
        if days <= 0:
            return 0
        before = (now or self.engine.clock()) - timedelta(days=days)
        self.backlog.start()
        total, after = 0, None
        while True:
            deleted, rows = self._batch(before, after)
            total += deleted
            if len(rows) < BATCH or self.backlog.spent():
                return total
            # Jobs kept (a photo's variants) stay at the head of the
            # oldest-first scan: the next batch starts past them.  It stopped
            # at "nothing deleted", so 500 kept jobs held back all the rest.
            after = (rows[-1]["created_at"], rows[-1]["job_id"])

    def _batch(
        self, before: datetime, after: tuple[datetime, int] | None
    ) -> tuple[int, list[dict[str, Any]]]:
        """One transaction: (jobs deleted, the jobs looked at)."""
        now = self.engine.clock()
        with self.engine.db.tx() as tx:
            rows = tx.prunable_jobs(before, BATCH, after)
            photo_of = {r["job_id"]: photo_of_variant_key(r["idempotency_key"]) for r in rows}
            waiting = tx.photos_with_variant_rows([p for p in photo_of.values() if p])
            gone = [r for r in rows if photo_of[r["job_id"]] not in waiting]
            ids = [r["job_id"] for r in gone]
            if ids:
                # Attempts up to the fold's watermark are counted there already.
                fold = tx.attempt_fold(lock=True)
                histogram = tx.attempt_duration_histogram(
                    durations.BOUNDS_MS, ids, after=int(fold["watermark"])
                )
                tx.add_pruned_durations(histogram, durations.BOUNDS_MS, now)
                tx.delete_jobs(ids, before)
            for project_id, credits in _credits(gone).items():
                tx.add_settled_credits(project_id, credits, now)
        return len(gone), rows


def _credits(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Credits used per project by these jobs and not settled yet: completed
    ones only (as in credit use), and not those the fold counted already."""
    used: dict[str, int] = defaultdict(int)
    for r in rows:
        if r["status"] == "completed" and not r["credits_folded"]:
            used[r["project_id"]] += int(r["credits"] or 0)
    return used

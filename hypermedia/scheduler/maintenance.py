"""Maintenance services: each is ``run_once()`` (testable alone) plus a period.

Only the elected leader runs them (see ``leader.Leader``), so two API nodes or
two ``serve`` processes never reap or aggregate the same rows twice.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Protocol

from hypermedia.db.dialects import is_lock_busy
from hypermedia.queue.engine import Engine
from hypermedia.scheduler.budget import BUDGET_SECONDS, Backlog, Backlogged


class Service(Protocol):
    """A maintenance service.  One with ``detached = True`` (it waits on a
    store: GC) runs in a thread of its own, so the leader's lease, the reaper
    and the promoter never wait behind it."""

    name: str

    @property
    def period(self) -> float:
        """Seconds from the end of one run to the next (read after each run)."""
        ...

    def run_once(self) -> Any: ...


@dataclass
class Reaper:
    """Expired leases back to retry (or failed); silent workers marked unhealthy."""

    engine: Engine
    name: str = "reaper"
    period: float = 5.0
    # It judges workers by their heartbeats: not in the moments after a
    # database outage, when none could write one (leader.WORKER_GRACE_SECONDS).
    waits_for_workers: bool = True

    def run_once(self) -> dict[str, int]:
        return self.engine.reap()


@dataclass
class Promoter:
    """retry_wait → queued once a job's backoff is over."""

    engine: Engine
    name: str = "promoter"
    period: float = 1.0

    def run_once(self) -> int:
        total = 0
        while (n := self.engine.promote()) > 0:
            total += n
        return total


@dataclass
class MetricsRetention(Backlogged):
    """Raw worker_metrics older than N days become hourly aggregates (seed 000)."""

    engine: Engine
    name: str = "metrics-retention"
    # The leader's runs have a time budget (scheduler/budget.py): ten days of
    # a fleet's samples took 8 s, with the lease and the reaper waiting.
    backlog: Backlog = field(default_factory=lambda: Backlog(3600.0))

    def run_once(self) -> int:
        """Aggregate whole hours, oldest first, each in its own transaction.

        Only hours wholly before the cutoff: the hour it falls in stays raw
        until it has passed (its first part aggregated, then the rest, wrote
        the hour twice: a duplicate key on every run after, and raw rows piled
        up for good).  A sample that lands in an hour aggregated already (a
        clock set back) is added to its row."""
        cutoff = self.engine.clock() - timedelta(days=self.engine.settings.metrics_raw_days)
        whole = cutoff.replace(minute=0, second=0, microsecond=0)
        self.backlog.start()
        hours = 0
        while not self.backlog.spent():
            try:
                with self.engine.db.tx() as tx:
                    oldest = tx.oldest_metric_before(whole)
                    if oldest is None:
                        return hours
                    folded = self._fold_hour(tx, oldest.replace(minute=0, second=0, microsecond=0))
            except _Raced:
                continue  # rolled back: the hour is read again as it is now
            except Exception as exc:
                if not is_lock_busy(exc):
                    raise
                # Another run holds the hour: a leader frozen mid-fold.  Waited
                # for, it held this leader's loop (the reaper, the promoter, its
                # lease's renewal) until that transaction ended, minutes maybe.
                return hours
            hours += folded
        return hours

    def _fold_hour(self, tx: Any, start: datetime) -> bool:
        """The raw samples of the hour from ``start`` added to its hourly rows.

        They are locked as read: a leader frozen (SIGSTOP, a paused VM) between
        reading them and writing the hour, while the next leader folded it,
        added them to that hour a second time when it woke (every sum of the
        hour doubled, the raw rows gone).  Deleting fewer than were read means
        some were folded meanwhile all the same: the whole hour is undone.
        False if another run had folded it by the time the lock was had."""
        end = start + timedelta(hours=1)
        raw = tx.metrics_between(start, end, lock=True)
        if not raw:
            return False
        rows = _aggregate(raw, start)
        workers = [r["worker_id"] for r in rows]
        before = tx.hourly_at(start, workers)
        tx.delete_hourly_at(start, list(before))
        tx.insert_hourly([_merge(before.get(r["worker_id"]), r) for r in rows])
        if tx.delete_metrics_between(start, end) != len(raw):
            raise _Raced
        return True


class _Raced(Exception):
    """Another run folded samples this one had read: roll back, read again."""


def _merge(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """One hourly row of two: ``old`` (stored already, if any) and ``new``."""
    if old is None:
        return new
    n, m = old["samples"], new["samples"]
    done = old["jobs_completed"] + new["jobs_completed"]
    weighted = (
        old["avg_job_duration_ms"] * old["jobs_completed"]
        + new["avg_job_duration_ms"] * new["jobs_completed"]
    )
    out = {**new, "samples": n + m, "jobs_completed": done}
    out["jobs_failed"] = old["jobs_failed"] + new["jobs_failed"]
    out["avg_job_duration_ms"] = int(weighted / done) if done else 0
    for col in ("cpu_percent", "memory_percent"):
        total = Decimal(old[f"{col}_avg"]) * n + Decimal(new[f"{col}_avg"]) * m
        out[f"{col}_avg"] = round(total / (n + m), 2)
    for col in ("cpu_percent_max", "memory_percent_max", "disk_percent_max"):
        out[col] = max(Decimal(old[col]), Decimal(new[col]))
    return out


def _aggregate(rows: list[dict[str, Any]], hour: datetime) -> list[dict[str, Any]]:
    by_worker: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_worker[r["worker_id"]].append(r)
    out = []
    for worker_id, rs in by_worker.items():
        n = len(rs)

        def avg(col: str, rs: list[dict[str, Any]] = rs, n: int = n) -> Decimal:
            return round(Decimal(sum(Decimal(r[col]) for r in rs)) / n, 2)

        def peak(col: str, rs: list[dict[str, Any]] = rs) -> Decimal:
            return Decimal(max(Decimal(r[col]) for r in rs))

        done = sum(r["jobs_completed_1m"] for r in rs)
        weighted = sum(r["avg_job_duration_ms"] * r["jobs_completed_1m"] for r in rs)
        out.append(
            {
                "worker_id": worker_id,
                "hour": hour,
                "samples": n,
                "cpu_percent_avg": avg("cpu_percent"),
                "cpu_percent_max": peak("cpu_percent"),
                "memory_percent_avg": avg("memory_percent"),
                "memory_percent_max": peak("memory_percent"),
                "disk_percent_max": peak("disk_percent"),
                "jobs_completed": done,
                "jobs_failed": sum(r["jobs_failed_1m"] for r in rs),
                "avg_job_duration_ms": int(weighted / done) if done else 0,
            }
        )
    return out


def default_services(engine: Engine) -> list[Service]:
    from hypermedia.photos import PhotoBridge, Photos
    from hypermedia.scheduler.attempt_fold import AttemptFold
    from hypermedia.scheduler.credits import CreditFold
    from hypermedia.scheduler.retention import JobRetention
    from hypermedia.storage.gc import GarbageCollector
    from hypermedia.storage.ledger import Storage

    s = engine.settings
    storage = Storage(engine.db, s, clock=engine.clock)
    return [
        Reaper(engine, period=s.reaper_interval_seconds),
        Promoter(engine, period=s.promoter_interval_seconds),
        MetricsRetention(engine, backlog=Backlog(s.retention_interval_seconds, BUDGET_SECONDS)),
        JobRetention(engine, backlog=Backlog(s.retention_interval_seconds, BUDGET_SECONDS)),
        GarbageCollector(storage, backlog=Backlog(s.gc_interval_seconds, BUDGET_SECONDS)),
        CreditFold(engine, backlog=Backlog(s.fold_interval_seconds, BUDGET_SECONDS)),
        AttemptFold(engine, backlog=Backlog(s.fold_interval_seconds, BUDGET_SECONDS)),
        PhotoBridge(Photos(engine, storage), period=s.photo_bridge_interval_seconds),
    ]

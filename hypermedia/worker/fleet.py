"""Workers as operators see them: the list, one worker, and drain.

Drain marks the worker's row ``draining``; the worker reads its own row every
poll interval, stops claiming, finishes what it runs and exits (see
``worker.runner``).  The heartbeat never overwrites a drain it has not seen.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any

import psutil

from hypermedia.errors import Conflict, NotFound
from hypermedia.pipelines import registry
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import EVERY_QUEUE

Row = dict[str, Any]
DRAINABLE = ("active", "idle")
LIVE = ("active", "idle", "draining")
# The id prefix of a worker that lives inside a ``process`` command (worker/local.py).
TEMPORARY = "process-"


def every_queue(tx: Any) -> set[str]:
    """The queues a ``*`` worker claims from: its pipelines' own, and each
    one a profile or an operator names (``Tx.named_queues``).  A queue only
    a job names needs a worker that lists it."""
    return registry.queues() | tx.named_queues()


class Fleet:
    def __init__(self, engine: Engine) -> None:
        self.db = engine.db
        self.clock = engine.clock
        self.settings = engine.settings

    def list(self, *, include_terminated: bool = False) -> list[Row]:
        """Workers, newest first, each with ``last_metrics``, ``healthy`` and
        ``leads_maintenance`` (whether it holds the leader's lease now)."""
        with self.db.read() as tx:
            rows = tx.workers(include_terminated=include_terminated)
            metrics = tx.latest_metrics([r["worker_id"] for r in rows])
            leader = self._leader(tx)
        return [
            {
                **self._shown(r, metrics.get(r["worker_id"])),
                "leads_maintenance": r["worker_id"] == leader,
            }
            for r in rows
        ]

    def leader(self) -> str | None:
        """Who runs the maintenance services now (a worker's id, or a
        scheduler's or serve's node id), or None while nobody holds the lease."""
        with self.db.read() as tx:
            return self._leader(tx)

    def _leader(self, tx: Any) -> str | None:
        from hypermedia.scheduler.leader import LEASE_NAME  # the scheduler imports workers

        return tx.lease_holder(LEASE_NAME, self.clock())

    def get(self, worker_id: str) -> Row:
        with self.db.read() as tx:
            row = tx.worker(worker_id)
            if row is None:
                raise NotFound(f"worker {worker_id} not found")
            metrics = tx.latest_metrics([worker_id])
        return self._shown(row, metrics.get(worker_id))

    def counts(self) -> dict[str, int]:
        """Workers by status, terminated ones included."""
        with self.db.read() as tx:
            return tx.worker_counts_by_status()

    def drain(self, worker_id: str) -> Row:
        """active/idle → draining; draining again is a no-op, any other status a Conflict."""
        with self.db.tx() as tx:
            if not tx.set_worker_status(worker_id, DRAINABLE, "draining"):
                status = tx.worker_status(worker_id)
                if status is None:
                    raise NotFound(f"worker {worker_id} not found")
                if status != "draining":
                    raise Conflict(f"cannot drain worker {worker_id}: it is {status}")
        return self.get(worker_id)

    def serving(self, queues: set[str]) -> set[str]:
        """Which of ``queues`` a worker serves now: one that is not draining,
        was heard from within the stale window, and (on this machine) whose
        process still exists, so a worker killed a moment ago serves nothing.
        Another ``process`` command's worker counts for nothing: it stops when
        that command's jobs end, and a second ``process`` waited on it in vain."""
        cutoff = self.clock() - timedelta(seconds=self.settings.worker_stale_seconds)
        host = socket.gethostname()[:255]
        served: set[str] = set()
        with self.db.read() as tx:  # the rows alone: no metrics wanted here
            rows = tx.workers()
            # QA: a queue only a job named read as served while any "*" worker ran.
            anywhere = any(EVERY_QUEUE in (r["queues"] or ()) for r in rows)
            every = every_queue(tx) if anywhere else set()
        for row in rows:
            if row["status"] not in DRAINABLE or row["last_heartbeat"] < cutoff:
                continue
            if row["worker_id"].startswith(TEMPORARY):
                continue
            if row["hostname"] == host and not psutil.pid_exists(row["pid"] or 0):
                continue
            named = set(row["queues"] or ())
            served |= queues & (named | every if EVERY_QUEUE in named else named)
        return served

    def _shown(self, row: Row, metrics: Row | None) -> Row:
        # Healthy: alive by its own account and heard from within the stale window.
        cutoff = self.clock() - timedelta(seconds=self.settings.worker_stale_seconds)
        healthy = row["status"] in LIVE and row["last_heartbeat"] >= cutoff
        return {**row, "last_metrics": metrics, "healthy": healthy}

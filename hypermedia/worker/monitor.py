"""The worker's clockwork: lease renewal, cancel checks, heartbeats, metrics.

Each duty has its own period (seed 000: heartbeat every 30 s, metrics every
60 s; leases renewed every lease/3; cancel checked about every second).  A
database outage only delays them: the heartbeat and the lease renewal, when
they fail, are tried again every RETRY_SECONDS, not a whole period later, so
they are written about a second after the database's return (a leader that
has just taken the lead gives the workers leader.WORKER_GRACE_SECONDS before
its reaper judges them), and each failure is said once, then once a minute
while it lasts.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import psutil

from hypermedia import __version__, leftovers, said
from hypermedia.linux import name_native
from hypermedia.queue.engine import Engine
from hypermedia.redact import brief
from hypermedia.worker.slot import Running

log = logging.getLogger(__name__)

RETRY_SECONDS = 1.0  # a failed duty's next try: see the module's docstring


class Stats:
    """Completed/failed counts and durations over the last minute, for worker_metrics."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done: deque[tuple[float, bool, int]] = deque()

    def record(self, ok: bool, duration_ms: int | None) -> None:
        with self._lock:
            self._done.append((time.monotonic(), ok, duration_ms or 0))

    def last_minute(self) -> tuple[int, int, int]:
        cutoff = time.monotonic() - 60
        with self._lock:
            while self._done and self._done[0][0] < cutoff:
                self._done.popleft()
            ok = sum(1 for _, good, _ in self._done if good)
            failed = len(self._done) - ok
            avg = int(sum(d for _, _, d in self._done) / len(self._done)) if self._done else 0
        return ok, failed, avg


class Monitor(threading.Thread):
    def __init__(
        self,
        engine: Engine,
        worker_id: str,
        running: Callable[[], list[Running]],
        stats: Stats,
        home: Path,
        stop: threading.Event,
        unstarted_cancelled: Callable[[list[Running]], None] | None = None,
    ) -> None:
        super().__init__(name="monitor", daemon=True)
        self.unstarted_cancelled = unstarted_cancelled
        self.engine = engine
        self.worker_id = worker_id
        self.running = running
        self.stats = stats
        self.home = home
        self.stop = stop
        s = engine.settings
        # The heartbeat first: after an outage it is what the reaper waits for.
        self.duties: list[tuple[float, Callable[[], None]]] = [
            (s.worker_heartbeat_seconds, self.heartbeat),
            (s.cancel_poll_seconds, self.check_cancels),
            (s.lease_seconds / 3, self.renew_leases),
            (s.worker_metrics_seconds, self.write_metrics),
            (s.worker_metrics_seconds, self.sweep_scratch),
        ]
        self.status = "active"

    def run(self) -> None:
        name_native()
        due = [time.monotonic() + period for period, _ in self.duties]
        while not self.stop.wait(0.1):
            now = time.monotonic()
            for i, (period, duty) in enumerate(self.duties):
                if now < due[i]:
                    continue
                name = duty.__name__
                try:
                    duty()
                except Exception as exc:
                    # Only what the reaper judges the worker by is tried again
                    # soon: metrics or a scratch sweep that fail wait their period.
                    soon = duty in (self.heartbeat, self.renew_leases)
                    due[i] = now + (min(period, RETRY_SECONDS) if soon else period)
                    said.warning(log, name, "%s failed (%s); will retry", name, brief(exc))
                    continue
                due[i] = now + period
                if said.ended(name):
                    log.info("%s works again", name)

    def _apply(self, asked: list[Running], statuses: dict[int, str]) -> None:
        # Only judge the jobs we asked about: one claimed since then is simply
        # not in the answer yet, and must not be taken for a lost lease.
        waiting = []
        for rj in asked:
            status = statuses.get(rj.job.job_id)
            if status is None:
                rj.lost.set()
            elif status == "cancel_requested":
                rj.cancel.set()
                if not rj.started:
                    waiting.append(rj)
        if waiting and self.unstarted_cancelled is not None:
            # Claimed ahead, waiting for a slot: ended now, not when a slot
            # frees up (behind long attempts, minutes later).
            self.unstarted_cancelled(waiting)

    def sweep_scratch(self) -> None:
        """Scratch folders of workers here that were killed since this one
        started, or too young to judge when it did (leftovers.py); and
        their jobs."""
        release_dead(self.engine, leftovers.sweep_folders(self.home.resolve() / "scratch"))

    def check_cancels(self) -> None:
        asked = self.running()
        if asked:
            self._apply(asked, self.engine.poll_statuses(self.worker_id, [r.key for r in asked]))

    def renew_leases(self) -> None:
        asked = self.running()
        if asked:
            self._apply(asked, self.engine.renew(self.worker_id, [r.key for r in asked]))

    def heartbeat(self) -> None:
        held = self.running()
        # Running: what slots took, not the jobs claimed ahead for them
        # (workers ls showed 6/2 on a worker of two slots), nor those whose
        # results wait to be stored or written while the slot runs the next (2/1).
        busy = sum(1 for r in held if r.started and not r.ended)
        with self.engine.db.tx() as tx:
            tx.update_worker(
                self.worker_id,
                {
                    "last_heartbeat": self.engine.clock(),
                    "current_jobs": min(busy, 127),
                    "status": self.status
                    if self.status == "draining"
                    else ("active" if held else "idle"),
                },
            )

    def write_metrics(self) -> None:
        ok, failed, avg = self.stats.last_minute()
        disk = shutil.disk_usage(self.home)
        with self.engine.db.tx() as tx:
            tx.insert_metric(
                {
                    "worker_id": self.worker_id,
                    "cpu_percent": min(psutil.cpu_percent(None), 999.99),
                    "memory_percent": psutil.virtual_memory().percent,
                    "disk_percent": round(100 * disk.used / disk.total, 2),
                    "jobs_completed_1m": ok,
                    "jobs_failed_1m": failed,
                    "avg_job_duration_ms": avg,
                    "recorded_at": self.engine.clock(),
                }
            )


def release_dead(engine: Engine, worker_ids: list[str]) -> None:
    """The jobs of workers known dead (their scratch folder here was free to
    take: leftovers.py) released now, not once their leases expire or their
    heartbeats go stale: a `process` run killed with -9 left its jobs
    `processing` past the end of the next, short, run.  A worker id is
    made fresh at each start, so one from another database matches nothing;
    only this machine's workers are judged (an flock on a network file system
    may hold on one machine only: another's live workers would look dead)."""
    if not worker_ids:
        return
    try:
        released = engine.release_dead(worker_ids, socket.gethostname()[:255])
    except Exception as exc:  # the reaper gets them later
        log.warning("could not release the jobs of stopped workers (%s)", brief(exc))
        return
    if released:
        log.info(
            "released %d job(s) of %s, whose process died",
            released,
            ", ".join(worker_ids) if len(worker_ids) < 4 else f"{len(worker_ids)} workers",
        )


def worker_row(
    worker_id: str, queues: list[str], concurrency: int, home: Path, now: object
) -> dict:
    disk = shutil.disk_usage(home)
    return {
        "worker_id": worker_id,
        "worker_type": "vps",
        # Nothing claimed yet: it was listed "active 0/N" until its first
        # heartbeat, beside idle workers doing as little.
        "status": "idle",
        "queues": queues,
        "max_concurrency": min(concurrency, 127),
        "current_jobs": 0,
        "cpu_cores": min(psutil.cpu_count() or 1, 127),
        "memory_mb": psutil.virtual_memory().total // 1_048_576,
        "disk_mb": disk.total // 1_048_576,
        "cost_per_hour_cents": 0,
        "hostname": socket.gethostname()[:255],
        "pid": __import__("os").getpid(),
        "version": __version__,
        "last_heartbeat": now,
        "started_at": now,
        "created_at": now,
    }


# A worker whose flusher or stager thread died went on heartbeating and
# renewing its leases: its jobs were held for as long as it lived, never
# reaped.  It exits at once instead (as a kill -9 would), and the reaper
# gives its jobs to other workers when their leases expire.
EXIT_THREAD_DIED = 70  # EX_SOFTWARE


def exit_if_they_die(vital: set[threading.Thread]) -> None:
    """Make an uncaught exception in any of ``vital`` end the process."""
    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        previous(args)  # its traceback first
        if args.thread in vital:
            name = args.thread.name
            log.critical(
                "the %s thread failed: the worker exits now; its jobs go to other "
                "workers once their leases expire",
                name,
            )
            logging.shutdown()
            os._exit(EXIT_THREAD_DIED)

    threading.excepthook = hook

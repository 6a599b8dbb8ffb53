"""A worker killed on the spot (kill -9, the OOM killer) leaves its jobs
`processing` until its lease expires or its heartbeat goes stale, and only a
leader's reaper looked.  Its scratch folder's lock is free the moment it dies
(leftovers.py), so a worker on the same machine that starts, or sweeps, then
knows it is dead and releases its jobs at once, with no leader at all."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from hypermedia.db.driver import Driver
from hypermedia.queue.engine import Engine
from tests.harness import attempts
from tests.integration._procs import Procs, WorkerProc, eventually, gone, submit, wait_job

pytestmark = pytest.mark.timeout(120)

# Nothing but the dead worker's folder may release its jobs in these tests.
SLOW_REAPING = {
    "HYPERMEDIA_LEASE_SECONDS": "600",
    "HYPERMEDIA_WORKER_STALE_SECONDS": "1200",
}


def _killed_running(
    procs: Procs, live: Engine, home: Path, age: float = 60
) -> tuple[WorkerProc, int]:
    """A worker killed with -9 while a job of its runs; its folder aged
    ``age`` seconds (by default past the moments when a folder is too young
    to judge)."""
    w = procs.worker("--concurrency", "1", "--no-maintenance", **SLOW_REAPING)
    job_id = submit(live, {"ms": 60_000})
    wait_job(procs.driver, job_id, {"processing"})
    procs.note_children(w)
    os.killpg(w.pid, signal.SIGKILL)
    eventually(lambda: gone(w.pid), 10, "the worker died")
    old = time.time() - age
    os.utime(home / "scratch" / w.worker_id / ".owner", (old, old))
    return w, job_id


def _released(procs: Procs, dead: WorkerProc, job_id: int) -> None:
    row = wait_job(procs.driver, job_id, {"retry_wait", "queued", "claimed", "processing"})
    first = attempts(procs.driver, job_id)[0]
    assert first["status"] == "orphaned", first
    assert "its worker's process died" in (first["error_message"] or ""), first
    assert row["attempt_count"] >= 1
    (status,) = procs.query("SELECT status FROM workers WHERE worker_id = :w", w=dead.worker_id)[0]
    assert status == "unhealthy"


def test_a_worker_starting_here_releases_the_jobs_of_one_that_died(
    driver: Driver, live: Engine, procs: Procs, tmp_path: Path
) -> None:
    dead, job_id = _killed_running(procs, live, procs.home)
    assert wait_job(driver, job_id, {"processing"})  # held by the dead worker, lease long
    started = time.monotonic()
    procs.worker("--concurrency", "1", "--no-maintenance", queues="idle", **SLOW_REAPING)
    wait_job(driver, job_id, {"retry_wait", "queued"}, timeout=15)
    assert time.monotonic() - started < 15
    _released(procs, dead, job_id)


def test_a_running_worker_here_releases_them_when_it_sweeps(
    driver: Driver, live: Engine, procs: Procs, tmp_path: Path
) -> None:
    procs.worker("--concurrency", "1", "--no-maintenance", queues="idle", **SLOW_REAPING)
    dead, job_id = _killed_running(procs, live, procs.home)
    # Its sweep runs every HYPERMEDIA_METRICS_SECONDS (1 s in the tests).
    wait_job(driver, job_id, {"retry_wait", "queued"}, timeout=15)
    _released(procs, dead, job_id)


def test_a_worker_killed_seconds_after_its_start_is_judged_by_the_next(
    driver: Driver, live: Engine, procs: Procs, tmp_path: Path
) -> None:
    """A `process` killed -9 in its first ten seconds: its folder was too young
    to judge, the next sweep came a minute later, and a next `process` of a
    few seconds ended with the dead one's jobs still `processing`."""
    w, job_id = _killed_running(procs, live, procs.home, age=3)  # 3 s after its start
    procs.worker(
        "--concurrency", "1", "--no-maintenance", queues="idle",
        HYPERMEDIA_METRICS_SECONDS="120", **SLOW_REAPING,
    )  # fmt: skip
    wait_job(driver, job_id, {"retry_wait", "queued"}, timeout=8)
    _released(procs, w, job_id)

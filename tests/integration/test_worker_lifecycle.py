"""A real worker's life: cancel of a running job, drain and stop on SIGTERM,
its registry row, heartbeats and metrics."""

from __future__ import annotations

import contextlib
import json
import signal
import time
from pathlib import Path

import pytest

from hypermedia.db.driver import Driver
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import NewJob
from tests.integration._procs import (
    Procs,
    attempts,
    events,
    eventually,
    gone,
    job,
    run_one,
    sqlite_only,
    submit,
    wait_job,
)

pytestmark = pytest.mark.timeout(90)


def driver_status(driver: Driver, job_id: int) -> str:
    with driver.read() as tx:
        row = tx.job(job_id)
    return "" if row is None else str(row["status"])


def _worker_row(procs: Procs, worker_id: str):
    (row,) = procs.query(
        "SELECT status, last_heartbeat, terminated_at, pid, max_concurrency, current_jobs "
        "FROM workers WHERE worker_id = :w",
        w=worker_id,
    )
    return row


def test_cancel_stops_a_running_attempt_and_kills_its_child(
    driver: Driver, live: Engine, procs: Procs
) -> None:
    w = procs.worker("--concurrency", "1", "--no-maintenance")
    warm = run_one(driver, live, {"ms": 0})["pid"]

    job_id = submit(live, {"ms": 30000})
    wait_job(driver, job_id, {"processing"}, 20)
    assert procs.one_child(w) == warm  # the attempt runs in the warm child

    out = procs.cli("jobs", "cancel", str(job_id), "--json")
    asked = time.monotonic()
    assert json.loads(out) == {"job_id": job_id, "status": "cancel_requested"}
    row = wait_job(driver, job_id, {"cancelled", "completed", "failed"}, 2)
    assert time.monotonic() - asked < 2

    assert row["status"] == "cancelled"
    assert row["outcome"] == "cancelled"
    assert row["category"] == "cancellation"
    (a,) = attempts(driver, job_id)
    assert a["status"] == "cancelled"
    assert a["duration_ms"] < 30000
    eventually(lambda: gone(warm), 2, "the cancelled attempt's child is gone")

    # The worker goes on, in a fresh child.
    assert w.alive()
    assert run_one(driver, live, {"ms": 0})["pid"] != warm
    procs.note_children(w)


def test_sigterm_drains_finishes_the_running_job_and_hands_back_the_rest(
    driver: Driver, live: Engine, procs: Procs, tmp_path: Path
) -> None:
    w = procs.worker("--concurrency", "1", "--no-maintenance", HYPERMEDIA_HEARTBEAT_SECONDS="0.5")
    # Short jobs first: a worker busy with short jobs claims ahead of its one
    # slot (worker/pace.py), so the long one's batch brings the waiting ones.
    # All in one transaction: enqueued apart, a claim in between could find
    # the queue empty, and a worker that idled claims nothing ahead until its
    # next result, the long job's, when the waiting ones just run (a CI flake).
    short = [NewJob("debug.sleep", {"ms": 0}, priority=1)] * 20
    long = NewJob("debug.sleep", {"ms": 3000}, priority=5)
    ids = live.enqueue_many([*short, long, *[NewJob("debug.sleep", {"ms": 0}, priority=9)] * 3])
    running, waiting = ids[len(short)], ids[len(short) + 1 :]
    wait_job(driver, running, {"processing"}, 20)
    # The worker claims them into its buffer while its one slot is busy.
    eventually(
        lambda: all(job(driver, j)["status"] == "claimed" for j in waiting),
        10,
        "the waiting jobs are claimed into the worker's buffer",
    )

    assert job(driver, running)["status"] == "processing"
    # Its row says one job running on its one slot, not the four it holds
    # (`workers ls` showed 4/1).
    eventually(
        lambda: (lambda r: (r.status, r.current_jobs) == ("active", 1))(
            _worker_row(procs, w.worker_id)
        ),
        5,
        "a heartbeat counting the running job only",
    )
    w.proc.send_signal(signal.SIGTERM)
    assert w.proc.wait(20) == 0

    row = job(driver, running)
    assert row["status"] == "completed"
    assert [a["status"] for a in attempts(driver, running)] == ["completed"]
    for j in waiting:
        row = job(driver, j)
        assert row["status"] == "queued", row["status"]
        assert row["attempt_count"] == 0
        assert row["claimed_by"] is None
        assert row["visibility_timeout"] is None
        assert attempts(driver, j) == []  # the attempt never ran: no history of it
        assert [(e["from_status"], e["to_status"]) for e in events(driver, j)][-1] == (
            "claimed",
            "queued",
        )

    reg = _worker_row(procs, w.worker_id)
    assert reg.status == "terminated"
    assert reg.terminated_at is not None
    assert reg.current_jobs == 0
    # Its scratch directory went with it.
    assert (tmp_path / "scratch").is_dir()
    assert not (tmp_path / "scratch" / w.worker_id).exists()


def test_second_sigterm_stops_at_once_and_the_job_is_not_lost(
    driver: Driver, live: Engine, procs: Procs
) -> None:
    w = procs.worker("--concurrency", "1")
    job_id = submit(live, {"ms": 4000}, max_attempts=3)
    wait_job(driver, job_id, {"processing"}, 20)
    child = procs.one_child(w)

    w.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert w.alive(), "the first SIGTERM drains: the running job keeps the worker up"
    w.proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    assert w.proc.wait(10) == 0
    assert time.monotonic() - t0 < 5
    assert gone(child)
    assert _worker_row(procs, w.worker_id).status == "terminated"

    # Abandoned (a drain would have let it complete), not failed: a new
    # worker runs it again.
    assert job(driver, job_id)["status"] not in ("completed", "failed", "cancelled")
    assert attempts(driver, job_id)[0]["status"] in ("orphaned", "started")
    w2 = procs.worker("--concurrency", "1")
    row = wait_job(driver, job_id, timeout=30)
    assert row["status"] == "completed"
    tries = attempts(driver, job_id)
    assert [a["status"] for a in tries] == ["orphaned", "completed"]
    assert tries[0]["worker_id"] == w.worker_id
    assert tries[1]["worker_id"] == w2.worker_id


@sqlite_only
def test_worker_registers_heartbeats_and_writes_metrics(
    driver: Driver, live: Engine, procs: Procs
) -> None:
    w = procs.worker("--concurrency", "2", "--no-maintenance")
    first = _worker_row(procs, w.worker_id)
    assert first.pid == w.pid
    assert first.max_concurrency == 2
    assert first.status in ("active", "idle")
    assert first.terminated_at is None
    # FAST heartbeat: every 0.5 s.
    eventually(
        lambda: _worker_row(procs, w.worker_id).last_heartbeat > first.last_heartbeat,
        3,
        "last_heartbeat advances",
    )

    ids = live.enqueue_many([NewJob("debug.sleep", {"ms": 0})] * 3)
    for j in ids:
        assert wait_job(driver, j)["status"] == "completed"

    # FAST metrics: a row every second, counting the last minute's jobs.
    def metric():
        rows = procs.query(
            "SELECT jobs_completed_1m, jobs_failed_1m, cpu_percent, memory_percent, "
            "disk_percent FROM worker_metrics WHERE worker_id = :w "
            "ORDER BY metric_id DESC",
            w=w.worker_id,
        )
        return rows[0] if rows and rows[0].jobs_completed_1m >= 3 else None

    m = eventually(metric, 5, "a worker_metrics row counts the 3 completed jobs")
    assert m.jobs_completed_1m == 3
    assert m.jobs_failed_1m == 0
    assert 0 <= m.cpu_percent <= 999.99
    assert 0 < m.memory_percent <= 100
    assert 0 < m.disk_percent <= 100

    # A cancelled attempt is no failure (it was counted as one); a failed one is.
    slow = live.enqueue(NewJob("debug.sleep", {"ms": 30_000}))
    eventually(lambda: driver_status(driver, slow) == "processing", 10, "the slow job runs")
    live.cancel(slow, "test")
    bad = live.enqueue(NewJob("debug.sleep", {"fail": "CORRUPT_INPUT"}, max_attempts=1))
    assert wait_job(driver, slow)["status"] == "cancelled"
    assert wait_job(driver, bad)["status"] == "failed"

    def counted():
        rows = procs.query(
            "SELECT jobs_completed_1m, jobs_failed_1m FROM worker_metrics WHERE worker_id = :w "
            "ORDER BY metric_id DESC",
            w=w.worker_id,
        )
        return rows[0] if rows and rows[0].jobs_failed_1m >= 1 else None

    m = eventually(counted, 5, "a worker_metrics row counts the failed job")
    time.sleep(1.5)  # a row more: the cancel, had it been counted, would show by now
    m = counted()
    assert m is not None and (m.jobs_completed_1m, m.jobs_failed_1m) == (3, 1)

    w.proc.send_signal(signal.SIGTERM)
    assert w.proc.wait(20) == 0
    assert _worker_row(procs, w.worker_id).status == "terminated"

    # A restart is a new worker: fresh id, new row; the old one stays terminated.
    w2 = procs.worker("--concurrency", "2", "--no-maintenance")
    assert w2.worker_id != w.worker_id
    assert str(w2.pid) in w2.worker_id
    assert _worker_row(procs, w.worker_id).status == "terminated"
    assert _worker_row(procs, w2.worker_id).status in ("active", "idle")


def test_the_worker_threads_carry_their_names_for_the_kernel(
    driver: Driver, live: Engine, procs: Procs
) -> None:
    w = procs.worker("--concurrency", "2")
    run_one(driver, live, {"ms": 0})  # warm: every thread has started
    tasks = Path(f"/proc/{w.proc.pid}/task")

    def names() -> set[str]:
        out = set()
        for t in tasks.iterdir():
            with contextlib.suppress(FileNotFoundError):  # a thread that just ended
                out.add((t / "comm").read_text().strip())
        return out

    want = {"flusher", "monitor", "listener", "stager", "slot-0", "slot-1", "leader"}
    eventually(lambda: want <= names(), 5, f"threads named {sorted(want)}")


def test_long_jobs_are_shared_between_idle_workers_not_hoarded(
    driver: Driver, live: Engine, procs: Procs
) -> None:
    """A worker holds ahead of its slots only about a second of work (worker/
    pace.py): four 1.5 s jobs queued at once go two to each of two one-slot
    workers, not all four to whichever claimed first (which then ran them one
    after another while the other idled)."""
    a = procs.worker("--concurrency", "1", "--no-maintenance")
    b = procs.worker("--concurrency", "1", "--no-maintenance")
    for w in (a, b):  # each has run a job: its child is warm, its claim loop running
        eventually(lambda w=w: _ran_one(procs, live, driver, w.worker_id), 30, "a warm worker")
    # Each now knows its jobs are short: holding ahead is fine for those.
    jobs = [submit(live, {"ms": 1500}, priority=1) for _ in range(4)]
    rows = [wait_job(driver, j, timeout=30) for j in jobs]
    assert all(r["status"] == "completed" for r in rows)
    ran = [attempts(driver, j)[-1]["worker_id"] for j in jobs]
    assert sorted(ran.count(w.worker_id) for w in (a, b)) == [2, 2], ran


def _ran_one(procs: Procs, live: Engine, driver: Driver, worker_id: str) -> bool:
    """Submit quick jobs until ``worker_id`` has run one."""
    job_id = submit(live, {"ms": 0})
    wait_job(driver, job_id, timeout=10)
    return bool(
        procs.query(
            "SELECT 1 FROM job_attempts WHERE worker_id = :w AND status = 'completed'",
            w=worker_id,
        )
    )

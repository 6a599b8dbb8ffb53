"""Whose time: a worker whose clock is wrong keeps the database server's
(queue/clock.py).  The skewed worker runs under libfaketime (Debian
``faketime``), a real process with a real wrong clock."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest

from hypermedia.db.driver import Driver
from hypermedia.queue.clock import DatabaseClock, clock_for, utcnow
from hypermedia.queue.engine import Engine
from tests.conftest import _unavailable
from tests.integration._procs import Procs, eventually, job, submit, wait_job

pytestmark = pytest.mark.timeout(120)

SERVERS = pytest.mark.parametrize("database_url", ["postgresql", "mariadb"], indirect=True)
LIBFAKETIME = next(iter(sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))), None)


@SERVERS
def test_the_server_clock_is_read_and_agrees_with_this_host(driver: Driver) -> None:
    server = driver.server_now()
    assert server.tzinfo is None  # naive UTC, like every stored timestamp
    assert abs(server - utcnow()) < timedelta(seconds=2)  # same host, same clock
    clock = clock_for(driver)
    assert isinstance(clock, DatabaseClock)
    assert abs(clock() - utcnow()) < timedelta(seconds=2)
    assert abs(clock.offset) < timedelta(seconds=1)


@SERVERS
def test_a_worker_ten_minutes_slow_keeps_its_lease_and_runs_its_job_once(
    driver: Driver, live: Engine, procs: Procs
) -> None:
    if LIBFAKETIME is None:
        _unavailable("libfaketime is not installed (Debian package faketime)")
    w = procs.worker(
        "--concurrency",
        "1",
        "--no-maintenance",
        LD_PRELOAD=str(LIBFAKETIME),
        FAKETIME="-10m",
        FAKETIME_DONT_FAKE_MONOTONIC="1",
        HYPERMEDIA_LEASE_SECONDS="30",
    )
    job_id = submit(live, {"ms": 4000})
    # By its own clock the worker would not even see the job for 10 minutes
    # (its available_at would lie in that clock's future).
    eventually(lambda: job(driver, job_id)["status"] == "processing", 30, "the attempt starts")
    # The leader's reaper, on this (right) clock, while the attempt runs: with
    # the worker's own clock its lease ended 9.5 minutes ago and its heartbeat
    # is 10 minutes old, so the job would be taken from it.
    reaped = live.reap()
    assert reaped == {"unhealthy_workers": 0, "terminated_workers": 0, "released_jobs": 0}
    row = wait_job(driver, job_id)
    assert row["status"] == "completed", (row["status"], row["safe_reason"])
    assert row["attempt_count"] == 1
    now = driver.server_now()
    assert abs(row["claimed_at"] - now) < timedelta(seconds=60)  # not 10 minutes ago
    heartbeat = procs.query(
        "SELECT last_heartbeat FROM workers WHERE worker_id = :w", w=w.worker_id
    )[0][0]
    assert abs(heartbeat - now) < timedelta(seconds=60)
    assert w.alive()
    assert os.environ.get("FAKETIME") is None  # only the worker was skewed


@SERVERS
def test_a_leader_ten_minutes_fast_takes_no_running_job_away(
    driver: Driver, live: Engine, procs: Procs
) -> None:
    """The other side: the reaper's now, ten minutes ahead, would find every
    lease expired and every heartbeat stale."""
    if LIBFAKETIME is None:
        _unavailable("libfaketime is not installed (Debian package faketime)")
    procs.worker("--concurrency", "1", "--no-maintenance", HYPERMEDIA_LEASE_SECONDS="30")
    job_id = submit(live, {"ms": 5000})
    eventually(lambda: job(driver, job_id)["status"] == "processing", 30, "the attempt starts")
    procs.spawn(
        "scheduler",
        name="scheduler",
        LD_PRELOAD=str(LIBFAKETIME),
        FAKETIME="+10m",
        FAKETIME_DONT_FAKE_MONOTONIC="1",
        HYPERMEDIA_REAPER_INTERVAL_SECONDS="0.5",
    )
    # It leads (its lease row is written in the server's time) and reaps.
    eventually(lambda: procs.query("SELECT COUNT(*) FROM leader_leases")[0][0] == 1, 30, "a leader")
    row = wait_job(driver, job_id)
    assert row["status"] == "completed", (row["status"], row["safe_reason"])
    assert row["attempt_count"] == 1
    held = procs.query("SELECT expires_at FROM leader_leases")[0][0]
    assert abs(held - driver.server_now()) < timedelta(minutes=2)  # not 10 minutes ahead

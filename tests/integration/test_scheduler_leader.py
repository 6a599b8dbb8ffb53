"""Two real ``hypermedia scheduler`` processes: one leader, failover on kill -9,
and the new leader's reaper reclaims an expired lease."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from hypermedia.db.driver import Driver
from hypermedia.queue.engine import Engine
from hypermedia.scheduler.leader import WORKER_GRACE_SECONDS
from tests.conftest import FakeClock
from tests.harness import FAST, hypermedia
from tests.integration._procs import Procs, attempts, eventually, job, submit

pytestmark = pytest.mark.timeout(90)

LEASE = float(FAST["HYPERMEDIA_LEADER_LEASE_SECONDS"])


def _leases(procs: Procs) -> list:
    return procs.query("SELECT name, holder, expires_at FROM leader_leases")


def _holder_pid(holder: str) -> int:
    # Node ids are "scheduler-<host>-<pid>-<random>" (see runner.new_worker_id).
    return int(holder.rsplit("-", 2)[1])


def test_one_leader_fails_over_and_the_new_one_reaps(
    driver: Driver, engine: Engine, clock: FakeClock, procs: Procs
) -> None:
    s1 = procs.spawn("scheduler", name="scheduler")
    s2 = procs.spawn("scheduler", name="scheduler")
    by_pid = {s1.pid: s1, s2.pid: s2}

    (row,) = eventually(lambda: _leases(procs), 20, "a scheduler takes the leader lease")
    assert row.name == "maintenance"
    leader = by_pid[_holder_pid(row.holder)]
    (other,) = (p for p in by_pid.values() if p is not leader)
    assert other.poll() is None and leader.poll() is None

    # The leader keeps it (renewing every lease/3) while the other stays out.
    first_expiry = row.expires_at
    eventually(
        lambda: (_leases(procs) or [row])[0].expires_at > first_expiry,
        LEASE * 2,
        "the leader renews its lease",
    )
    (again,) = _leases(procs)
    assert again.holder == row.holder

    # kill -9: no resignation; the other takes over once the lease expires.
    os.killpg(leader.pid, signal.SIGKILL)
    leader.wait(5)
    killed = time.monotonic()
    (new,) = eventually(
        lambda: [r for r in _leases(procs) if r.holder != row.holder],
        LEASE * 4,
        "the surviving scheduler takes over",
    )
    assert _holder_pid(new.holder) == other.pid
    assert time.monotonic() - killed < LEASE * 4
    assert other.poll() is None
    # Said without -v: an operator asks "who runs maintenance?".
    logs = {proc.pid: path for proc, path in procs._procs}
    said = eventually(
        lambda: "leads maintenance now" in (text := logs[other.pid].read_text()) and text,
        10,
        "the new leader says so",
    )
    assert f"{new.holder} started: standing for leader" in said
    assert f"{new.holder} leads maintenance now" in said

    # The new leader's reaper works: a job claimed two minutes ago by a worker
    # that never renewed (its lease expired a minute ago) is reclaimed.
    clock.advance(-120)
    job_id = submit(engine, {"ms": 0}, max_attempts=3)
    (claimed,) = engine.claim("ghost-worker", ["bulk"], 1)
    assert claimed.job_id == job_id
    row = eventually(  # after the grace a new leader gives the workers first
        lambda: (r := job(driver, job_id))["status"] in ("retry_wait", "queued") and r,
        10 + WORKER_GRACE_SECONDS,
        "the reaper releases the expired lease",
    )
    assert row["attempt_count"] == 1
    assert row["visibility_timeout"] is None
    (a,) = attempts(driver, job_id)
    assert a["status"] == "orphaned"
    assert a["error_code"] == "ORPHANED"
    # … and its promoter queues it again once the backoff is over.
    eventually(lambda: job(driver, job_id)["status"] == "queued", 10, "promoted to queued")

    # A scheduler asked to stop resigns at once: the lease row goes away.
    other.send_signal(signal.SIGTERM)
    assert other.wait(15) == 0
    assert _leases(procs) == []
    assert f"{new.holder} stopped" in logs[other.pid].read_text()


@pytest.mark.parametrize("command", [["scheduler"], ["worker", "--burst"]])
def test_an_option_the_driver_refuses_stops_the_command_in_one_line(
    driver: Driver, tmp_path: Path, command: list[str]
) -> None:
    """An unknown connection option killed the scheduler's leader thread with
    a traceback, and the command ran on, doing no maintenance, as if healthy;
    a mistyped sslmode had every command wait for a database that was there."""
    if driver.name == "sqlite":
        pytest.skip("a SQLite URL's options are checked as the URL is read")
    options = ["bogus_opt=1"] + (["sslmode=requre"] if driver.name == "postgresql" else [])
    for option in options:
        bad = driver.url + ("&" if "?" in driver.url else "?") + option
        done = hypermedia(*command, url=bad, home=tmp_path / "home", timeout=30)
        assert done.returncode == 2, done.stderr
        assert option.split("=")[0] in done.stderr and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr

"""Metrics retention on every database (seed 000): raw worker_metrics older
than ``metrics_raw_days`` become one hourly row per worker and hour."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa

from hypermedia.db.driver import Driver
from hypermedia.db.schema import worker_metrics, worker_metrics_hourly
from hypermedia.db.workers import WorkerQueries
from hypermedia.queue.engine import Engine
from hypermedia.scheduler.budget import CATCH_UP_SECONDS, Backlog
from hypermedia.scheduler.maintenance import MetricsRetention

DAYS = 7


def _at(clock: Any, minute: int, second: int = 0) -> Any:
    """A time ``minute``:``second`` into the hour the retention cutoff falls in."""
    cutoff = clock() - timedelta(days=DAYS)
    return cutoff.replace(minute=minute, second=second, microsecond=0)


def _sample(engine: Engine, worker: str, when: Any, cpu: float, done: int = 0, ms: int = 0) -> None:
    with engine.db.tx() as tx:
        tx.insert_metric(
            {
                "worker_id": worker,
                "cpu_percent": cpu,
                "memory_percent": cpu / 2,
                "disk_percent": 10 + cpu,
                "jobs_completed_1m": done,
                "jobs_failed_1m": 1,
                "avg_job_duration_ms": ms,
                "recorded_at": when,
            }
        )


def _hourly(driver: Driver) -> dict[tuple[str, int], dict[str, Any]]:
    with driver.read() as tx:
        rows = tx.conn.execute(sa.select(worker_metrics_hourly)).mappings()
        return {(r["worker_id"], r["hour"].hour): dict(r) for r in rows}


def _raw(driver: Driver) -> int:
    with driver.read() as tx:
        q = sa.select(sa.func.count()).select_from(worker_metrics)
        return int(tx.conn.execute(q).scalar_one())


def test_whole_hours_past_the_cutoff_become_one_row_per_worker(engine, driver, clock) -> None:
    clock.now = clock.now.replace(minute=30)
    hour = _at(clock, 0) - timedelta(hours=2)
    _sample(engine, "w1", hour + timedelta(minutes=1), 10, done=2, ms=100)
    _sample(engine, "w1", hour + timedelta(minutes=59), 30, done=6, ms=300)
    _sample(engine, "w2", hour + timedelta(minutes=5), 50)
    _sample(engine, "w1", hour + timedelta(hours=1, minutes=10), 20)
    _sample(engine, "w1", clock(), 99)  # young: stays raw

    assert MetricsRetention(engine).run_once() == 2
    rows = _hourly(driver)
    w1 = rows[("w1", hour.hour)]
    assert w1["samples"] == 2 and w1["jobs_completed"] == 8 and w1["jobs_failed"] == 2
    assert Decimal(w1["cpu_percent_avg"]) == 20 and Decimal(w1["cpu_percent_max"]) == 30
    assert Decimal(w1["memory_percent_avg"]) == 10 and Decimal(w1["disk_percent_max"]) == 40
    assert w1["avg_job_duration_ms"] == 250  # weighted by the jobs each sample counted
    assert rows[("w2", hour.hour)]["samples"] == 1
    assert rows[("w1", (hour + timedelta(hours=1)).hour)]["samples"] == 1
    assert len(rows) == 3 and _raw(driver) == 1


def test_the_hour_the_cutoff_falls_in_waits_until_it_has_passed(engine, driver, clock) -> None:
    # Its first part aggregated, then the rest, wrote the hour twice: a
    # duplicate key on every run after, and raw samples kept for good.
    clock.now = clock.now.replace(minute=30)
    _sample(engine, "w1", _at(clock, 0, 1), 10)
    _sample(engine, "w1", _at(clock, 30, 20), 30)
    assert MetricsRetention(engine).run_once() == 0
    assert _raw(driver) == 2 and _hourly(driver) == {}

    clock.advance(3600)
    assert MetricsRetention(engine).run_once() == 1
    assert MetricsRetention(engine).run_once() == 0
    (row,) = _hourly(driver).values()
    assert row["samples"] == 2 and Decimal(row["cpu_percent_avg"]) == 20
    assert _raw(driver) == 0


def test_a_sample_in_an_hour_aggregated_already_is_added_to_it(engine, driver, clock) -> None:
    clock.now = clock.now.replace(minute=30)
    hour = _at(clock, 0) - timedelta(hours=1)
    _sample(engine, "w1", hour + timedelta(minutes=1), 10, done=1, ms=100)
    assert MetricsRetention(engine).run_once() == 1
    _sample(engine, "w1", hour + timedelta(minutes=2), 40, done=3, ms=500)  # a clock set back
    assert MetricsRetention(engine).run_once() == 1

    (row,) = _hourly(driver).values()
    assert row["samples"] == 2 and row["jobs_completed"] == 4 and row["jobs_failed"] == 2
    assert Decimal(row["cpu_percent_avg"]) == 25 and Decimal(row["cpu_percent_max"]) == 40
    assert row["avg_job_duration_ms"] == 400
    assert _raw(driver) == 0


def test_a_leader_run_stops_on_its_budget_and_comes_back_soon(engine, driver, clock) -> None:
    clock.now = clock.now.replace(minute=30)
    for h in range(1, 4):
        _sample(engine, "w1", _at(clock, 0) - timedelta(hours=h), 10)
    spent = MetricsRetention(engine, backlog=Backlog(3600.0, budget_seconds=0.0))
    assert spent.run_once() == 0
    assert spent.period == CATCH_UP_SECONDS and _raw(driver) == 3
    assert MetricsRetention(engine).run_once() == 3 and _raw(driver) == 0


def test_two_leaders_folding_one_hour_count_it_once(
    engine, driver, clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A leader frozen (SIGSTOP) between reading an hour's samples and writing
    its hourly row, while the next leader folded the hour, added the samples
    a second time when it woke: every sum of the hour doubled, for good."""
    hour = _at(clock, 0) - timedelta(hours=3)
    for i in range(1, 7):
        _sample(engine, "w1", hour + timedelta(minutes=5 * i), 10 * i, done=i)
    frozen, go = threading.Event(), threading.Event()
    hourly_at = WorkerQueries.hourly_at

    def stalled(self: Any, *args: Any) -> Any:
        if threading.current_thread().name == "frozen":
            frozen.set()
            go.wait(30)
        return hourly_at(self, *args)

    monkeypatch.setattr(WorkerQueries, "hourly_at", stalled)
    runs: dict[str, Any] = {}

    def run(name: str) -> None:
        try:
            runs[name] = MetricsRetention(engine).run_once()
        except Exception as exc:
            runs[name] = exc

    first = threading.Thread(target=run, args=("frozen",), name="frozen")
    first.start()
    assert frozen.wait(30)
    second = threading.Thread(target=run, args=("next",), name="next")
    second.start()
    second.join(1.5)  # the next leader folds the hour meanwhile, or waits for its samples
    go.set()
    first.join(30)
    second.join(30)
    assert not isinstance(runs["frozen"], Exception) and not isinstance(runs["next"], Exception)
    assert runs["frozen"] + runs["next"] == 1, runs  # the hour folded once
    w1 = _hourly(driver)[("w1", hour.hour)]
    assert (w1["samples"], w1["jobs_completed"], w1["jobs_failed"]) == (6, 21, 6)
    assert Decimal(w1["cpu_percent_max"]) == 60 and _raw(driver) == 0


def test_a_fold_held_by_a_frozen_leader_does_not_hold_the_next(engine, driver, clock) -> None:
    """Waiting for the samples a frozen leader had locked held the next
    leader's whole loop (its reaper, promoter and lease) until that
    transaction ended: the next run leaves the hour for later at once."""
    if driver.name == "sqlite":
        pytest.skip("SQLite: one writer at a time, the write lock itself is waited for")
    hour = _at(clock, 0) - timedelta(hours=3)
    _sample(engine, "w1", hour + timedelta(minutes=5), 10, done=1)
    with driver.tx() as tx:  # the frozen leader, its fold begun
        assert len(tx.metrics_between(hour, hour + timedelta(hours=1), lock=True)) == 1
        started = time.monotonic()
        assert MetricsRetention(engine).run_once() == 0
        assert time.monotonic() - started < 5
    assert MetricsRetention(engine).run_once() == 1 and _raw(driver) == 0

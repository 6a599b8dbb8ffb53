"""Helpers shared by the conformance tests: drive jobs to a status, read rows back.

Every status is reached through the engine's public methods, except ``paused``
(the engine has no pause method yet): that one is set with a guarded update whose
allowed sources come from the transition table, exactly as the engine would.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from hypermedia.db.driver import Driver
from hypermedia.queue import states
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import AttemptResult, NewJob, Output
from tests.harness import attempts as attempts  # re-exported for the tests
from tests.harness import events as events

Row = dict[str, Any]
W1 = "w1"


def new_job(engine: Engine, job_type: str = "debug.noop", **kw: Any) -> int:
    return engine.enqueue(NewJob(job_type, **kw))


def job_row(driver: Driver, job_id: int) -> Row:
    with driver.read() as tx:
        row = tx.job(job_id)
    assert row is not None, f"job {job_id} vanished"
    return row


def status_of(driver: Driver, job_id: int) -> str:
    return str(job_row(driver, job_id)["status"])


def transitions(driver: Driver, job_id: int) -> list[tuple[str | None, str | None]]:
    return [(e["from_status"], e["to_status"]) for e in events(driver, job_id)]


def outputs(driver: Driver, job_id: int) -> list[Row]:
    with driver.read() as tx:
        return tx.outputs(job_id)


def snapshot(driver: Driver, job_id: int) -> tuple[Row, list[Row], list[Row], list[Row]]:
    """Everything the engine may write about a job: for 'changed nothing' checks."""
    with driver.read() as tx:
        return tx.job(job_id), tx.attempts(job_id), tx.events(job_id), tx.outputs(job_id)


def done(job_id: int, attempt: int, **kw: Any) -> AttemptResult:
    return AttemptResult(job_id=job_id, attempt=attempt, status="completed", **kw)


def failed(
    job_id: int, attempt: int, code: str, status: str = "failed", **kw: Any
) -> AttemptResult:
    return AttemptResult(job_id=job_id, attempt=attempt, status=status, code=code, **kw)


def thumb(version: str = "v1", output_type: str = "thumbnail") -> Output:
    return Output(
        output_type=output_type,
        mime_type="image/webp",
        profile_version=version,
        metadata={"width": 200},
        output_key="objects/1/thumb.webp",
        output_size_bytes=123,
    )


def claim_one(engine: Engine, worker: str = W1, queue: str = "bulk") -> tuple[int, int]:
    got = engine.claim(worker, [queue], 1)
    assert len(got) == 1, "expected exactly one ready job"
    return got[0].job_id, got[0].attempt


def force(driver: Driver, job_id: int, action: str, values: Row | None = None) -> None:
    """Apply ``action`` with the same guard the engine uses (sources from the table)."""
    full = {"status": states.target(action), **(values or {})}
    with driver.tx() as tx:
        assert tx.update_job(job_id, states.sources(action), full), (
            f"guarded {action} refused job {job_id}"
        )


def set_columns(driver: Driver, job_id: int, values: Row) -> None:
    """Change non-status columns (test set-up only, never a status)."""
    assert "status" not in values
    with driver.tx() as tx:
        assert tx.update_job(job_id, states.STATUSES, values)


def drive_to(engine: Engine, driver: Driver, status: str, worker: str = W1, **kw: Any) -> int:
    """A fresh job in ``status``, reached through real engine operations."""
    if status == "created":
        return new_job(engine, hold=True, **kw)
    if status == "queued":
        return new_job(engine, **kw)
    if status == "cancelled":
        job_id = new_job(engine, **kw)
        assert engine.cancel(job_id) == "cancelled"
        return job_id
    job_id = new_job(engine, **kw)
    got = engine.claim(worker, [kw.get("queue") or "bulk"], 1)
    assert [c.job_id for c in got] == [job_id]
    attempt = got[0].attempt
    if status == "claimed":
        return job_id
    assert engine.start(worker, [(job_id, attempt)]) == {job_id}
    if status == "processing":
        pass
    elif status == "cancel_requested":
        assert engine.cancel(job_id) == "cancel_requested"
    elif status == "paused":
        force(driver, job_id, "pause", {"visibility_timeout": None})
    elif status == "retry_wait":
        assert engine.settle(worker, [failed(job_id, attempt, "CRASHED")]) == {job_id}
    elif status == "completed":
        assert engine.settle(worker, [done(job_id, attempt)]) == {job_id}
    elif status == "failed":
        assert engine.settle(worker, [failed(job_id, attempt, "CORRUPT_INPUT")]) == {job_id}
    else:  # pragma: no cover - a new status needs a recipe here
        raise AssertionError(f"no recipe for {status}")
    assert status_of(driver, job_id) == status
    return job_id


def past(engine: Engine, seconds: float = 1.0) -> Any:
    return engine.clock() - timedelta(seconds=seconds)


def race(database_url: str, n: int, fn: Callable[[Driver, int], Any]) -> list[Any]:
    """Run ``fn(driver, i)`` in ``n`` threads released together, each with its own pool.

    Returns each call's result, or the exception it raised.
    """
    drivers = [Driver(database_url) for _ in range(n)]
    barrier = threading.Barrier(n)
    got: list[Any] = [None] * n

    def run(i: int) -> None:
        barrier.wait()
        try:
            got[i] = fn(drivers[i], i)
        except Exception as exc:  # the caller asserts on it
            got[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for d in drivers:
        d.dispose()
    return got

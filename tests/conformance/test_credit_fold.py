"""The leader's credit fold on every database: finished jobs' credits move into
project_credits.settled_credits and out of the rows a budget check sums, and a
project's credit use stays exact through folds, retries and retention."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa

from hypermedia.db.driver import Driver
from hypermedia.db.schema import processing_jobs as J
from hypermedia.errors import InvalidRequest
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import NewJob
from hypermedia.queue.profiles import Credits, Prices, Profiles
from hypermedia.scheduler import credits as fold_module
from hypermedia.scheduler.credits import CreditFold
from hypermedia.scheduler.maintenance import default_services
from hypermedia.scheduler.retention import JobRetention

from ._helpers import W1, claim_one, done, failed, race

DAY = 86400.0


def _project() -> str:
    return f"fold-{uuid.uuid4().hex[:10]}"


def _paid(engine: Engine, base: int) -> str:
    key = f"c-{uuid.uuid4().hex[:12]}"
    Profiles(engine).create(key, "debug.sleep", {}, credits=Prices(base, 0, 0, 0))
    return key


def _run(engine: Engine, project: str, key: str, outcome: str, actual: int | None = None) -> int:
    """One job of ``project`` taken to ``outcome``: completed, failed or queued."""
    job_id = engine.enqueue(NewJob("debug.sleep", profile=key, project_id=project))
    if outcome == "queued":
        return job_id
    got, attempt = claim_one(engine)
    assert got == job_id
    result = (
        done(got, attempt, actual_credits=actual)
        if outcome == "completed"
        else failed(got, attempt, "CORRUPT_INPUT")
    )
    assert engine.settle(W1, [result]) == {job_id}
    return job_id


def _folded(driver: Driver, job_ids: list[int]) -> dict[int, bool]:
    with driver.read() as tx:
        q = sa.select(J.c.job_id, J.c.credits_folded).where(J.c.job_id.in_(job_ids))
        return {r[0]: bool(r[1]) for r in tx.conn.execute(q)}


def _settled(driver: Driver, project: str) -> int:
    with driver.read() as tx:
        row = tx.budget(project)
    return int(row["settled_credits"]) if row else 0


def _used(engine: Engine, project: str) -> int:
    return int(Credits(engine).show(project)[0]["used"])


def test_a_fold_moves_finished_jobs_credits_and_keeps_the_use(engine, driver) -> None:
    project, key = _project(), _paid(engine, 4)
    Credits(engine).set_budget(project, 100)
    a = _run(engine, project, key, "completed", actual=1)
    b = _run(engine, project, key, "completed")  # no actual credits: its estimate, 4
    c = _run(engine, project, key, "failed")
    d = _run(engine, project, key, "queued")
    before = _used(engine, project)
    assert before == 1 + 4 + 0 + 4

    assert CreditFold(engine).run_once() == 3
    assert _folded(driver, [a, b, c, d]) == {a: True, b: True, c: True, d: False}
    assert "credits_folded" not in engine.get(a)  # bookkeeping, not part of a job
    assert _settled(driver, project) == 5
    assert _used(engine, project) == before
    assert Credits(engine).show()[0]["used"] == before  # the report of every project too
    # Nothing more to fold; the queued job folds once it has finished.
    assert CreditFold(engine).run_once() == 0
    got, attempt = claim_one(engine)
    assert engine.settle(W1, [done(got, attempt, actual_credits=2)]) == {d}
    assert CreditFold(engine).run_once() == 1
    assert (_settled(driver, project), _used(engine, project)) == (7, 7)


def test_budgets_hold_after_a_fold(engine) -> None:
    project, key = _project(), _paid(engine, 4)
    Credits(engine).set_budget(project, 10)
    _run(engine, project, key, "completed")
    _run(engine, project, key, "completed")
    CreditFold(engine).run_once()
    with pytest.raises(InvalidRequest, match="credit budget exceeded: 8 of 10 used"):
        engine.enqueue(NewJob("debug.sleep", profile=key, project_id=project))


def test_a_retried_job_counts_again_after_its_fold(engine, driver) -> None:
    project, key = _project(), _paid(engine, 3)
    Credits(engine).set_budget(project, 100)
    job_id = _run(engine, project, key, "failed")
    assert CreditFold(engine).run_once() == 1
    assert _used(engine, project) == 0
    engine.retry(job_id)
    assert _folded(driver, [job_id]) == {job_id: False}
    assert _used(engine, project) == 3  # live again: it holds its estimate
    got, attempt = claim_one(engine)
    assert engine.settle(W1, [done(got, attempt, actual_credits=2)]) == {job_id}
    assert CreditFold(engine).run_once() == 1
    assert (_settled(driver, project), _used(engine, project)) == (2, 2)


def test_retention_after_a_fold_counts_nothing_twice(engine, clock) -> None:
    project, key = _project(), _paid(engine, 5)
    Credits(engine).set_budget(project, 100)
    _run(engine, project, key, "completed")
    assert CreditFold(engine).run_once() == 1
    _run(engine, project, key, "completed")  # not folded when retention deletes it
    assert _used(engine, project) == 10
    clock.advance(31 * DAY)
    assert JobRetention(engine).run_once() == 2
    assert _used(engine, project) == 10


def test_only_projects_with_a_budget_are_folded(engine, driver) -> None:
    free, capped, key = _project(), _project(), _paid(engine, 2)
    a = _run(engine, free, key, "completed")
    b = _run(engine, capped, key, "completed")
    Credits(engine).set_budget(capped, 50)
    assert CreditFold(engine).run_once() == 1
    assert _folded(driver, [a, b]) == {a: False, b: True}
    assert (_used(engine, free), _used(engine, capped)) == (2, 2)


def test_many_batches_and_the_leaders_budget(engine, driver, monkeypatch) -> None:
    monkeypatch.setattr(fold_module, "BATCH", 3)
    project, key = _project(), _paid(engine, 1)
    Credits(engine).set_budget(project, 100)
    for _ in range(7):
        _run(engine, project, key, "completed")
    assert CreditFold(engine).run_once() == 7
    assert (_settled(driver, project), _used(engine, project)) == (7, 7)

    for _ in range(4):
        _run(engine, project, key, "completed")
    fold = {s.name: s for s in default_services(engine)}["credit-fold"]
    assert isinstance(fold, CreditFold)
    assert fold.period == engine.settings.fold_interval_seconds
    fold.backlog.budget_seconds = 0.0  # spent before the first batch
    assert fold.run_once() == 0 and fold.period < engine.settings.fold_interval_seconds
    fold.backlog.budget_seconds = None
    assert fold.run_once() == 4 and fold.period == engine.settings.fold_interval_seconds
    assert _used(engine, project) == 11


def test_a_fold_racing_enqueues_never_lets_the_budget_overrun(
    engine, database_url, settings, clock
) -> None:
    """A fold commits between an enqueue's two reads of the credit use only if
    it could take the project's row: it cannot while the enqueue holds it."""
    project, key = _project(), _paid(engine, 3)
    Credits(engine).set_budget(project, 30)
    for _ in range(5):
        _run(engine, project, key, "completed")  # 15 used, none folded

    def work(drv: Driver, i: int) -> object:
        other = Engine(drv, settings, clock=clock)
        if i == 0:
            return CreditFold(other).run_once()
        return other.enqueue(NewJob("debug.sleep", profile=key, project_id=project))

    got = race(database_url, 9, work)
    assert got[0] == 5, got
    made = [g for g in got[1:] if isinstance(g, int)]
    refused = [g for g in got[1:] if isinstance(g, InvalidRequest)]
    assert (len(made), len(refused)) == (5, 3), got
    assert _used(engine, project) == 30


def test_a_retry_past_the_budget_is_refused_and_changes_nothing(engine, driver) -> None:
    project, key = _project(), _paid(engine, 4)
    Credits(engine).set_budget(project, 12)
    _run(engine, project, key, "completed")
    _run(engine, project, key, "completed")
    job_id = _run(engine, project, key, "failed")
    CreditFold(engine).run_once()
    Credits(engine).set_budget(project, 10)
    with pytest.raises(InvalidRequest, match="credit budget exceeded: 8 of 10 used"):
        engine.retry(job_id)
    assert engine.get(job_id)["status"] == "failed"
    assert _folded(driver, [job_id]) == {job_id: True}
    Credits(engine).set_budget(project, 12)
    engine.retry(job_id)
    assert engine.get(job_id)["status"] == "queued" and _used(engine, project) == 12

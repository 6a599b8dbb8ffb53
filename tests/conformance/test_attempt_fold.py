"""The leader's attempt fold on every database: finished attempts' durations
move into pruned_attempt_durations by id, /metrics' histogram stays the same
across every fold and prune, and a scrape reads only the attempts past the
watermark."""

from __future__ import annotations

from datetime import timedelta

from hypermedia.queue import durations
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import AttemptResult, NewJob
from hypermedia.queue.queues import Queues
from hypermedia.scheduler.attempt_fold import SETTLE, AttemptFold
from hypermedia.scheduler.maintenance import default_services
from hypermedia.scheduler.retention import JobRetention

W = "w-fold"


def _run(engine: Engine, ms: int, job_type: str = "debug.noop", ok: bool = True) -> int:
    job_id = engine.enqueue(NewJob(job_type, {}))
    (c,) = engine.claim(W, ["bulk"], 1)
    engine.start(W, [(job_id, c.attempt)])
    status, code = ("completed", None) if ok else ("failed", "CORRUPT_INPUT")
    assert engine.settle(W, [AttemptResult(job_id, c.attempt, status, code, duration_ms=ms)])
    return job_id


def _histogram(engine: Engine) -> dict[str, dict]:
    rows = Queues(engine).figures(durations.BOUNDS_MS)["durations"]
    return {r["job_type"]: r for r in rows}


def _watermark(engine: Engine) -> int:
    with engine.db.read() as tx:
        return int(tx.attempt_fold()["watermark"])


def _newest_attempt(engine: Engine) -> int:
    with engine.db.read() as tx:
        return tx.attempt_ids()[0]


def _settle(engine: Engine, clock) -> int:  # type: ignore[no-untyped-def]
    """Two runs a minute apart: the first notes the newest id (folding to
    what an earlier run noted), the second folds to it."""
    fold, moved = AttemptFold(engine), 0
    for _ in range(2):
        clock.advance(SETTLE.total_seconds() + 1)
        moved += fold.run_once()
    return moved


def test_a_fold_keeps_the_histogram_and_moves_the_watermark(engine, clock) -> None:
    for ms in (3, 200, 700_000):
        _run(engine, ms)
    _run(engine, 40, "debug.sleep", ok=False)
    before = _histogram(engine)
    assert before["debug.noop"]["count"] == 3 and before["debug.sleep"]["count"] == 1

    assert _settle(engine, clock) > 0
    assert _watermark(engine) == _newest_attempt(engine)
    assert _histogram(engine) == before
    with engine.db.read() as tx:  # the scrape's live part is empty now
        assert tx.attempt_duration_histogram(durations.BOUNDS_MS, after=_watermark(engine)) == []

    _run(engine, 3)  # new attempts count live until the next fold
    after = _histogram(engine)
    assert after["debug.noop"]["count"] == 4 and after["debug.noop"]["le_0"] == 2
    assert _settle(engine, clock) > 0
    assert _histogram(engine) == after


def test_ids_younger_than_a_minute_are_not_folded(engine, clock) -> None:
    _run(engine, 5)
    fold = AttemptFold(engine)
    assert fold.run_once() == 0  # notes the newest id
    clock.advance(SETTLE.total_seconds() - 5)
    _run(engine, 5)
    assert fold.run_once() == 0 and _watermark(engine) == 0
    clock.advance(10)
    fold.run_once()
    assert 0 < _watermark(engine) < _newest_attempt(engine)  # the first only
    assert _histogram(engine)["debug.noop"]["count"] == 2


def test_a_running_attempt_holds_the_watermark_back(engine, clock) -> None:
    _run(engine, 5)
    engine.enqueue(NewJob("debug.noop", {}))
    (running,) = engine.claim(W, ["bulk"], 1)
    _run(engine, 7)
    _settle(engine, clock)
    with engine.db.read() as tx:
        newest, oldest_running = tx.attempt_ids()
    assert oldest_running is not None
    assert _watermark(engine) == oldest_running - 1 < newest
    before = _histogram(engine)
    assert before["debug.noop"]["count"] == 2
    result = AttemptResult(running.job_id, running.attempt, "completed", duration_ms=9)
    assert engine.settle(W, [result])
    assert _histogram(engine)["debug.noop"]["count"] == 3
    clock.advance(SETTLE.total_seconds() + 1)
    AttemptFold(engine).run_once()
    assert _watermark(engine) == newest
    assert _histogram(engine)["debug.noop"]["count"] == 3


def test_retention_after_a_fold_counts_nothing_twice(engine, clock) -> None:
    _run(engine, 3)
    _run(engine, 200)
    _settle(engine, clock)
    _run(engine, 3)  # past the watermark when retention deletes it
    before = _histogram(engine)
    assert before["debug.noop"]["count"] == 3
    clock.advance(31 * 86400)
    assert JobRetention(engine).run_once() == 3
    assert _histogram(engine) == before
    assert _settle(engine, clock) == 0 or _histogram(engine) == before
    assert _histogram(engine) == before


def test_many_steps_and_the_leader(engine, clock, monkeypatch) -> None:
    from hypermedia.scheduler import attempt_fold

    monkeypatch.setattr(attempt_fold, "STEP", 2)
    for ms in (1, 2, 3, 4, 5):
        _run(engine, ms)
    before = _histogram(engine)
    _settle(engine, clock)
    assert _watermark(engine) == _newest_attempt(engine)
    assert _histogram(engine) == before
    fold = {s.name: s for s in default_services(engine)}["attempt-fold"]
    assert isinstance(fold, AttemptFold)
    assert fold.period == engine.settings.fold_interval_seconds
    assert fold.backlog.budget_seconds is not None
    clock.advance(timedelta(minutes=5).total_seconds())
    assert fold.run_once() == 0  # nothing new


def test_attempts_after_everything_was_pruned_still_count(engine, clock) -> None:
    """SQLite reuses the ids of deleted newest rows: the watermark comes down
    with them, or the next attempts would hide behind it."""
    for ms in (3, 4, 5):
        _run(engine, ms)
    _settle(engine, clock)
    assert _watermark(engine) == _newest_attempt(engine) > 0
    clock.advance(31 * 86400)
    assert JobRetention(engine).run_once() == 3
    before = _histogram(engine)
    assert before["debug.noop"]["count"] == 3  # from the pruned table alone
    _run(engine, 6)
    assert _histogram(engine)["debug.noop"]["count"] == 4
    _settle(engine, clock)
    assert _histogram(engine)["debug.noop"]["count"] == 4

"""The flusher's batching: when starts are written, folded or kept.

The engine here only records what it is asked to write (the flusher's own
logic is under test; the writes themselves are tested against every database
in tests/conformance).
"""

from __future__ import annotations

import itertools
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from hypermedia.queue.models import AttemptResult, Claimed
from hypermedia.worker import flusher
from hypermedia.worker.flusher import PROGRESS_DELAY, START_DELAY, Flusher


class Recorder:
    def __init__(self, fail: int = 0, refuse: Any = None) -> None:
        self.calls: list[tuple[float, list[tuple[int, int]], list[int]]] = []
        self.fail = fail
        # Called with each batch's starts and results: an exception it raises
        # is the database refusing that batch (as it would every time).
        self.refuse = refuse
        self.written: list[AttemptResult] = []
        self.wrote = threading.Event()
        self.claims: list[tuple[list[str], int, list[int]]] = []
        self.held: list[Any] = []
        self.progress: list[tuple[float, dict[Any, Any]]] = []
        self.db = SimpleNamespace(autocommit=True)  # held views are built for PostgreSQL

    def flush(self, worker_id: str, starts: Any, results: Any, held: Any = None) -> set[int]:
        if self.fail:
            self.fail -= 1
            raise ConnectionError("database away")
        if self.refuse is not None:
            self.refuse(list(starts), list(results))
        self.written.extend(results)
        self.calls.append((time.monotonic(), list(starts), [r.job_id for r in results]))
        self.held.append(held)
        self.wrote.set()
        return {r.job_id for r in results}

    def report_progress(self, worker_id: str, reports: Any) -> int:
        self.progress.append((time.monotonic(), dict(reports)))
        return len(reports)

    def flush_and_claim(
        self,
        worker_id: str,
        starts: Any,
        results: Any,
        queues: list[str],
        n: int,
        held: Any = None,
        only: Any = None,
    ) -> tuple[set[int], list[Any]]:
        accepted = self.flush(worker_id, starts, results, held)
        self.claims.append((list(queues), n, [r.job_id for r in results]))
        return accepted, [f"job-{i}" for i in range(n)]


def _flusher(
    engine: Recorder, gather: int | None = None, held: Any = None, lookup: Any = None
) -> Flusher:
    f = Flusher(engine, "w1", gather=gather, held=held, lookup=lookup)  # type: ignore[arg-type]
    f.start()
    return f


def test_a_start_followed_soon_by_its_result_is_never_written_alone() -> None:
    engine = Recorder()
    f = _flusher(engine)
    f.started(1, 1)
    time.sleep(START_DELAY / 4)
    f.finished(AttemptResult(1, 1, "completed"))
    assert engine.wrote.wait(5)
    assert f.close(5)
    assert [(s, r) for _, s, r in engine.calls] == [([], [1])]


def test_a_long_attempt_has_its_start_written_after_the_delay() -> None:
    engine = Recorder()
    f = _flusher(engine)
    t0 = time.monotonic()
    f.started(2, 1)
    assert engine.wrote.wait(5)
    when, starts, results = engine.calls[0]
    assert (starts, results) == ([(2, 1)], [])
    assert START_DELAY <= when - t0 < START_DELAY + 1.0
    assert f.close(5)


def test_progress_writes_its_start_at_once() -> None:
    engine = Recorder()
    f = _flusher(engine)
    t0 = time.monotonic()
    f.started(3, 1)
    f.progress(3, 1, {"percent": 10})
    assert engine.wrote.wait(5)
    when, starts, _ = engine.calls[0]
    assert starts == [(3, 1)] and when - t0 < START_DELAY
    assert f.close(5)


def test_progress_is_written_at_most_every_delay_and_the_newest_wins() -> None:
    engine = Recorder()
    f = _flusher(engine)
    f.started(4, 1)
    t0 = time.monotonic()
    sent = 0
    while time.monotonic() - t0 < 2.5 * PROGRESS_DELAY:
        sent += 1
        f.progress(4, 1, {"percent": sent})
        time.sleep(PROGRESS_DELAY / 25)
    time.sleep(PROGRESS_DELAY * 1.5)  # the last report is still written, late
    assert f.close(5)
    written = [(t, r[(4, 1)]["percent"]) for t, r in engine.progress]
    assert sent > 40 and 2 <= len(written) <= 4, (sent, written)
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(written)]
    assert min(gaps) >= PROGRESS_DELAY * 0.95, gaps
    assert [p for _, p in written] == sorted(p for _, p in written)
    assert written[-1][1] == sent


def test_waiting_progress_rides_along_with_a_result() -> None:
    engine = Recorder()
    f = _flusher(engine)
    f.progress(5, 1, {"percent": 10})
    f.progress(6, 1, {"percent": 20})
    deadline = time.monotonic() + 5
    while not engine.progress and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.progress, "the first report was not written at once"
    t0 = time.monotonic()
    f.progress(6, 1, {"percent": 90})  # not due for PROGRESS_DELAY on its own
    f.finished(AttemptResult(5, 1, "completed"))
    assert engine.wrote.wait(5)
    assert f.close(5)
    last_when, last = engine.progress[-1]
    assert last == {(6, 1): {"percent": 90}}
    assert last_when - t0 < PROGRESS_DELAY / 2


def test_closing_writes_waiting_starts_and_a_failed_write_is_retried() -> None:
    engine = Recorder(fail=1)
    f = _flusher(engine)
    f.started(4, 1)
    f.started(5, 1)
    assert f.close(10)
    assert sorted(s for _, starts, _ in engine.calls for s in starts) == [(4, 1), (5, 1)]
    assert f.idle()


def _in_a_stream(
    monkeypatch: pytest.MonkeyPatch, delay: float, held: Any = None
) -> tuple[Recorder, Flusher]:
    """A gathering flusher (RESULT_DELAY = ``delay``) that has written one
    result, so that the next ones come in a stream."""
    monkeypatch.setattr(flusher, "RESULT_DELAY", delay)
    engine = Recorder()
    f = _flusher(engine, gather=10, held=held)
    f.finished(AttemptResult(1, 1, "completed"))
    assert engine.wrote.wait(5)
    engine.calls.clear()
    engine.wrote.clear()
    return engine, f


def test_a_claim_rides_in_the_transaction_of_waiting_results(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine, f = _in_a_stream(monkeypatch, 1.0)
    f.finished(AttemptResult(5, 1, "completed"))
    f.finished(AttemptResult(6, 1, "completed"))
    # Fewer than a batch: they wait for the claim (up to RESULT_DELAY).
    assert f.claim(["bulk"], 3) == ["job-0", "job-1", "job-2"]
    assert engine.claims == [(["bulk"], 3, [5, 6])]
    assert [r for _, _, r in engine.calls] == [[5, 6]]
    assert f.close(5)


def test_results_in_a_stream_are_written_alone_after_the_delay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine, f = _in_a_stream(monkeypatch, 0.3)
    t0 = time.monotonic()
    f.finished(AttemptResult(7, 1, "completed"))
    assert engine.wrote.wait(5)
    when, _, results = engine.calls[0]
    assert results == [7] and engine.claims == []
    assert 0.3 <= when - t0 < 0.3 + 1.0
    assert f.close(5)


def test_a_result_that_comes_alone_is_written_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # An attempt longer than the delay: holding its result would only make
    # its job end later.
    monkeypatch.setattr(flusher, "RESULT_DELAY", 5.0)
    engine = Recorder()
    f = _flusher(engine, gather=10)
    t0 = time.monotonic()
    f.finished(AttemptResult(9, 1, "completed"))
    assert engine.wrote.wait(4)
    assert engine.calls[0][2] == [9] and engine.calls[0][0] - t0 < 4
    assert f.close(5)


def test_the_last_result_of_a_stream_goes_at_once_when_no_other_job_is_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    held = [5]
    engine, f = _in_a_stream(monkeypatch, 5.0, held=lambda: held[0])
    f.finished(AttemptResult(7, 1, "completed"))
    time.sleep(0.1)
    assert engine.calls == []  # other jobs held: it waits for their results
    held[0] = 2
    t0 = time.monotonic()
    f.finished(AttemptResult(8, 1, "completed"))  # the two results are all there is
    assert engine.wrote.wait(4)
    when, _, results = engine.calls[0]
    assert results == [7, 8] and when - t0 < 1.0
    assert f.close(5)


def test_a_failed_claim_raises_to_the_claimer_and_keeps_the_results(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine, f = _in_a_stream(monkeypatch, 1.0)
    engine.fail = 1
    f.finished(AttemptResult(8, 1, "completed"))
    with pytest.raises(ConnectionError):
        f.claim(["bulk"], 2)
    assert engine.wrote.wait(5)  # the retry wrote the result on its own
    assert [r for _, _, r in engine.calls] == [[8]]
    assert f.close(5)
    assert f.claim(["bulk"], 2) == []  # closed: nothing more is claimed


def _claimed(job_id: int, attempt: int = 1) -> Claimed:
    return Claimed(job_id, f"u{job_id}", "debug.noop", "bulk", 5, {}, attempt, 3, 60, None, 7, "p")


def test_results_carry_the_held_view_of_their_jobs() -> None:
    """What the worker holds (lookup) and which starts were written: the view
    a completion is decided from without a read."""
    engine = Recorder()
    jobs = {1: _claimed(1), 2: _claimed(2), 3: _claimed(3, attempt=2)}
    f = _flusher(engine, lookup=jobs.get)
    f.started(1, 1)
    deadline = time.monotonic() + 5
    while not any(c[1] for c in engine.calls) and time.monotonic() < deadline:
        time.sleep(0.01)  # job 1's start is written alone, after START_DELAY
    engine.wrote.clear()
    for r in (AttemptResult(1, 1, "completed"), AttemptResult(2, 1, "completed")):
        f.finished(r)
    f.finished(AttemptResult(3, 1, "failed", "INTERNAL"))  # not the held attempt
    f.finished(AttemptResult(4, 1, "completed"))  # not held at all
    assert f.close(5)
    views: dict[int, Any] = {}
    for h in engine.held:
        views.update(h or {})
    assert views[1]["status"] == "processing" and views[2]["status"] == "claimed"
    assert (views[1]["attempt_count"], views[1]["profile_id"], views[1]["claimed_by"]) == (
        1,
        7,
        "w1",
    )
    assert 3 not in views and 4 not in views


def _refusing(*job_ids: int, code: str | None = None) -> Any:
    """A database that refuses any batch holding one of these jobs (and, with
    ``code``, only results of theirs with another code)."""

    def refuse(starts: list[tuple[int, int]], results: list[AttemptResult]) -> None:
        for j, _ in starts:
            if j in job_ids and code is None:
                raise ValueError(f"start of {j}")
        for r in results:
            if r.job_id in job_ids and (code is None or r.code != code):
                raise ValueError(f"result of {r.job_id}")

    return refuse


def test_a_result_the_database_refuses_becomes_a_failure_and_holds_up_nothing() -> None:
    engine = Recorder(refuse=_refusing(2, code="INTERNAL"))
    seen: list[tuple[int, str, bool]] = []
    f = Flusher(engine, "w1", lambda r, ok: seen.append((r.job_id, r.status, ok)))  # type: ignore[arg-type]
    f.start()
    f.finished(AttemptResult(1, 1, "completed"))
    f.finished(AttemptResult(2, 1, "completed", result={"text": "a"}, duration_ms=7))
    f.finished(AttemptResult(3, 1, "completed"))
    assert f.close(5)
    assert sorted(seen) == [(1, "completed", True), (2, "failed", True), (3, "completed", True)]
    (failed,) = [r for r in engine.written if r.job_id == 2]
    assert (failed.code, failed.result, failed.duration_ms) == ("INTERNAL", None, 7)
    assert "could not be recorded" in failed.message


def test_a_result_refused_even_as_a_failure_is_dropped_and_the_rest_written() -> None:
    engine = Recorder(refuse=_refusing(2))
    seen: list[tuple[int, bool]] = []
    f = Flusher(engine, "w1", lambda r, ok: seen.append((r.job_id, ok)))  # type: ignore[arg-type]
    f.start()
    f.started(2, 1)  # refused too: dropped, not retried for ever
    f.progress(2, 1, {"percent": 5})
    for j in (1, 2, 3):
        f.finished(AttemptResult(j, 1, "completed"))
    assert f.close(5)
    assert sorted(seen) == [(1, True), (2, False), (3, True)]
    assert sorted(r.job_id for r in engine.written) == [1, 3]


def test_the_database_going_away_while_a_batch_is_isolated_keeps_what_is_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(flusher.time, "sleep", lambda s: None)
    engine = Recorder(refuse=_refusing(1, code="INTERNAL"))
    calls = {"n": 0}
    refuse = engine.refuse

    def away_once(starts: Any, results: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 3:  # the batch, job 1 alone, then away for job 1's failure
            raise ConnectionError("database away")
        refuse(starts, results)

    engine.refuse = away_once
    seen: list[tuple[int, bool]] = []
    f = Flusher(engine, "w1", lambda r, ok: seen.append((r.job_id, ok)))  # type: ignore[arg-type]
    f.start()
    f.finished(AttemptResult(1, 1, "completed"))
    f.finished(AttemptResult(2, 1, "completed"))
    f.finished(AttemptResult(3, 1, "completed"))
    assert f.close(5)
    assert sorted(seen) == [(1, True), (2, True), (3, True)]
    assert sorted((r.job_id, r.status) for r in engine.written) == [
        (1, "failed"),
        (2, "completed"),
        (3, "completed"),
    ]

"""Settling attempts: fencing, results, retries and backoff, cancel, explicit retry."""

from __future__ import annotations

from datetime import timedelta

import pytest

from hypermedia.errors import ERROR_POLICY
from hypermedia.queue import states
from hypermedia.queue.backoff import retry_delay
from hypermedia.queue.engine import Engine, held_row
from hypermedia.queue.models import AttemptResult, Output
from hypermedia.queue.settle import IMPLIED_CODE

from ._helpers import (
    W1,
    attempts,
    claim_one,
    done,
    drive_to,
    events,
    failed,
    job_row,
    new_job,
    outputs,
    snapshot,
    status_of,
    thumb,
    transitions,
)

RETRYABLE = sorted(c for c, p in ERROR_POLICY.items() if p.retryable)
PERMANENT = sorted(c for c, p in ERROR_POLICY.items() if not p.retryable)
US = timedelta(microseconds=1)  # rounding slack of stored timestamps


def _running(engine: Engine, worker: str = W1, **kw) -> tuple[int, int]:
    job_id = new_job(engine, **kw)
    job_id_, attempt = claim_one(engine, worker)
    assert job_id_ == job_id
    assert engine.start(worker, [(job_id, attempt)]) == {job_id}
    return job_id, attempt


# -- fencing ---------------------------------------------------------------------


def test_completion_from_another_worker_is_dropped(engine, driver):
    job_id, a = _running(engine)
    before = snapshot(driver, job_id)
    assert engine.settle("w2", [done(job_id, a, outputs=[thumb()])]) == set()
    assert engine.flush("w2", [], [failed(job_id, a, "CORRUPT_INPUT")]) == set()
    assert snapshot(driver, job_id) == before


def test_result_for_an_old_attempt_is_dropped(engine, driver):
    job_id, a = _running(engine)
    before = snapshot(driver, job_id)
    for stale in (a - 1, a + 1):
        assert engine.settle(W1, [done(job_id, stale)]) == set()
    assert snapshot(driver, job_id) == before


def test_start_is_fenced(engine, driver):
    job_id = new_job(engine)
    _, a = claim_one(engine)
    before = snapshot(driver, job_id)
    assert engine.start("w2", [(job_id, a)]) == set()
    assert engine.start(W1, [(job_id, a + 1)]) == set()
    assert engine.flush("w2", [(job_id, a)], []) == set()
    assert snapshot(driver, job_id) == before
    assert engine.start(W1, [(job_id, a)]) == {job_id}
    assert status_of(driver, job_id) == "processing"


def test_flush_starts_and_settles_in_one_go(engine, driver):
    j1 = new_job(engine)
    j2 = new_job(engine)
    c = engine.claim(W1, ["bulk"], 2)
    assert [x.job_id for x in c] == [j1, j2]
    accepted = engine.flush(W1, [(j1, 1), (j2, 1)], [done(j1, 1)])
    assert accepted == {j1}
    assert status_of(driver, j1) == "completed" and status_of(driver, j2) == "processing"
    assert transitions(driver, j1)[-2:] == [("claimed", "processing"), ("processing", "completed")]


def test_a_batch_with_one_stale_result_settles_the_others(engine, driver):
    j1, a1 = _running(engine)
    j2, a2 = _running(engine)
    accepted = engine.settle(W1, [done(j1, a1), done(j2, a2 + 5)])
    assert accepted == {j1}
    assert status_of(driver, j2) == "processing"


def test_a_batch_of_results_settles_together(engine, driver):
    """One flush carries many results of every kind (grouped into executemany updates)."""
    jobs = [_running(engine, max_attempts=3) for _ in range(9)]
    engine.cancel(jobs[8][0])
    (j0, a0), (j1, a1), (j2, a2), (j3, a3), (j4, a4), (j5, a5), (j6, a6), (j7, a7), (j8, a8) = jobs
    results = [
        done(j0, a0),
        done(j1, a1, outputs=[thumb()]),
        done(j2, a2, actual_credits=3),
        failed(j3, a3, "CRASHED"),
        failed(j4, a4, "TIMEOUT", status="timeout"),
        failed(j5, a5, "CORRUPT_INPUT"),
        failed(j6, a6, "UNSUPPORTED_FORMAT"),
        failed(j7, a7, "OOM"),
        failed(j8, a8, "CRASHED"),
    ]
    assert engine.flush(W1, [], results) == {j for j, _ in jobs}
    expected = ["completed"] * 3 + ["retry_wait"] * 2 + ["failed"] * 2 + ["retry_wait", "cancelled"]
    assert [status_of(driver, j) for j, _ in jobs] == expected
    assert [attempts(driver, j)[0]["status"] for j, _ in jobs] == [
        "completed",
        "completed",
        "completed",
        "failed",
        "timeout",
        "failed",
        "failed",
        "failed",
        "failed",
    ]
    assert job_row(driver, j2)["actual_credits"] == 3
    assert len(outputs(driver, j1)) == 1
    assert all(
        len([e for e in events(driver, j) if e["from_status"] == "processing"]) == 1
        for j, _ in jobs[:8]
    )


@pytest.mark.parametrize("stale_first", [True, False])
def test_stale_and_current_results_for_one_job_in_one_batch(
    engine, driver, settings, clock, stale_first
):
    """The same worker lost attempt 1 (reaped) and re-claimed attempt 2; both report at once."""
    job_id, a1 = _running(engine)
    clock.advance(settings.lease_seconds + 1)
    engine.reap()
    clock.advance(settings.backoff_max_seconds + 1)
    engine.promote()
    _, a2 = claim_one(engine)
    stale, current = failed(job_id, a1, "CORRUPT_INPUT"), done(job_id, a2)
    batch = [stale, current] if stale_first else [current, stale]
    assert engine.renew(W1, [(job_id, a2), (job_id, a1)][:: 1 if stale_first else -1]) == {
        job_id: "claimed"
    }
    assert engine.flush(W1, [(job_id, a2)], batch) == {job_id}
    row = engine.get(job_id)
    assert (row["status"], row["outcome"]) == ("completed", "completed")
    assert [(x["attempt_number"], x["status"]) for x in row["attempts"]] == [
        (1, "orphaned"),
        (2, "completed"),
    ]


def test_late_result_after_reap_and_reclaim_is_rejected(engine, driver, settings, clock):
    job_id, a1 = _running(engine, worker=W1)
    clock.advance(settings.lease_seconds + 1)
    assert engine.reap()["released_jobs"] == 1
    assert status_of(driver, job_id) == "retry_wait"
    clock.advance(settings.backoff_max_seconds + 1)
    assert engine.promote() == 1
    _, a2 = claim_one(engine, "w2")
    assert a2 == a1 + 1
    engine.start("w2", [(job_id, a2)])

    # w1 wakes up and reports its (now superseded) attempt, in every way it could.
    before = snapshot(driver, job_id)
    assert engine.settle(W1, [done(job_id, a1, outputs=[thumb()])]) == set()
    assert engine.settle(W1, [done(job_id, a2)]) == set()  # right number, wrong worker
    assert engine.renew(W1, [(job_id, a1)]) == {}
    assert snapshot(driver, job_id) == before

    assert engine.settle("w2", [done(job_id, a2, outputs=[thumb()])]) == {job_id}
    row = engine.get(job_id)
    assert row["status"] == "completed" and row["outcome"] == "completed"
    assert [(x["attempt_number"], x["worker_id"], x["status"]) for x in row["attempts"]] == [
        (1, W1, "orphaned"),
        (2, "w2", "completed"),
    ]
    assert len(row["outputs"]) == 1
    terminal = [e for e in row["events"] if e["to_status"] in states.TERMINAL]
    assert len(terminal) == 1
    # And a very late w1 report after the end changes nothing either.
    assert engine.settle(W1, [done(job_id, a1)]) == set()


def test_reaper_guard_ignores_results_for_another_holder(engine, driver):
    job_id, a = _running(engine)
    res = AttemptResult(
        job_id=job_id, attempt=a, status="orphaned", code="ORPHANED", worker_id="someone-else"
    )
    before = snapshot(driver, job_id)
    assert engine.settle(None, [res]) == set()
    assert snapshot(driver, job_id) == before


@pytest.mark.parametrize("flush", [False, True])
def test_a_retry_forgets_the_last_attempts_progress(engine, driver, flush):
    """A failed attempt's progress stays (where it stopped), but not while
    the job waits for its next attempt: the worker's batch path too."""
    waits, fails = _running(engine), _running(engine, max_attempts=1)
    for job_id, a in (waits, fails):
        assert engine.report_progress(W1, {(job_id, a): {"percent": 100, "step": "4/4"}}) == 1
    results = [failed(job_id, a, "CRASHED") for job_id, a in (waits, fails)]
    if flush:
        engine.flush(W1, [], results)
    else:
        engine.settle(W1, results)
    assert (status_of(driver, waits[0]), job_row(driver, waits[0])["progress"]) == (
        "retry_wait",
        None,
    )
    assert status_of(driver, fails[0]) == "failed"
    assert job_row(driver, fails[0])["progress"]["percent"] == 100.0
    # An explicit retry is a new attempt too: it showed the last one's 100 %
    # while queued and through the next attempt.
    engine.retry(fails[0])
    assert (status_of(driver, fails[0]), job_row(driver, fails[0])["progress"]) == ("queued", None)


def test_progress_reports_are_fenced_and_batched(engine, driver, clock):
    j1, a1 = _running(engine)
    j2, a2 = _running(engine)
    j3, a3 = _running(engine, worker="w2")
    before3 = snapshot(driver, j3)
    n = engine.report_progress(
        W1,
        {
            (j1, a1): {"percent": 40, "step": "decoding /srv/in/file.png"},
            (j2, a2): {"percent": None, "step": "probing"},
            (j3, a3): {"percent": 10},  # w2's job: not W1's to report
            (j1, a1 + 1): {"percent": 99},  # superseded attempt number
        },
    )
    assert n == 2
    p1, p2 = job_row(driver, j1)["progress"], job_row(driver, j2)["progress"]
    assert (p1["mode"], p1["percent"]) == ("determinate", 40.0)
    assert "/srv/in" not in p1["step"]
    assert (p2["mode"], p2["percent"], p2["step"]) == ("step", None, "probing")
    assert snapshot(driver, j3) == before3
    ev = events(driver, j1)[-1]
    assert (ev["kind"], ev["from_status"], ev["to_status"]) == ("progress", None, None)
    assert status_of(driver, j1) == "processing"
    # Nonsense percentages are ignored rather than stored.
    assert engine.report_progress(W1, {(j1, a1): {"percent": 250}}) == 0
    assert job_row(driver, j1)["progress"]["percent"] == 40.0


def test_progress_history_keeps_the_newest_fifty_and_every_state_change(engine, driver):
    from hypermedia.queue.engine import DIAGNOSTIC_HISTORY

    j1, a1 = _running(engine)
    j2, a2 = _running(engine)
    changes = [(e["from_status"], e["to_status"]) for e in events(driver, j1)]
    for i in range(1, DIAGNOSTIC_HISTORY + 12):
        reports = {(j1, a1): {"percent": i}}
        if i <= 3:
            reports[(j2, a2)] = {"percent": i}
        assert engine.report_progress(W1, reports) == len(reports)
    kept = [e for e in events(driver, j1) if e["kind"] == "progress"]
    assert len(kept) == DIAGNOSTIC_HISTORY
    assert [e["message"] for e in kept] == [f"{i}%" for i in range(12, DIAGNOSTIC_HISTORY + 12)]
    assert [
        (e["from_status"], e["to_status"]) for e in events(driver, j1) if e["kind"] == "event"
    ] == changes
    assert len([e for e in events(driver, j2) if e["kind"] == "progress"]) == 3


# -- completed results and outputs ------------------------------------------------------


def test_completion_records_result_credits_and_attempt_metrics(engine, driver, clock):
    job_id, a = _running(engine)
    clock.advance(3)
    res = done(
        job_id,
        a,
        result={"slept_ms": 3},
        actual_credits=4,
        duration_ms=3000,
        peak_memory_mb=50,
        cpu_time_ms=120,
        outputs=[thumb()],
    )
    assert engine.settle(W1, [res]) == {job_id}
    row = job_row(driver, job_id)
    assert row["status"] == "completed" and row["outcome"] == "completed"
    assert row["completed_at"] == clock.now and row["visibility_timeout"] is None
    assert row["result"] == {"slept_ms": 3} and row["actual_credits"] == 4
    assert row["error_code"] is None and row["category"] is None
    [att] = attempts(driver, job_id)
    assert (att["status"], att["duration_ms"], att["peak_memory_mb"], att["cpu_time_ms"]) == (
        "completed",
        3000,
        50,
        120,
    )
    assert att["finished_at"] == clock.now and att["error_code"] is None
    [out] = outputs(driver, job_id)
    assert (out["output_type"], out["mime_type"], out["profile_version"], out["metadata"]) == (
        "thumbnail",
        "image/webp",
        "v1",
        {"width": 200},
    )
    assert Engine.duration(job_row(driver, job_id)) == timedelta(seconds=3)


def test_same_output_reported_twice_is_stored_once(engine, driver):
    job_id, a = _running(engine)
    res = done(job_id, a, outputs=[thumb(), thumb(), thumb("v2"), thumb(output_type="preview")])
    assert engine.settle(W1, [res]) == {job_id}
    # The completion reported again (a retried flush) is fenced off.
    assert engine.settle(W1, [res]) == set()
    keys = sorted((o["output_type"], o["profile_version"]) for o in outputs(driver, job_id))
    assert keys == [("preview", "v1"), ("thumbnail", "v1"), ("thumbnail", "v2")]


def test_output_without_version_records_the_jobs_profile_version(engine, driver):
    job_id, a = _running(engine)
    out = Output(output_type="verdict", mime_type="application/json", metadata={"ok": True})
    assert engine.settle(W1, [done(job_id, a, outputs=[out])]) == {job_id}
    [row] = outputs(driver, job_id)
    assert row["profile_version"] == "debug-noop:v1"


def test_failed_attempt_leaves_no_outputs(engine, driver):
    job_id, a = _running(engine)
    res = AttemptResult(
        job_id=job_id, attempt=a, status="failed", code="CORRUPT_INPUT", outputs=[thumb()]
    )
    engine.settle(W1, [res])
    assert outputs(driver, job_id) == []


# -- retries ------------------------------------------------------------------------------


def _assert_backoff(row, now, attempt: int, settings, code: str) -> None:
    base = settings.backoff_base_seconds * ERROR_POLICY[code].backoff_factor
    step = min(settings.backoff_max_seconds, base * 2 ** (attempt - 1))
    delay = row["available_at"] - now
    assert timedelta(seconds=step / 2) - US <= delay <= timedelta(seconds=step) + US, delay
    # And the policy function agrees on those bounds.
    assert retry_delay(attempt, base, settings.backoff_max_seconds) <= step


def test_retryable_codes_wait_with_backoff(engine, driver, settings, clock):
    for code in RETRYABLE:
        job_id, a = _running(engine)
        res = failed(job_id, a, code, message=f"boom at /srv/data/{code}")
        assert engine.settle(W1, [res]) == {job_id}, code
        row = job_row(driver, job_id)
        pol = ERROR_POLICY[code]
        assert row["status"] == "retry_wait", code
        assert (row["error_code"], row["category"], row["retryable"]) == (code, pol.category, True)
        assert row["outcome"] is None and row["completed_at"] is None, code
        assert row["visibility_timeout"] is None, code
        assert "/srv/data" not in row["safe_reason"], code  # redacted
        _assert_backoff(row, clock.now, a, settings, code)
        [att] = attempts(driver, job_id)
        assert (att["status"], att["error_code"]) == ("failed", code)
        assert transitions(driver, job_id)[-1] == ("processing", "retry_wait"), code


def test_permanent_codes_fail_at_once(engine, driver, clock):
    for code in PERMANENT:
        job_id, a = _running(engine, max_attempts=5)
        assert engine.settle(W1, [failed(job_id, a, code)]) == {job_id}, code
        row = job_row(driver, job_id)
        pol = ERROR_POLICY[code]
        assert row["status"] == "failed" and row["attempt_count"] == 1, code
        assert (row["outcome"], row["category"], row["retryable"]) == (
            pol.outcome,
            pol.category,
            False,
        )
        assert row["completed_at"] == clock.now and row["error_code"] == code
        assert row["safe_reason"], code
        assert transitions(driver, job_id)[-1] == ("processing", "failed"), code


def test_permanent_codes_include_the_documented_ones():
    assert {"CORRUPT_INPUT", "UNSUPPORTED_FORMAT", "INPUT_TOO_LARGE", "LIMIT_EXCEEDED"} <= set(
        PERMANENT
    )
    assert {"CRASHED", "TIMEOUT", "STORAGE_UNAVAILABLE", "OOM"} <= set(RETRYABLE)


@pytest.mark.parametrize(("status", "code"), [("timeout", "TIMEOUT"), ("crashed", "CRASHED")])
def test_attempt_status_implies_a_code(engine, driver, status, code):
    job_id, a = _running(engine)
    engine.settle(W1, [AttemptResult(job_id=job_id, attempt=a, status=status)])
    row = job_row(driver, job_id)
    assert row["status"] == "retry_wait" and row["error_code"] == code
    assert attempts(driver, job_id)[0]["status"] == status


def test_unknown_code_is_retried_as_internal(engine, driver):
    job_id, a = _running(engine)
    engine.settle(W1, [failed(job_id, a, "SOMETHING_NEW")])
    row = job_row(driver, job_id)
    assert (row["status"], row["category"]) == ("retry_wait", "unknown")


def test_timeout_on_last_attempt_fails_with_outcome_timeout(engine, driver, clock):
    job_id, a = _running(engine, max_attempts=1)
    engine.settle(W1, [AttemptResult(job_id=job_id, attempt=a, status="timeout", code="TIMEOUT")])
    row = job_row(driver, job_id)
    assert (row["status"], row["outcome"], row["category"]) == ("failed", "timeout", "timeout")
    assert row["completed_at"] == clock.now


def test_a_job_that_times_out_twice_in_a_row_fails(engine, driver, clock):
    """The row keeps the previous attempt's code through retry_wait and the
    next claim; an explicit retry clears it, so it gets its retry again."""
    job_id = new_job(engine, max_attempts=5)
    for _ in (1, 2):
        _, a = claim_one(engine)
        engine.start(W1, [(job_id, a)])
        engine.settle(W1, [AttemptResult(job_id=job_id, attempt=a, status="timeout")])
        clock.advance(3600)
        engine.promote()
    row = job_row(driver, job_id)
    assert (row["status"], row["outcome"], row["attempt_count"]) == ("failed", "timeout", 2)
    engine.retry(job_id)
    _, a = claim_one(engine)
    engine.start(W1, [(job_id, a)])
    engine.settle(W1, [AttemptResult(job_id=job_id, attempt=a, status="timeout")])
    assert job_row(driver, job_id)["status"] == "retry_wait"


def test_retries_back_off_exponentially_until_attempts_run_out(engine, driver, settings, clock):
    job_id = new_job(engine, max_attempts=3)
    for n in (1, 2, 3):
        _, a = claim_one(engine)
        assert a == n
        engine.start(W1, [(job_id, a)])
        engine.settle(W1, [failed(job_id, a, "STORAGE_UNAVAILABLE")])
        row = job_row(driver, job_id)
        if n < 3:
            assert row["status"] == "retry_wait"
            _assert_backoff(row, clock.now, n, settings, "STORAGE_UNAVAILABLE")
            # Not due yet: promote leaves it, claim cannot see it.
            assert engine.promote() == 0
            assert engine.claim(W1, ["bulk"], 5) == []
            clock.advance((row["available_at"] - clock.now).total_seconds())
            assert engine.promote() == 1
    row = engine.get(job_id)
    assert (row["status"], row["outcome"], row["category"]) == ("failed", "failed", "storage")
    assert [x["attempt_number"] for x in row["attempts"]] == [1, 2, 3]
    assert row["attempt_count"] == row["max_attempts"] == 3


def test_oom_doubles_the_memory_limit(engine, driver, settings, clock):
    job_id = new_job(engine, max_attempts=3)
    limits = []
    for _ in range(2):
        _, a = claim_one(engine)
        limits.append(engine.get(job_id)["memory_limit_mb"])
        engine.settle(W1, [failed(job_id, a, "OOM")])
        clock.advance(60)
        engine.promote()
    [c] = engine.claim(W1, ["bulk"], 1)
    limits.append(c.memory_limit_mb)
    base = settings.child_memory_mb
    assert limits == [None, base * 2, base * 4]


def test_promote_moves_only_due_jobs(engine, driver, clock):
    due, a = _running(engine)
    engine.settle(W1, [failed(due, a, "CRASHED")])
    clock.advance(0.2)  # > backoff_max_seconds of the test settings
    later, b = _running(engine)
    engine.settle(W1, [failed(later, b, "CRASHED")])
    assert engine.promote() == 1
    assert status_of(driver, due) == "queued" and status_of(driver, later) == "retry_wait"
    assert transitions(driver, due)[-1] == ("retry_wait", "queued")
    assert transitions(driver, later)[-1] == ("processing", "retry_wait")
    assert [c.job_id for c in engine.claim("w2", ["bulk"], 5)] == [due]


def test_promote_respects_its_limit(engine, driver, clock):
    ids = []
    for _ in range(3):
        j, a = _running(engine)
        engine.settle(W1, [failed(j, a, "CRASHED")])
        ids.append(j)
    clock.advance(60)
    assert engine.promote(limit=2) == 2
    assert engine.promote(limit=2) == 1
    assert {status_of(driver, j) for j in ids} == {"queued"}


# -- explicit retry --------------------------------------------------------------------


def test_retry_of_failed_job_is_a_new_attempt(engine, driver, clock):
    job_id, a = _running(engine, max_attempts=3)
    engine.settle(W1, [failed(job_id, a, "CORRUPT_INPUT", message="bad header")])
    assert engine.can_retry(engine.get(job_id))
    clock.advance(10)
    engine.retry(job_id, actor="ops")
    row = job_row(driver, job_id)
    assert row["status"] == "queued" and row["max_attempts"] == 3
    for col in ("outcome", "category", "retryable", "error_code", "safe_reason", "completed_at"):
        assert row[col] is None, col
    assert row["available_at"] == clock.now
    _, a2 = claim_one(engine, "w2")
    assert a2 == 2
    engine.settle("w2", [done(job_id, a2)])
    got = engine.get(job_id)
    assert [(x["attempt_number"], x["status"]) for x in got["attempts"]] == [
        (1, "failed"),
        (2, "completed"),
    ]
    assert got["status"] == "completed"


def test_retry_raises_max_attempts_when_exhausted(engine, driver):
    job_id, a = _running(engine, max_attempts=1)
    engine.settle(W1, [failed(job_id, a, "CRASHED")])
    assert job_row(driver, job_id)["status"] == "failed"
    engine.retry(job_id)
    assert job_row(driver, job_id)["max_attempts"] == 2
    _, a2 = claim_one(engine)
    assert a2 == 2
    assert job_row(driver, job_id)["attempt_count"] <= job_row(driver, job_id)["max_attempts"]


def test_retry_of_cancelled_job(engine, driver):
    job_id, a = _running(engine)
    engine.cancel(job_id)
    engine.settle(W1, [AttemptResult(job_id=job_id, attempt=a, status="cancelled")])
    assert status_of(driver, job_id) == "cancelled"
    engine.retry(job_id)
    _, a2 = claim_one(engine)
    assert a2 == 2
    assert [x["status"] for x in attempts(driver, job_id)] == ["cancelled", "started"]


# -- cancel ----------------------------------------------------------------------------


@pytest.mark.parametrize("status", ["created", "queued", "retry_wait", "paused"])
def test_cancel_of_waiting_job_is_immediate_and_final(engine, driver, clock, status):
    job_id = drive_to(engine, driver, status)
    assert engine.cancel(job_id, actor="ann") == "cancelled"
    row = job_row(driver, job_id)
    assert (row["status"], row["outcome"], row["category"]) == (
        "cancelled",
        "cancelled",
        "cancellation",
    )
    assert row["completed_at"] == clock.now
    # A retry_wait job kept its last attempt's code (TIMEOUT…): no error now.
    assert row["error_code"] is None and row["safe_reason"] == "cancelled by request"
    assert transitions(driver, job_id)[-1] == (status, "cancelled")
    assert events(driver, job_id)[-1]["actor"] == "ann"
    clock.advance(3600)
    assert engine.promote() == 0
    assert engine.claim(W1, ["bulk"], 10) == []
    assert engine.reap()["released_jobs"] == 0
    assert status_of(driver, job_id) == "cancelled"


@pytest.mark.parametrize("status", ["claimed", "processing"])
def test_cancel_of_running_job_asks_the_worker(engine, driver, status):
    job_id = drive_to(engine, driver, status)
    a = job_row(driver, job_id)["attempt_count"]
    assert engine.cancel(job_id) == "cancel_requested"
    assert engine.renew(W1, [(job_id, a)]) == {job_id: "cancel_requested"}
    assert engine.poll_statuses(W1, [(job_id, a)]) == {job_id: "cancel_requested"}
    assert transitions(driver, job_id)[-1] == (status, "cancel_requested")


def test_cancel_requested_ends_cancelled_whatever_the_attempt_did(engine, driver):
    kinds = [
        ("failed", "CRASHED"),
        ("failed", "CORRUPT_INPUT"),
        ("timeout", None),
        ("crashed", None),
        ("cancelled", None),
        ("failed", "OOM"),
    ]
    for kind, code in kinds:
        job_id, a = _running(engine, max_attempts=5)
        engine.cancel(job_id)
        res = AttemptResult(job_id=job_id, attempt=a, status=kind, code=code)
        assert engine.settle(W1, [res]) == {job_id}, kind
        row = job_row(driver, job_id)
        assert (row["status"], row["outcome"], row["category"]) == (
            "cancelled",
            "cancelled",
            "cancellation",
        ), (kind, code)
        assert row["completed_at"] is not None
        # No error code on the job (the reaper's ORPHANED was kept, and /v0
        # then showed the cancel as an error); the attempt keeps what it did.
        assert row["error_code"] is None, (kind, code)
        assert attempts(driver, job_id)[0]["status"] == kind
        assert attempts(driver, job_id)[0]["error_code"] == (code or IMPLIED_CODE.get(kind))
        assert transitions(driver, job_id)[-1] == ("cancel_requested", "cancelled")


def test_cancel_requested_that_completes_is_completed(engine, driver):
    job_id, a = _running(engine)
    engine.cancel(job_id)
    assert engine.settle(W1, [done(job_id, a, outputs=[thumb()])]) == {job_id}
    row = engine.get(job_id)
    assert (row["status"], row["outcome"]) == ("completed", "completed")
    assert len(row["outputs"]) == 1
    assert transitions(driver, job_id)[-1] == ("cancel_requested", "completed")


# -- reading ---------------------------------------------------------------------------


def test_get_shows_legacy_status_and_retryability(engine, driver):
    for status in states.STATUSES:
        job_id = drive_to(engine, driver, status, queue=f"q_{status}")
        row = engine.get(job_id)
        assert row["legacy_status"] == states.LEGACY_STATUS[status], status
        assert row["can_retry"] is (status in ("failed", "cancelled")), status
        assert row["events"][0]["to_status"] in ("queued", "created")
        assert [a["attempt_number"] for a in row["attempts"]] == list(
            range(1, row["attempt_count"] + 1)
        )


def test_duration_is_none_until_finished(engine, driver, clock):
    job_id, a = _running(engine)
    assert Engine.duration(job_row(driver, job_id)) is None
    clock.advance(2.5)
    engine.settle(W1, [done(job_id, a)])
    assert Engine.duration(job_row(driver, job_id)) == timedelta(seconds=2.5)


def test_list_filters(engine):
    a = new_job(engine)
    b = new_job(engine, queue="images")
    engine.cancel(a)
    assert [r["job_id"] for r in engine.list(status="cancelled")] == [a]
    assert [r["job_id"] for r in engine.list(queue="images")] == [b]
    assert [r["job_id"] for r in engine.list()] == [b, a]
    assert [r["job_id"] for r in engine.list(before_id=b)] == [a]


# -- flush and claim in one call (the SQLite worker's batch) ---------------------


def test_flush_and_claim_settles_then_claims_the_next_jobs(engine, driver):
    job_id, a = _running(engine)
    stale_id, stale_a = _running(engine)
    nxt = [new_job(engine) for _ in range(3)]
    accepted, claimed = engine.flush_and_claim(
        W1,
        [],
        [done(job_id, a), done(stale_id, stale_a + 1)],
        ["bulk"],
        2,  # stale: dropped
    )
    assert accepted == {job_id}
    assert status_of(driver, job_id) == "completed"
    assert status_of(driver, stale_id) == "processing"
    assert [c.job_id for c in claimed] == nxt[:2]
    assert {status_of(driver, j) for j in nxt[:2]} == {"claimed"}
    assert status_of(driver, nxt[2]) == "queued"
    assert [c.attempt for c in claimed] == [1, 1]
    assert transitions(driver, nxt[0]) == [(None, "queued"), ("queued", "claimed")]


def test_flush_and_claim_with_nothing_to_write_only_claims(engine, driver):
    j = new_job(engine)
    accepted, claimed = engine.flush_and_claim(W1, [], [], ["bulk"], 10)
    assert accepted == set()
    assert [c.job_id for c in claimed] == [j]
    assert engine.flush_and_claim(W1, [], [], ["bulk"], 10) == (set(), [])


# -- completions decided from the worker's own view (``held``) ---------------------


def _held(engine: Engine, worker: str = W1) -> tuple[int, int, dict]:
    """A claimed job and the worker's view of it, as the flusher builds it."""
    new_job(engine)
    (job,) = engine.claim(worker, ["bulk"], 1)
    return job.job_id, job.attempt, {job.job_id: held_row(job, worker, started=False)}


def test_a_completion_decided_from_the_held_view_matches_the_read_one(engine, driver):
    job_id, a, held = _held(engine)
    res = AttemptResult(job_id, a, "completed", duration_ms=40, cpu_time_ms=3, peak_memory_mb=9)
    assert engine.flush(W1, [], [res], held) == {job_id}
    row = engine.get(job_id)
    assert (row["status"], row["outcome"], row["actual_credits"]) == ("completed", "completed", 0)
    # The folded start is dated back by the attempt's duration, as when read.
    gap = row["completed_at"] - row["started_at"]
    assert timedelta(milliseconds=40) - US <= gap <= timedelta(milliseconds=40) + US
    assert transitions(driver, job_id)[-1] == ("claimed", "completed")
    (att,) = attempts(driver, job_id)
    assert (att["status"], att["duration_ms"], att["cpu_time_ms"]) == ("completed", 40, 3)


def test_a_stale_held_view_falls_back_to_the_locked_path(engine, driver):
    """The view says claimed, but a cancel was requested meanwhile: the guard
    refuses the blind write and the result is settled again under the lock
    (a completed attempt wins over the cancel request)."""
    job_id, a, held = _held(engine)
    assert engine.cancel(job_id) == "cancel_requested"
    assert status_of(driver, job_id) == "cancel_requested"
    assert engine.flush(W1, [], [done(job_id, a)], held) == {job_id}
    assert status_of(driver, job_id) == "completed"
    assert transitions(driver, job_id)[-1] == ("cancel_requested", "completed")


def test_a_held_view_with_the_wrong_status_is_checked_not_trusted(engine, driver):
    job_id, a, held = _held(engine)
    held[job_id]["status"] = "processing"  # the worker thinks its start was written
    assert engine.flush(W1, [], [done(job_id, a)], held) == {job_id}
    assert status_of(driver, job_id) == "completed"
    assert transitions(driver, job_id)[-1] == ("claimed", "completed")


def test_a_held_view_of_a_superseded_attempt_changes_nothing(engine, driver, settings, clock):
    job_id, a1, held = _held(engine)
    clock.advance(settings.lease_seconds + 1)
    assert engine.reap()["released_jobs"] == 1
    clock.advance(settings.backoff_max_seconds + 1)
    engine.promote()
    _, a2 = claim_one(engine, "w2")
    before = snapshot(driver, job_id)
    assert engine.flush(W1, [], [done(job_id, a1)], held) == set()
    # Even a view forged with the new attempt number is refused: wrong worker.
    held[job_id]["attempt_count"] = a2
    assert engine.flush(W1, [], [done(job_id, a2)], held) == set()
    assert snapshot(driver, job_id) == before


def test_flush_and_claim_with_a_held_view_settles_and_claims_in_one_go(engine, driver):
    job_id, a, held = _held(engine)
    nxt = new_job(engine)
    accepted, claimed = engine.flush_and_claim(W1, [], [done(job_id, a)], ["bulk"], 5, held)
    assert accepted == {job_id} and [c.job_id for c in claimed] == [nxt]
    assert status_of(driver, job_id) == "completed" and status_of(driver, nxt) == "claimed"
    assert transitions(driver, nxt) == [(None, "queued"), ("queued", "claimed")]


def test_a_result_reported_twice_in_one_batch_completes_the_job_once(engine, driver):
    job_id, a, held = _held(engine)
    assert engine.flush(W1, [], [done(job_id, a), done(job_id, a)], held) == {job_id}
    assert status_of(driver, job_id) == "completed"
    assert transitions(driver, job_id).count(("claimed", "completed")) == 1

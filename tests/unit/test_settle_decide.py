"""decide(): an attempt's result -> the job's next state (pure, no database)."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

import pytest

from hypermedia import config
from hypermedia.config import Settings
from hypermedia.errors import CATEGORIES, ERROR_POLICY, policy_for
from hypermedia.queue import states
from hypermedia.queue.models import AttemptResult, Output
from hypermedia.queue.settle import decide

NOW = datetime(2026, 1, 2, 3, 4, 5)
SETTINGS = Settings(backoff_base_seconds=2.0, backoff_max_seconds=30.0, child_memory_mb=1000)


@pytest.fixture(autouse=True)
def _a_big_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default memory ceiling depends on the machine's RAM: fix it."""
    monkeypatch.setattr(config, "machine_memory_mb", lambda: 64_000)


def job(
    status: str = "processing",
    attempt_count: int = 1,
    max_attempts: int = 3,
    memory_limit_mb: int | None = None,
    error_code: str | None = None,
) -> dict:
    return {
        "error_code": error_code,
        "job_id": 7,
        "status": status,
        "attempt_count": attempt_count,
        "max_attempts": max_attempts,
        "claimed_by": "w1",
        "memory_limit_mb": memory_limit_mb,
        # Set by the attempt's start: a job claimed has none yet.
        "started_at": None if status == "claimed" else NOW - timedelta(seconds=5),
    }


def result(status: str = "failed", code: str | None = None, **kw) -> AttemptResult:
    return AttemptResult(job_id=7, attempt=kw.pop("attempt", 1), status=status, code=code, **kw)


def run(j: dict, r: AttemptResult, seed: int = 1, settings: Settings = SETTINGS):
    return decide(j, r, NOW, settings, random.Random(seed))


# -- the policy table ------------------------------------------------------------------


def test_policy_is_consistent_data():
    for code, pol in ERROR_POLICY.items():
        assert code == code.upper()
        assert pol.category in CATEGORIES, code
        assert pol.outcome in states.OUTCOMES, code
        assert pol.memory_factor >= 1.0
        assert pol.backoff_factor >= 1.0
    assert policy_for("NEVER_HEARD_OF_IT") is ERROR_POLICY["INTERNAL"]


# -- completed ---------------------------------------------------------------------------


@pytest.mark.parametrize("status", sorted(states.RUNNING_SIDE))
def test_completed_attempt_completes(status):
    out = Output("thumbnail", "image/webp", metadata={"w": 1}, profile_version="v3")
    d = run(
        job(status),
        result(
            "completed",
            code="IGNORED",
            result={"n": 1},
            outputs=[out],
            actual_credits=9,
            duration_ms=5,
        ),
    )
    assert d.action == "complete"
    v = d.job_values
    assert (v["status"], v["outcome"], v["completed_at"], v["actual_credits"]) == (
        "completed",
        "completed",
        NOW,
        9,
    )
    assert v["error_code"] is None and v["visibility_timeout"] is None
    assert v["result"] == {"n": 1}
    assert d.attempt_values["status"] == "completed" and d.attempt_values["error_code"] is None
    assert d.attempt_values["duration_ms"] == 5 and d.attempt_values["finished_at"] == NOW
    assert [(o["output_type"], o["profile_version"], o["job_id"]) for o in d.outputs] == [
        ("thumbnail", "v3", 7)
    ]
    assert (d.event["from_status"], d.event["to_status"], d.event["kind"]) == (
        status,
        "completed",
        "event",
    )
    assert states.is_allowed(status, "completed")


def test_result_with_folded_start_records_when_the_attempt_began():
    d = run(job("claimed"), result("completed", duration_ms=1500))
    assert d.job_values["started_at"] == NOW - timedelta(milliseconds=1500)
    # A started job keeps its own started_at.
    assert (
        "started_at" not in run(job("processing"), result("completed", duration_ms=1500)).job_values
    )
    assert "started_at" not in run(job("claimed"), result("completed")).job_values
    # A cancel asked meanwhile refused the start: the row says cancel_requested
    # and has no started_at; the job ended with none, and no duration.
    asked = {**job("cancel_requested"), "started_at": None}
    d = run(asked, result("completed", duration_ms=1500))
    assert d.job_values["started_at"] == NOW - timedelta(milliseconds=1500)


# -- cancel requested ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["failed", "timeout", "crashed", "cancelled", "orphaned"])
def test_cancel_requested_ends_cancelled(kind):
    d = run(
        job("cancel_requested", attempt_count=3, max_attempts=3),
        result(
            kind,
            code="CORRUPT_INPUT" if kind == "failed" else None,
            outputs=[Output("x", "a/b", profile_version="v1")],
        ),
    )
    assert d.action == "confirm_cancel"
    assert (d.job_values["status"], d.job_values["outcome"], d.job_values["category"]) == (
        "cancelled",
        "cancelled",
        "cancellation",
    )
    assert d.job_values["completed_at"] == NOW
    assert d.outputs == []
    assert d.attempt_values["status"] == kind
    assert d.event["kind"] == "event"  # the user's cancel is not an error (SSE: event: event)


# -- failures --------------------------------------------------------------------------------


@pytest.mark.parametrize("code", sorted(c for c, p in ERROR_POLICY.items() if p.retryable))
@pytest.mark.parametrize("attempt", [1, 2])
def test_retryable_with_attempts_left_waits(code, attempt):
    d = run(job(attempt_count=attempt, max_attempts=3), result("failed", code, attempt=attempt))
    step = min(30.0, 2.0 * ERROR_POLICY[code].backoff_factor * 2 ** (attempt - 1))
    assert d.action == "retry_later"
    v = d.job_values
    assert v["status"] == "retry_wait" and v["retryable"] is True
    assert v["category"] == ERROR_POLICY[code].category and v["error_code"] == code
    assert timedelta(seconds=step / 2) <= v["available_at"] - NOW <= timedelta(seconds=step)
    assert "outcome" not in v and "completed_at" not in v
    assert d.event["kind"] == "error" and d.event["code"] == code
    assert d.outputs == []


@pytest.mark.parametrize("code", sorted(c for c, p in ERROR_POLICY.items() if p.retryable))
def test_retryable_without_attempts_left_fails_with_its_outcome(code):
    d = run(job(attempt_count=3, max_attempts=3), result("failed", code, attempt=3))
    pol = ERROR_POLICY[code]
    assert d.action == "fail"
    v = d.job_values
    assert (v["status"], v["outcome"], v["category"]) == ("failed", pol.outcome, pol.category)
    assert v["completed_at"] == NOW and "available_at" not in v
    assert "no attempts left" in d.event["message"]


@pytest.mark.parametrize("code", sorted(c for c, p in ERROR_POLICY.items() if not p.retryable))
def test_permanent_codes_fail_on_first_attempt(code):
    d = run(job(attempt_count=1, max_attempts=10), result("failed", code))
    v = d.job_values
    assert d.action == "fail"
    assert (v["status"], v["retryable"], v["outcome"]) == ("failed", False, "failed")
    assert v["category"] == ERROR_POLICY[code].category
    assert "permanent" in d.event["message"]


def test_timeout_on_last_attempt_has_outcome_timeout():
    d = run(job(attempt_count=2, max_attempts=2), result("timeout", attempt=2))
    assert (d.job_values["outcome"], d.job_values["category"], d.job_values["error_code"]) == (
        "timeout",
        "timeout",
        "TIMEOUT",
    )


def test_a_second_timeout_in_a_row_fails_with_attempts_left():
    twice = job(attempt_count=2, max_attempts=5, error_code="TIMEOUT")
    d = run(twice, result("timeout", attempt=2))
    assert (d.job_values["status"], d.job_values["outcome"]) == ("failed", "timeout")
    assert "the attempt before it ended so too" in d.event["message"]


@pytest.mark.parametrize("before", [None, "CRASHED", "OOM"])
def test_a_timeout_after_anything_else_is_retried(before):
    d = run(job(attempt_count=2, max_attempts=5, error_code=before), result("timeout", attempt=2))
    assert d.job_values["status"] == "retry_wait"


def test_other_codes_are_retried_in_a_row():
    d = run(job(attempt_count=2, max_attempts=5, error_code="CRASHED"), result("crashed"))
    assert d.job_values["status"] == "retry_wait"


@pytest.mark.parametrize(
    ("status", "code"),
    [
        ("timeout", "TIMEOUT"),
        ("crashed", "CRASHED"),
        ("orphaned", "ORPHANED"),
        ("failed", "INTERNAL"),
    ],
)
def test_missing_code_is_implied_by_attempt_status(status, code):
    d = run(job(), result(status))
    assert d.job_values["category"] == ERROR_POLICY[code].category
    if status != "failed":
        assert d.attempt_values["error_code"] == code


def test_orphaned_last_attempt_has_outcome_orphaned():
    d = run(job(attempt_count=1, max_attempts=1), result("orphaned", "ORPHANED"))
    assert d.job_values["outcome"] == "orphaned"


@pytest.mark.parametrize(("current", "expected"), [(None, 2000), (1500, 3000), (2500, 4000)])
def test_oom_doubles_memory_up_to_the_ceiling(current, expected):
    # The ceiling: four times child_memory_mb (1000) unless set.
    d = run(job(memory_limit_mb=current), result("failed", "OOM"))
    assert d.job_values["status"] == "retry_wait"
    assert d.job_values["memory_limit_mb"] == expected


def test_an_oom_at_the_ceiling_fails_with_attempts_left():
    d = run(job(memory_limit_mb=4000, attempt_count=1, max_attempts=5), result("failed", "OOM"))
    assert (d.job_values["status"], d.job_values["outcome"]) == ("failed", "failed")
    assert "4000 MB, the most an attempt may get" in d.event["message"]
    settings = SETTINGS.with_(child_memory_max_mb=16000)
    d = run(job(memory_limit_mb=4000), result("failed", "OOM"), settings=settings)
    assert d.job_values["memory_limit_mb"] == 8000


def test_an_oom_is_judged_by_the_memory_this_worker_gave():
    # A job grown to 8000 MB elsewhere ran with this worker's ceiling, 4000.
    d = run(job(memory_limit_mb=8000, max_attempts=5), result("failed", "OOM"))
    assert d.job_values["status"] == "failed"
    assert "it had 4000 MB" in d.event["message"]


def test_other_codes_leave_memory_alone():
    d = run(job(memory_limit_mb=1234), result("failed", "CRASHED"))
    assert "memory_limit_mb" not in d.job_values


def test_messages_are_redacted_and_bounded():
    msg = "failed on /srv/hm/objects/1/in.jpg password=hunter2 " + "x" * 5000
    d = run(job(), result("failed", "CORRUPT_INPUT", message=msg))
    for text in (
        d.job_values["safe_reason"],
        d.attempt_values["error_message"],
        d.event["message"],
    ):
        assert "/srv/hm" not in text and "hunter2" not in text
    assert len(d.job_values["safe_reason"]) <= 300
    assert len(d.attempt_values["error_message"]) <= 2000
    assert len(d.event["message"]) <= 1000


def test_reason_defaults_to_the_code_in_words():
    d = run(job(), result("failed", "UNSUPPORTED_FORMAT"))
    assert d.job_values["safe_reason"] == "unsupported format"


@pytest.mark.parametrize(
    "code", ["STORAGE_UNAVAILABLE", "PROVIDER_UNAVAILABLE", "DEPENDENCY_FAILED"]
)
def test_something_away_is_waited_for_longer_up_to_the_cap(code):
    """A store or provider that is away gets 15 times the base (15-30 s first
    at the default 2 s); a crashed child is retried within seconds."""
    crashed = run(job(), result("failed", "CRASHED")).job_values["available_at"] - NOW
    away = run(job(), result("failed", code)).job_values["available_at"] - NOW
    assert crashed <= timedelta(seconds=2) and timedelta(seconds=15) <= away
    later = run(job(attempt_count=2), result("failed", code, attempt=2))
    assert later.job_values["available_at"] - NOW <= timedelta(seconds=30)  # the cap


def test_same_seed_same_delay_different_seed_spreads():
    a = run(job(), result("failed", "CRASHED"), seed=1).job_values["available_at"]
    b = run(job(), result("failed", "CRASHED"), seed=1).job_values["available_at"]
    c = {
        run(job(), result("failed", "CRASHED"), seed=s).job_values["available_at"]
        for s in range(20)
    }
    assert a == b and len(c) > 10


def test_every_decision_is_an_allowed_transition():
    for status in sorted(states.RUNNING_SIDE):
        for kind in ("completed", "failed", "timeout", "crashed", "cancelled", "orphaned"):
            for code in [None, *ERROR_POLICY]:
                for count in (1, 3):
                    d = run(job(status, attempt_count=count), result(kind, code, attempt=count))
                    assert d.job_values["status"] == states.target(d.action)
                    assert status in states.sources(d.action)
                    assert d.event["from_status"] == status
                    assert d.event["to_status"] == d.job_values["status"]

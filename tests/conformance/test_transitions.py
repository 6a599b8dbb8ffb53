"""The transition table (states.TRANSITIONS) as the engine enforces it, on every database.

Allowed pairs are each reached through a public engine method; forbidden pairs are
generated from STATUSES x engine methods, not listed by hand, and each must be
refused without touching the job.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from hypermedia.errors import NotFound, StaleTransition
from hypermedia.queue import states
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import AttemptResult

from ._helpers import (
    W1,
    done,
    drive_to,
    failed,
    force,
    job_row,
    new_job,
    past,
    set_columns,
    snapshot,
    status_of,
    transitions,
)

# -- allowed pairs ------------------------------------------------------------

# Allowed by the table but produced by no engine method: settle() turns every
# non-completed result of a cancel_requested job into 'cancelled', and the engine
# has no pause/resume yet.  These are reached with the table's own guard instead.
NO_ENGINE_ROUTE = {
    ("cancel_requested", "failed"): "fail",
    ("cancel_requested", "retry_wait"): "retry_later",
    ("processing", "paused"): "pause",
    ("paused", "queued"): "resume",
}


def _attempt(engine: Engine, job_id: int) -> int:
    return int(job_row(engine.db, job_id)["attempt_count"])


def _route(engine: Engine, clock, job_id: int, src: str, dst: str) -> None:
    """Make the engine move ``job_id`` from ``src`` to ``dst`` through a public method."""
    a = _attempt(engine, job_id)
    pair = (src, dst)
    if pair in NO_ENGINE_ROUTE:
        force(engine.db, job_id, NO_ENGINE_ROUTE[pair])
    elif pair == ("created", "queued"):
        engine.release(job_id)
    elif pair == ("queued", "claimed"):
        assert [c.job_id for c in engine.claim(W1, ["bulk"], 5)] == [job_id]
    elif pair == ("claimed", "processing"):
        assert engine.start(W1, [(job_id, a)]) == {job_id}
    elif dst == "completed":
        assert engine.settle(W1, [done(job_id, a)]) == {job_id}
    elif dst == "retry_wait":
        assert engine.settle(W1, [failed(job_id, a, "CRASHED")]) == {job_id}
    elif dst == "failed":
        assert engine.settle(W1, [failed(job_id, a, "CORRUPT_INPUT")]) == {job_id}
    elif pair == ("retry_wait", "queued"):
        clock.advance(60)
        assert engine.promote() == 1
    elif dst == "cancelled" and src == "cancel_requested":
        stopped = AttemptResult(job_id=job_id, attempt=a, status="cancelled")
        assert engine.settle(W1, [stopped]) == {job_id}
    elif dst in ("cancelled", "cancel_requested"):
        assert engine.cancel(job_id) == dst
    elif pair == ("claimed", "queued"):
        assert engine.hand_back(W1, [(job_id, a)]) == {job_id}
    elif dst == "queued" and src in ("failed", "cancelled"):
        engine.retry(job_id)
    else:  # a new table entry needs a route here
        pytest.fail(f"no engine route for allowed transition {src} -> {dst}")


@pytest.mark.parametrize("pair", sorted(states.ALLOWED), ids=lambda p: f"{p[0]}->{p[1]}")
def test_every_allowed_transition_is_reachable(engine, driver, clock, pair):
    src, dst = pair
    job_id = drive_to(engine, driver, src)
    before = len(transitions(driver, job_id))
    _route(engine, clock, job_id, src, dst)
    assert status_of(driver, job_id) == dst
    if pair not in NO_ENGINE_ROUTE:
        # Exactly one new diagnostic event, naming this very change.
        assert transitions(driver, job_id)[before:] == [(src, dst)]


def test_table_pairs_without_engine_route_are_still_in_the_table():
    # Guard against the exception list above silently outliving the table.
    for (src, dst), action in NO_ENGINE_ROUTE.items():
        assert src in states.sources(action) and states.target(action) == dst


def test_drive_to_reaches_every_status(engine, driver):
    for status in states.STATUSES:
        job_id = drive_to(engine, driver, status, queue=f"q_{status}")
        assert status_of(driver, job_id) == status


# -- forbidden pairs ------------------------------------------------------------

# Engine method -> the table actions it implements.  A method must refuse a job
# whose status is outside the union of those actions' sources.
METHODS: dict[str, tuple[str, ...]] = {
    "release": ("release",),
    "claim": ("claim",),
    "start": ("start",),
    "settle": ("complete", "retry_later", "fail", "confirm_cancel"),
    "promote": ("promote",),
    # cancel of a cancel_requested job is an idempotent no-op (tested below).
    "cancel": ("cancel", "request_cancel"),
    "hand_back": ("hand_back",),
    "retry": ("retry",),
    # No engine method yet: the driver's guarded update itself must refuse.
    "guard:pause": ("pause",),
    "guard:resume": ("resume",),
}
NOOP_ON = {"cancel": {"cancel_requested"}}


def test_methods_cover_every_action():
    covered = {a for actions in METHODS.values() for a in actions}
    assert covered == set(states.TRANSITIONS)


def _accepted(method: str) -> frozenset[str]:
    return frozenset().union(*(states.sources(a) for a in METHODS[method]))


def _forbidden(method: str) -> list[str]:
    noop = NOOP_ON.get(method, set())
    return [s for s in states.STATUSES if s not in _accepted(method) and s not in noop]


def _reject(engine: Engine, method: str, job_id: int, attempt: int, queue: str) -> None:
    """Call ``method`` on a job it must refuse; assert the refusal it reports."""

    def stale(call: Callable[[int], object]) -> None:
        status = status_of(engine.db, job_id)
        with pytest.raises(StaleTransition) as info:
            call(job_id)
        assert info.value.job_id == job_id and info.value.status == status

    if method in ("release", "retry", "cancel"):
        stale(getattr(engine, method))
    elif method == "claim":
        assert engine.claim(W1, [queue], 50) == []
    elif method == "start":
        assert engine.start(W1, [(job_id, attempt)]) == set()
    elif method == "settle":
        assert engine.settle(W1, [done(job_id, attempt)]) == set()
        assert engine.settle(W1, [failed(job_id, attempt, "CRASHED")]) == set()
        assert engine.settle(W1, [failed(job_id, attempt, "CORRUPT_INPUT")]) == set()
        assert engine.flush(W1, [], [done(job_id, attempt)]) == set()
    elif method == "promote":
        assert engine.promote() == 0
    elif method == "hand_back":
        assert engine.hand_back(W1, [(job_id, attempt)]) == set()
    elif method.startswith("guard:"):
        action = method.split(":", 1)[1]
        with engine.db.tx() as tx:
            ok = tx.update_job(job_id, states.sources(action), {"status": states.target(action)})
        assert ok is False
    else:  # pragma: no cover
        raise AssertionError(method)


@pytest.mark.parametrize("method", list(METHODS))
def test_forbidden_transitions_are_refused_and_change_nothing(engine, driver, clock, method):
    """For each status outside the method's sources (STATUSES x methods, generated)."""
    jobs: dict[str, tuple[int, int, str]] = {}
    for status in _forbidden(method):
        queue = f"q_{status}"
        job_id = drive_to(engine, driver, status, queue=queue)
        # Isolate the status guard: the job is "held" by W1 on its current
        # attempt and due now, so only its status can be the reason to refuse.
        row = job_row(driver, job_id)
        fix = {"available_at": past(engine)}
        if row["claimed_by"] is None:
            fix["claimed_by"] = W1
        set_columns(driver, job_id, fix)
        jobs[status] = (job_id, int(row["attempt_count"]), queue)
    assert jobs, f"{method} accepts every status?"
    before = {s: snapshot(driver, j) for s, (j, _, _) in jobs.items()}
    clock.advance(1)
    accepted = []
    for status, (job_id, attempt, queue) in jobs.items():
        try:
            _reject(engine, method, job_id, attempt, queue)
        except (AssertionError, pytest.fail.Exception) as exc:
            accepted.append(f"{status}: {exc}")
    assert not accepted, f"{method} did not refuse: {accepted}"
    changed = [s for s, (j, _, _) in jobs.items() if snapshot(driver, j) != before[s]]
    assert not changed, f"{method} changed jobs in {changed}"


def test_forbidden_pairs_are_generated_not_listed():
    # 10 methods x 10 statuses minus what each accepts: all the rest is tested.
    pairs = {(m, s) for m in METHODS for s in _forbidden(m)}
    assert ("cancel", "completed") in pairs and ("retry", "queued") in pairs
    assert ("retry", "completed") in pairs and ("release", "queued") in pairs
    assert ("settle", "queued") in pairs and ("claim", "retry_wait") in pairs
    assert len(pairs) == sum(
        len(states.STATUSES) - len(_accepted(m) | NOOP_ON.get(m, set())) for m in METHODS
    )


def test_cancel_of_cancel_requested_is_idempotent(engine, driver):
    job_id = drive_to(engine, driver, "cancel_requested")
    before = snapshot(driver, job_id)
    assert engine.cancel(job_id) == "cancel_requested"
    assert snapshot(driver, job_id) == before


@pytest.mark.parametrize("call", ["release", "cancel", "retry"])
def test_user_actions_on_missing_job_raise_not_found(engine, call):
    with pytest.raises(NotFound):
        getattr(engine, call)(987654)


def test_stale_transition_message_names_job_and_status(engine, driver):
    job_id = drive_to(engine, driver, "completed")
    with pytest.raises(StaleTransition, match=rf"cannot cancel job {job_id}: it is completed"):
        engine.cancel(job_id)


# -- events follow the changes ------------------------------------------------------


def test_lifecycle_writes_one_event_per_change_in_order(engine, driver, clock):
    job_id = new_job(engine, max_attempts=2)
    a = engine.claim(W1, ["bulk"], 1)[0].attempt
    engine.start(W1, [(job_id, a)])
    engine.settle(W1, [failed(job_id, a, "STORAGE_UNAVAILABLE")])
    clock.advance(5)
    assert engine.promote() == 1
    a = engine.claim("w2", ["bulk"], 1)[0].attempt
    assert a == 2
    engine.flush("w2", [(job_id, a)], [done(job_id, a)])
    evs = [
        (e["from_status"], e["to_status"], e["attempt_number"], e["actor"])
        for e in engine.get(job_id)["events"]
    ]
    assert evs == [
        (None, "queued", None, None),
        ("queued", "claimed", 1, W1),
        ("claimed", "processing", 1, W1),
        ("processing", "retry_wait", 1, W1),
        ("retry_wait", "queued", None, None),
        ("queued", "claimed", 2, "w2"),
        ("claimed", "processing", 2, "w2"),
        ("processing", "completed", 2, "w2"),
    ]


def test_failure_event_carries_code_and_error_kind(engine, driver):
    job_id = drive_to(engine, driver, "failed")
    last = engine.get(job_id)["events"][-1]
    assert (last["kind"], last["code"]) == ("error", "CORRUPT_INPUT")
    assert "permanent" in last["message"]


def test_user_actions_record_actor(engine, driver):
    job_id = new_job(engine, hold=True)
    engine.release(job_id, actor="alice")
    engine.cancel(job_id, actor="bob")
    engine.retry(job_id, actor="carol")
    evs = engine.get(job_id)["events"][1:]
    assert [(e["from_status"], e["to_status"], e["actor"]) for e in evs] == [
        ("created", "queued", "alice"),
        ("queued", "cancelled", "bob"),
        ("cancelled", "queued", "carol"),
    ]
    assert job_row(driver, job_id)["updated_by"] == "carol"


def test_a_cancelled_job_is_not_one_the_engine_retries_by_itself(engine, driver):
    # `retryable` said true (as of no failure at all); `can_retry` says a
    # retry by request may run it again.
    job_id = new_job(engine)
    engine.cancel(job_id)
    row = job_row(driver, job_id)
    assert (row["status"], row["retryable"]) == ("cancelled", False)
    assert engine.get(job_id)["can_retry"] is True


def test_a_retry_starts_from_no_start(engine, driver, clock):
    """A retry kept the last attempt's started_at, claimed_at and claimed_by
    until its next claim: cancelled before that, its duration ran from the
    last attempt's start to the cancel."""
    job_id = drive_to(engine, driver, "failed")
    assert job_row(driver, job_id)["started_at"] is not None
    engine.retry(job_id)
    row = job_row(driver, job_id)
    assert (row["status"], row["started_at"], row["claimed_at"], row["claimed_by"]) == (
        "queued", None, None, None,
    )  # fmt: skip
    clock.advance(60)
    engine.cancel(job_id)
    assert engine.duration(job_row(driver, job_id)) is None  # it never started this time

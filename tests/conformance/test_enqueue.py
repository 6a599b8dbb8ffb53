"""Enqueue: validation, idempotency, batches, profile resolution, credits."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import timedelta

import pytest

from hypermedia.db.driver import Driver
from hypermedia.errors import IdempotencyConflict, InvalidRequest
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import NewJob

from ._helpers import claim_one, events, failed, job_row, race, transitions


def _count_jobs(engine: Engine) -> int:
    return len(engine.list(limit=10_000))


def _profile(
    driver: Driver,
    job_type: str = "debug.sleep",
    version: str = "v1",
    key: str | None = None,
    **values,
) -> str:
    """Insert a profile under a fresh key (profiles survive between tests); return the key."""
    key = key or f"test-{uuid.uuid4().hex[:12]}"
    row = {
        "profile_key": key,
        "profile_version": version,
        "job_type": job_type,
        "queue_name": "bulk",
        "settings": {"max_ms": 1000},
        "credit_cost_base": 0,
        "is_active": True,
        **values,
    }
    with driver.tx() as tx:
        tx.insert_profile(row)
    return key


# -- idempotency ------------------------------------------------------------------


def test_same_idempotency_key_returns_the_same_job(engine, driver):
    first = engine.enqueue(NewJob("debug.sleep", {"ms": 5}, idempotency_key="k1"))
    again = engine.enqueue(NewJob("debug.sleep", {"ms": 5}, idempotency_key="k1"))
    assert again == first
    assert _count_jobs(engine) == 1
    assert transitions(driver, first) == [(None, "queued")]


def test_a_repeat_matches_even_when_the_profile_filled_in_defaults(engine, storage):
    """Stored params are validated ones (profile defaults added); the raw repeat still matches."""
    import io

    from tests.media import png

    obj = storage.put(io.BytesIO(png(4, 4)))
    ask = NewJob("image.thumbnail", {}, object_id=obj["object_id"], idempotency_key="thumb-1")
    first = engine.enqueue(ask)
    assert engine.get(first)["params"] != {}  # defaults were filled in
    assert engine.enqueue(ask) == first
    assert engine.enqueue_many([ask]) == [first]
    with pytest.raises(IdempotencyConflict):
        engine.enqueue(
            NewJob(
                "image.thumbnail",
                {"size": 99},
                object_id=obj["object_id"],
                idempotency_key="thumb-1",
            )
        )


def test_idempotent_repeat_after_the_job_moved_on_still_returns_it(engine):
    first = engine.enqueue(NewJob("debug.noop", idempotency_key="k-moved"))
    engine.cancel(first)
    assert engine.enqueue(NewJob("debug.noop", idempotency_key="k-moved")) == first
    assert _count_jobs(engine) == 1


def test_same_key_for_a_different_request_conflicts(engine):
    first = engine.enqueue(NewJob("debug.sleep", {"ms": 5}, idempotency_key="k2"))
    others = {
        "params": NewJob("debug.sleep", {"ms": 6}, idempotency_key="k2"),
        "priority": NewJob("debug.sleep", {"ms": 5}, priority=1, idempotency_key="k2"),
        "job_type": NewJob("debug.noop", idempotency_key="k2"),
        "queue": NewJob("debug.sleep", {"ms": 5}, queue="images", idempotency_key="k2"),
        "object": NewJob("debug.sleep", {"ms": 5}, object_id=42, idempotency_key="k2"),
        # A client asking for other retry or timeout terms got the first job's.
        "attempts": NewJob("debug.sleep", {"ms": 5}, max_attempts=100, idempotency_key="k2"),
        "timeout": NewJob("debug.sleep", {"ms": 5}, timeout_seconds=5, idempotency_key="k2"),
    }
    for what, other in others.items():
        with pytest.raises(IdempotencyConflict):
            engine.enqueue(other)
            pytest.fail(f"a different {what} was accepted under the same key")
    assert [j["job_id"] for j in engine.list()] == [first]


def test_a_repeat_names_the_terms_it_was_made_with(engine):
    """The timeout given is the one kept (none given: the profile's); an
    explicit retry raises max_attempts, and the repeat still finds the job."""
    first = engine.enqueue(
        NewJob("debug.sleep", {"ms": 5}, max_attempts=1, timeout_seconds=7, idempotency_key="k3")
    )
    same = NewJob("debug.sleep", {"ms": 5}, max_attempts=1, timeout_seconds=7, idempotency_key="k3")
    assert engine.enqueue(same) == first
    assert engine.enqueue(replace(same, timeout_seconds=None)) == first
    got, attempt = claim_one(engine)  # its one attempt fails for good
    assert got == first
    assert engine.settle("w1", [failed(first, attempt, "CORRUPT_INPUT")]) == {first}
    engine.retry(first)  # a second attempt: max_attempts 2
    assert engine.get(first)["max_attempts"] == 2
    assert engine.enqueue(same) == first
    with pytest.raises(IdempotencyConflict):  # asked for 3: never made so
        engine.enqueue(replace(same, max_attempts=3))


def test_same_key_with_another_profile_conflicts(engine, driver):
    """The profile is part of the request: another profile or another pinned
    version under the same key is a conflict, even with the same params (it
    used to return the first job, made with other settings and prices).  The
    key alone still repeats the job after a newer version came."""
    mine, other = _profile(driver), _profile(driver)  # same type, same settings
    first = engine.enqueue(NewJob("debug.sleep", {"ms": 5}, profile=mine, idempotency_key="kp"))
    _profile(driver, key=mine, version="v2")
    for ref in (other, f"{mine}:v2", None):  # None: the type's default profile, debug-sleep
        with pytest.raises(IdempotencyConflict):
            engine.enqueue(NewJob("debug.sleep", {"ms": 5}, profile=ref, idempotency_key="kp"))
            pytest.fail(f"profile {ref} was taken for {mine} under the same key")
    for ref in (mine, f"{mine}:v1"):
        again = NewJob("debug.sleep", {"ms": 5}, profile=ref, idempotency_key="kp")
        assert engine.enqueue(again) == first
    assert _count_jobs(engine) == 1


def test_profile_references_follow_the_one_rule(engine, driver):
    """KEY or KEY:vN, as everywhere else: "KEY:" used to be read as KEY."""
    key = _profile(driver)
    for bad in (f"{key}:", f"{key}:V1", f"{key}:v1:x", f"{key}:v0"):
        with pytest.raises(InvalidRequest, match="is not a profile reference"):
            engine.enqueue(NewJob("debug.sleep", profile=bad))
    assert _count_jobs(engine) == 0


def test_idempotency_keys_are_per_project(engine):
    a = engine.enqueue(NewJob("debug.noop", project_id="p1", idempotency_key="same"))
    b = engine.enqueue(NewJob("debug.noop", project_id="p2", idempotency_key="same"))
    assert a != b
    assert _count_jobs(engine) == 2


def test_concurrent_enqueues_with_one_key_make_one_job(
    engine, driver, database_url, settings, clock
):
    """Racing clients with the same key all get the one job (no unique-key error)."""
    got = race(
        database_url,
        6,
        lambda drv, i: Engine(drv, settings, clock=clock).enqueue(
            NewJob("debug.sleep", {"ms": 1}, idempotency_key="race")
        ),
    )
    assert all(isinstance(g, int) for g in got), got
    assert len(set(got)) == 1
    assert _count_jobs(engine) == 1
    assert len(events(driver, got[0])) == 1


# -- validation -------------------------------------------------------------------


BAD_REQUESTS = {
    "unknown-type": NewJob("no.such_type"),
    "noop-params": NewJob("debug.noop", {"unexpected": 1}),
    "ms-negative": NewJob("debug.sleep", {"ms": -1}),
    "ms-string": NewJob("debug.sleep", {"ms": "10"}),
    "unknown-param": NewJob("debug.sleep", {"bogus": True}),
    "fail-code": NewJob("debug.sleep", {"fail": "NOT_A_CODE"}),
    "priority-0": NewJob("debug.noop", priority=0),
    "priority-11": NewJob("debug.noop", priority=11),
    "max-attempts-0": NewJob("debug.noop", max_attempts=0),
    "timeout-0": NewJob("debug.noop", timeout_seconds=0),
    "timeout-negative": NewJob("debug.noop", timeout_seconds=-5),
    "timeout-over-a-week": NewJob("debug.noop", timeout_seconds=7 * 86400 + 1),
    "params-over-64-kib": NewJob("debug.sleep", {"marker": "x" * (64 * 1024)}),
    "params-not-json": NewJob("debug.sleep", {"marker": float("nan")}),
    "unknown-profile": NewJob("debug.noop", profile="no-such-profile"),
    "unknown-version": NewJob("debug.noop", profile="debug-noop:v999"),
    "profile-of-other-type": NewJob("debug.noop", profile="debug-sleep"),
}


def test_invalid_requests_are_refused_and_store_nothing(engine):
    for what, bad in BAD_REQUESTS.items():
        for call in (
            lambda b: engine.enqueue(b),
            lambda b: engine.enqueue_many([NewJob("debug.noop"), b]),
        ):
            try:
                call(bad)
            except InvalidRequest:
                continue
            except Exception as exc:
                pytest.fail(f"{what}: {type(exc).__name__} instead of InvalidRequest: {exc}")
            pytest.fail(f"{what}: accepted")
    assert _count_jobs(engine) == 0


def test_invalid_request_messages_are_user_safe(engine):
    with pytest.raises(InvalidRequest, match="priority must be from 1"):
        engine.enqueue(NewJob("debug.noop", priority=0))
    with pytest.raises(InvalidRequest, match="unknown parameters: bogus"):
        engine.enqueue(NewJob("debug.sleep", {"bogus": 1}))


def test_params_are_settings_not_data(engine):
    """Every claim reads a job's params and the worker hands them to its child:
    at most 64 KiB of JSON, refused with the reason before anything is stored."""
    with pytest.raises(InvalidRequest, match="params take at most 64 KiB as JSON"):
        engine.enqueue(NewJob("debug.sleep", {"marker": "é" * 33_000}))  # 2 bytes each
    job_id = engine.enqueue(NewJob("debug.sleep", {"marker": "x" * 65_000}))
    assert len(engine.get(job_id)["params"]["marker"]) == 65_000


def test_bounds_of_priority_are_accepted(engine):
    ids = engine.enqueue_many([NewJob("debug.noop", priority=1), NewJob("debug.noop", priority=10)])
    assert [engine.get(i)["priority"] for i in ids] == [1, 10]


def test_input_larger_than_profile_allows_is_refused(engine, driver):
    key = _profile(driver, max_input_bytes=1000)
    said = rf"larger than profile {key}:v1 accepts \(1001 bytes; at most 1000\)"
    with pytest.raises(InvalidRequest, match=said):
        engine.enqueue(NewJob("debug.sleep", profile=key, input_size_bytes=1001))
    assert engine.enqueue(NewJob("debug.sleep", profile=key, input_size_bytes=1000))


# -- batches ------------------------------------------------------------------------


def test_enqueue_many_returns_ids_in_the_order_given(engine):
    jobs = [
        NewJob(
            "debug.sleep" if i % 3 else "debug.noop",
            {"ms": i} if i % 3 else {},
            priority=10 - i % 10,
            input_key=f"in/{i}",
        )
        for i in range(30)
    ]
    ids = engine.enqueue_many(jobs)
    assert len(set(ids)) == 30
    for job, job_id in zip(jobs, ids, strict=True):
        row = engine.get(job_id)
        assert (row["input_key"], row["job_type"], row["priority"], row["params"]) == (
            job.input_key,
            job.job_type,
            job.priority,
            job.params,
        )
        assert [(e["from_status"], e["to_status"]) for e in row["events"]] == [(None, "queued")]


def test_enqueue_many_of_nothing_is_nothing(engine):
    assert engine.enqueue_many([]) == []
    assert _count_jobs(engine) == 0


# -- what an enqueued job looks like --------------------------------------------------


def test_new_job_row(engine, driver, clock):
    job_id = engine.enqueue(
        NewJob(
            "debug.sleep",
            {"ms": 3},
            priority=2,
            max_attempts=4,
            project_id="proj",
            owner_id="ann",
            created_by="ann",
            input_key="in/x",
            input_size_bytes=10,
        )
    )
    row = job_row(driver, job_id)
    assert row["status"] == "queued"
    assert row["queue_name"] == "bulk"  # the profile's queue
    assert row["timeout_seconds"] == 3600  # the profile's timeout
    assert (row["attempt_count"], row["max_attempts"], row["priority"]) == (0, 4, 2)
    assert row["available_at"] == clock.now and row["created_at"] == clock.now
    assert row["claimed_by"] is None and row["completed_at"] is None
    assert (row["project_id"], row["owner_id"], row["created_by"]) == ("proj", "ann", "ann")
    assert len(row["job_uuid"]) == 36
    ev = events(driver, job_id)[0]
    assert ev["actor"] == "ann" and "debug-sleep:v1" in ev["message"]


def test_queue_and_timeout_overrides(engine, driver):
    job_id = engine.enqueue(NewJob("debug.noop", queue="images", timeout_seconds=7))
    row = job_row(driver, job_id)
    assert (row["queue_name"], row["timeout_seconds"]) == ("images", 7)


def test_hold_creates_and_release_queues(engine, driver):
    job_id = engine.enqueue(NewJob("debug.noop", hold=True))
    assert job_row(driver, job_id)["status"] == "created"
    assert engine.claim("w1", ["bulk"], 5) == []
    engine.release(job_id)
    assert [c.job_id for c in engine.claim("w1", ["bulk"], 5)] == [job_id]


def test_run_at_sets_available_at(engine, driver, clock):
    when = clock.now + timedelta(minutes=5)
    job_id = engine.enqueue(NewJob("debug.noop", run_at=when))
    assert job_row(driver, job_id)["available_at"] == when


# -- profiles and credits -------------------------------------------------------------


def test_profile_key_resolves_to_newest_active_version(engine, driver):
    key = _profile(driver, version="v1", settings={"max_ms": 10})
    _profile(driver, key=key, version="v2", settings={"max_ms": 20})
    with driver.read() as tx:
        v1, v2 = tx.profile(key, "v1")["profile_id"], tx.profile(key, "v2")["profile_id"]

    newest = engine.enqueue(NewJob("debug.sleep", {"ms": 15}, profile=key))
    assert job_row(driver, newest)["profile_id"] == v2
    pinned = engine.enqueue(NewJob("debug.sleep", {"ms": 5}, profile=f"{key}:v1"))
    assert job_row(driver, pinned)["profile_id"] == v1
    # Profile settings feed validation: v1 allows at most 10 ms.
    with pytest.raises(InvalidRequest):
        engine.enqueue(NewJob("debug.sleep", {"ms": 15}, profile=f"{key}:v1"))


def test_deactivated_version_is_not_used_for_new_jobs(engine, driver):
    key = _profile(driver, version="v1")
    _profile(driver, key=key, version="v2", is_active=False)
    with driver.read() as tx:
        v1 = tx.profile(key, "v1")["profile_id"]
    job_id = engine.enqueue(NewJob("debug.sleep", profile=key))
    assert job_row(driver, job_id)["profile_id"] == v1
    # Seed 000: inactive versions exist "to prevent new jobs from using them".
    with pytest.raises(InvalidRequest):
        engine.enqueue(NewJob("debug.sleep", profile=f"{key}:v2"))


def test_default_profile_is_the_job_type_with_dashes(engine, driver):
    job_id = engine.enqueue(NewJob("debug.sleep"))
    with driver.read() as tx:
        expected = tx.profile("debug-sleep")["profile_id"]
    assert job_row(driver, job_id)["profile_id"] == expected


def test_estimated_credits(engine, driver):
    cases = [
        (0, 0, 0, 0),
        (5, 0, 50 * 1_048_576, 5),
        (5, 3, 10 * 1_048_576, 35),
        (1, 3, int(2.4 * 1_048_576), 9),  # 1 + 7.2, rounded up
        (2, 10, 1_048_576 // 2, 7),  # 2 + 5.0
    ]
    for base, per_mb, size, expected in cases:
        key = _profile(driver, credit_cost_base=base, credit_cost_per_mb=per_mb)
        job_id = engine.enqueue(NewJob("debug.sleep", profile=key, input_size_bytes=size))
        row = job_row(driver, job_id)
        assert row["estimated_credits"] == expected, (base, per_mb, size)
        assert row["actual_credits"] is None


@pytest.mark.parametrize(
    "job_type",
    [
        "image.thumbnail",
        "image.compress",
        "pdf.preview",
        "storage.dedup_check",
        "security.virus_scan",
        "debug.copy",
    ],
)
def test_a_job_type_that_reads_an_input_needs_one(engine: Engine, job_type: str) -> None:
    before = _count_jobs(engine)
    with pytest.raises(InvalidRequest, match="needs an input object"):
        engine.enqueue(NewJob(job_type))
    assert _count_jobs(engine) == before


@pytest.mark.parametrize("project", ["", "x" * 65, "tab\there"])
def test_a_job_needs_a_project_id_like_a_token_or_a_budget(engine: Engine, project: str) -> None:
    """The CLI's --project '' made a job of no project (tokens and budgets refused it)."""
    before = _count_jobs(engine)
    with pytest.raises(InvalidRequest, match="a project id is 1 to 64 printable characters"):
        engine.enqueue(NewJob("debug.noop", project_id=project))
    assert _count_jobs(engine) == before

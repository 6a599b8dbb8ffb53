"""Credits: estimates at enqueue, budgets (race-free), actual credits at completion,
and the input facts a completed job reports about its input object."""

from __future__ import annotations

import io
import os
import threading
import uuid
from typing import Any

import pytest

from hypermedia.db.driver import Driver
from hypermedia.errors import InvalidRequest
from hypermedia.queue import enqueue as enqueue_module
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import NewJob
from hypermedia.queue.profiles import Credits, Prices, Profiles

from ._helpers import W1, claim_one, done, failed, job_row, race, thumb

MB = 1_048_576


def _profile(engine: Engine, base=0, per_mb=0, per_page=0, per_minute=0) -> str:
    key = f"c-{uuid.uuid4().hex[:12]}"
    Profiles(engine).create(
        key, "debug.sleep", {}, credits=Prices(base, per_mb, per_page, per_minute)
    )
    return key


def _object(storage: Any, driver: Driver, size: int, **facts: Any) -> int:
    oid = storage.put(io.BytesIO(os.urandom(size)))["object_id"]
    if facts:
        with driver.tx() as tx:
            assert tx.set_object_facts(oid, facts)
    return int(oid)


def _estimate(engine: Engine, key: str, **kw: Any) -> int:
    job_id = engine.enqueue(NewJob("debug.sleep", profile=key, **kw))
    return int(engine.get(job_id)["estimated_credits"])


def _complete(engine: Engine, job_id: int, *, settle: bool = False, **kw: Any) -> dict:
    got, attempt = claim_one(engine)
    assert got == job_id
    res = done(job_id, attempt, **kw)
    # flush: PostgreSQL's optimistic fast path for results without outputs;
    # settle: one transaction under locks (every database).
    accepted = engine.settle(W1, [res]) if settle else engine.flush(W1, [], [res])
    assert accepted == {job_id}
    return engine.get(job_id)


# -- estimates ---------------------------------------------------------------------------


def test_estimate_from_base_size_pages_and_minutes(engine, driver, storage):
    key = _profile(engine, base=2, per_mb=3, per_page=5, per_minute=7)
    known = _object(storage, driver, MB + MB // 2, pages=4, duration_ms=90_000)
    unknown = _object(storage, driver, MB + MB // 2)
    # 2 + 3·1.5 + 5·4 + 7·1.5 = 37
    assert _estimate(engine, key, object_id=known) == 37
    # Pages unknown count as 1, minutes as 0: 2 + 4.5 + 5 = 11.5, rounded up.
    assert _estimate(engine, key, object_id=unknown) == 12
    # Without an object: the size given, 1 page.
    assert _estimate(engine, key, input_size_bytes=2 * MB) == 2 + 6 + 5


def test_a_pdf_job_is_estimated_for_the_pages_it_renders(engine, driver, storage):
    """Not the whole document: the first page of 5,000 was held as 5,000 pages
    against the budget (refused under a small one) and charged as 1."""
    key = f"c-{uuid.uuid4().hex[:12]}"
    Profiles(engine).create(key, "pdf.preview", {}, credits=Prices(1, 0, 1, 0))

    def estimate(object_id: int, **params: int) -> int:
        job_id = engine.enqueue(NewJob("pdf.preview", params, profile=key, object_id=object_id))
        return int(engine.get(job_id)["estimated_credits"])

    long_doc = _object(storage, driver, 1000, pages=5000)
    assert estimate(long_doc) == 1 + 1  # the profile's range: page 1
    assert estimate(long_doc, first_page=3, last_page=12) == 1 + 10
    short = _object(storage, driver, 1000, pages=4)
    assert estimate(short, first_page=3, last_page=12) == 1 + 2  # clamped to the document
    # Pages not known yet: the range asked for, an upper bound.
    assert estimate(_object(storage, driver, 1000), first_page=1, last_page=8) == 1 + 8


@pytest.mark.parametrize(
    ("base", "per_mb", "size", "expected"),
    [
        (0, 0, 0, 0),
        (5, 0, 50 * MB, 5),
        (5, 3, 10 * MB, 35),
        (1, 3, int(2.4 * MB), 9),  # 1 + 7.2 → 8.2, rounded up
        (2, 10, MB // 2, 7),  # exact: not rounded up past 7
        (0, 1, 1, 1),  # a byte is a started MB
        (0, 1_000_000, 2147 * MB, 2_147_000_000),  # near the most one job may cost
    ],
)
def test_estimates_round_up_to_whole_credits(engine, base, per_mb, size, expected):
    key = _profile(engine, base=base, per_mb=per_mb)
    assert _estimate(engine, key, input_size_bytes=size) == expected


def test_an_estimate_past_what_one_job_may_cost_is_refused(engine):
    """It was stored capped at 2,147,483,647 (the INT column), so a job priced
    past a budget of 2.5e9 fitted in it."""
    key = _profile(engine, per_mb=1_000_000)
    with pytest.raises(InvalidRequest, match="priced at 5120000000 credits, over the"):
        _estimate(engine, key, input_size_bytes=5 * 1024**3)


# -- budgets -----------------------------------------------------------------------------


def test_enqueue_past_the_budget_is_refused_clearly(engine, driver):
    credits, key = Credits(engine), _profile(engine, base=4)
    credits.set_budget("p1", 10)
    a = engine.enqueue(NewJob("debug.sleep", profile=key, project_id="p1"))
    engine.enqueue(NewJob("debug.sleep", profile=key, project_id="p1"))
    msg = "credit budget exceeded: 8 of 10 used, this request needs 4"
    with pytest.raises(InvalidRequest, match=msg):
        engine.enqueue(NewJob("debug.sleep", profile=key, project_id="p1"))
    # A batch is refused whole: nothing of it is stored.
    with pytest.raises(InvalidRequest, match="this request needs 8"):
        engine.enqueue_many(
            [NewJob("debug.noop", project_id="p1")]
            + [NewJob("debug.sleep", profile=key, project_id="p1")] * 2
        )
    assert len(engine.list(project_id="p1")) == 2
    # Free jobs are never refused; other projects and projects without a budget run.
    assert engine.enqueue(NewJob("debug.noop", project_id="p1"))
    assert engine.enqueue(NewJob("debug.sleep", profile=key, project_id="p2"))
    # A cancelled job gives its estimate back.
    engine.cancel(a)
    assert engine.enqueue(NewJob("debug.sleep", profile=key, project_id="p1"))
    assert credits.show("p1") == [{"project_id": "p1", "budget": 10, "used": 8, "remaining": 2}]
    credits.set_budget("p1", None)
    assert credits.show("p1")[0]["remaining"] is None
    assert engine.enqueue(NewJob("debug.sleep", profile=key, project_id="p1"))


def test_a_batch_written_in_chunks_is_refused_whole(engine):
    """A batch of several chunks (``jobs submit --count 1500``) is one check
    of the whole: past the budget none of it is stored.  It used to be a
    transaction per 1000 jobs: the first ones stayed queued behind the error."""
    credits, key = Credits(engine), _profile(engine, base=1)
    project = f"chunks-{uuid.uuid4().hex[:8]}"
    credits.set_budget(project, 25)
    job = NewJob("debug.sleep", profile=key, project_id=project)
    engine.enqueue(job)
    # Refused in its last chunk, the figure is the whole request's.
    msg = "credit budget exceeded: 1 of 25 used, this request needs 30$"
    with pytest.raises(InvalidRequest, match=msg):
        engine.enqueue_many([job] * 30, chunk=10)
    # Refused before its last chunk, it is not: "or more" (it read as exact,
    # and a budget raised to it was refused again).
    msg = "credit budget exceeded: 1 of 25 used, this request needs 30 or more"
    with pytest.raises(InvalidRequest, match=msg):
        engine.enqueue_many([job] * 40, chunk=30)
    assert len(engine.list(project_id=project)) == 1
    ids = engine.enqueue_many([job] * 24, chunk=10)
    assert len(set(ids)) == 24
    assert credits.show(project)[0]["used"] == 25
    with pytest.raises(InvalidRequest, match="25 of 25 used, this request needs 1"):
        engine.enqueue_many([NewJob("debug.noop", project_id=project), job], chunk=1)


def test_credit_use_counts_actual_of_completed_and_estimates_of_live_jobs(engine, driver):
    credits, key = Credits(engine), _profile(engine, base=3)
    completed = engine.enqueue(NewJob("debug.sleep", profile=key, project_id="u"))
    _complete(engine, completed, actual_credits=1)
    failed_job = engine.enqueue(NewJob("debug.sleep", profile=key, project_id="u"))
    got, attempt = claim_one(engine)
    engine.settle(W1, [failed(got, attempt, "CORRUPT_INPUT")])
    assert job_row(driver, failed_job)["status"] == "failed"
    engine.enqueue(NewJob("debug.sleep", profile=key, project_id="u"))  # queued: 3
    engine.enqueue(NewJob("debug.sleep", profile=key, project_id="u", hold=True))  # created: 3
    engine.enqueue(NewJob("debug.sleep", profile=key, project_id="other"))
    assert credits.show("u") == [{"project_id": "u", "budget": None, "used": 7, "remaining": None}]
    credits.set_budget("empty", 5)
    everyone = {r["project_id"]: r for r in credits.show()}
    assert everyone["u"]["used"] == 7 and everyone["other"]["used"] == 3
    assert everyone["empty"] == {"project_id": "empty", "budget": 5, "used": 0, "remaining": 5}
    # Lowering a budget under what is used refuses new work and cancels nothing.
    credits.set_budget("u", 2)
    assert credits.show("u")[0]["remaining"] == -5
    with pytest.raises(InvalidRequest, match="credit budget exceeded: 7 of 2 used"):
        engine.enqueue(NewJob("debug.sleep", profile=key, project_id="u"))


def test_bad_budgets_are_refused(engine):
    for project, value in (("p", -1), ("", 5), ("x" * 65, 5)):
        with pytest.raises(InvalidRequest):
            Credits(engine).set_budget(project, value)


def test_concurrent_enqueues_never_overrun_the_budget(engine, database_url, settings, clock):
    """Racing clients of one project: exactly as many jobs as the budget pays for."""
    key = _profile(engine, base=3)
    Credits(engine).set_budget("race", 10)
    got = race(
        database_url,
        8,
        lambda drv, i: Engine(drv, settings, clock=clock).enqueue(
            NewJob("debug.sleep", profile=key, project_id="race")
        ),
    )
    made = [g for g in got if isinstance(g, int)]
    refused = [g for g in got if isinstance(g, InvalidRequest)]
    assert (len(made), len(refused)) == (3, 5), got
    assert all("credit budget exceeded" in str(r) for r in refused)
    assert Credits(engine).show("race")[0]["used"] == 9


def test_concurrent_first_budgets_of_a_project_are_one_row(engine, database_url, settings):
    # Racing first writes of one new row: on InnoDB two losers of the insert
    # deadlock on its key; the victim's transaction is run again.
    for round_ in range(5):
        project = f"first-{round_}"
        got = race(
            database_url,
            6,
            lambda drv, i, project=project: Credits(Engine(drv, settings)).set_budget(
                project, 100 + i
            ),
        )
        assert all(isinstance(g, dict) for g in got), got
        (row,) = Credits(engine).show(project)
        assert row["budget"] in {100 + i for i in range(6)}


# -- actual credits ------------------------------------------------------------------------


@pytest.mark.parametrize("settle", [False, True], ids=["flush", "settle"])
def test_actual_credits_from_what_was_processed(engine, driver, storage, settle):
    key = _profile(engine, base=1, per_mb=1, per_page=2, per_minute=3)
    oid = _object(storage, driver, 2 * MB, pages=10)

    def run(**kw: Any) -> dict:
        job_id = engine.enqueue(NewJob("debug.sleep", profile=key, object_id=oid))
        assert engine.get(job_id)["estimated_credits"] == 1 + 2 + 20
        return _complete(engine, job_id, settle=settle, **kw)

    # Fewer pages than estimated, and minutes: 1 + 2 (input MB) + 2·3 + 3·1.5 = 13.5 → 14.
    assert run(result={"usage": {"pages": 3, "minutes": 1.5}})["actual_credits"] == 14
    # Every unit reported: 1 + 0.5 + 0 + 0 → 2.
    usage = {"mb": 0.5, "pages": 0, "minutes": 0}
    assert run(result={"usage": usage})["actual_credits"] == 2
    # Nothing reported: what the estimate assumed.
    assert run(result={"slept_ms": 0})["actual_credits"] == 23
    # Nonsense is ignored, unit by unit.
    junk = {"pages": -4, "minutes": "lots", "mb": 1e13}
    assert run(result={"usage": junk})["actual_credits"] == 23
    # An explicit figure from the worker wins.
    assert run(actual_credits=5)["actual_credits"] == 5
    # With outputs (always the careful path): the same pricing.
    with_output = run(result={"usage": {"pages": 1}}, outputs=[thumb()])
    assert with_output["actual_credits"] == 1 + 2 + 2


def test_flat_profiles_charge_their_base(engine):
    key = _profile(engine, base=4)
    job_id = engine.enqueue(NewJob("debug.sleep", profile=key, input_size_bytes=50 * MB))
    assert _complete(engine, job_id, result={"usage": {"pages": 99}})["actual_credits"] == 4
    free = engine.enqueue(NewJob("debug.noop"))
    assert _complete(engine, free)["actual_credits"] == 0


def test_failed_jobs_are_not_charged(engine):
    key = _profile(engine, base=4)
    job_id = engine.enqueue(NewJob("debug.sleep", profile=key, max_attempts=1))
    got, attempt = claim_one(engine)
    engine.flush(W1, [], [failed(got, attempt, "CRASHED", result={"usage": {"pages": 1}})])
    row = engine.get(job_id)
    assert (row["status"], row["actual_credits"]) == ("failed", None)


# -- input facts -----------------------------------------------------------------------------


@pytest.mark.parametrize("settle", [False, True], ids=["flush", "settle"])
def test_input_facts_update_the_input_object(engine, driver, storage, settle):
    key = _profile(engine, per_page=2)
    oid = _object(storage, driver, 1000)
    job_id = engine.enqueue(NewJob("debug.sleep", profile=key, object_id=oid))
    facts = {"pages": 7, "duration_ms": 120_000, "width": 640, "height": 480}
    row = _complete(
        engine, job_id, settle=settle, result={"input_facts": {**facts, "checksum": "forged"}}
    )
    # No usage reported: the pages it found are what it processed.
    assert (row["estimated_credits"], row["actual_credits"]) == (2, 14)
    obj = storage.get(oid)
    assert {k: obj[k] for k in facts} == facts
    assert obj["checksum"].startswith("blake3:") and obj["checksum"] != "forged"
    # The next estimate knows the pages.
    assert _estimate(engine, key, object_id=oid) == 14


def test_bad_input_facts_are_ignored_and_failures_report_none(engine, driver, storage):
    oid = _object(storage, driver, 1000, pages=3)
    job_id = engine.enqueue(NewJob("debug.sleep", object_id=oid))
    bad = {"pages": -1, "duration_ms": "long", "width": True, "height": 2**40}
    _complete(engine, job_id, result={"input_facts": bad})
    obj = storage.get(oid)
    assert (obj["pages"], obj["duration_ms"], obj["width"], obj["height"]) == (3, None, 0, 0)

    again = engine.enqueue(NewJob("debug.sleep", object_id=oid, max_attempts=1))
    got, attempt = claim_one(engine)
    assert got == again
    res = failed(again, attempt, "CORRUPT_INPUT", result={"input_facts": {"pages": 99}})
    engine.settle(W1, [res])
    assert storage.get(oid)["pages"] == 3


def test_credits_of_a_project_id_no_project_can_have_are_refused(engine):
    """`credits show --project ''` answered "unlimited, 0 used", where
    `set-budget` refuses the same id."""
    credits = Credits(engine)
    for bad in ("", "x" * 300, "a\nb"):
        with pytest.raises(InvalidRequest, match="a project id is 1 to 64 printable characters"):
            credits.show(bad)


def test_a_project_with_only_free_or_failed_jobs_is_known(engine):
    """`credits set-budget` warned "a typo?" of a project whose jobs cost nothing."""
    credits = Credits(engine)
    assert not credits.is_known("free-only")
    engine.enqueue(NewJob("debug.noop", project_id="free-only"))
    assert credits.is_known("free-only")


def test_a_project_with_only_stored_objects_is_known(engine, storage):
    """Uploaded first, budgeted next: `credits set-budget` warned "a typo?"
    of a project holding the objects just uploaded."""
    credits = Credits(engine)
    assert not credits.is_known("uploads-only")
    storage.put(io.BytesIO(b"bytes"), filename="a.txt", project_id="uploads-only")
    assert credits.is_known("uploads-only")


def test_a_repeat_that_waited_for_the_budget_gets_the_first_job(
    engine, database_url, settings, clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sends of one request (one Idempotency-Key) at once, the budget
    room for one job: the second looked its key up before the first had
    committed, then waited for the budget's lock, and the budget, counting the
    first's job, refused it: "credit budget exceeded" to a repeat."""
    key = _profile(engine, base=3)
    Credits(engine).set_budget("idem", 3)
    inside, go = threading.Event(), threading.Event()
    real = enqueue_module.check_budgets

    def held_open(*args: Any, **kw: Any) -> None:
        real(*args, **kw)  # the budget row locked, the job not yet committed
        if threading.current_thread().name == "first":
            inside.set()
            go.wait(30)

    monkeypatch.setattr(enqueue_module, "check_budgets", held_open)
    got: dict[str, Any] = {}

    def send(name: str) -> None:
        drv = Driver(database_url)
        try:
            job = NewJob("debug.sleep", profile=key, project_id="idem", idempotency_key="k1")
            got[name] = Engine(drv, settings, clock=clock).enqueue(job)
        except Exception as exc:
            got[name] = exc
        finally:
            drv.dispose()

    first = threading.Thread(target=send, args=("first",), name="first")
    first.start()
    assert inside.wait(30)
    second = threading.Thread(target=send, args=("second",), name="second")
    second.start()
    second.join(1)  # past its lookup, waiting for the lock (SQLite: for the transaction)
    go.set()
    first.join(30)
    second.join(30)
    assert isinstance(got["first"], int) and got["second"] == got["first"], got
    assert len(engine.list(project_id="idem")) == 1


def test_every_project_is_listed_one_with_tokens_only_too(engine):
    """`credits show` listed projects with a budget or credits used: one with
    tokens only (its first job not made yet) was missing."""
    from hypermedia.auth.tokens import Tokens

    Tokens(engine.db).create("tokens-only", "jobs:read")
    engine.enqueue(NewJob("debug.noop", project_id="with-jobs"))
    rows = {r["project_id"]: r for r in Credits(engine).show()}
    assert {"tokens-only", "with-jobs"} <= set(rows)
    assert (rows["tokens-only"]["used"], rows["tokens-only"]["budget"]) == (0, None)

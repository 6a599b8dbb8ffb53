"""A result the database refuses must not wedge the worker's flusher.

PostgreSQL stores no NUL character in a JSON value; the worker scrubs them
from what pipelines return, but whatever else a database refuses for good
(every time it is sent) has to end its job, not stall every other result of
the worker behind it for ever.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import pytest

from hypermedia.db.driver import Driver
from hypermedia.errors import ValueRefused
from hypermedia.queue import states
from hypermedia.queue.engine import Engine
from hypermedia.worker.flusher import Flusher

from ._helpers import W1, done, job_row, new_job


def test_a_refused_result_fails_its_job_and_the_others_complete(
    engine: Engine, driver: Driver
) -> None:
    ids = [new_job(engine, max_attempts=1) for _ in range(3)]
    claimed = {c.job_id: c.attempt for c in engine.claim(W1, ["bulk"], 3)}
    assert sorted(claimed) == ids
    seen: dict[int, bool] = {}
    f = Flusher(engine, W1, lambda r, ok: seen.__setitem__(r.job_id, ok))
    f.start()
    poison = {"text": "a\x00b"}
    for j in ids:
        f.finished(done(j, claimed[j], result=poison if j == ids[1] else {"n": j}))
    assert f.close(20), "the flusher did not finish its work"
    assert seen == dict.fromkeys(ids, True)
    for j in (ids[0], ids[2]):
        row = job_row(driver, j)
        assert (row["status"], row["result"]) == ("completed", {"n": j})
    row = job_row(driver, ids[1])
    if driver.name == "postgresql":
        assert (row["status"], row["error_code"]) == ("failed", "INTERNAL")
        assert "could not be recorded" in row["safe_reason"]
    else:  # stored as it came, or refused the same way: never stuck
        assert (row["status"], row["result"]) in [("completed", poison), ("failed", None)]


def test_a_value_the_database_refuses_is_the_callers_mistake(
    engine: Engine, driver: Driver
) -> None:
    """DataError (here a NUL, which only PostgreSQL refuses) is a ValueRefused,
    an InvalidRequest (a 422 at the API), not an internal error."""
    job_id = new_job(engine)
    refused: AbstractContextManager[object] = (
        pytest.raises(ValueRefused) if driver.name == "postgresql" else nullcontext()
    )
    with refused, driver.tx() as tx:
        tx.update_job(job_id, states.STATUSES, {"safe_reason": "a\x00b"})
    assert job_row(driver, job_id)["safe_reason"] in (None, "a\x00b")

"""Failing attempts in a real worker, on every database: timeout, crash, OOM,
permanent and retryable error codes.  The worker must survive each of them."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from hypermedia.db.driver import Driver
from hypermedia.errors import ERROR_POLICY
from hypermedia.queue.engine import Engine
from tests.harness import FAST
from tests.integration._procs import (
    Procs,
    attempts,
    events,
    eventually,
    gone,
    run_one,
    submit,
    wait_job,
)

pytestmark = pytest.mark.timeout(90)


def test_timeout_kills_the_attempt_and_the_worker_carries_on(
    driver: Driver, live: Engine, procs: Procs
) -> None:
    w = procs.worker("--concurrency", "1", "--no-maintenance")
    t0 = time.monotonic()
    out = procs.cli(
        "jobs",
        "submit",
        "debug.sleep",
        "--params",
        '{"ms": 10000}',
        "--timeout",
        "1",
        "--max-attempts",
        "1",
        "--json",
    )
    (job_id,) = json.loads(out)["job_ids"]
    row = wait_job(driver, job_id, timeout=15)
    waited = time.monotonic() - t0

    assert row["status"] == "failed"
    assert row["outcome"] == "timeout"
    assert row["error_code"] == "TIMEOUT"
    assert row["category"] == "timeout"
    (a,) = attempts(driver, job_id)
    assert a["status"] == "timeout"
    assert a["error_code"] == "TIMEOUT"
    # Killed at its 1 s deadline, not after the 10 s it asked to sleep.
    assert 1000 <= a["duration_ms"] < 4000, a["duration_ms"]
    assert (row["completed_at"] - row["started_at"]).total_seconds() < 4
    assert waited < 10

    assert w.alive()
    assert run_one(driver, live, {"ms": 0})["slept_ms"] == 0


def test_crash_is_retried_then_fails_with_crashed(
    driver: Driver, live: Engine, procs: Procs
) -> None:
    w = procs.worker("--concurrency", "1")  # maintenance on: its promoter ends retry_wait
    job_id = submit(live, {"crash": True}, max_attempts=2)
    row = wait_job(driver, job_id, timeout=30)

    assert row["status"] == "failed"
    assert row["error_code"] == "CRASHED"
    assert row["outcome"] == "failed"
    assert row["attempt_count"] == 2
    tries = attempts(driver, job_id)
    assert [a["status"] for a in tries] == ["crashed", "crashed"]
    assert {a["error_code"] for a in tries} == {"CRASHED"}
    assert all("SIGKILL" in a["error_message"] for a in tries), tries
    # A start folded into its result shows as claimed → retry_wait: both count.
    moves = [(e["from_status"], e["to_status"]) for e in events(driver, job_id)]
    assert [m for m in moves if m[1] == "retry_wait"] in (
        [("processing", "retry_wait")],
        [("claimed", "retry_wait")],
    )
    assert ("retry_wait", "queued") in moves
    # Said in the worker's log too (a child killed on the spot prints nothing).
    said = w.log.read_text()
    for n in (1, 2):
        assert f"job {job_id} attempt {n}: the processing child died (SIGKILL)" in said

    assert w.alive()
    assert run_one(driver, live, {"ms": 0})["slept_ms"] == 0


def test_oom_is_retried_with_twice_the_memory_in_a_new_child(
    driver: Driver, live: Engine, procs: Procs
) -> None:
    w = procs.worker("--concurrency", "1", HYPERMEDIA_CHILD_MEMORY_MB="256")
    warm = run_one(driver, live, {"ms": 0})["pid"]

    # 400 MB does not fit under a 256 MB address-space limit, but does under
    # 512 MB: the second attempt only succeeds if the limit really doubled.
    job_id = submit(live, {"alloc_mb": 400}, max_attempts=3)
    row = wait_job(driver, job_id, timeout=30)

    first, second = attempts(driver, job_id)
    assert first["status"] == "failed"
    assert first["error_code"] == "OOM"
    assert second["status"] == "completed"
    assert row["status"] == "completed"
    assert row["memory_limit_mb"] == 512
    assert 400 <= second["peak_memory_mb"] < 512
    # The child that hit its limit was killed, never reused.
    assert row["result"]["pid"] != warm
    eventually(lambda: gone(warm), 5, "the out-of-memory child is gone")
    procs.note_children(w)
    assert w.alive()


def test_no_attempt_gets_more_memory_than_its_workers_ceiling(
    driver: Driver, live: Engine, procs: Procs
) -> None:
    """A job whose OOM retries grew its limit on a bigger machine runs under
    this worker's ceiling: 400 MB fits under the job's 4 GB, not under 384."""
    procs.worker(
        "--concurrency", "1", HYPERMEDIA_CHILD_MEMORY_MB="256", HYPERMEDIA_CHILD_MEMORY_MAX_MB="384"
    )
    job_id = submit(live, {"alloc_mb": 400}, max_attempts=3, hold=True)
    with driver.tx() as tx:
        q = sa.text("UPDATE processing_jobs SET memory_limit_mb = 4096 WHERE job_id = :j")
        tx.conn.execute(q, {"j": job_id})
    live.release(job_id)
    row = wait_job(driver, job_id, timeout=30)
    assert (row["status"], row["error_code"]) == ("failed", "OOM")
    messages = " ".join(e["message"] or "" for e in events(driver, job_id))
    assert "it had 384 MB, the most an attempt may get" in messages
    assert len(attempts(driver, job_id)) == 1


def test_permanent_code_fails_at_once_retryable_code_backs_off(
    driver: Driver, live: Engine, procs: Procs
) -> None:
    w = procs.worker("--concurrency", "2")  # maintenance on: its promoter ends retry_wait
    permanent = submit(live, {"fail": "CORRUPT_INPUT"}, max_attempts=3)
    transient = submit(live, {"fail": "STORAGE_UNAVAILABLE"}, max_attempts=3)

    row = wait_job(driver, permanent, timeout=30)
    assert row["status"] == "failed"
    assert row["attempt_count"] == 1
    assert row["error_code"] == "CORRUPT_INPUT"
    assert row["category"] == "invalid_input"
    assert not row["retryable"]
    assert [a["status"] for a in attempts(driver, permanent)] == ["failed"]

    row = wait_job(driver, transient, timeout=30)
    assert row["status"] == "failed"
    assert row["attempt_count"] == 3
    assert row["error_code"] == "STORAGE_UNAVAILABLE"
    assert row["category"] == "storage"
    tries = attempts(driver, transient)
    assert [(a["status"], a["error_code"]) for a in tries] == [
        ("failed", "STORAGE_UNAVAILABLE")
    ] * 3
    moves = [(e["from_status"], e["to_status"]) for e in events(driver, transient)]
    # claimed → retry_wait when the worker folded the start into the result.
    into_wait = [src for src, dst in moves if dst == "retry_wait"]
    assert len(into_wait) == 2 and set(into_wait) <= {"claimed", "processing"}, moves
    assert moves.count(("retry_wait", "queued")) == 2
    assert moves[-1][1] == "failed"

    # Backoff: attempt n waits between half and all of base * 2**(n-1)
    # (capped), and the next attempt was not claimed before that.
    base = float(FAST["HYPERMEDIA_BACKOFF_BASE_SECONDS"])
    base *= ERROR_POLICY["STORAGE_UNAVAILABLE"].backoff_factor
    cap = float(FAST["HYPERMEDIA_BACKOFF_MAX_SECONDS"])
    said = [
        float(m.group(1))
        for e in events(driver, transient)
        if (m := re.search(r"retry in ([0-9.]+)s", e["message"]))
    ]
    assert len(said) == 2, said
    for n in (1, 2):
        step = min(cap, base * 2 ** (n - 1))
        assert step / 2 - 0.05 <= said[n - 1] <= step + 0.05, (n, said)
        gap = (tries[n]["started_at"] - tries[n - 1]["finished_at"]).total_seconds()
        assert step / 2 <= gap < step + 5, (n, gap)
    # The last retry's available_at is still on the row (failing keeps it).
    wait = (row["available_at"] - tries[1]["finished_at"]).total_seconds()
    step = min(cap, 2 * base)
    assert step / 2 - 0.001 <= wait <= step + 0.001, wait
    assert tries[2]["started_at"] >= row["available_at"]
    assert w.alive()


def test_a_result_that_is_not_json_fails_the_job_instead_of_wedging_it(
    driver: Driver, live: Engine, procs: Procs
) -> None:
    """NaN is no JSON: the child refuses to send it, so the settling
    transaction is not retried for ever."""
    w = procs.worker("--concurrency", "1")
    bad = submit(live, {"nan": True}, max_attempts=3)
    row = wait_job(driver, bad, timeout=30)
    assert (row["status"], row["error_code"], row["attempt_count"]) == (
        "failed",
        "INVALID_OUTPUT",
        1,
    )
    assert "not plain JSON" in row["safe_reason"]
    assert row["result"] is None
    assert w.alive()
    assert run_one(driver, live, {"ms": 1})["slept_ms"] == 1


@pytest.mark.parametrize("forged", ["pickle", "huge", "junk", "warm"])
def test_a_child_that_forges_its_report_is_killed_and_runs_nothing_in_the_worker(
    driver: Driver, live: Engine, procs: Procs, tmp_path: Path, forged: str
) -> None:
    """A decoder exploited by a hostile file runs code in the child; that code
    must get no further.  A pickled report would run in the worker (which holds
    the database and storage credentials), a 3 GiB frame header would make it
    buffer 3 GiB, and a report of the wrong shape would break its slot."""
    marker = tmp_path / "unpickled"
    w = procs.worker("--concurrency", "1", "--no-maintenance")
    bad = submit(live, {"forge": forged, "marker": str(marker)}, max_attempts=1)
    row = wait_job(driver, bad, timeout=30)
    assert (row["status"], row["error_code"]) == ("failed", "CRASHED")
    assert "malformed report" in row["safe_reason"]
    (a,) = attempts(driver, bad)
    assert a["status"] == "crashed"
    assert a["duration_ms"] < 4000  # killed at the forgery, not after its 5 s sleep
    assert not marker.exists()
    assert w.alive()
    assert run_one(driver, live, {"ms": 1})["slept_ms"] == 1


def test_an_attempt_writing_past_its_file_limit_fails_and_the_worker_carries_on(
    driver: Driver, live: Engine, procs: Procs
) -> None:
    """RLIMIT_FSIZE: a hostile input must not fill the disk the database is on."""
    w = procs.worker("--concurrency", "1", HYPERMEDIA_CHILD_MAX_FILE_MB="2")
    big = submit(live, {"write_mb": 5}, max_attempts=3)
    row = wait_job(driver, big, timeout=30)
    assert (row["status"], row["error_code"], row["attempt_count"]) == (
        "failed",
        "LIMIT_EXCEEDED",
        1,
    )
    assert "over its 2 MB limit" in row["safe_reason"]
    assert w.alive()
    assert run_one(driver, live, {"write_mb": 1})["slept_ms"] == 0


def test_a_native_abort_near_the_memory_limit_is_an_oom(
    driver: Driver, live: Engine, procs: Procs
) -> None:
    """A C/C++ library whose allocation fails under RLIMIT_AS aborts the child
    (pdfium inflating a huge stream does) instead of raising MemoryError: an
    abort after the attempt's address space grew through most of its room is
    an OOM (retried with twice the memory); one without that growth is a crash."""
    w = procs.worker("--concurrency", "1", "--no-maintenance", HYPERMEDIA_CHILD_MEMORY_MB="512")
    run_one(driver, live, {"ms": 0})  # a warm child, its libraries loaded
    near = submit(live, {"abort": True, "alloc_mb": 400, "ms": 400}, max_attempts=1)
    bare = submit(live, {"abort": True, "ms": 400}, max_attempts=1)
    # Filled and aborted between two samples of its address space: its
    # resident peak tells (it was "CRASHED (SIGABRT)" at 8 GB of a PDF).
    quick = submit(live, {"abort": True, "alloc_mb": 400, "ms": 0}, max_attempts=1)
    # One allocation refused whole, memory far from the limit: its library
    # said so before the abort (a 62-byte GIF's 400 MB frame was CRASHED).
    refused = submit(live, {"abort": True, "refused_mb": 400}, max_attempts=1)
    near_row, bare_row = wait_job(driver, near, timeout=30), wait_job(driver, bare, timeout=30)
    assert wait_job(driver, quick, timeout=30)["error_code"] == "OOM"
    assert wait_job(driver, refused, timeout=30)["error_code"] == "OOM"

    assert (near_row["status"], near_row["error_code"]) == ("failed", "OOM")
    (a,) = attempts(driver, near)
    assert a["error_message"] == "the attempt ran out of memory in a native library"
    assert (bare_row["status"], bare_row["error_code"]) == ("failed", "CRASHED")
    (b,) = attempts(driver, bare)
    assert "SIGABRT" in b["error_message"]
    assert w.alive()


def test_an_attempt_filling_its_scratch_folder_file_by_file_is_stopped(
    driver: Driver, live: Engine, procs: Procs
) -> None:
    """Each file under the file limit, their total over the scratch limit: it
    wrote on until its timeout, the disk the database is on filling."""
    w = procs.worker("--concurrency", "1", HYPERMEDIA_CHILD_MAX_SCRATCH_MB="3")
    big = submit(live, {"spill_mb": 5, "ms": 20_000}, max_attempts=3)
    row = wait_job(driver, big, timeout=30)
    assert (row["status"], row["error_code"], row["attempt_count"]) == (
        "failed",
        "LIMIT_EXCEEDED",
        1,
    )
    assert "its 3 MB limit to its scratch folder" in row["safe_reason"]
    (a,) = attempts(driver, big)
    assert a["duration_ms"] < 10_000  # stopped at a check, not at the end of its 20 s
    assert w.alive()
    assert run_one(driver, live, {"spill_mb": 2})["slept_ms"] == 0  # under the limit

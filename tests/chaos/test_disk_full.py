"""A full disk under the embedded default (SQLite, the pool and the scratch
folders all in HYPERMEDIA_HOME), with real processes on a real small tmpfs.

While the disk is full, attempts fail with STORAGE_UNAVAILABLE and wait in
``retry_wait``; the worker stays up.  Once space is freed, every job completes
exactly once, with one output whose bytes are the input's.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hypermedia.db.driver import Driver
from tests.harness import (
    attempts,
    checksum_of,
    events,
    fill_disk,
    hypermedia,
    query,
    small_tmpfs,
    spawn,
    stop,
    wait_for,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="tmpfs mounts"),
]

INPUT = os.urandom(8 << 20)  # no room for its copy once the disk is full
JOBS = 3


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "disk", 128) as disk:
        yield disk


def _wait(what: str, check, timeout: float, log: Path) -> None:  # type: ignore[no-untyped-def]
    try:
        wait_for(check, timeout, 0.2, what)
    except AssertionError as exc:
        text = log.read_text()
        pytest.fail(f"{exc}; worker log:\n{text[:3000]}\n…\n{text[-2000:]}")


def test_a_full_disk_holds_jobs_back_and_loses_none(small_disk: Path, tmp_path: Path) -> None:
    home = small_disk / "home"
    url = f"sqlite:///{home / 'hypermedia.db'}"
    home.mkdir()
    assert hypermedia("db", "upgrade", url=url, home=home).returncode == 0
    src = tmp_path / "input.bin"
    src.write_bytes(INPUT)
    put = hypermedia("objects", "put", str(src), "--json", url=url, home=home)
    assert put.returncode == 0, put.stderr
    object_id = json.loads(put.stdout)["object_id"]
    submit = hypermedia(
        "jobs", "submit", "debug.copy", "--object", str(object_id), "--count", str(JOBS),
        "--max-attempts", "100", "--json", url=url, home=home,
    )  # fmt: skip
    assert submit.returncode == 0, submit.stderr
    job_ids = [int(i) for i in json.loads(submit.stdout)["job_ids"]]
    # Room for the database's writes (its WAL grows to ~4 MiB between
    # checkpoints), not for a copy of the input.  While a copy fills the
    # rest, the worker's database writes fail too, and are retried.
    filler = fill_disk(small_disk, leave=6 << 20)
    assert os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize < len(INPUT)

    log = tmp_path / "worker.log"
    worker = spawn("worker", "--queues", "bulk", "--concurrency", "2", url=url, home=home, log=log)
    driver = Driver(url)
    try:

        def held_back() -> bool:
            # The worker then claims one job at a time, with pauses
            # (worker/outage.py): not every job need fail first.
            failed = query(
                url,
                "SELECT count(*) FROM job_attempts WHERE error_code = 'STORAGE_UNAVAILABLE'",
            )
            return failed[0][0] >= 2 and "the storage is away" in log.read_text()

        _wait("jobs to fail on the full disk and the worker to pause", held_back, 60, log)
        assert worker.poll() is None, log.read_text()[-3000:]
        rows = query(url, "SELECT status, safe_reason FROM processing_jobs")
        assert {r[0] for r in rows} <= {"retry_wait", "queued", "claimed", "processing"}, rows
        assert not any(r[0] == "completed" for r in rows)

        filler.unlink()

        def all_done() -> bool:
            rows = query(url, "SELECT status FROM processing_jobs")
            return all(r[0] == "completed" for r in rows)

        _wait("every job to complete once space is back", all_done, 90, log)
        assert worker.poll() is None
        for job_id in job_ids:
            tries = attempts(driver, job_id)
            assert [a["attempt_number"] for a in tries] == list(range(1, len(tries) + 1))
            assert [a["status"] for a in tries[:-1]] == ["failed"] * (len(tries) - 1)
            assert {a["error_code"] for a in tries[:-1]} <= {"STORAGE_UNAVAILABLE"}
            assert tries[-1]["status"] == "completed"
            ends = [e for e in events(driver, job_id) if e["to_status"] == "completed"]
            assert len(ends) == 1, ends
            outs = query(
                url,
                "SELECT o.checksum, o.size, o.state FROM job_outputs j "
                "JOIN objects o ON o.object_id = j.object_id WHERE j.job_id = :j",
                j=job_id,
            )
            assert [tuple(o) for o in outs] == [(checksum_of(INPUT), len(INPUT), "ready")]
        assert "Traceback" not in log.read_text()
    finally:
        assert stop(worker) == 0
        driver.dispose()

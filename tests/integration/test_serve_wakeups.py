"""``hypermedia serve`` on SQLite starts a job at once, wherever it was queued.

SQLite cannot push a notification.  The embedded service's workers share the
API's process and are woken by the commit itself; a CLI in another process
wakes them through the wake file beside the database (hypermedia/db/wakeups.py).
With a 30 s poll interval, each job here would otherwise wait for the worker's
next poll.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from tests.harness import http_json, hypermedia, start_serve, stop, wait_for


def test_a_job_submitted_to_the_api_starts_without_waiting_for_a_poll(tmp_path: Path) -> None:
    home = tmp_path / "embedded"
    server, base = start_serve(tmp_path, home, HYPERMEDIA_POLL_INTERVAL_SECONDS="30")
    try:
        token = (home / "admin-token").read_text().strip()
        time.sleep(1.5)  # past the worker's first claim: it now waits for its next poll
        for _ in range(2):  # the second after the worker went idle again
            t0 = time.monotonic()
            job = http_json(f"{base}/v1/jobs", {"job_type": "debug.noop"}, token)[1]

            def done(job_id: int = job["job_id"]) -> bool:
                return (
                    http_json(f"{base}/v1/jobs/{job_id}", token=token)[1]["status"] == "completed"
                )

            wait_for(done, 10, interval=0.05, what="the job completes")
            assert time.monotonic() - t0 < 5, "the job waited for the worker's poll"
            time.sleep(0.5)
    finally:
        assert stop(server, signal.SIGTERM) == 0, (tmp_path / "serve.log").read_text()[-2000:]


def test_a_job_submitted_from_another_process_starts_without_waiting_for_a_poll(
    tmp_path: Path,
) -> None:
    home = tmp_path / "embedded"
    server, _ = start_serve(tmp_path, home, HYPERMEDIA_POLL_INTERVAL_SECONDS="30")
    try:
        time.sleep(1.5)  # past the worker's first claim
        for _ in range(2):
            t0 = time.monotonic()
            out = hypermedia(
                "jobs", "submit", "debug.noop", "--wait", "--json", url="", home=home, timeout=20
            )
            assert out.returncode == 0, out.stderr
            assert json.loads(out.stdout)["jobs"][0]["status"] == "completed"
            # The CLI's own start-up is most of it; a missed wake-up costs up to 30 s.
            assert time.monotonic() - t0 < 10, "the job waited for the worker's poll"
    finally:
        assert stop(server, signal.SIGTERM) == 0, (tmp_path / "serve.log").read_text()[-2000:]

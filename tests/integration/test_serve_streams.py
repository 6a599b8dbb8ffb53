"""A server that stops ends its open event streams: a real ``serve``, a
real stream, SIGTERM."""

from __future__ import annotations

import http.client
import json
import signal
import time
from pathlib import Path

from tests.harness import hypermedia, start_serve, stop


def test_an_open_stream_does_not_hold_the_shutdown(tmp_path: Path) -> None:
    """It kept serve waiting to uvicorn's graceful timeout, then was
    cancelled with a traceback in the log."""
    home = tmp_path / "home"
    server, base = start_serve(tmp_path, home)
    try:
        done = hypermedia(
            "jobs", "submit", "debug.noop", "--queue", "nobody", "--json", url="", home=home
        )
        assert done.returncode == 0, done.stderr
        (job_id,) = json.loads(done.stdout)["job_ids"]
        token = (home / "admin-token").read_text().strip()
        conn = http.client.HTTPConnection(base.removeprefix("http://"), timeout=30)
        conn.request(
            "GET",
            f"/v1/jobs/{job_id}/events",
            headers={"Authorization": f"Bearer {token}", "Accept": "text/event-stream"},
        )
        stream = conn.getresponse()
        assert stream.status == 200
        assert stream.readline().startswith(b"retry:")  # open, waiting on a queued job
        started = time.monotonic()
        assert stop(server, signal.SIGTERM) == 0
        assert time.monotonic() - started < 4.5  # uvicorn waited 5 s for it
        assert b"event: end" not in stream.read()  # ended, not as if the job had
        conn.close()
    finally:
        stop(server, signal.SIGKILL)
    log = (tmp_path / "serve.log").read_text()
    for sign in ("Traceback", "CancelledError", "graceful shutdown exceeded"):
        assert sign not in log, log[-3000:]

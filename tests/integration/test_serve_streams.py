"""A server that stops ends its open event streams: a real ``serve``, a
real stream, SIGTERM."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import time
from pathlib import Path

from tests.harness import http_json, hypermedia, start_serve, stop, wait_for


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


def test_readiness_says_stopping_while_serve_drains(tmp_path: Path) -> None:
    """A SIGTERM drains the worker (as long as its attempts take) while the
    API still answers: /readyz said 200 meanwhile, so a load balancer kept
    sending requests to a server about to close."""
    home = tmp_path / "home"
    server, base = start_serve(tmp_path, home)
    try:
        token = (home / "admin-token").read_text().strip()
        status, made = http_json(
            f"{base}/v1/jobs", {"job_type": "debug.sleep", "params": {"ms": 4000}}, token
        )
        assert status == 201, made
        job = f"{base}/v1/jobs/{made['job_id']}"
        wait_for(
            lambda: http_json(job, token=token)[1]["status"] == "processing",
            30,
            what="the job to run",
        )
        server.send_signal(signal.SIGTERM)
        status, body = http_json(f"{base}/readyz")
        assert (status, body["serving"]) == (503, "stopping"), body
        assert http_json(f"{base}/healthz")[0] == 200  # alive, not ready
        assert server.wait(30) == 0
    finally:
        if server.poll() is None:
            stop(server, signal.SIGKILL)
    log = (tmp_path / "serve.log").read_text()
    assert "Traceback" not in log, log[-2000:]


def test_head_answers_as_get_without_a_body_and_opens_no_stream(tmp_path: Path) -> None:
    """HEAD of an API resource was a 405 (`curl -I`). It answers the GET's
    status and headers now, on a connection that stays usable, and a HEAD of
    a job's event stream does not take one of the token's stream slots."""
    home = tmp_path / "home"
    server, base = start_serve(tmp_path, home, HYPERMEDIA_API_MAX_STREAMS="2")
    try:
        token = (home / "admin-token").read_text().strip()
        status, made = http_json(
            f"{base}/v1/jobs", {"job_type": "debug.noop", "queue": "nobody"}, token
        )
        assert status == 201, made
        job = f"/v1/jobs/{made['job_id']}"
        auth = {"Authorization": f"Bearer {token}"}
        conn = http.client.HTTPConnection(base.removeprefix("http://"), timeout=30)
        conn.request("GET", job, headers=auth)
        got = conn.getresponse()
        body = got.read()
        for _ in range(4):  # more than the stream slots: none is kept
            conn.request("HEAD", f"{job}/events", headers={**auth, "Accept": "text/event-stream"})
            head = conn.getresponse()
            assert head.status == 200 and head.getheader("content-type", "").startswith(
                "text/event-stream"
            )
            assert head.read() == b""
        conn.request("HEAD", job, headers=auth)
        head = conn.getresponse()
        assert (head.status, head.read()) == (200, b"")
        assert head.getheader("content-length") == str(len(body))
        conn.request("HEAD", "/v1/jobs/999999", headers=auth)
        missing = conn.getresponse()
        assert (missing.status, missing.read()) == (404, b"")
        # No length where the GET has none (its stream is sent in chunks).
        conn.request("HEAD", f"{job}/events", headers={**auth, "Accept": "text/event-stream"})
        head = conn.getresponse()
        assert head.getheader("content-length") is None and head.read() == b""
        for path in ("/docs", "/docs/swagger-ui.css"):  # a router of its own
            conn.request("GET", path)
            got = conn.getresponse()
            body = got.read()
            conn.request("HEAD", path)
            head = conn.getresponse()
            assert (head.status, head.read()) == (got.status, b"") == (200, b""), path
            assert head.getheader("content-length") == str(len(body)), path
        conn.request("GET", f"{job}/events", headers={**auth, "Accept": "text/event-stream"})
        stream = conn.getresponse()
        assert stream.status == 200, stream.read()
        assert stream.readline().startswith(b"retry:")
        conn.close()
        # A caller refused is answered before its body is read, HEAD as GET.
        for method in ("GET", "HEAD"):
            raw = socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1])), 10)
            raw.sendall(
                f"{method} {job} HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n".encode()
            )
            assert raw.recv(100).startswith(b"HTTP/1.1 401"), method  # not after 20 bytes
            raw.close()
    finally:
        stop(server, signal.SIGKILL)
    assert "Traceback" not in (tmp_path / "serve.log").read_text()


def test_serve_goes_on_when_its_output_is_closed(tmp_path: Path) -> None:
    """`serve | head -1`: it exited 1, silently, right after its banner, and
    took the service with it."""
    import subprocess
    import sys

    from tests.harness import answers_ready, cli_env
    from tests.ports import free_port

    home, port = tmp_path / "home", free_port()
    base = f"http://127.0.0.1:{port}"
    with open(tmp_path / "serve.err", "wb") as err:
        server = subprocess.Popen(
            [sys.executable, "-m", "hypermedia", "serve", "--port", str(port)],
            env=cli_env("", home),
            stdout=subprocess.PIPE,
            stderr=err,
            start_new_session=True,
        )
    try:
        assert server.stdout is not None
        assert server.stdout.readline().startswith(b"first start")  # as `head -1` reads
        server.stdout.close()  # and goes
        wait_for(lambda: answers_ready(base), 30, what="serve answers /readyz")
        time.sleep(1.0)
        assert server.poll() is None and answers_ready(base)
        assert stop(server, signal.SIGTERM) == 0
    finally:
        stop(server, signal.SIGKILL)
    said = (tmp_path / "serve.err").read_text()
    assert "standard output was closed: serving on" in said, said[-2000:]
    assert str(home.resolve() / "admin-token") in said and "Traceback" not in said

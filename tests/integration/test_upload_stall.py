"""An upload whose client goes quiet is dropped, and a refused one is not
read on: a real ``serve``, a raw socket."""

from __future__ import annotations

import json
import signal
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.harness import hypermedia, start_serve, stop


@contextmanager
def _upload(
    tmp_path: Path,
    declared: int,
    path: str = "/v1/objects",
    extra: str = "",
    kind: str = "application/json",
    **env: str,
) -> Iterator[tuple[socket.socket, Path]]:
    """A ``serve`` with ``env``, and a socket that sent the head of a POST to
    ``path`` of ``declared`` bytes, with ``extra`` header lines (the body is
    the caller's)."""
    home = tmp_path / "home"
    server, base = start_serve(tmp_path, home, **env)
    try:
        token = (home / "admin-token").read_text().strip()
        port = int(base.rsplit(":", 1)[1])
        head = (
            f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: {kind}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Length: {declared}\r\n{extra}\r\n"
        )
        with socket.create_connection(("127.0.0.1", port), timeout=15) as s:
            s.sendall(head.encode())
            yield s, home
    finally:
        assert stop(server, signal.SIGTERM) == 0, (tmp_path / "serve.log").read_text()[-2000:]


def _closed_after(answer: bytes, s: socket.socket) -> None:
    """Closed with the answer: bytes sent after it are not waited on for the
    rest of the declared body (with no timeout at all)."""
    assert b"connection: close" in answer.lower()
    closed_at = time.monotonic()
    try:
        s.sendall(b"y" * 10)
        while s.recv(65536):
            pass
    except OSError:  # reset: closed as well
        pass
    assert time.monotonic() - closed_at < 5


def test_a_stalled_upload_is_dropped_and_leaves_nothing(tmp_path: Path) -> None:
    """It held its connection and temp file for ever (a slow-loris client)."""
    with _upload(tmp_path, 1000, HYPERMEDIA_UPLOAD_IDLE_SECONDS="1") as (s, home):
        s.sendall(b"x" * 10)  # then nothing
        started = time.monotonic()
        answer = s.recv(65536)
        waited = time.monotonic() - started
        while b'"request_timeout"' not in answer and (more := s.recv(65536)):
            answer += more  # the body may come in a segment of its own
        assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
        _closed_after(answer, s)
        assert b'"request_timeout"' in answer and 0.5 < waited < 10
        assert list((home / "tmp").glob("upload-*.part")) == []
        listed = hypermedia("objects", "ls", "--json", url="", home=home)
        assert listed.returncode == 0 and json.loads(listed.stdout) == []


def _answer(s: socket.socket, code: bytes) -> bytes:
    answer = s.recv(65536)
    while code not in answer and (more := s.recv(65536)):
        answer += more
    return answer


def _nothing_made(home: Path) -> None:
    for what in ("objects", "jobs"):
        listed = hypermedia(what, "ls", "--json", url="", home=home)
        assert listed.returncode == 0 and json.loads(listed.stdout) == [], what


def test_a_stalled_json_body_is_dropped_too(tmp_path: Path) -> None:
    """A JSON route waited for the rest of a declared body for ever."""
    with _upload(tmp_path, 100, "/v1/jobs", HYPERMEDIA_UPLOAD_IDLE_SECONDS="1") as (s, home):
        s.sendall(b'{"prof')  # then nothing
        started = time.monotonic()
        answer = _answer(s, b'"request_timeout"')
        assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
        assert b"the request body stalled" in answer
        assert 0.5 < time.monotonic() - started < 10
        _closed_after(answer, s)
        _nothing_made(home)


def test_a_request_of_ambiguous_length_is_refused(tmp_path: Path) -> None:
    """Content-Length with Transfer-Encoding: the parser took the chunked
    body, a proxy trusting the length would read another request in it."""
    body = json.dumps({"job_type": "debug.noop"}).encode()
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    smuggle = "Transfer-Encoding: chunked\r\n"
    with _upload(tmp_path, 3, "/v1/jobs", smuggle) as (s, home):
        s.sendall(chunked)
        answer = _answer(s, b'"bad_request"')
        assert answer.startswith(b"HTTP/1.1 400"), answer[:300]
        assert b"the request's length is ambiguous" in answer
        _nothing_made(home)


def test_a_refused_upload_closes_its_connection(tmp_path: Path) -> None:
    """A 413 (over the upload limit) closes the connection too: the rest of
    the body is never read."""
    with _upload(tmp_path, 5000, HYPERMEDIA_MAX_UPLOAD_BYTES="1000") as (s, _):
        s.sendall(b"x" * 100)
        answer = s.recv(65536)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
        _closed_after(answer, s)


def test_a_download_whose_client_takes_nothing_is_dropped(tmp_path: Path) -> None:
    """It held an open blob and a few MB of buffers for as long as the client
    stalled (100 stalled clients: +420 MB and 200 descriptors)."""
    home = tmp_path / "home"
    size = 48 << 20  # past the socket buffers on both ends
    blob = tmp_path / "big.bin"
    with open(blob, "wb") as f:
        f.truncate(size)
    assert hypermedia("db", "upgrade", url="", home=home).returncode == 0
    put = hypermedia("objects", "put", str(blob), "--json", url="", home=home)
    assert put.returncode == 0, put.stderr
    object_id = json.loads(put.stdout)["object_id"]
    server, base = start_serve(tmp_path, home, HYPERMEDIA_DOWNLOAD_IDLE_SECONDS="1")
    try:
        link = hypermedia("objects", "url", str(object_id), "--base-url", base, url="", home=home)
        assert link.returncode == 0, link.stderr
        target = link.stdout.strip().split(base, 1)[1]
        port = int(base.rsplit(":", 1)[1])
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.settimeout(15)
            s.connect(("127.0.0.1", port))
            s.sendall(f"GET {target} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
            time.sleep(4)  # takes nothing
            got = 0
            while chunk := s.recv(1 << 20):
                got += len(chunk)
        assert got < size, got  # the connection ended before the body did
        said = (tmp_path / "serve.log").read_text()
        assert "download dropped (the client took nothing for 1 s)" in said
        assert "Traceback" not in said
        assert "without completing" not in said  # said once, as a warning, not an ERROR
        # A client that reads gets it all, stall setting and all.
        with socket.create_connection(("127.0.0.1", port), timeout=15) as s:
            s.sendall(f"GET {target} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n".encode())
            got = 0
            while chunk := s.recv(1 << 20):
                got += len(chunk)
        assert size < got < size + 2000
    finally:
        assert stop(server, signal.SIGTERM) == 0, (tmp_path / "serve.log").read_text()[-2000:]


def _closed_within(s: socket.socket, limit: float) -> float:
    """Seconds until the server closed ``s`` (read to its end), under ``limit``."""
    started = time.monotonic()
    s.settimeout(limit)
    try:
        while s.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return time.monotonic() - started


def test_a_request_head_that_never_completes_is_closed(tmp_path: Path) -> None:
    """A connection that sent nothing, or half its headers, was held open for
    ever (slow loris): no timer ran before a request's head was in."""
    home = tmp_path / "home"
    server, base = start_serve(tmp_path, home, HYPERMEDIA_HEADER_SECONDS="1")
    try:
        port = int(base.rsplit(":", 1)[1])
        silent = socket.create_connection(("127.0.0.1", port))
        half = socket.create_connection(("127.0.0.1", port))
        half.sendall(b"POST /v1/objects HTTP/1.1\r\nHost: x\r\n")
        with silent, half:
            assert 0.5 < _closed_within(silent, 10) < 5
            assert _closed_within(half, 10) < 5
        # A kept-alive connection: the next request's head is timed from the answer.
        with socket.create_connection(("127.0.0.1", port)) as kept:
            kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert kept.recv(65536).startswith(b"HTTP/1.1 200")
            kept.sendall(b"GET /healthz HTTP/1.1\r\n")  # and no more
            assert _closed_within(kept, 10) < 5
        # An upload answered before its body came (no token: 401), then its
        # body: the next head is timed from there (it was not timed at all).
        with socket.create_connection(("127.0.0.1", port)) as early:
            early.sendall(b"POST /v1/objects HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n")
            assert early.recv(65536).startswith(b"HTTP/1.1 401")
            early.sendall(b"0123456789")
            assert _closed_within(early, 10) < 5
        # A slow body is not the head's business: its own idle timer (60 s) holds.
        with socket.create_connection(("127.0.0.1", port)) as slow:
            token = (home / "admin-token").read_text().strip()
            slow.sendall(
                f"POST /v1/objects HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                "Content-Length: 4\r\n\r\nab".encode()
            )
            time.sleep(2.5)
            slow.sendall(b"cd")
            slow.settimeout(10)
            assert slow.recv(65536).startswith(b"HTTP/1.1 201")
    finally:
        assert stop(server, signal.SIGTERM) == 0, (tmp_path / "serve.log").read_text()[-2000:]


def test_a_json_body_is_not_waited_for_when_its_caller_may_not_ask(tmp_path: Path) -> None:
    """The token and scope are judged before the body is read: with no token,
    a body sent a byte a minute held its connection for as long as it liked,
    and was answered 408, never 401."""
    home = tmp_path / "home"
    server, base = start_serve(tmp_path, home)
    try:
        made = hypermedia(
            "tokens", "create", "--project", "p1", "--scopes", "jobs:read", "--json",
            url="", home=home,
        )  # fmt: skip
        reader = json.loads(made.stdout)["token"]
        port = int(base.rsplit(":", 1)[1])
        for auth, code in (("", b"401"), ("Bearer hm_nope", b"401"), (f"Bearer {reader}", b"403")):
            head = "POST /v1/jobs HTTP/1.1\r\nHost: t\r\nContent-Length: 400\r\n"
            head += f"Authorization: {auth}\r\n\r\n" if auth else "\r\n"
            with socket.create_connection(("127.0.0.1", port), timeout=15) as s:
                s.sendall(head.encode() + b"{")  # and no more, for now
                started = time.monotonic()
                answer = _answer(s, b"}")
                assert answer.startswith(b"HTTP/1.1 " + code), (auth, answer[:300])
                assert time.monotonic() - started < 5  # not after the 60 s idle limit
                _closed_after(answer, s)
        _nothing_made(home)
    finally:
        assert stop(server, signal.SIGTERM) == 0, (tmp_path / "serve.log").read_text()[-2000:]


def test_an_upload_cut_by_the_servers_stop_is_a_503_to_try_again(tmp_path: Path) -> None:
    """Still open past the stop's grace, it was cancelled: the client got a
    plain-text 500 ("Internal Server Error"), the log a traceback."""
    home = tmp_path / "home"
    server, base = start_serve(tmp_path, home)
    try:
        token = (home / "admin-token").read_text().strip()
        port = int(base.rsplit(":", 1)[1])
        head = (
            "POST /v1/objects HTTP/1.1\r\nHost: t\r\nContent-Type: application/octet-stream\r\n"
            f"Authorization: Bearer {token}\r\nContent-Length: 100000\r\n\r\n"
        )
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(head.encode() + b"x" * 1000)  # and then nothing, for now
            time.sleep(0.5)
            server.send_signal(signal.SIGTERM)
            answer = _answer(s, b"}")
        assert answer.startswith(b"HTTP/1.1 503"), answer[:300]
        assert b'"code":"stopping"' in answer and b"retry-after: 2" in answer.lower()
        assert server.wait(30) == 0
    finally:
        if server.poll() is None:
            stop(server, signal.SIGKILL)
    said = (tmp_path / "serve.log").read_text()
    assert "Traceback" not in said and "Exception in ASGI application" not in said, said[-3000:]
    assert list((home / "tmp").glob("upload-*.part")) == []


def test_a_form_refused_part_way_is_not_read_on(tmp_path: Path) -> None:
    """A form refused at its first field (one the route does not take) was
    answered 422 at once, but the connection stayed open: the rest of the
    body, gigabytes maybe, was read and thrown away."""
    head = '--b0undary\r\nContent-Disposition: form-data; name="nope"\r\n\r\nx\r\n'
    kind = "multipart/form-data; boundary=b0undary"
    with _upload(tmp_path, 50_000_000, kind=kind) as (s, home):
        s.sendall(head.encode())
        answer = _answer(s, b"}")
        assert answer.startswith(b"HTTP/1.1 422"), answer[:300]
        assert b"unexpected or repeated form field" in answer
        _closed_after(answer, s)
        _nothing_made(home)


def test_a_form_with_two_content_type_lines_is_refused(tmp_path: Path) -> None:
    """The server read the first line's boundary and stored the file; a proxy
    keeping the last reads another form (the test client joins the lines,
    so only a raw socket shows it)."""
    body = (
        b'--B0undary\r\nContent-Disposition: form-data; name="file"; filename="q.txt"\r\n\r\n'
        b"DATA\r\n--B0undary--\r\n"
    )
    extra = "Content-Type: multipart/form-data; boundary=other\r\n"
    kind = "multipart/form-data; boundary=B0undary"
    with _upload(tmp_path, len(body), extra=extra, kind=kind) as (s, home):
        s.sendall(body)
        answer = _answer(s, b'"invalid_request"')
        assert answer.startswith(b"HTTP/1.1 422"), answer[:300]
        assert b"Content-Type twice" in answer
        listed = hypermedia("objects", "ls", "--json", url="", home=home)
        assert listed.returncode == 0 and json.loads(listed.stdout) == []

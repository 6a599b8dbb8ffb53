"""The lean PutObject and GetObject's own logic: retries, error documents, when
it steps aside.

Against a scripted local HTTP server (the real store is in
tests/storage/test_backends.py, which sends every small request this way)."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import botocore.exceptions
import pytest
import urllib3
from botocore.credentials import Credentials

from hypermedia.storage import s3_lean
from hypermedia.storage.base import StorageUnavailable
from hypermedia.storage.s3 import S3Backend
from hypermedia.storage.s3_lean import LeanS3

CREDS = Credentials("AKIDEXAMPLE", "not-a-real-secret")


class Script:
    def __init__(self) -> None:
        self.answers: list[tuple[int, bytes]] = []
        self.seen: list[dict[str, Any]] = []


@pytest.fixture
def store() -> Iterator[tuple[str, Script]]:
    script = Script()

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            self._answer(self.rfile.read(int(self.headers["Content-Length"])))

        def do_GET(self) -> None:
            self._answer(b"")

        def _answer(self, body: bytes) -> None:
            seen = {"method": self.command, "path": self.path, "body": body}
            script.seen.append({**seen, "headers": dict(self.headers)})
            status, doc = script.answers.pop(0) if script.answers else (200, b"")
            self.send_response(status)
            self.send_header("Content-Length", str(len(doc)))
            if status == 206:
                self.send_header("Content-Range", f"bytes 0-{len(doc) - 1}/1000")
                self.send_header("ETag", '"abc"')
            self.end_headers()
            self.wfile.write(doc)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", script
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3_lean, "_backoff", lambda attempt: None)


def _lean(url: str) -> LeanS3:
    return LeanS3(url, "bkt", "us-east-1", lambda: CREDS, 2, (1.0, 5.0))


def _error(code: str) -> bytes:
    return f"<Error><Code>{code}</Code><Message>m {code}</Message></Error>".encode()


def test_a_put_is_signed_and_sent_as_given(store: tuple[str, Script]) -> None:
    url, script = store
    _lean(url).put("a/b c.bin", b"data", {"Content-MD5": "x==", "x-amz-meta-checksum": "c"})
    (req,) = script.seen
    assert req["path"] == "/bkt/a/b%20c.bin"
    assert req["body"] == b"data"
    h = {k.lower(): v for k, v in req["headers"].items()}
    assert h["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
    assert "content-md5" in h["authorization"] and h["content-md5"] == "x=="
    assert h["x-amz-meta-checksum"] == "c"
    assert len(h["x-amz-content-sha256"]) == 64  # plain HTTP: the payload is signed


def test_a_busy_store_is_tried_once_more(store: tuple[str, Script]) -> None:
    url, script = store
    script.answers = [(503, _error("SlowDown")), (200, b"")]
    _lean(url).put("k", b"x", {})
    assert len(script.seen) == 2


def test_a_store_busy_twice_raises_its_error(store: tuple[str, Script]) -> None:
    url, script = store
    script.answers = [(500, _error("InternalError")), (500, _error("InternalError"))]
    with pytest.raises(botocore.exceptions.ClientError) as info:
        _lean(url).put("k", b"x", {})
    assert info.value.response["Error"]["Code"] == "InternalError"
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
    assert len(script.seen) == 2


@pytest.mark.parametrize(
    "status,code", [(400, "BadDigest"), (403, "SignatureDoesNotMatch"), (404, "NoSuchBucket")]
)
def test_a_refusal_is_not_retried(store: tuple[str, Script], status: int, code: str) -> None:
    url, script = store
    script.answers = [(status, _error(code))]
    with pytest.raises(botocore.exceptions.ClientError) as info:
        _lean(url).put("k", b"x", {})
    assert info.value.response["Error"] == {"Code": code, "Message": f"m {code}"}
    assert len(script.seen) == 1


def test_an_answer_without_an_error_document_keeps_its_status() -> None:
    error = s3_lean._client_error("PUT", 502, b"<html>bad gateway</html>")
    assert error.response["Error"]["Code"] == "502"


def test_a_store_that_is_not_there_is_a_transport_error() -> None:
    with pytest.raises(urllib3.exceptions.HTTPError):
        _lean("http://127.0.0.1:9").put("k", b"x", {})


def test_it_steps_aside_for_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    class Client:
        class meta:
            endpoint_url = "http://127.0.0.1:9"

            class config:
                connect_timeout, read_timeout = 5, 60

    assert LeanS3.of(Client(), lambda: CREDS, "b", "us-east-1", 2) is not None
    monkeypatch.setenv("https_proxy", "http://proxy.invalid:3128")
    assert LeanS3.of(Client(), lambda: CREDS, "b", "us-east-1", 2) is None


def test_credentials_are_resolved_at_the_first_request_once(store: tuple[str, Script]) -> None:
    url, script = store
    asked: list[int] = []

    def resolve() -> Credentials:
        asked.append(1)
        return CREDS

    lean = LeanS3(url, "bkt", "us-east-1", resolve, 2, (1.0, 5.0))
    assert asked == []
    lean.put("a", b"x", {})
    lean.put("b", b"x", {})
    assert asked == [1] and len(script.seen) == 2


def test_no_credentials_is_the_clients_error(store: tuple[str, Script]) -> None:
    url, script = store
    lean = LeanS3(url, "bkt", "us-east-1", lambda: None, 2, (1.0, 5.0))
    with pytest.raises(botocore.exceptions.NoCredentialsError):
        lean.put("k", b"x", {})
    assert script.seen == []


def _backend(url: str, **keys: str) -> S3Backend:
    return S3Backend("bkt", endpoint=url, **keys)


def test_a_redirect_hands_this_and_later_requests_to_the_client(
    store: tuple[str, Script],
) -> None:
    url, script = store
    script.answers = [(301, _error("PermanentRedirect"))]  # then 200 for the rest
    backend = _backend(url, access_key_id="AKIDEXAMPLE", secret_access_key="not-a-real-secret")
    try:
        backend.put("objects/1/original.bin", io.BytesIO(b"data"))
        assert backend._lean is None
        backend.put("objects/2/original.bin", io.BytesIO(b"more"))
    finally:
        backend.close()
    agents = [r["headers"].get("User-Agent", "") for r in script.seen]
    assert len(agents) == 3
    assert "Botocore" not in agents[0]  # the lean request, answered with the redirect
    assert all("Botocore" in a for a in agents[1:])  # the same put again, and the next


def test_a_backend_without_credentials_says_so(
    store: tuple[str, Script], monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    url, script = store
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    backend = _backend(url)
    try:
        with pytest.raises(
            StorageUnavailable, match=r"no S3 credentials.*HYPERMEDIA_S3_ACCESS_KEY_ID"
        ):
            backend.put("objects/1/original.bin", io.BytesIO(b"data"))
    finally:
        backend.close()
    assert script.seen == []


def test_a_get_returns_the_answer_as_boto3_names_it(store: tuple[str, Script]) -> None:
    url, script = store
    script.answers = [(206, b"0123456789")]
    answer = _lean(url).get("objects/1/original.jpg", {"Range": "bytes=0-9"})
    assert answer["Body"].read() == b"0123456789"
    answer["Body"].close()
    assert (answer["ContentLength"], answer["ContentRange"], answer["ETag"]) == (
        10,
        "bytes 0-9/1000",
        '"abc"',
    )
    (req,) = script.seen
    h = {k.lower(): v for k, v in req["headers"].items()}
    assert (req["method"], req["path"], h["range"]) == (
        "GET",
        "/bkt/objects/1/original.jpg",
        "bytes=0-9",
    )
    assert "range" in h["authorization"]  # signed with the request


def test_a_missing_key_is_the_client_error_of_getobject(store: tuple[str, Script]) -> None:
    url, script = store
    script.answers = [(404, _error("NoSuchKey"))]
    with pytest.raises(botocore.exceptions.ClientError) as info:
        _lean(url).get("k", {})
    assert info.value.operation_name == "GetObject"
    assert info.value.response["Error"]["Code"] == "NoSuchKey"
    assert len(script.seen) == 1


def test_a_get_from_a_busy_store_is_tried_once_more(store: tuple[str, Script]) -> None:
    url, script = store
    script.answers = [(503, _error("SlowDown")), (200, b"body")]
    assert _lean(url).get("k", {})["Body"].read() == b"body"
    assert len(script.seen) == 2

"""An upload whose bytes were still on their way into the pool when the
server stopped: its client is told 503 "not kept, send again", so nothing of
it is kept.  The store is hung (SIGSTOP) to hold the copy past the stop's grace.
"""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path

import pytest

from hypermedia.config import Settings
from hypermedia.db.driver import Driver
from hypermedia.storage.gc import GarbageCollector
from hypermedia.storage.ledger import Storage
from tests.harness import answers_ready, spawn, stop, wait_for
from tests.integration._procs import sqlite_only
from tests.ports import free_port
from tests.storage.conftest import SeaweedServer

pytestmark = pytest.mark.timeout(180)


def _answer(sock: socket.socket) -> bytes:
    got = b""
    while not got.endswith(b"}") and (data := sock.recv(65536)):
        got += data
    return got


@sqlite_only  # the API's own logic: one database shows it
def test_an_upload_cut_by_the_stop_mid_copy_keeps_nothing(
    driver: Driver,
    s3_storage: Storage,
    s3_settings: Settings,
    seaweed: SeaweedServer,
    tmp_path: Path,
) -> None:
    """The copy ran on after the 503: the object ended `ready` (sent again, a
    duplicate), or the process left with it `pending` for GC's 6-hour sweep."""
    home, log, port = tmp_path / "home", tmp_path / "serve.log", free_port()
    server = spawn(
        "serve", "--port", str(port), url=driver.url, home=home, log=log,
        HYPERMEDIA_DEFAULT_POOL="s3",
        HYPERMEDIA_S3_ACCESS_KEY_ID=s3_settings.s3_access_key_id,
        HYPERMEDIA_S3_SECRET_ACCESS_KEY=s3_settings.s3_secret_access_key,
        HYPERMEDIA_S3_TIMEOUT_SECONDS="40",  # the hung store holds the copy past the stop
    )  # fmt: skip
    try:
        wait_for(lambda: answers_ready(f"http://127.0.0.1:{port}"), 60, what="serve is ready")
        token = (home / "admin-token").read_text().strip()
        body = b"y" * 200_000
        head = (
            "POST /v1/objects HTTP/1.1\r\nHost: t\r\nContent-Type: application/octet-stream\r\n"
            f"Authorization: Bearer {token}\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        with seaweed.hung(), socket.create_connection(("127.0.0.1", port), timeout=40) as s:
            s.sendall(head.encode() + body)
            pending = wait_for(
                lambda: s3_storage.list(state="pending", reserved=True), 20, what="the copy"
            )
            server.send_signal(signal.SIGTERM)
            answer = _answer(s)  # after the stop's 5 s grace
            assert answer.startswith(b"HTTP/1.1 503"), answer[:300]
            assert b'"code":"stopping"' in answer
            # Given to GC at once, while its bytes are still held by the store.
            (row,) = s3_storage.list(reserved=True)
            assert (row["object_id"], row["state"]) == (pending[0]["object_id"], "deleting")
        assert server.wait(60) == 0, log.read_text()[-2000:]
    finally:
        stop(server, signal.SIGKILL)
    # Nothing was made ready then; GC takes the row, and no blob is left.
    assert [r["state"] for r in s3_storage.list(reserved=True)] in ([], ["deleting"])
    GarbageCollector(s3_storage).run_once()
    assert s3_storage.list(reserved=True) == []
    backend = s3_storage.backend(row["pool_id"])
    time.sleep(1)
    assert not backend.exists(row["storage_key"]), json.dumps(row, default=str)
    said = log.read_text()
    assert "Traceback" not in said, said[-3000:]

"""What a process killed on the spot leaves on disk is removed by the next
one: a worker's scratch folder (its staged inputs among it) and a server's
half-received upload.  Real processes, SIGKILL, the embedded default."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import pytest

from tests.harness import hypermedia, spawn, start_serve, stop, wait_for

pytestmark = pytest.mark.timeout(120)

OWNER = ".owner"


def _age(path: Path, seconds: float = 60) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def _kill(proc) -> None:  # type: ignore[no-untyped-def]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def test_a_killed_workers_scratch_is_removed_by_the_next(tmp_path: Path) -> None:
    home = tmp_path / "home"
    url = f"sqlite:///{home / 'hypermedia.db'}"
    assert hypermedia("db", "upgrade", url=url, home=home).returncode == 0
    scratch = home / "scratch"
    first = spawn("worker", "--queues", "bulk", url=url, home=home)
    try:
        # The slot's inbox, made when its child starts (after the owner file).
        (inbox,) = wait_for(lambda: list(scratch.glob("*/slot-0-in")), 30, what="a slot's inbox")
        dead = inbox.parent
        assert (dead / OWNER).exists()
        (inbox / "input.bin").write_bytes(os.urandom(1 << 20))
        _kill(first)
        assert dead.exists()  # nobody else could remove it
        _age(dead / OWNER)  # past the few seconds a new folder is left alone
        second = spawn("worker", "--queues", "bulk", url=url, home=home)
        try:
            wait_for(lambda: not dead.exists(), 30, what="the next worker to sweep it")
            (mine,) = wait_for(lambda: list(scratch.iterdir()), 10, what="its own folder")
            assert (mine / OWNER).exists()
        finally:
            assert stop(second) == 0
        assert list(scratch.iterdir()) == []  # a worker that stops takes its own
    finally:
        stop(first, signal.SIGKILL)


def test_a_server_killed_mid_upload_leaves_nothing_after_restart(tmp_path: Path) -> None:
    home = tmp_path / "home"
    server, base = start_serve(tmp_path, home)
    try:
        token = (home / "admin-token").read_text().strip()
        port = int(base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as sock:
            head = (
                "POST /v1/objects HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: Bearer {token}\r\n"
                "Content-Type: application/octet-stream\r\nContent-Length: 50000000\r\n\r\n"
            )
            sock.sendall(head.encode() + os.urandom(1 << 20))  # 1 MB of 50 MB
            parts = wait_for(
                lambda: [p for p in (home / "tmp").glob("upload-*.part") if p.stat().st_size],
                30,
                what="the upload's temp file",
            )
            _kill(server)
        (part,) = parts
        assert part.exists()
        _age(part)
        server, base = start_serve(tmp_path, home)
        assert not part.exists()
        assert list((home / "tmp").iterdir()) == []
    finally:
        stop(server, signal.SIGKILL)

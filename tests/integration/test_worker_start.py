"""A worker, `serve` and `db upgrade --wait` started before their database
is there wait for it, and a SIGTERM meanwhile ends them cleanly; commands
that wait for jobs outlive an outage (real processes, a real PostgreSQL)."""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from hypermedia.db import revisions
from hypermedia.db.driver import Driver
from hypermedia.db.migrate import upgrade
from tests.conftest import PG_ADMIN, _server_db, drop_database, make_database
from tests.harness import (
    a_noop_completes,
    answers_ready,
    hypermedia,
    pg_accepting,
    query,
    spawn,
    stop,
    wait_for,
)
from tests.ports import free_port

pytestmark = pytest.mark.timeout(120)


def _waiting(log: Path) -> bool:
    """Waiting: for a server that is away, or for the database the URL names
    (refused, but a deploy may create it next)."""
    said = log.read_text() if log.exists() else ""
    return "the database is unavailable" in said or (
        "the database refuses this connection" in said and "; waiting for it" in said
    )


def test_a_worker_started_before_its_database_waits_then_works(tmp_path: Path) -> None:
    name = f"hm_test_{uuid.uuid4().hex[:10]}"
    url = (
        sa.engine.make_url(Driver(PG_ADMIN).url)
        .set(database=name)
        .render_as_string(hide_password=False)
    )
    log = tmp_path / "worker.log"
    worker = spawn("worker", "--queues", "bulk", url=url, home=tmp_path / "home", log=log)
    try:
        wait_for(lambda: _waiting(log), 30, what="the worker to wait for its database")
        time.sleep(1.5)  # a few retries
        assert worker.poll() is None, log.read_text()
        assert _server_db(PG_ADMIN, name, "postgresql") == url  # the database appears
        upgrade(url)
        a_noop_completes(url)  # registered once
        assert stop(worker) == 0
        assert "Traceback" not in log.read_text()
    finally:
        stop(worker, signal.SIGKILL)
        drop_database("postgresql", url)


def test_sigterm_while_waiting_for_the_database_exits_cleanly(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    url = "postgresql://postgres@127.0.0.1:1/nowhere"  # nothing listens on port 1
    worker = spawn("worker", url=url, home=tmp_path / "home", log=log)
    try:
        wait_for(lambda: _waiting(log), 30, what="the worker to wait for its database")
        t0 = time.monotonic()
        assert stop(worker, timeout=10) == 0
        assert time.monotonic() - t0 < 6
        assert "Traceback" not in log.read_text()
    finally:
        stop(worker, signal.SIGKILL)


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("postgresql://no_such_role@127.0.0.1/test", 'role "no_such_role" does not exist'),
        ("postgresql://postgres@127.0.0.1/no_such_db", 'database "no_such_db" does not exist'),
        ("mysql://root:wrong@127.0.0.1/test", "Access denied for user 'root'"),
    ],
)
def test_a_database_that_refuses_the_url_is_said_to(tmp_path: Path, url: str, said: str) -> None:
    """Not "unavailable", and not "did not answer" when the wait ends: it
    answered, and no restart will change its answer."""
    gave_up = hypermedia("db", "upgrade", "--wait", "1", url=url, home=tmp_path)
    assert gave_up.returncode == 1
    assert gave_up.stderr.startswith("WARNING: the database refuses this connection ("), gave_up
    assert said in gave_up.stderr and "check HYPERMEDIA_DATABASE_URL" in gave_up.stderr
    assert "error: the database was not ready within 1 s: the database refuses" in gave_up.stderr
    assert "wrong" not in gave_up.stderr  # the password, redacted


def test_db_upgrade_wait_and_serve_start_before_their_database(tmp_path: Path) -> None:
    """`db upgrade --wait` and `serve` started while the database refuses
    connections wait for it, then migrate (serve then answers /readyz);
    past --wait's bound, or on SIGTERM, they end without a traceback."""
    url = make_database("postgresql", tmp_path)
    name = sa.engine.make_url(url).database
    assert name
    home = tmp_path / "home"
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        pg_accepting(name, False)
        gave_up = hypermedia("db", "upgrade", "--wait", "1", url=url, home=home)
        assert gave_up.returncode == 1
        assert "was not ready within 1 s: the database is unavailable (" in gave_up.stderr
        assert "Traceback" not in gave_up.stderr
        upgrading = spawn("db", "upgrade", "--wait", "60", url=url, home=home)
        serve_log = tmp_path / "serve.log"
        serving = spawn("serve", "--port", str(port), url=url, home=home, log=serve_log)
        procs += [upgrading, serving]
        wait_for(lambda: _waiting(serve_log), 30, what="serve to wait for its database")
        time.sleep(1.5)
        assert upgrading.poll() is None and serving.poll() is None, serve_log.read_text()
        pg_accepting(name, True)
        assert upgrading.wait(60) == 0
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: answers_ready(base), 60, what="serve to answer /readyz")
        assert query(url, "SELECT version_num FROM alembic_version")[0][0] == revisions.head()
        assert stop(serving) == 0
        assert "Traceback" not in serve_log.read_text()
    finally:
        for p in procs:
            stop(p, signal.SIGKILL)
        pg_accepting(name, True)
        drop_database("postgresql", url)


def test_commands_that_wait_outlive_a_database_outage(tmp_path: Path) -> None:
    """``jobs submit --wait`` and ``jobs tail`` keep waiting while the
    database refuses connections, and end when the job does."""
    url = make_database("postgresql", tmp_path)
    name = sa.engine.make_url(url).database
    home = tmp_path / "home"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        upgrade(url)
        submit = spawn("jobs", "submit", "debug.noop", "--wait", url=url, home=home)
        procs.append(submit)
        queued = wait_for(
            lambda: query(url, "SELECT job_id FROM processing_jobs"), 30, what="the job queued"
        )
        (job_id,) = [r[0] for r in queued]
        tail_log = tmp_path / "tail.log"
        tail = spawn("jobs", "tail", str(job_id), url=url, home=home, log=tail_log)
        procs.append(tail)
        time.sleep(1.0)
        pg_accepting(name, False)
        # Started while it is away: the schema check before a command does
        # not end it (it exited 1 "database unavailable" at once).
        late_log = tmp_path / "late.log"
        late = spawn("jobs", "tail", str(job_id), url=url, home=home, log=late_log)
        procs.append(late)
        # So are `jobs submit --wait` and `process` (they exited 1 at once).
        late_submit_log = tmp_path / "late-submit.log"
        late_submit = spawn(
            "jobs", "submit", "debug.noop", "--wait", url=url, home=home, log=late_submit_log
        )
        src = tmp_path / "in.bin"
        src.write_bytes(b"some bytes")
        process_log = tmp_path / "process.log"
        late_process = spawn(
            "process", str(src), "--profile", "debug-copy", "--out", str(tmp_path / "out"),
            url=url, home=home, log=process_log,
        )  # fmt: skip
        procs += [late_submit, late_process]
        time.sleep(3.0)  # several polls fail meanwhile
        assert submit.poll() is None and tail.poll() is None, tail_log.read_text()
        assert late.poll() is None, late_log.read_text()
        assert late_submit.poll() is None, late_submit_log.read_text()
        assert late_process.poll() is None, process_log.read_text()
        pg_accepting(name, True)
        procs.append(spawn("worker", "--queues", "bulk", url=url, home=home))
        assert submit.wait(60) == 0
        assert tail.wait(60) == 0, tail_log.read_text()
        assert late.wait(60) == 0, late_log.read_text()
        assert late_submit.wait(60) == 0, late_submit_log.read_text()
        assert late_process.wait(60) == 0, process_log.read_text()
        assert (tmp_path / "out" / "in.copy.bin").read_bytes() == b"some bytes"
        for log in (tail_log, late_submit_log, process_log):
            assert log.read_text().count("database unavailable") == 1, log.read_text()
    finally:
        for p in procs:
            stop(p, signal.SIGKILL)
        pg_accepting(name, True)
        drop_database("postgresql", url)

"""A database not migrated yet, on every backend: a worker waits for its
`db upgrade` instead of dying (PostgreSQL, MariaDB) or warning at every retry
(SQLite), then works; the API says 503, not 500, and /readyz tells why.
Real processes, real databases."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from hypermedia.api.app import create_app
from hypermedia.config import Settings
from hypermedia.db import ready, revisions
from hypermedia.db.driver import Driver
from hypermedia.db.migrate import upgrade
from hypermedia.queue.engine import Engine
from hypermedia.services import Services
from tests.conftest import BACKENDS, drop_database, make_database
from tests.harness import a_noop_completes, cli_env, hypermedia, query, spawn, stop, wait_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.parametrize("backend", BACKENDS)]

TOKEN = {"Authorization": "Bearer hm_abcdefghij_" + "x" * 32}  # well formed: it is looked up
NOT_MIGRATED = "the database has no hypermedia schema: run `hypermedia db upgrade`"


@pytest.fixture
def empty_url(backend: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    url = make_database(backend, tmp_path)
    yield url
    drop_database(backend, url)


def test_the_revision_is_read_without_alembic(empty_url: str) -> None:
    driver = Driver(empty_url)
    try:
        with driver.read() as tx:
            assert tx.schema_revision() is None
        kind, why = ready.not_ready(driver) or ("", "")
        assert (kind, why) == ("schema", NOT_MIGRATED)
        assert not ready.wait_until_ready(driver, threading.Event(), deadline=time.monotonic())
        upgrade(empty_url, revisions.known()[-2])
        assert ready.not_ready(driver) == ("schema", revisions.behind(revisions.known()[-2]))
        upgrade(empty_url)
        with driver.read() as tx:
            assert tx.schema_revision() == revisions.head()
        assert ready.not_ready(driver) is None
        assert ready.wait_until_ready(driver, threading.Event())
    finally:
        driver.dispose()


def test_a_worker_waits_for_the_migration_then_works(empty_url: str, tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    worker = spawn("worker", "--queues", "bulk", url=empty_url, home=tmp_path / "home", log=log)
    try:
        wait_for(lambda: NOT_MIGRATED in log.read_text(), 30, what="the worker to say why it waits")
        time.sleep(2.0)  # several checks: said once, not at each
        assert worker.poll() is None, log.read_text()
        assert log.read_text().count(NOT_MIGRATED) == 1, log.read_text()
        done = hypermedia("db", "upgrade", url=empty_url, home=tmp_path / "home")
        assert done.returncode == 0, done.stderr
        a_noop_completes(empty_url)
        assert stop(worker) == 0
        assert "Traceback" not in log.read_text()
    finally:
        stop(worker, signal.SIGKILL)


def test_the_api_answers_503_and_readyz_says_not_migrated(empty_url: str, tmp_path: Path) -> None:
    driver = Driver(empty_url)
    try:
        svc = Services.from_engine(Engine(driver, Settings(home=tmp_path, database_url=empty_url)))
        with TestClient(create_app(svc)) as client:  # nothing raised to the server
            r = client.get("/readyz")  # the pools are listed in the database: not asked
            assert (r.status_code, r.json()) == (
                503,
                {"database": "not migrated", "storage": "not checked", "serving": "ok"},
            )
            r = client.get("/v1/jobs", headers=TOKEN)
            assert r.status_code == 503, r.text
            assert r.json()["code"] == "database_not_migrated"
            assert client.get("/healthz").status_code == 200
            upgrade(empty_url)
            r = client.get("/readyz")
            assert (r.status_code, r.json()) == (
                200,
                {"database": "ok", "storage": "ok", "serving": "ok"},
            )
            assert client.get("/v1/jobs", headers=TOKEN).status_code == 401  # unknown, now
    finally:
        driver.dispose()


def test_readyz_says_refused_for_a_database_that_does_not_exist(
    backend: str, empty_url: str, tmp_path: Path
) -> None:
    """A server that answers but refuses the URL's database is not a missing
    migration: /readyz must not send the operator to `db upgrade`."""
    if backend == "sqlite":
        pytest.skip("a SQLite file is created, never refused")
    url = empty_url.rsplit("/", 1)[0] + "/hm_no_such_database"
    driver = Driver(url)
    try:
        svc = Services.from_engine(Engine(driver, Settings(home=tmp_path, database_url=url)))
        with TestClient(create_app(svc)) as client:
            r = client.get("/readyz")
            assert (r.status_code, r.json()) == (
                503,
                {"database": "refused", "storage": "not checked", "serving": "ok"},
            )
    finally:
        driver.dispose()


def test_a_command_on_it_says_to_migrate(empty_url: str, tmp_path: Path) -> None:
    done = hypermedia("jobs", "ls", url=empty_url, home=tmp_path / "home")
    assert done.returncode == 1
    said = " ".join(done.stderr.split())  # rich wraps long lines
    # A server database: "is the database migrated? run …"; a SQLite file that
    # is not there (`jobs ls` only reads: it creates none): "no database at …".
    assert "run `hypermedia db upgrade`" in said, said
    assert "Traceback" not in said


def test_process_refuses_a_server_database_behind_before_uploading(
    backend: str, empty_url: str, tmp_path: Path
) -> None:
    """`process` skipped the schema check on PostgreSQL and MariaDB: it
    uploaded, made the object ready, then failed on a missing table."""
    if backend == "sqlite":
        pytest.skip("process migrates the embedded SQLite database itself")
    older = revisions.known()[-2]
    upgrade(empty_url, older)
    image = tmp_path / "a.bin"
    image.write_bytes(b"some bytes")
    done = hypermedia(
        "process", str(image), "--profile", "debug-copy", "--out", str(tmp_path / "out"),
        url=empty_url, home=tmp_path / "home",
    )  # fmt: skip
    said = " ".join(done.stderr.split())
    assert done.returncode == 1, said
    assert f"the database schema is at revision {older}" in said, said
    assert query(empty_url, "SELECT COUNT(*) FROM objects")[0][0] == 0


def test_migrations_started_together_take_turns(empty_url: str, tmp_path: Path) -> None:
    """Replicas of `serve` each migrate as they start: four `db upgrade`
    processes at once on an empty database all succeed, and it ends at head
    with each step applied once."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "hypermedia", "db", "upgrade"],
            env=cli_env(empty_url, tmp_path / f"home{i}"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(4)
    ]
    outputs = [p.communicate(timeout=90)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, outputs
    assert query(empty_url, "SELECT version_num FROM alembic_version") == [(revisions.head(),)]
    profiles = query(empty_url, "SELECT profile_key, profile_version FROM processing_profiles")
    assert profiles and len(profiles) == len(set(profiles))

"""Shared fixtures: one fresh database per backend per test session.

Backends come from HYPERMEDIA_TEST_BACKENDS (default: sqlite,postgresql,mariadb).
Locally a server that is not running skips its tests with a reason; with
CI=true a missing server is a failure.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from hypermedia.config import Settings
from hypermedia.db.driver import Driver
from hypermedia.db.migrate import upgrade
from hypermedia.db.schema import metadata
from hypermedia.queue.engine import Engine

# The CLI wraps its output at $COLUMNS when it has one, as on a terminal, and
# pytest-xdist's workers run with COLUMNS=80: the commands the tests start are
# piped, so they must not inherit it.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)

IN_CI = os.environ.get("CI", "").lower() == "true"
PG_ADMIN = os.environ.get("HYPERMEDIA_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
MY_ADMIN = os.environ.get("HYPERMEDIA_TEST_MARIADB", "mysql://root@127.0.0.1:3306/test")
BACKENDS = os.environ.get("HYPERMEDIA_TEST_BACKENDS", "sqlite,postgresql,mariadb").split(",")


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"CI=true and {reason}")
    pytest.skip(reason)


def _server_db(admin_url: str, name: str, backend: str) -> str:
    """Create database ``name`` on the server behind ``admin_url``; return its URL."""
    admin = sa.create_engine(Driver(admin_url).url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
            conn.exec_driver_sql(f"CREATE DATABASE {name}")
    except sa.exc.OperationalError as exc:
        _unavailable(f"{backend} is not reachable ({type(exc.orig).__name__})")
    finally:
        admin.dispose()
    return (
        sa.engine.make_url(Driver(admin_url).url)
        .set(database=name)
        .render_as_string(hide_password=False)
    )


def make_database(backend: str, tmp: Path) -> str:
    name = f"hm_test_{uuid.uuid4().hex[:10]}"
    if backend == "sqlite":
        return f"sqlite:///{tmp / (name + '.db')}"
    if backend == "postgresql":
        return _server_db(PG_ADMIN, name, backend)
    if backend == "mariadb":
        return _server_db(MY_ADMIN, name, backend)
    raise ValueError(backend)


def drop_database(backend: str, url: str) -> None:
    if backend == "sqlite":
        return
    admin_url = PG_ADMIN if backend == "postgresql" else MY_ADMIN
    name = sa.engine.make_url(url).database
    admin = sa.create_engine(Driver(admin_url).url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            if backend == "postgresql":
                conn.exec_driver_sql(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    f"WHERE datname = '{name}' AND pid <> pg_backend_pid()"
                )
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
    except sa.exc.OperationalError:
        pass
    finally:
        admin.dispose()


@pytest.fixture(scope="session", params=BACKENDS)
def database_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A migrated database on each backend, shared by the whole session."""
    backend = request.param
    url = make_database(backend, tmp_path_factory.mktemp(backend))
    upgrade(url)
    yield url
    drop_database(backend, url)


def backend_of(url: str) -> str:
    return Driver(url).name


# Tables emptied between tests; profiles are seeded by migration and kept.
_VOLATILE = [t for t in reversed(metadata.sorted_tables) if t.name != "processing_profiles"]


@pytest.fixture
def driver(_session_driver: Driver) -> Iterator[Driver]:
    """The session's Driver over a database emptied for this test."""
    with _session_driver.tx() as tx:
        for table in _VOLATILE:
            tx.conn.execute(table.delete())
    yield _session_driver


@pytest.fixture(scope="session")
def _session_driver(database_url: str) -> Iterator[Driver]:
    # One pool per backend for the whole run: a new pool per test costs a
    # connection handshake each time (TLS set-up on MariaDB).
    drv = Driver(database_url)
    yield drv
    drv.dispose()


@pytest.fixture(autouse=True)
def _tmpdir_kept() -> Iterator[None]:
    """A pipeline run in the test process points ``TMPDIR`` at its scratch (for
    libvips, as a child would); the folder goes with the test, and every process
    started later (a database server restarted by a fault test) inherited it."""
    before = os.environ.get("TMPDIR")
    yield
    if before is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    return Settings(
        home=tmp_path, database_url=database_url, backoff_base_seconds=0.05, backoff_max_seconds=0.2
    )


class FakeClock:
    """A clock tests move by hand, for backoff and lease expiry without sleeping."""

    def __init__(self) -> None:
        from hypermedia.queue.clock import utcnow

        self.now = utcnow()

    def __call__(self):  # type: ignore[no-untyped-def]
        return self.now

    def advance(self, seconds: float) -> None:
        from datetime import timedelta

        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def engine(driver: Driver, settings: Settings, clock: FakeClock) -> Engine:
    import random

    return Engine(driver, settings, clock=clock, rng=random.Random(7))


@pytest.fixture
def storage(driver: Driver, settings: Settings):  # type: ignore[no-untyped-def]
    """The objects ledger over the test database, with the local pool in tmp_path."""
    from hypermedia.storage.ledger import Storage

    return Storage(driver, settings)


@pytest.fixture
def procs(driver: Driver, tmp_path: Path):  # type: ignore[no-untyped-def]
    """Processes started by a test; all of them (and their children) die at teardown."""
    from tests.integration._procs import Procs

    p = Procs(driver, tmp_path)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
def landlock() -> int:
    """The kernel's Landlock ABI; skips (fails with CI=true) where there is none."""
    from hypermedia.worker import sandbox

    version = sandbox.abi()
    if version == 0:
        _unavailable("this kernel has no Landlock (Linux 5.13+)")
    return version

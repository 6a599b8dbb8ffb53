"""Migrations take an empty database to head, match the models, and go back down."""

from __future__ import annotations

from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from hypermedia.db.driver import Driver
from hypermedia.db.migrate import current, downgrade, head, upgrade
from hypermedia.db.schema import metadata
from tests.conftest import drop_database, make_database


def _diff(url: str) -> list:
    drv = Driver(url)
    try:
        with drv.engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            return list(compare_metadata(ctx, metadata))
    finally:
        drv.dispose()


def test_the_newest_migration_is_head() -> None:
    versions = Path(__file__).parents[2] / "hypermedia" / "db" / "migrations" / "versions"
    newest = max(p.name.split("_")[0] for p in versions.glob("[0-9]*.py"))
    assert head() == newest


def test_head_matches_models(database_url: str) -> None:
    assert current(database_url) == head()
    assert _diff(database_url) == []


def test_downgrade_to_empty_and_back(database_url: str, tmp_path) -> None:
    backend = Driver(database_url).name
    backend = "mariadb" if backend == "mysql" else backend
    url = make_database(backend, tmp_path)
    try:
        upgrade(url)
        downgrade(url, "base")
        assert current(url) is None
        upgrade(url)
        assert current(url) == head()
        drv = Driver(url)
        try:
            with drv.read() as tx:
                keys = {
                    (p["profile_key"], p["job_type"]) for p in tx.profiles_for_type("debug.noop")
                }
        finally:
            drv.dispose()
        assert keys == {("debug-noop", "debug.noop")}
    finally:
        drop_database(backend, url)

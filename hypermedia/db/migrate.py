"""Alembic, driven from code: ``hypermedia db upgrade`` calls ``upgrade``."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from hypermedia.db.driver import normalise_url

MIGRATIONS = Path(__file__).with_name("migrations")


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    # ConfigParser would read a '%' in a password as interpolation.
    cfg.set_main_option("sqlalchemy.url", normalise_url(url).replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


def current(url: str) -> str | None:
    from alembic.runtime.migration import MigrationContext

    from hypermedia.db.driver import Driver

    drv = Driver(url)
    try:
        with drv.engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        drv.dispose()


def head() -> str:
    """The newest revision the code ships."""
    from alembic.script import ScriptDirectory

    rev = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert rev is not None
    return rev

"""Alembic, driven from code: ``hypermedia db upgrade`` calls ``upgrade``."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config

from hypermedia.db import revisions
from hypermedia.db.driver import normalise_url
from hypermedia.errors import InvalidRequest, Refused

MIGRATIONS = Path(__file__).with_name("migrations")


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    # ConfigParser would read a '%' in a password as interpolation.
    cfg.set_main_option("sqlalchemy.url", normalise_url(url).replace("%", "%%"))
    return cfg


class NewerSchema(Refused):
    """The database was migrated by a newer hypermedia: nothing to do here."""


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate to ``revision``; NewerSchema for a database this code is older
    than (Alembic said "Can't locate revision", as if the argument were
    wrong), InvalidRequest for a revision below the database's (Alembic did
    nothing and said nothing: this is no downgrade)."""
    if not revision.strip():  # Alembic failed on it with a bare AssertionError
        raise InvalidRequest(
            f"REVISION is empty: one of {', '.join(revisions.known())}, or none for the newest"
        )
    at = current(url)
    if revisions.newer(at):
        raise NewerSchema(
            f"the database schema (revision {at}) is newer than this hypermedia "
            f"(revision {revisions.head()}): upgrade hypermedia"
        )
    if at is not None and (revision == "base" or (revision in revisions.known() and revision < at)):
        raise InvalidRequest(
            f"the database is at revision {at}, past {revision}: `db upgrade` does not downgrade"
        )
    cfg = alembic_config(url)
    # Tables without a record are judged under the migration lock (env.py):
    # judged before it, the tables another upgrade was making that moment
    # (MariaDB shows them as they come) were taken for a lost record.
    cfg.attributes["refuse_unstamped"] = True
    with _steps_only():
        command.upgrade(cfg, revision)


class LostStamp(Refused):
    """hypermedia's tables are there, Alembic's record of their revision is not."""


def refuse_unstamped(conn: Any, dialect: str) -> None:
    """Refuse a database with our tables and no revision recorded
    (``alembic_version`` dropped or emptied), under the migration lock with
    no revision read: the first step failed on PostgreSQL and SQLite with
    "relation job_attempts already exists", and nothing said what to do;
    MariaDB, whose steps skip what is already there, ran the whole history
    again over the tables and brought back a column a later step had dropped.

    On MariaDB 0001's tables without a record are also what a first `db
    upgrade` leaves when it stops inside 0001: that one is run again, as
    MariaDB's steps are written to be.  Only a table of a later step (0003's
    ``objects``) says a record was lost there."""
    import sqlalchemy as sa

    later = "objects" if dialect == "mysql" else "processing_jobs"
    if sa.inspect(conn).has_table(later):
        raise LostStamp(
            "the database has hypermedia's tables but no record of their revision "
            "(its alembic_version table is missing or empty); nothing was changed. "
            "Record the revision they are at with `hypermedia db stamp REVISION` "
            f"(this hypermedia's newest: {revisions.head()}), then `hypermedia db upgrade`"
        )


def has_job_tables(url: str) -> bool:
    """Whether hypermedia's tables are in the database at ``url``."""
    from hypermedia.db.driver import Driver

    drv = Driver(url)
    try:
        with drv.read() as tx:
            return bool(tx.has_job_tables())
    finally:
        drv.dispose()


def stamp(url: str, revision: str) -> None:
    """Record ``revision`` as the database's without running any step: for
    hypermedia's tables only (stamped, a database without them answered every
    command "run db upgrade", which then found nothing to do)."""
    if revision == "head":  # as `db upgrade` takes it
        revision = revisions.head()
    if revision not in revisions.known():
        raise InvalidRequest(
            f"no revision {revision!r}: one of {', '.join(revisions.known())}, or head"
        )
    if not has_job_tables(url):
        raise InvalidRequest(
            "the database has no hypermedia tables to stamp: run `hypermedia db upgrade`"
        )
    with _steps_only():
        command.stamp(alembic_config(url), revision, purge=True)


def downgrade(url: str, revision: str) -> None:
    with _steps_only():
        command.downgrade(alembic_config(url), revision)


class _Steps(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage().startswith("Running ")


@contextmanager
def _steps_only() -> Iterator[None]:
    """Alembic's log down to the steps it runs ("Running upgrade 0008 ->
    0009, …", worth seeing: a step may take minutes): `serve` migrates at
    every start, and its plugin and dialect lines said nothing to a user."""
    migration, plugins = (
        logging.getLogger("alembic.runtime.migration"),
        logging.getLogger("alembic.runtime.plugins"),
    )
    steps, level = _Steps(), plugins.level
    migration.addFilter(steps)
    plugins.setLevel(logging.WARNING)
    try:
        yield
    finally:
        migration.removeFilter(steps)
        plugins.setLevel(level)


def current(url: str) -> str | None:
    from alembic.runtime.migration import MigrationContext

    from hypermedia.db.driver import Driver

    drv = Driver(url)
    try:
        with drv.engine.connect() as conn, _steps_only():  # no "Context impl …" lines
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        drv.dispose()


def head() -> str:
    """The newest revision the code ships."""
    from alembic.script import ScriptDirectory

    rev = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert rev is not None
    return rev

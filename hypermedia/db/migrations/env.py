"""Alembic environment: online migrations only, one connection, one transaction."""

from __future__ import annotations

from collections import Counter

from alembic import context
from sqlalchemy import Connection

from hypermedia.db import dialects, migrate
from hypermedia.db.driver import Driver
from hypermedia.db.migrations import redone
from hypermedia.db.schema import metadata


def _dangling(connection: Connection) -> Counter[tuple[str, str]]:
    """Rows whose foreign key points at nothing, counted by (table, parent):
    a table rebuild gives rows new rowids, so rows cannot be compared."""
    rows = connection.exec_driver_sql("PRAGMA foreign_key_check").all()
    return Counter((str(r[0]), str(r[2])) for r in rows)


url = context.config.get_main_option("sqlalchemy.url")
assert url, "sqlalchemy.url must be set"
driver = Driver(url)
try:
    with driver.engine.connect() as connection:
        if driver.name == "sqlite":
            # A table rebuild (batch mode) drops the old table: with foreign
            # keys on, that fails while other tables reference its rows.  The
            # pragma is ignored inside a transaction, so it is set on the raw
            # connection before one begins, and the keys are checked at the end.
            raw = connection.connection.driver_connection
            assert raw is not None
            raw.execute("PRAGMA foreign_keys=OFF")
        # Taken before Alembic reads the database's revision, so a migration
        # that another process ran meanwhile is seen as done.
        with dialects.migration_lock(connection, driver.name):
            context.configure(
                connection=connection,
                target_metadata=metadata,
                render_as_batch=driver.name == "sqlite",
                compare_type=True,
            )
            if driver.name == "mysql":
                redone.install(context.get_context().impl)
            unstamped = context.get_context().get_current_revision() is None
            if unstamped and context.config.attributes.get("refuse_unstamped"):
                migrate.refuse_unstamped(connection, driver.name)
            # Rows that broke a foreign key before (a legacy producer writing
            # with foreign keys off, as sqlite3 does by default) are not the
            # migration's doing: only new breakage stops it.
            before = _dangling(connection) if driver.name == "sqlite" else Counter()
            with context.begin_transaction():
                context.run_migrations()
                if driver.name == "sqlite":
                    broken = _dangling(connection) - before
                    if broken:
                        raise RuntimeError(f"a migration broke foreign keys: {dict(broken)}")
            connection.commit()
finally:
    driver.dispose()

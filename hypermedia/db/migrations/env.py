"""Alembic environment: online migrations only, one connection, one transaction."""

from __future__ import annotations

from alembic import context

from hypermedia.db.driver import Driver
from hypermedia.db.schema import metadata

url = context.config.get_main_option("sqlalchemy.url")
assert url, "sqlalchemy.url must be set"
driver = Driver(url)
try:
    with driver.engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=metadata,
            render_as_batch=driver.name == "sqlite",
            compare_type=True,
        )
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()
finally:
    driver.dispose()

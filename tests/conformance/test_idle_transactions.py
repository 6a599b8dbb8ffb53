"""A session frozen inside a transaction is ended by the server, its locks
with it (db/driver.py IDLE_TRANSACTION_SECONDS): a SIGSTOPped worker held its
jobs' rows, so the reaper skipped them and `jobs cancel` waited, for as long
as it stayed stopped."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from hypermedia.db.driver import IDLE_TRANSACTION_SECONDS, Driver


def test_every_connection_has_the_idle_transaction_timeout(driver: Driver) -> None:
    if driver.name == "sqlite":
        pytest.skip("SQLite has no server sessions to end")
    query = {
        "postgresql": "SELECT setting::int FROM pg_settings"
        " WHERE name = 'idle_in_transaction_session_timeout'",
        "mysql": "SELECT @@SESSION.idle_transaction_timeout",
    }[driver.name]
    unit = 1000 if driver.name == "postgresql" else 1  # PostgreSQL says milliseconds
    # Several pooled connections at once: each was set as it was made.
    with driver.tx() as a, driver.read() as b:
        for tx in (a, b):
            assert tx.conn.execute(sa.text(query)).scalar_one() == IDLE_TRANSACTION_SECONDS * unit

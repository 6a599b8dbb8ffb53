"""MariaDB's claim updates the rows it locked by primary key, whatever the
optimizer estimates (db/dialects.mysql_claim_update).

With fewer queued rows than ids in the list, InnoDB planned the UPDATE on
idx_available (status, available_at), locking queued rows outside the list,
another claimer's among them: two claiming workers deadlocked.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from hypermedia.db.dialects import mysql_claim_update
from hypermedia.db.driver import Driver
from hypermedia.queue.engine import Engine

from ._helpers import new_job

pytestmark = pytest.mark.parametrize("database_url", ["mariadb"], indirect=True)


def test_the_claim_update_walks_the_primary_key(driver: Driver, engine: Engine) -> None:
    for _ in range(200):  # finished history and a short queue: a busy queue's table
        engine.cancel(new_job(engine))
    queued = [new_job(engine) for _ in range(2)]
    ids = queued + [max(queued) + k for k in range(1, 11)]  # more ids than queued rows
    stmt = mysql_claim_update(ids).values(claimed_by="w")
    with driver.tx() as tx:
        tx.conn.exec_driver_sql("ANALYZE TABLE processing_jobs")
        sql = stmt.compile(dialect=tx.conn.dialect, compile_kwargs={"literal_binds": True})
        plan = tx.conn.execute(sa.text(f"EXPLAIN {sql}")).mappings().all()
    assert [row["key"] for row in plan] == ["PRIMARY"], plan

"""db/fast.py: prepared statements on SQLite's own cursor write and read exactly
what SQLAlchemy does, and fail the way SQLAlchemy's statements fail."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from hypermedia.db import fast
from hypermedia.db.driver import Driver
from hypermedia.db.migrate import upgrade
from hypermedia.db.schema import job_events as E
from hypermedia.db.schema import processing_jobs as J

PROFILE = 1  # the first profile the migrations install


@pytest.fixture
def db(tmp_path: Path) -> Driver:
    url = f"sqlite:///{tmp_path / 'fast.db'}"
    upgrade(url)  # the real schema, with its profiles (jobs need one)
    return Driver(url)


def _job(**values: object) -> dict[str, object]:
    now = datetime(2026, 12, 1, 8, 0, 0, 123456)
    row: dict[str, object] = {
        "job_uuid": "u1",
        "object_id": None,
        "pool_id": None,
        "owner_id": "o",
        "project_id": "p",
        "job_type": "debug.noop",
        "queue_name": "bulk",
        "priority": 5,
        "status": "queued",
        "profile_id": PROFILE,
        "params": {"ms": 5, "nested": {"a": [1, 2]}},
        "input_key": "",
        "input_size_bytes": 0,
        "available_at": now,
        "created_at": now,
        "updated_at": now,
    }
    row.update(values)
    return row


def test_inserted_rows_read_back_as_sqlalchemy_writes_them(db: Driver) -> None:
    with db.tx() as tx:
        fast.insert_many(tx.conn, J, [_job(job_uuid="fast")])
        tx.conn.execute(sa.insert(J).values(_job(job_uuid="core")))
    with db.read() as tx:
        raw = {
            r.job_uuid: (r.params, r.available_at)
            for r in tx.conn.execute(
                sa.text("SELECT job_uuid, params, available_at FROM processing_jobs")
            )
        }
        assert raw["fast"] == raw["core"]  # the same stored text: JSON, datetime format
        p = fast.prepare(
            tx.conn,
            ("test_read", 1),
            lambda: sa.select(J.c.job_uuid, J.c.params, J.c.available_at).where(
                J.c.job_uuid == sa.bindparam("u")
            ),
        )
        [row] = fast.rows(tx.conn, p, {"u": "fast"})
    assert row == {
        "job_uuid": "fast",
        "params": {"ms": 5, "nested": {"a": [1, 2]}},
        "available_at": datetime(2026, 12, 1, 8, 0, 0, 123456),
    }


def test_constants_stay_and_every_other_parameter_must_be_given(db: Driver) -> None:
    with db.tx() as tx:
        fast.insert_many(tx.conn, J, [_job(job_uuid="a"), _job(job_uuid="b")])
        p = fast.prepare(
            tx.conn,
            ("test_update",),
            lambda: (
                sa.update(J)
                .where(J.c.job_uuid == sa.bindparam("u"))
                .values(status="cancelled", updated_at=sa.bindparam("now"))
            ),
        )
        later = datetime(2026, 12, 2, 0, 0, 0, 1)
        assert fast.execute(tx.conn, p, {"u": "a", "now": later})[0] == 1
        with pytest.raises(KeyError):
            fast.execute(tx.conn, p, {"u": "b"})
    with db.read() as tx:
        got = dict(tx.conn.execute(sa.select(J.c.job_uuid, J.c.status)).all())
        assert got == {"a": "cancelled", "b": "queued"}
        assert (
            tx.conn.execute(sa.select(J.c.updated_at).where(J.c.job_uuid == "a")).scalar() == later
        )


def test_database_errors_are_sqlalchemy_errors_and_roll_back(db: Driver) -> None:
    with pytest.raises(sa.exc.IntegrityError), db.tx() as tx:
        fast.insert_many(tx.conn, J, [_job(job_uuid="dup")])
        fast.insert_many(tx.conn, J, [_job(job_uuid="dup")])  # job_uuid is unique
    with db.read() as tx:
        assert tx.conn.execute(sa.select(sa.func.count()).select_from(J)).scalar() == 0


def test_an_expanding_in_cannot_be_prepared(db: Driver) -> None:
    with db.tx() as tx, pytest.raises(ValueError, match="expanding IN"):
        fast.prepare(tx.conn, ("test_in",), lambda: sa.select(E).where(E.c.job_id.in_([1, 2])))
    with db.tx() as tx:
        ids = [3, 4]
        p = fast.prepare(
            tx.conn,
            ("test_ids", len(ids)),
            lambda: sa.select(E.c.job_id).where(E.c.job_id.in_(fast.id_params(ids))),
        )
        assert fast.rows(tx.conn, p, fast.id_values(ids)) == []


def test_the_claim_reads_the_queue_index_in_order_without_statistics(db: Driver) -> None:
    """No ANALYZE has run (the embedded default): SQLite's own choice was
    idx_available plus a sort of every queued row for each claim."""
    from hypermedia.db.dialects import _SQLITE_READY

    with db.tx() as tx:
        fast.insert_many(tx.conn, J, [_job(job_uuid=f"j{i}") for i in range(50)])
        sql = fast.prepare(tx.conn, ("ready",), lambda: _SQLITE_READY).sql
        cur = tx.conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
        plan = [r[3] for r in cur.execute("EXPLAIN QUERY PLAN " + sql, ("bulk", "2030", 10))]
    assert any("USING INDEX idx_status_queue" in step for step in plan), plan
    assert not any("TEMP B-TREE" in step for step in plan), plan


def test_statements_keyed_by_job_ids_go_through_the_primary_key(
    db: Driver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claim, fence and settle name their jobs by id; their status and worker
    terms only guard.  Without statistics SQLite used to answer those terms
    from idx_available or idx_claimed, reading every queued job (or every job
    the worker ever claimed) to find ten: the claim slowed as the queue grew."""
    from hypermedia.config import Settings
    from hypermedia.queue.engine import Engine
    from hypermedia.queue.models import AttemptResult, NewJob

    seen: dict[str, list[object]] = {}
    for name in ("rows", "execute", "execute_many"):
        real = getattr(fast, name)

        def spy(conn: object, p: fast.Prepared, values: object, real: object = real) -> object:
            one = values if isinstance(values, dict) else values[0]  # type: ignore[index]
            seen.setdefault(p.sql, fast._params(p, one))
            return real(conn, p, values)  # type: ignore[operator]

        monkeypatch.setattr(fast, name, spy)
    eng = Engine(db, Settings(database_url=str(db.url)))
    eng.enqueue_many([NewJob("debug.noop") for _ in range(30)])
    got = eng.claim("w1", ["bulk"], 10)
    eng.flush("w1", [(c.job_id, c.attempt) for c in got[:5]], [])
    done = [AttemptResult(job_id=c.job_id, attempt=c.attempt, status="completed") for c in got]
    eng.flush("w1", [], done)
    keyed = {s: v for s, v in seen.items() if "processing_jobs.job_id IN" in s}
    assert len(keyed) >= 3, list(seen)  # the claim, the fence, the settling update
    with db.read() as tx:
        cur = tx.conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
        for sql, params in keyed.items():
            plan = [r[3] for r in cur.execute("EXPLAIN QUERY PLAN " + sql, params)]
            assert plan == ["SEARCH processing_jobs USING INTEGER PRIMARY KEY (rowid=?)"], (
                sql,
                plan,
            )

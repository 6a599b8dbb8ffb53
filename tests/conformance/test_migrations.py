"""Migrations take an empty database to head, match the models, and go back down."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from hypermedia.db import revisions
from hypermedia.db.driver import Driver
from hypermedia.db.migrate import LostStamp, current, downgrade, head, stamp, upgrade
from hypermedia.db.schema import job_attempts as attempts_table
from hypermedia.db.schema import metadata
from hypermedia.db.schema import processing_jobs as jobs_table
from hypermedia.errors import InvalidRequest
from hypermedia.queue import durations
from hypermedia.queue.clock import utcnow
from tests.conftest import drop_database, make_database


def _made_on(obj: object, dialect: str) -> bool:
    """Whether the schema makes ``obj`` on ``dialect``: an index may be one
    dialect's only (``ddl_if``: idx_project_job, SQLite's)."""
    dialects = getattr(getattr(obj, "_ddl_if", None), "dialect", None)
    if dialects is None:
        return True
    return dialect in ([dialects] if isinstance(dialects, str) else dialects)


def _diff(url: str) -> list:
    drv = Driver(url)

    def here(obj: object, name: str | None, kind: str, reflected: bool, other: object) -> bool:
        # Alembic compares without ddl_if.  One found all the same where it
        # is not made (reflected: no ddl_if) is still a difference.
        return _made_on(obj, conn.dialect.name)

    try:
        with drv.engine.connect() as conn:
            opts = {"compare_type": True, "include_object": here}
            ctx = MigrationContext.configure(conn, opts=opts)
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


def test_tables_whose_revision_record_was_lost_are_named_and_stamped(
    database_url: str, tmp_path
) -> None:
    """alembic_version emptied or dropped: `db upgrade` failed with "relation
    job_attempts already exists" (PostgreSQL, SQLite) and no hint, and MariaDB
    ran every step again, bringing back a column 0008 had dropped.  Now it says
    so and changes nothing, and `db stamp` records the revision."""
    backend = Driver(database_url).name
    backend = "mariadb" if backend == "mysql" else backend
    url = make_database(backend, tmp_path)
    try:
        # Nothing to stamp yet: stamped, every command said "run db upgrade",
        # which then found nothing to do.
        with pytest.raises(InvalidRequest, match="no hypermedia tables to stamp"):
            stamp(url, head())
        upgrade(url)
        for lose in ("DELETE FROM alembic_version", "DROP TABLE alembic_version"):
            drv = Driver(url)
            try:
                with drv.engine.begin() as conn:
                    conn.execute(sa.text(lose))
                with drv.read() as tx:  # what every other command says: not "run db upgrade"
                    assert tx.schema_behind() == revisions.LOST
            finally:
                drv.dispose()
            with pytest.raises(LostStamp, match="hypermedia db stamp REVISION"):
                upgrade(url)
            assert current(url) is None and _diff(url) == []  # nothing changed
            with pytest.raises(InvalidRequest, match="no revision '9999'"):
                stamp(url, "9999")
            stamp(url, "head")  # as `db upgrade` names it (it was "no revision 'head'")
            assert current(url) == head()
            upgrade(url)  # and on from there
            assert _diff(url) == []
            # Alembic failed on an empty one with a bare AssertionError (exit 1).
            with pytest.raises(InvalidRequest, match="REVISION is empty"):
                upgrade(url, "")
    finally:
        drop_database(backend, url)


def test_mariadb_goes_on_with_a_first_step_that_stopped_part_way(
    database_url: str, tmp_path
) -> None:
    """A first `db upgrade` killed inside 0001 leaves some of its tables and no
    record: taken for a lost record, it was refused ("db stamp …", which would
    have skipped every later step); it is run again, as MariaDB's steps are."""
    if Driver(database_url).name != "mysql":
        pytest.skip("MariaDB only: PostgreSQL and SQLite roll a failed step back")
    url = make_database("mariadb", tmp_path)
    drv = Driver(url)
    try:
        upgrade(url, "0001")
        with drv.engine.begin() as conn:  # as if killed before the record, two tables short
            conn.exec_driver_sql("DROP TABLE alembic_version")
            conn.exec_driver_sql("DROP TABLE worker_metrics_hourly")
            conn.exec_driver_sql("DROP TABLE leader_leases")
        upgrade(url)
        assert current(url) == head() and _diff(url) == []
    finally:
        drv.dispose()
        drop_database("mariadb", url)


def test_0008_down_gives_folded_counts_back_to_the_rows(database_url: str, tmp_path) -> None:
    """Below 0008 credit use is the rows' sum plus pruned_credits, and the
    duration histogram the attempts' plus pruned_attempt_durations: what the
    folds counted must leave those counters, what retention counted stay."""
    backend = Driver(database_url).name
    backend = "mariadb" if backend == "mysql" else backend
    url = make_database(backend, tmp_path)
    try:
        upgrade(url)
        drv = Driver(url)
        try:
            with drv.tx() as tx:
                profile_id = tx.profiles_for_type("debug.noop")[0]["profile_id"]
                job = {"owner_id": "o", "job_type": "debug.noop", "queue_name": "bulk"}
                job |= {"profile_id": profile_id, "estimated_credits": 5, "max_attempts": 3}
                rows = [
                    ("completed", 2, True),  # folded: 2 of the counter
                    ("completed", None, True),  # folded at its estimate: 5
                    ("failed", None, True),  # folded for nothing
                    ("completed", 3, False),  # not folded: its row counts
                ]
                for i, (status, actual, folded) in enumerate(rows):
                    tx.conn.execute(
                        sa.insert(jobs_table).values(
                            **job,
                            job_uuid=f"u{i}",
                            project_id="p",
                            status=status,
                            actual_credits=actual,
                            credits_folded=folded,
                            attempt_count=1,
                            completed_at=sa.func.current_timestamp(),
                        )
                    )
                # 7 folded + 100 from jobs retention deleted
                now = datetime(2026, 12, 3)
                tx.add_settled_credits("p", 107, now)
                # Two attempts folded, one live, and one retention deleted (50 ms).
                job_id = tx.conn.execute(sa.select(sa.func.min(jobs_table.c.job_id))).scalar()
                for number, ms in ((1, 3), (2, 700), (3, 9)):
                    tx.conn.execute(
                        sa.insert(attempts_table).values(
                            job_id=job_id,
                            worker_id="w",
                            attempt_number=number,
                            status="failed",
                            duration_ms=ms,
                        )
                    )
                folded = tx.attempt_ids()[0] - 1
                bounds = durations.BOUNDS_MS
                tx.add_pruned_durations(
                    tx.attempt_duration_histogram(bounds, upto=folded), bounds, now
                )
                deleted = {"job_type": "debug.noop", "count": 1, "sum_ms": 50}
                deleted |= {f"le_{i}": int(b >= 50) for i, b in enumerate(bounds)}
                tx.add_pruned_durations([deleted], bounds, now)
                tx.set_attempt_fold({"watermark": folded, "seen": folded}, now)
        finally:
            drv.dispose()
        downgrade(url, "0007")
        engine = sa.create_engine(Driver(url).url)
        try:
            with engine.connect() as conn:
                pruned = conn.execute(sa.text("SELECT pruned_credits FROM project_credits"))
                assert pruned.scalar_one() == 100
                # Only the deleted attempt's counts stay: the others have rows.
                row = conn.execute(
                    sa.text("SELECT attempts, sum_ms, buckets FROM pruned_attempt_durations")
                ).one()
                buckets = row[2] if isinstance(row[2], dict) else json.loads(row[2])
                assert (row[0], row[1]) == (1, 50)
                assert {k: v for k, v in buckets.items() if v} == {
                    durations.key(b): 1 for b in durations.BOUNDS_MS if b >= 50
                }
        finally:
            engine.dispose()
        upgrade(url)
        assert current(url) == head()
    finally:
        drop_database(backend, url)


def test_0009_keeps_rows_checks_and_indexes_and_ids_go_on(database_url: str, tmp_path) -> None:
    """0009 rebuilds SQLite's processing_jobs and job_attempts as
    AUTOINCREMENT: their rows, named CHECKs and indexes come through, and
    after the newest job is deleted the next one still gets a new id."""
    backend = Driver(database_url).name
    backend = "mariadb" if backend == "mysql" else backend
    url = make_database(backend, tmp_path)
    try:
        upgrade(url, "0008")
        drv = Driver(url)
        try:
            with drv.tx() as tx:
                job_id = _insert_job(tx.conn, "old")
                tx.conn.execute(
                    sa.insert(attempts_table).values(
                        job_id=job_id, worker_id="w", attempt_number=1, status="failed"
                    )
                )
        finally:
            drv.dispose()
        upgrade(url)
        engine = sa.create_engine(Driver(url).url)
        try:
            insp = sa.inspect(engine)
            for table in (jobs_table, attempts_table):
                names = {i["name"] for i in insp.get_indexes(table.name)}
                made = {i.name for i in table.indexes if _made_on(i, engine.dialect.name)}
                assert made <= names
                checks = {c["name"] for c in insp.get_check_constraints(table.name)}
                named = {c.name for c in table.constraints if isinstance(c, sa.CheckConstraint)}
                assert named <= checks
            with engine.begin() as conn:
                assert conn.execute(sa.select(jobs_table.c.job_uuid)).scalars().all() == ["old"]
                count = sa.select(sa.func.count()).select_from(attempts_table)
                assert conn.execute(count).scalar() == 1
            # MariaDB reports a failed CHECK as an OperationalError.
            refused = (sa.exc.IntegrityError, sa.exc.OperationalError)
            with engine.begin() as conn, pytest.raises(refused, match="status"):
                _insert_job(conn, "bad", status="bogus")
            with engine.begin() as conn:
                conn.execute(sa.delete(attempts_table))
                conn.execute(sa.delete(jobs_table))  # the newest job, pruned
                assert _insert_job(conn, "new") > job_id
            if backend == "sqlite":
                with engine.connect() as conn:
                    sql = conn.exec_driver_sql(
                        "SELECT group_concat(sql) FROM sqlite_master WHERE name IN "
                        "('processing_jobs', 'job_attempts')"
                    ).scalar()
                assert sql.count("AUTOINCREMENT") == 2
        finally:
            engine.dispose()
        downgrade(url, "0008")
        upgrade(url)
        assert current(url) == head()
    finally:
        drop_database(backend, url)


def _insert_job(conn: sa.Connection, uuid: str, status: str = "queued") -> int:
    profile_id = conn.execute(
        sa.text("SELECT profile_id FROM processing_profiles WHERE job_type = 'debug.noop'")
    ).scalar()
    values = {"owner_id": "o", "project_id": "p", "job_type": "debug.noop", "queue_name": "bulk"}
    values |= {"profile_id": profile_id, "max_attempts": 3, "job_uuid": uuid, "status": status}
    return int(conn.execute(sa.insert(jobs_table).values(values)).inserted_primary_key[0])


def test_time_defaults_are_utc_in_any_session_time_zone(database_url: str) -> None:
    """A legacy producer's rows take the columns' defaults: CURRENT_TIMESTAMP
    in a session in Tokyo put them 9 h ahead of every other row (adopted 9 h
    late, listed as the newest)."""
    drv = Driver(database_url)
    zone = {
        "postgresql": "SET TIME ZONE 'Asia/Tokyo'",
        "mysql": "SET time_zone = '+09:00'",
    }
    try:
        with drv.engine.begin() as conn:
            if drv.name in zone:
                conn.exec_driver_sql(zone[drv.name])
            conn.exec_driver_sql("INSERT INTO photos (photo_id, album) VALUES ('tz-1', 'tz')")
            conn.exec_driver_sql("INSERT INTO variant_jobs (photo_id) VALUES ('tz-1')")
            made = conn.exec_driver_sql(
                "SELECT p.created_at, v.next_attempt_at FROM photos p "
                "JOIN variant_jobs v ON v.photo_id = p.photo_id WHERE p.photo_id = 'tz-1'"
            ).one()
            conn.exec_driver_sql("DELETE FROM photos WHERE photo_id = 'tz-1'")
        now = utcnow()  # the schema's naive UTC
        for value in made:
            at = datetime.fromisoformat(value) if isinstance(value, str) else value  # SQLite
            assert abs((at - now).total_seconds()) < 120, (value, now)
        # Every "now" default says UTC, not only the two a producer is known to use.
        if drv.name in zone:
            inspector = sa.inspect(drv.engine)
            for table in inspector.get_table_names():
                for column in inspector.get_columns(table):
                    default = str(column.get("default") or "").lower()
                    assert "current_timestamp" not in default, (table, column["name"], default)
    finally:
        drv.dispose()


def test_0013_leaves_other_applications_tables_alone(database_url: str, tmp_path) -> None:
    """A database shared with another application: 0013 set every "now"
    default of every table to UTC, a text column's 'current_timestamp' string
    and MariaDB's ON UPDATE clause included."""
    backend = Driver(database_url).name
    if backend == "sqlite":
        pytest.skip("SQLite's CURRENT_TIMESTAMP is UTC: 0013 changes nothing there")
    backend = "mariadb" if backend == "mysql" else backend
    url = make_database(backend, tmp_path)
    other = {
        "postgresql": "CREATE TABLE other_app (id int PRIMARY KEY, "
        "seen timestamptz NOT NULL DEFAULT CURRENT_TIMESTAMP, "
        "note text DEFAULT 'current_timestamp')",
        "mariadb": "CREATE TABLE other_app (id int PRIMARY KEY, "
        "seen TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP, "
        "note varchar(40) DEFAULT 'current_timestamp')",
    }
    drv = Driver(url)
    try:
        with drv.engine.begin() as conn:
            conn.exec_driver_sql(other[backend])

        def defaults() -> dict[str, str]:
            with drv.engine.connect() as conn:
                cols = sa.inspect(conn).get_columns("other_app")
                if backend == "mariadb":
                    ddl = conn.exec_driver_sql("SHOW CREATE TABLE other_app").one()[1]
                    assert "on update current_timestamp" in ddl.lower(), ddl
            return {c["name"]: str(c["default"]) for c in cols}

        before = defaults()
        upgrade(url, "0013")
        assert defaults() == before
        downgrade(url, "0012")
        assert defaults() == before
        upgrade(url)
        with drv.engine.connect() as conn:  # ours did change
            ours = {c["name"]: c["default"] for c in sa.inspect(conn).get_columns("photos")}
        assert "utc" in str(ours["created_at"]).lower(), ours
    finally:
        drv.dispose()
        drop_database(backend, url)


def test_a_dangling_row_from_before_does_not_stop_the_upgrade(database_url: str, tmp_path) -> None:
    """A legacy producer writing with foreign keys off (sqlite3's default)
    left a variant_jobs row of a photo that is gone: the check after the
    migrations blamed them for it, and every `db upgrade` and `serve` start
    failed for ever."""
    if Driver(database_url).name != "sqlite":
        pytest.skip("SQLite only: the others enforce their foreign keys")
    url = make_database("sqlite", tmp_path)
    upgrade(url, "0013")
    drv = Driver(url)
    try:
        with drv.engine.connect() as conn:
            raw = conn.connection.driver_connection
            assert raw is not None
            raw.execute("PRAGMA foreign_keys=OFF")
            conn.exec_driver_sql("INSERT INTO variant_jobs (photo_id) VALUES ('gone')")
            conn.commit()
    finally:
        drv.dispose()
    upgrade(url)
    assert current(url) == head()
    upgrade(url)  # and again, with nothing to do


def test_a_users_profile_named_like_a_later_built_in_is_kept(database_url: str, tmp_path) -> None:
    """`profiles create pdf-preview` at 0004 made pdf-preview v1, which 0005
    ships: the upgrade stopped on the unique key (on MariaDB for good, its
    DDL committed), with no word on what to do."""
    backend = Driver(database_url).name
    backend = "mariadb" if backend == "mysql" else backend
    url = make_database(backend, tmp_path)
    drv = Driver(url)
    try:
        upgrade(url, "0004")
        with drv.engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO processing_profiles (profile_key, profile_version, job_type,"
                " queue_name, settings, credit_cost_base, is_active)"
                " VALUES ('pdf-preview', 'v1', 'debug.noop', 'bulk', '{}', 5, true)"
            )
        upgrade(url)
        assert current(url) == head()
        with drv.engine.connect() as conn:
            rows = conn.exec_driver_sql(
                "SELECT profile_key, job_type FROM processing_profiles"
                " WHERE profile_key IN ('pdf-preview', 'virus-scan')"
            ).all()
        assert sorted(map(tuple, rows)) == [
            ("pdf-preview", "debug.noop"),
            ("virus-scan", "security.virus_scan"),
        ]
    finally:
        drv.dispose()
        drop_database(backend, url)


def test_mariadb_runs_again_a_step_that_stopped_part_way(database_url: str, tmp_path) -> None:
    """MariaDB commits each DDL statement: a `db upgrade` killed inside a step
    left its work done under the previous stamp, and every later upgrade (and
    `serve` start) stopped on "Table 'projects' already exists".  Here each
    step is made to have run whole without its stamp, the worst case, and the
    upgrade must go through to a schema that matches the models."""
    if Driver(database_url).name != "mysql":
        pytest.skip("MariaDB only: PostgreSQL and SQLite roll a failed step back")
    from hypermedia.db import revisions

    steps = [r for r in revisions.known() if r >= "0003"]
    for step in steps:
        url = make_database("mariadb", tmp_path)
        drv = Driver(url)
        try:
            upgrade(url, step)
            before = revisions.known()[revisions.known().index(step) - 1]
            with drv.engine.begin() as conn:
                conn.exec_driver_sql(f"UPDATE alembic_version SET version_num = '{before}'")
            upgrade(url)
            assert current(url) == head(), step
            assert _diff(url) == [], step
        finally:
            drv.dispose()
            drop_database("mariadb", url)

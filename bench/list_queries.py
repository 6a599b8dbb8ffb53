"""Job lists at scale: GET /v1/jobs's query (``Tx.jobs``) and the dashboard's
recent failures with a million jobs, with and without migration 0016's indexes
(``idx_project_status``; on SQLite ``idx_project_job`` too).

Fills ``processing_jobs`` of a fresh database at head (SQLite in a temporary
folder, PostgreSQL ``hm_bench_lists``, MariaDB ``hm_bench_lists``) with
``--rows`` jobs in one INSERT ... SELECT: three projects (90 % / 10 % / 0.1 %
of the rows), four job types on three queues, 96.9 % completed, 2 % failed
spread over every id, 0.6 % cancelled, 0.5 % queued among the newest 5 %.
Then times each page (limit 51, the API's 50 + 1; the median of three after
one warm-up) as migrated, drops those indexes, times again, and prints both
with their ratio.  PostgreSQL and MariaDB are analysed after the fill, as
their autovacuum and InnoDB would have; SQLite is not (nothing runs ANALYZE
on a hypermedia database: its planner works without statistics).  Not a
comparison with a peer: the question is whether a page costs what it shows
or what the table holds.

    .venv/bin/python bench/list_queries.py --rows 1000000
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import _common as C
import sqlalchemy as sa

from hypermedia.db.driver import normalise_url

MARIADB_ADMIN = "mysql://root@127.0.0.1:3306/test"
NAME = "hm_bench_lists"
INDEXES = ("idx_project_status", "idx_project_job")  # migration 0016's

# (label, Tx.jobs filters); each with no project, the big one and the small one,
# on the first page and from a cursor in the middle of the ids.
FILTERS: list[tuple[str, dict[str, str]]] = [
    ("all", {}),
    ("status=failed", {"status": "failed"}),
    ("status=queued", {"status": "queued"}),
    ("type=pdf.preview", {"job_type": "pdf.preview"}),
    ("type=virus_scan & failed", {"job_type": "security.virus_scan", "status": "failed"}),
    ("queue=bulk & queued", {"queue": "bulk", "status": "queued"}),
]
PROJECTS = (None, "p_big", "p_small")


def fill_sql(dialect: str, rows: int, profile_id: int) -> str:
    """One INSERT ... SELECT of ``rows`` jobs, ids 1..rows, a second apart."""
    if dialect == "postgresql":
        src = f"SELECT i FROM generate_series(1::bigint, {rows}::bigint) AS g(i)"
        at = "TIMESTAMP '2025-01-01' + make_interval(secs => {})"
        uuid = "'u-' || lpad(i::text, 12, '0')"
    elif dialect == "mysql":
        src = f"SELECT seq AS i FROM seq_1_to_{rows}"
        at = "TIMESTAMPADD(SECOND, {}, '2025-01-01')"
        uuid = "CONCAT('u-', LPAD(i, 12, '0'))"
    else:
        src = (
            "WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g "
            f"WHERE i < {rows}) SELECT i FROM g"
        )
        at = "datetime('2025-01-01', '+' || ({}) || ' seconds')"
        uuid = "'u-' || printf('%012d', i)"
    status = (
        f"CASE WHEN i > {rows - rows // 20} AND hs < 100 THEN 'queued' "
        "WHEN hs >= 970 AND hs < 990 THEN 'failed' "
        "WHEN hs >= 990 AND hs < 996 THEN 'cancelled' ELSE 'completed' END"
    )
    kind = "CASE WHEN ht < 60 THEN {} WHEN ht < 85 THEN {} WHEN ht < 95 THEN {} ELSE {} END"
    done = "CASE WHEN st = 'queued' THEN {} ELSE {} END"
    return f"""
INSERT INTO processing_jobs (job_id, job_uuid, owner_id, project_id, job_type, queue_name,
  priority, status, profile_id, input_key, input_size_bytes, estimated_credits, actual_credits,
  max_attempts, attempt_count, timeout_seconds, available_at, created_at, updated_at,
  started_at, completed_at, outcome, credits_folded)
SELECT i, {uuid}, 'owner',
  CASE WHEN i % 1000 = 7 THEN 'p_small' WHEN i % 10 = 3 THEN 'p_mid' ELSE 'p_big' END,
  {kind.format("'image.thumbnail'", "'pdf.preview'", "'debug.noop'", "'security.virus_scan'")},
  {kind.format("'images'", "'documents'", "'bulk'", "'bulk'")},
  5, st, {profile_id}, 'k/obj', 1000, 1, {done.format("NULL", "1")}, 3,
  {done.format("0", "1")}, 3600,
  {at.format("i")}, {at.format("i")}, {at.format("i")},
  {done.format("NULL", at.format("i + 1"))}, {done.format("NULL", at.format("i + hs % 50 + 2"))},
  {done.format("NULL", "st")}, {done.format("FALSE", "TRUE")}
FROM (SELECT i, hs, ht, {status} AS st FROM (
  SELECT i, (i * 2654435761) % 1000003 % 1000 AS hs, (i * 40503) % 10007 % 100 AS ht
  FROM ({src}) AS n) AS h) AS s
"""


@contextlib.contextmanager
def database(backend: str, admin: str) -> Iterator[str]:
    """A fresh empty database's URL; dropped afterwards."""
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="hm-bench-lists-") as d:
            yield f"sqlite:///{d}/lists.db"
    elif backend == "postgresql":
        with C.pg_database(admin, NAME) as url:
            yield url
    else:
        server = sa.create_engine(normalise_url(MARIADB_ADMIN))
        with server.begin() as c:
            c.exec_driver_sql(f"DROP DATABASE IF EXISTS {NAME}")
            c.exec_driver_sql(f"CREATE DATABASE {NAME}")
        try:
            yield MARIADB_ADMIN.rsplit("/", 1)[0] + f"/{NAME}"
        finally:
            with server.begin() as c:
                c.exec_driver_sql(f"DROP DATABASE IF EXISTS {NAME}")
            server.dispose()


def filled(url: str, rows: int) -> Any:
    """The database at head with ``rows`` jobs, analysed; its Driver."""
    from hypermedia.db.driver import Driver
    from hypermedia.db.migrate import upgrade

    upgrade(url)
    driver = Driver(url)
    t = time.perf_counter()
    with driver.tx() as tx:
        profile_id = tx.conn.exec_driver_sql("SELECT MIN(profile_id) FROM processing_profiles")
        sql = fill_sql(driver.name, rows, profile_id.scalar())
        tx.conn.exec_driver_sql(sql if driver.name == "sqlite" else sql.replace("%", "%%"))
    analyse(driver)
    print(f"... {driver.name}: {rows:,} jobs in {time.perf_counter() - t:.0f} s", flush=True)
    return driver


def analyse(driver: Any) -> None:
    if driver.name == "sqlite":
        return
    with driver.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.exec_driver_sql(
            "VACUUM ANALYZE processing_jobs"
            if driver.name == "postgresql"
            else "ANALYZE TABLE processing_jobs"
        )


def drop_indexes(driver: Any) -> None:
    made = {i["name"] for i in sa.inspect(driver.engine).get_indexes("processing_jobs")}
    with driver.engine.begin() as c:
        for name in INDEXES:
            if name in made:
                on = " ON processing_jobs" if driver.name == "mysql" else ""
                c.exec_driver_sql(f"DROP INDEX {name}{on}")


def cases(rows: int) -> list[tuple[str, Callable[[Any], Any]]]:
    out: list[tuple[str, Callable[[Any], Any]]] = []
    for label, filters in FILTERS:
        for project in PROJECTS:
            for before in (None, rows // 2):
                kw: dict[str, Any] = {**filters, "limit": 51, "project_id": project}
                if before:
                    kw["before_id"] = before
                name = f"{label}, {project or 'any project'}{', deep' if before else ''}"
                out.append((name, lambda tx, kw=kw: tx.jobs(**kw)))
    for project in ("p_big", "p_small"):
        out.append((f"recent failures, {project}", lambda tx, p=project: tx.recent_failures(p, 10)))
    return out


def timed(driver: Any, fn: Callable[[Any], Any]) -> float:
    times = []
    for _ in range(4):
        t = time.perf_counter()
        with driver.read() as tx:
            fn(tx)
        times.append((time.perf_counter() - t) * 1000)
        if sum(times) > 10_000:  # a slow one: its first two runs tell
            break
    return statistics.median(times[1:])


def run(backend: str, args: argparse.Namespace) -> list[list[Any]]:
    with database(backend, args.pg_admin) as url:
        driver = filled(url, args.rows)
        try:
            todo = cases(args.rows)
            with_index = [timed(driver, fn) for _, fn in todo]
            drop_indexes(driver)
            analyse(driver)
            without = [timed(driver, fn) for _, fn in todo]
        finally:
            driver.dispose()
    return [
        [backend, name, f"{a:.1f}", f"{b:.1f}", f"{b / a:.1f}x"]
        for (name, _), a, b in zip(todo, with_index, without, strict=True)
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--backends", default="sqlite,postgresql,mariadb")
    ap.add_argument("--pg-admin", default=C.DEFAULT_PG_ADMIN)
    ap.add_argument("--time-limit", type=float, default=1800)
    args = ap.parse_args()
    C.set_time_limit(args.time_limit)
    C.note_code_version()
    rows = [r for b in args.backends.split(",") for r in run(b, args)]
    print(f"\ncommand: {C.command_line()}\nmachine: {C.machine_line()}")
    print(f"jobs: {args.rows:,}; ms per page (limit 51), median of 3 after a warm-up\n")
    head = ("database", "page", "ms as migrated", "ms without 0016's", "without / with")
    print(C.table(head, rows))


if __name__ == "__main__":
    main()

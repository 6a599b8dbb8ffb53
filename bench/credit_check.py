"""What a budget check costs as a project's history grows, before and after the credit fold.

A paid enqueue locks its project's budget row and adds up the project's credit
use (db/credit_queries.py).  For each ``--jobs`` count, a fresh PostgreSQL
database gets that many completed jobs of one project with a budget
(bulk-loaded with INSERT ... SELECT generate_series, then VACUUM ANALYZE); the
credit-use read is timed ``--reads`` times, the leader's fold
(``CreditFold.run_once``, no time budget) is run and timed, the table is
VACUUM ANALYZEd (as autovacuum does after that many updates) and the read is timed
again.  Prints the medians and their ratio, and the plan of the read
after the fold.

    .venv/bin/python bench/credit_check.py --jobs 1000,500000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import _common as C

PROJECT = "bench-credits"
FILL = """
INSERT INTO processing_jobs (
    job_uuid, owner_id, project_id, job_type, queue_name, status, profile_id,
    estimated_credits, actual_credits, max_attempts, attempt_count,
    started_at, completed_at, created_at, updated_at)
SELECT gen_random_uuid()::text, 'system', %(project)s, 'debug.noop', 'bulk', 'completed',
       %(profile_id)s, 3, 2, 3, 1, t.ts, t.ts, t.ts, t.ts
FROM generate_series(1, %(n)s) AS g(i), (SELECT now() AT TIME ZONE 'UTC' AS ts) AS t
"""


def read_ms(engine: Any, reads: int) -> tuple[float, int]:
    """Median milliseconds of one credit-use read, and what it read."""
    times, used = [], 0
    for _ in range(reads):
        with engine.db.read() as tx:
            t0 = time.perf_counter()
            used = tx.credit_use(PROJECT)
            times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), used


def plan(url: str) -> str:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "EXPLAIN SELECT sum(estimated_credits) FROM processing_jobs "
            "WHERE project_id = %s AND credits_folded = false",
            (PROJECT,),
        ).fetchall()
    return "\n".join("    " + r[0] for r in rows)


def measure(admin: str, n: int, reads: int) -> list[Any]:
    from hypermedia.queue.profiles import Credits
    from hypermedia.scheduler.credits import CreditFold

    with C.pg_database(admin, f"hm_bench_credits_{n}") as url:
        engine = C.hm_engine(C.db_url(admin, f"hm_bench_credits_{n}", "postgresql+psycopg"))
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                profile_id = conn.execute(
                    "SELECT min(profile_id) FROM processing_profiles WHERE job_type = 'debug.noop'"
                ).fetchone()[0]
                conn.execute(FILL, {"project": PROJECT, "profile_id": profile_id, "n": n})
                conn.execute("VACUUM ANALYZE processing_jobs")
            Credits(engine).set_budget(PROJECT, 10**12)
            before, used_before = read_ms(engine, reads)
            t0 = time.perf_counter()
            folded = CreditFold(engine).run_once()
            fold_s = time.perf_counter() - t0
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("VACUUM ANALYZE processing_jobs")  # as autovacuum does after the fold
            after, used_after = read_ms(engine, reads)
            assert folded == n and used_before == used_after == 2 * n, (folded, used_after)
            print(f"plan of the read after the fold ({n:,} jobs):\n{plan(url)}")
        finally:
            engine.db.dispose()
    return [f"{n:,}", f"{before:.2f}", f"{after:.2f}", f"{before / after:.0f}x", f"{fold_s:.1f}"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", default="1000,500000")
    ap.add_argument("--reads", type=int, default=21)
    ap.add_argument("--pg-admin", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = ap.parse_args()
    print(C.command_line())
    print(C.machine_line())
    rows = [measure(args.pg_admin, int(n), args.reads) for n in args.jobs.split(",")]
    headers = ["completed jobs", "read ms before fold", "after fold", "faster", "fold s"]
    print(C.table(headers, rows))


if __name__ == "__main__":
    main()

"""What a /metrics scrape costs the database, before and after the attempt fold.

For each ``--jobs`` count, a fresh PostgreSQL database gets that many finished
jobs of three job types with one attempt each (bulk-loaded with INSERT ...
SELECT generate_series, then VACUUM ANALYZE).  ``Queues.figures`` (everything
/metrics reads) is timed ``--reads`` times; the leader's attempt fold is run
to the newest attempt (its one-minute wait skipped by dating the noted id
back), and the reads are timed again.  Prints the medians, the histogram's
share, and checks that both scrapes give the same histogram.

    .venv/bin/python bench/metrics_scrape.py --jobs 1000000
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

FILL_JOBS = """
INSERT INTO processing_jobs (job_uuid, owner_id, project_id, job_type, queue_name, status,
    profile_id, estimated_credits, max_attempts, attempt_count, started_at, completed_at)
SELECT gen_random_uuid()::text, 'system', 'default',
       (ARRAY['image.thumbnail', 'pdf.preview', 'debug.noop'])[1 + i %% 3], 'bulk',
       'completed', %(profile_id)s, 0, 3, 1, now(), now()
FROM generate_series(1, %(n)s) AS g(i)
"""
FILL_ATTEMPTS = """
INSERT INTO job_attempts (job_id, worker_id, attempt_number, status, started_at, finished_at,
    duration_ms)
SELECT job_id, 'bench', 1, 'completed', now(), now(), (job_id * 7919) %% 5000
FROM processing_jobs
"""


def timed(engine: Any, reads: int) -> tuple[float, float, list[Any]]:
    """Median s of a whole scrape's reads and of the histogram's; the histogram."""
    from hypermedia.queue import durations
    from hypermedia.queue.queues import Queues

    whole, hist, figures = [], [], {}
    for _ in range(reads):
        t0 = time.perf_counter()
        figures = Queues(engine).figures(durations.BOUNDS_MS)
        whole.append(time.perf_counter() - t0)
        with engine.db.read() as tx:
            mark = int(tx.attempt_fold()["watermark"])
            t0 = time.perf_counter()
            tx.attempt_duration_histogram(durations.BOUNDS_MS, after=mark)
            hist.append(time.perf_counter() - t0)
    return statistics.median(whole), statistics.median(hist), figures["durations"]


def measure(admin: str, n: int, reads: int) -> list[Any]:
    from hypermedia.scheduler.attempt_fold import AttemptFold

    name = f"hm_bench_scrape_{n}"
    with C.pg_database(admin, name) as url:
        engine = C.hm_engine(C.db_url(admin, name, "postgresql+psycopg"))
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                profile_id = conn.execute("SELECT min(profile_id) FROM processing_profiles")
                conn.execute(FILL_JOBS, {"profile_id": profile_id.fetchone()[0], "n": n})
                conn.execute(FILL_ATTEMPTS, {})
                conn.execute("VACUUM ANALYZE")
            before, before_hist, histogram = timed(engine, reads)
            with psycopg.connect(url, autocommit=True) as conn:  # noted a minute ago
                conn.execute(
                    "UPDATE attempt_fold SET seen = (SELECT max(attempt_id) FROM job_attempts), "
                    "seen_at = (now() AT TIME ZONE 'UTC') - interval '2 minutes'"
                )
            t0 = time.perf_counter()
            AttemptFold(engine).run_once()
            fold_s = time.perf_counter() - t0
            after, after_hist, folded = timed(engine, reads)
            assert folded == histogram, "the fold changed the histogram"
        finally:
            engine.db.dispose()
    return [
        f"{n:,}",
        f"{before:.3f}",
        f"{before_hist:.3f}",
        f"{after:.3f}",
        f"{after_hist:.4f}",
        f"{fold_s:.1f}",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", default="1000000")
    ap.add_argument("--reads", type=int, default=5)
    ap.add_argument("--pg-admin", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = ap.parse_args()
    print(C.command_line())
    print(C.machine_line())
    rows = [measure(args.pg_admin, int(n), args.reads) for n in args.jobs.split(",")]
    headers = ["finished jobs", "scrape s", "of it histogram", "after fold", "histogram", "fold s"]
    print(C.table(headers, rows))


if __name__ == "__main__":
    main()

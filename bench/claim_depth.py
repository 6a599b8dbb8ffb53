"""Claim cost against queue depth on PostgreSQL: does Engine.claim stay flat as the queue grows?

For each depth (``--depths``, default 1,000 then 1,000,000 queued debug.noop rows,
bulk-loaded with INSERT ... SELECT generate_series and then VACUUM ANALYZE), time
``Engine.claim(worker, ['bulk'], --batch)`` ``--claims`` times.  Between two timed
claims, untimed: the claimed jobs are started and completed with ``Engine.flush``
(as a worker would) and as many fresh queued rows are inserted, so the depth stays
constant.  Prints p50/p99 claim latency per depth, the ratio of the p99s (target:
p99 at 1M <= 2x p99 at 1k) and ``EXPLAIN (ANALYZE, BUFFERS)`` of the exact SQL the
claim sent (captured from the driver), checking that ``idx_status_queue`` is used.

    .venv/bin/python bench/claim_depth.py --depths 1000,1000000 --claims 2000
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import _common as C

TARGET_RATIO = 2.0
INDEX = "idx_status_queue"
WORKER = "bench-claim-depth"

FILL = """
INSERT INTO processing_jobs (
    job_uuid, owner_id, project_id, job_type, queue_name, priority, status, profile_id,
    params, input_key, input_size_bytes, estimated_credits, max_attempts, attempt_count,
    timeout_seconds, available_at, created_at, updated_at)
SELECT gen_random_uuid()::text, 'system', 'default', 'debug.noop', %(queue)s, 5, 'queued',
       %(profile_id)s, '{}'::jsonb, '', 0, %(credits)s, 3, 0, %(timeout)s, t.ts, t.ts, t.ts
FROM generate_series(1, %(n)s) AS g(i),
     (SELECT (now() AT TIME ZONE 'UTC') - interval '1 second' AS ts) AS t
"""


class Filler:
    """Bulk-load queued debug.noop rows straight into processing_jobs."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        row = self.conn.execute(
            "SELECT profile_id, queue_name, timeout_seconds, credit_cost_base "
            "FROM processing_profiles WHERE profile_key = 'debug-noop' AND is_active "
            "ORDER BY profile_id DESC LIMIT 1"
        ).fetchone()
        if row is None:
            raise SystemExit("no active debug-noop profile: did the migrations run?")
        self.params = {"profile_id": row[0], "queue": row[1], "timeout": row[2], "credits": row[3]}

    def add(self, n: int) -> None:
        if n > 0:
            self.conn.execute(FILL, {**self.params, "n": n})

    def fill_to(self, depth: int, chunk: int = 100_000) -> float:
        t = time.perf_counter()
        have = self.queued()
        while have < depth:
            k = min(chunk, depth - have)
            self.add(k)
            have += k
        self.conn.execute("VACUUM (ANALYZE) processing_jobs")
        return time.perf_counter() - t

    def queued(self) -> int:
        return int(
            self.conn.execute(
                "SELECT count(*) FROM processing_jobs WHERE status = 'queued'"
            ).fetchone()[0]
        )

    def close(self) -> None:
        self.conn.close()


class Capture:
    """Record the SQL the driver sends while the block runs."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self.statements: list[tuple[str, Any]] = []

    def _hook(
        self,
        conn: Any,
        cursor: Any,
        statement: str,
        parameters: Any,
        context: Any,
        executemany: bool,
    ) -> None:
        self.statements.append((statement, parameters))

    def __enter__(self) -> Capture:
        sa.event.listen(self.engine, "before_cursor_execute", self._hook)
        return self

    def __exit__(self, *exc: object) -> None:
        sa.event.remove(self.engine, "before_cursor_execute", self._hook)


def explain_claim(eng: Any, url: str, batch: int) -> tuple[str, bool]:
    """EXPLAIN ANALYZE the statement(s) Engine.claim sends that pick queued rows.

    The claim is run once for real to capture its SQL (those jobs are then
    completed), and the captured SQL is explained in a transaction that is
    rolled back, so the plan is the one the claim actually gets.
    """
    with Capture(eng.db.engine) as cap:
        got = eng.claim(WORKER, ["bulk"], batch)
    complete(eng, got)
    picks = [
        (s, p)
        for s, p in cap.statements
        if "processing_jobs" in s and "queued" in s and "SKIP LOCKED" in s.upper()
    ]
    if not picks:
        picks = [(s, p) for s, p in cap.statements if "processing_jobs" in s and "queued" in s]
    out = []
    used = False
    with psycopg.connect(url) as conn:
        for stmt, params in picks:
            with conn.transaction(force_rollback=True):
                plan = "\n".join(
                    r[0] for r in conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + stmt, params)
                )
            used = used or INDEX in plan
            out.append(f"-- SQL sent by Engine.claim:\n{stmt.strip()}\n-- plan:\n{plan}")
    return "\n\n".join(out) or "(no claim statement captured)", used


def complete(eng: Any, got: list[Any]) -> None:
    from hypermedia.queue.models import AttemptResult

    if got:
        eng.flush(
            WORKER,
            [(c.job_id, c.attempt) for c in got],
            [AttemptResult(job_id=c.job_id, attempt=c.attempt, status="completed") for c in got],
        )


def measure(
    eng: Any, filler: Filler, claims: int, warmup: int, batch: int
) -> tuple[list[float], list[float]]:
    lat, settle = [], []
    for i in range(warmup + claims):
        t = time.perf_counter()
        got = eng.claim(WORKER, ["bulk"], batch)
        dt = time.perf_counter() - t
        if len(got) != batch:
            raise RuntimeError(f"claim returned {len(got)} jobs, expected {batch}")
        t = time.perf_counter()
        complete(eng, got)
        ds = time.perf_counter() - t
        filler.add(len(got))  # keep the depth constant
        if i >= warmup:
            lat.append(dt * 1000)
            settle.append(ds * 1000)
    return lat, settle


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--depths", default="1000,1000000")
    p.add_argument("--claims", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--pg-admin", default=C.DEFAULT_PG_ADMIN)
    p.add_argument("--time-limit", type=float, default=1800.0)
    p.add_argument("--keep", action="store_true", help="do not drop the database afterwards")
    args = p.parse_args(argv)
    depths = [int(x) for x in args.depths.split(",") if x]

    C.set_time_limit(args.time_limit)
    C.note_code_version()
    load0 = os.getloadavg()[0]
    print(f"command: {C.command_line()}", flush=True)
    rows, plans = [], []
    try:
        with C.pg_database(args.pg_admin, "hm_bench_claim_depth", keep=args.keep) as url:
            eng = C.hm_engine(url)
            filler = Filler(url)
            try:
                for depth in sorted(depths):
                    load = filler.fill_to(depth)
                    print(f"... depth {depth:,}: loaded in {load:.1f} s", flush=True)
                    plan, used = explain_claim(eng, url, args.batch)
                    filler.add(args.batch)
                    plans.append((depth, plan, used))
                    lat, settle = measure(eng, filler, args.claims, args.warmup, args.batch)
                    rows.append((depth, filler.queued(), lat, settle, used))
                    print(f"... depth {depth:,}: {args.claims} claims done", flush=True)
            finally:
                filler.close()
                eng.db.dispose()
    except C.BenchTimeout as exc:
        print(f"stopped: {exc}; partial results follow")

    print()
    print(f"command: {C.command_line()}")
    print(f"machine: {C.machine_line()}")
    print(f"load average (1 min): at start {load0:.2f}, at end {os.getloadavg()[0]:.2f}")
    print(
        f"{args.claims} timed claims of {args.batch} per depth after {args.warmup} warm-up; "
        "between claims (untimed) the jobs are completed and the depth topped up"
    )
    print()
    print(
        C.table(
            [
                "queued depth",
                "claim p50 ms",
                "claim p99 ms",
                "claim mean ms",
                "claim max ms",
                "flush p50 ms",
                f"plan uses {INDEX}",
            ],
            [
                [
                    d,
                    C.percentile(lat, 50),
                    C.percentile(lat, 99),
                    statistics.fmean(lat),
                    max(lat),
                    C.percentile(st, 50),
                    "yes" if used else "NO",
                ]
                for d, _, lat, st, used in rows
            ],
        )
    )
    if len(rows) >= 2:
        lo, hi = rows[0], rows[-1]
        r = C.percentile(hi[2], 99) / C.percentile(lo[2], 99)
        r50 = C.percentile(hi[2], 50) / C.percentile(lo[2], 50)
        verdict = "met" if r <= TARGET_RATIO else "MISSED"
        print()
        print(
            f"p99 at {hi[0]:,} / p99 at {lo[0]:,} = {r:.2f}x (target <= {TARGET_RATIO:.1f}x: "
            f"{verdict}); p50 ratio {r50:.2f}x"
        )
    for depth, plan, used in plans:
        print()
        print(f"== EXPLAIN at depth {depth:,} ({INDEX} used: {'yes' if used else 'NO'}) ==")
        print(plan)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

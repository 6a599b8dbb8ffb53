"""Pick-up latency on PostgreSQL: enqueue -> attempt start with an idle worker woken by NOTIFY.

Starts one idle ``hypermedia worker --queues bulk`` subprocess (no --burst, default
poll interval, so only LISTEN/NOTIFY can wake it quickly), then enqueues ``--jobs``
debug.noop jobs one at a time with ``Engine.enqueue`` and random gaps (``--gap-ms``,
default 50-150 ms).  Latency per job = ``job_attempts.started_at`` (the worker's
claim) minus ``processing_jobs.created_at`` (the enqueuer), both naive UTC from the
same machine clock.  Target: p99 < 100 ms.

    .venv/bin/python bench/pickup_latency.py --jobs 200
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import _common as C

TARGET_P99_MS = 100.0

LATENCIES = """
SELECT j.job_id,
       extract(epoch FROM a.started_at - j.created_at) * 1000 AS pickup_ms,
       extract(epoch FROM j.completed_at - j.created_at) * 1000 AS done_ms
FROM processing_jobs j
JOIN job_attempts a ON a.job_id = j.job_id AND a.attempt_number = 1
WHERE j.job_id = ANY(%s)
ORDER BY j.job_id
"""


def wait_idle(url: str, proc: C.Proc, timeout: float) -> float:
    """Wait until the worker has registered and its first (empty) claim has had time to run."""
    t0 = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            n = conn.execute(
                "SELECT count(*) FROM workers WHERE status IN ('active', 'idle')"
            ).fetchone()[0]
            if n:
                break
            if proc.poll() is not None:
                raise SystemExit(f"worker exited (rc={proc.poll()}):\n{proc.tail()}")
            if time.perf_counter() - t0 > timeout:
                raise SystemExit(f"worker did not register within {timeout:.0f} s:\n{proc.tail()}")
            time.sleep(0.05)
    time.sleep(2.0)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--gap-ms", default="50,150", help="min,max pause between two enqueues")
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--pg-admin", default=C.DEFAULT_PG_ADMIN)
    p.add_argument("--time-limit", type=float, default=600.0)
    args = p.parse_args(argv)
    lo, hi = (float(x) / 1000 for x in args.gap_ms.split(","))
    rng = random.Random(args.seed)

    ok, msg = C.worker_available(need=())
    if not ok:
        print(f"cannot run: {msg}")
        return 2
    C.set_time_limit(args.time_limit)
    C.note_code_version()
    load0 = os.getloadavg()[0]
    print(f"command: {C.command_line()}", flush=True)
    from hypermedia.config import Settings
    from hypermedia.queue.models import NewJob

    rows: list[tuple[int, float, float | None]] = []
    rc = None
    with (
        tempfile.TemporaryDirectory(prefix="hm_bench_pickup_") as tmp,
        C.pg_database(args.pg_admin, "hm_bench_pickup") as url,
    ):
        eng = C.hm_engine(url)
        proc = C.Proc(
            C.worker_command(concurrency=args.concurrency, batch=args.batch, burst=False),
            C.worker_env(url, Path(tmp) / "home"),
            Path(tmp) / "worker.log",
        )
        try:
            proc.start()
            ready = wait_idle(url, proc, 120)
            print(f"... worker pid {proc.pid} idle after {ready:.1f} s; enqueueing", flush=True)
            ids = []
            for _ in range(args.jobs):
                time.sleep(rng.uniform(lo, hi))
                ids.append(eng.enqueue(NewJob("debug.noop")))
            deadline = time.perf_counter() + 120
            with psycopg.connect(url, autocommit=True) as conn:
                while time.perf_counter() < deadline:
                    left = conn.execute(
                        "SELECT count(*) FROM processing_jobs WHERE job_id = ANY(%s) "
                        "AND status <> 'completed'",
                        (ids,),
                    ).fetchone()[0]
                    if not left:
                        break
                    time.sleep(0.1)
                rows = [
                    (r[0], float(r[1]), None if r[2] is None else float(r[2]))
                    for r in conn.execute(LATENCIES, (ids,))
                ]
        except C.BenchTimeout as exc:
            print(f"stopped: {exc}; partial results follow")
        finally:
            rc = proc.stop()
            eng.db.dispose()
            log_tail = proc.tail(10)

    pick = [r[1] for r in rows]
    done = [r[2] for r in rows if r[2] is not None]
    print()
    print(f"command: {C.command_line()}")
    print(f"machine: {C.machine_line()}")
    print(f"load average (1 min): at start {load0:.2f}, at end {os.getloadavg()[0]:.2f}")
    wcmd = " ".join(C.worker_command(concurrency=args.concurrency, batch=args.batch, burst=False))
    print(
        f"worker: {wcmd}; poll interval {Settings().poll_interval_seconds:g} s (default), "
        "so fast pick-up needs NOTIFY"
    )
    print(
        f"{args.jobs} jobs enqueued one at a time, gaps uniform {args.gap_ms} ms; "
        f"{len(pick)} picked up, {len(done)} completed; worker exit code after SIGTERM: {rc}"
    )
    print()
    print(
        C.table(
            ["enqueue ->", "n", "p50 ms", "p90 ms", "p99 ms", "max ms", "mean ms"],
            [
                [
                    name,
                    len(v),
                    C.percentile(v, 50),
                    C.percentile(v, 90),
                    C.percentile(v, 99),
                    max(v) if v else None,
                    statistics.fmean(v) if v else None,
                ]
                for name, v in (("attempt start (claim)", pick), ("completed", done))
            ],
        )
    )
    if pick:
        p99 = C.percentile(pick, 99)
        print()
        print(
            f"pick-up p99 {p99:.1f} ms (target < {TARGET_P99_MS:.0f} ms: "
            f"{'met' if p99 < TARGET_P99_MS else 'MISSED'})"
        )
    if len(pick) < args.jobs:
        print(f"\nworker log tail:\n{log_tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where a debug.noop job's CPU goes: the worker (with its children) against the
rest of the machine (PostgreSQL, the kernel), per job, on PostgreSQL.

Fills a fresh database with ``--jobs`` debug.noop jobs (as bench/queue_throughput.py
does), then drains it with one ``hypermedia worker --burst`` subprocess and reads
its CPU (and its reaped children's) from ``wait4`` and the whole machine's busy
time from ``/proc/stat``.  ``--env NAME=VALUE`` runs the worker with extra
settings, so two runs side by side show what a setting costs, e.g.:

    .venv/bin/python bench/worker_cpu.py --batch 10
    .venv/bin/python bench/worker_cpu.py --batch 10 --env HYPERMEDIA_CHILD_MAX_ATTEMPTS=1000

Run it on a quiet machine: the rest-of-machine column counts everything.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import _common as C
import queue_throughput as Q


def busy_seconds() -> float:
    with open("/proc/stat") as f:
        ticks = list(map(int, f.readline().split()[1:]))
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # less idle, iowait


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for the worker")
    ap.add_argument("--pg-admin", default=C.DEFAULT_PG_ADMIN)
    args = ap.parse_args()
    extra = dict(kv.split("=", 1) for kv in args.env)
    print(f"command: {C.command_line()}\n{C.machine_line()}")
    with (
        tempfile.TemporaryDirectory() as work,
        C.pg_database(args.pg_admin, f"hm_bench_cpu_b{args.batch}") as url,
    ):
        Q.hm_fill(url, args.jobs, args.batch)
        Q.pg_analyze(url)
        cmd = C.worker_command(concurrency=args.concurrency, batch=args.batch, burst=True)
        env = C.worker_env(
            url, Path(work) / "home", HYPERMEDIA_CLAIM_BATCH=str(args.batch), **extra
        )
        busy0, t0 = busy_seconds(), time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, status, ru = os.wait4(proc.pid, 0)
        wall, busy = time.perf_counter() - t0, busy_seconds() - busy0
        counts = Q.hm_counts(url)
    if status != 0 or counts.get("completed") != args.jobs:
        sys.exit(f"the worker exited with {status}; statuses {counts}")
    worker = ru.ru_utime + ru.ru_stime
    per = 1e6 / args.jobs
    print(
        C.table(
            [
                "B",
                "env",
                "wall s (incl. start-up)",
                "worker+children us/job",
                "rest us/job",
                "machine us/job",
            ],
            [
                [
                    args.batch,
                    " ".join(args.env) or "-",
                    f"{wall:.2f}",
                    f"{worker * per:.0f}",
                    f"{(busy - worker) * per:.0f}",
                    f"{busy * per:.0f}",
                ]
            ],
        )
    )


if __name__ == "__main__":
    main()

"""Where a thumbnail drain's CPU goes, by worker thread, in its steady state.

    .venv/bin/python bench/worker_threads.py [--images 240] [--megapixels 8] [--concurrency 2]

Uploads ``--images`` JPEGs (drawn as bench/thumbnails.py draws them, kept in
its ``--inputs`` folder) into a fresh SQLite HYPERMEDIA_HOME, enqueues one
``image.thumbnail`` job (profile ``image-thumbnail:v1``) per file and drains
them with ``hypermedia worker --burst``, sampling every 20 ms the CPU time and
voluntary context switches of each of the worker's threads (their kernel
names: hypermedia/linux.py), of its children and of the whole machine.
The figures are per image over the steady window between the 1/6th and the
5/6th completion (``processing_jobs.completed_at``), so the worker's start-up
and the drain's tail do not count.  Not a comparison with a peer: the
diagnostic behind docs/benchmarks.md's "where the last 10 %% goes".
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import UTC
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import _common as C
import thumbnails as T

TICK = os.sysconf("SC_CLK_TCK")


def _stat_cpu(path: str) -> tuple[int, int]:
    """(user + system ticks, system ticks) of a /proc stat file."""
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12]), int(fields[12])


def _switches(path: str) -> int:
    with open(path) as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    return 0


def _machine() -> tuple[int, int]:
    """(all ticks, idle + iowait ticks) of the whole machine."""
    with open("/proc/stat") as f:
        ticks = list(map(int, f.readline().split()[1:]))
    return sum(ticks), ticks[3] + ticks[4]


def sample(pid: int) -> dict[str, tuple[int, ...]]:
    """One sample: per thread name (cpu, sys, switches), children, machine."""
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    kids = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        base = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{base}/comm") as f:
                name = f.read().strip()
            cpu, sys_ = _stat_cpu(f"{base}/stat")
            row = out[name]
            row[0], row[1], row[2] = (
                row[0] + cpu,
                row[1] + sys_,
                row[2] + _switches(f"{base}/status"),
            )
            with open(f"{base}/children") as f:
                for child in f.read().split():
                    kids += _stat_cpu(f"/proc/{child}/stat")[0]
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread or child that just ended
    res = {k: tuple(v) for k, v in out.items()}
    res["(children)"] = (kids, 0, 0)
    res["(machine)"] = _machine()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=240)
    ap.add_argument("--megapixels", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument(
        "--inputs", type=Path, default=Path(tempfile.gettempdir()) / "hypermedia-bench-thumbnails"
    )
    args = ap.parse_args()

    import sqlalchemy as sa

    from hypermedia.config import Settings
    from hypermedia.db.driver import Driver
    from hypermedia.db.schema import job_attempts, processing_jobs
    from hypermedia.queue.models import NewJob
    from hypermedia.storage.ledger import Storage

    files = T.make_inputs(args.inputs, [args.megapixels], args.images)[args.megapixels]
    home = Path(tempfile.mkdtemp(prefix="hm-threads-"))
    url = f"sqlite:///{home / 'hypermedia.db'}"
    engine = C.hm_engine(url)
    driver = Driver(url)
    try:
        storage = Storage(driver, Settings(home=home, database_url=url))
        objects = storage.put_files(files)
        engine.enqueue_many(
            [
                NewJob("image.thumbnail", profile=T.PROFILE, object_id=o["object_id"])
                for o in objects
            ]
        )
        cmd = [str(C.HYPERMEDIA_BIN), "worker", "--queues", "images", "--burst"]
        cmd += ["--concurrency", str(args.concurrency), "--no-maintenance"]
        samples: list[tuple[float, dict[str, tuple[int, ...]]]] = []
        with open(home / "worker.log", "wb") as log:
            proc = subprocess.Popen(cmd, env=C.worker_env(url, home), stdout=log, stderr=log)
            while proc.poll() is None:
                try:
                    samples.append((time.time(), sample(proc.pid)))
                except (FileNotFoundError, ProcessLookupError):
                    break
                time.sleep(0.02)
        if proc.wait() != 0:
            raise SystemExit(f"the worker failed: {(home / 'worker.log').read_text()[-2000:]}")
        J, A = processing_jobs, job_attempts
        with driver.read() as tx:
            done = sorted(
                r[0].replace(tzinfo=UTC).timestamp()  # stored naive, in UTC
                for r in tx.conn.execute(sa.select(J.c.completed_at)).all()
            )
            cpu_ms = tx.conn.execute(sa.select(sa.func.avg(A.c.cpu_time_ms))).scalar_one()
        report(samples, done, float(cpu_ms or 0), args)
    finally:
        driver.dispose()
        shutil.rmtree(home, ignore_errors=True)


def report(
    samples: list[tuple[float, dict[str, tuple[int, ...]]]],
    done: list[float],
    child_cpu_ms: float,
    args: argparse.Namespace,
) -> None:
    lo, hi = len(done) // 6, len(done) * 5 // 6
    n = hi - lo
    start, end = done[lo], done[hi]

    def at(t: float) -> dict[str, tuple[int, ...]]:
        return max((s for s in samples if s[0] <= t), key=lambda s: s[0], default=samples[0])[1]

    a, b = at(start), at(end)

    def per_image(key: str, i: int) -> float:
        return (b.get(key, (0, 0, 0))[i] - a.get(key, (0, 0, 0))[i]) / n

    rows = []
    for name in sorted(b, key=lambda k: -per_image(k, 0)):
        if name.startswith("("):
            continue
        rows.append(
            [
                name,
                f"{per_image(name, 0) * 1000 / TICK:.2f}",
                f"{per_image(name, 1) * 1000 / TICK:.2f}",
                f"{per_image(name, 2):.1f}",
            ]
        )
    worker = sum(per_image(k, 0) for k in b if not k.startswith("(")) * 1000 / TICK
    all_ticks = per_image("(machine)", 0) * 1000 / TICK
    idle = per_image("(machine)", 1) * 1000 / TICK
    print(f"command: {C.command_line()}")
    print(f"machine: {C.machine_line()}")
    print(
        f"{args.images} JPEGs of {args.megapixels} MP, {args.concurrency} lanes; steady window: "
        f"completions {lo}..{hi}, {n} images in {end - start:.2f} s = {n / (end - start):.1f} img/s"
    )
    print()
    print(C.table(["thread", "CPU ms/img", "of it system", "voluntary switches/img"], rows))
    print()
    print(f"worker threads, all: {worker:.2f} ms per image")
    print(f"a child's CPU per attempt (job_attempts.cpu_time_ms): {child_cpu_ms:.1f} ms")
    kids = per_image("(children)", 0) * 1000 / TICK
    print(f"the live children, sampled: {kids:.1f} ms per image")
    print(f"machine: {all_ticks:.1f} ms of CPU time per image ({idle:.2f} ms of it idle)")


if __name__ == "__main__":
    main()

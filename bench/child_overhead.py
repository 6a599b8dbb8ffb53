"""Process overhead of one tiny attempt: a warm child versus a fresh process.

    .venv/bin/python bench/child_overhead.py [--attempts 2000]

Runs debug.noop attempts through hypermedia's warm child (the pipe round trip
plus the per-attempt limits, rusage and peak-memory reset), side by side with
starting a fresh ``python -I -m hypermedia.worker.child`` per attempt (what a
worker without a warm pool would pay), and prints the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from hypermedia.worker.pool import Child


def _attempt(child: Child, msg: dict) -> None:
    if not child.send(msg):
        raise RuntimeError("child refused the attempt")
    ready, reply = child.poll(10.0)
    if not ready or reply is None or reply.get("status") != "completed":
        raise RuntimeError(f"attempt failed: {reply!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attempts", type=int, default=2000)
    ap.add_argument("--cold", type=int, default=30, help="fresh-process attempts")
    args = ap.parse_args()
    scratch = tempfile.mkdtemp(prefix="hm-bench-")
    msg = {
        "op": "run",
        "job_id": 1,
        "job_type": "debug.noop",
        "params": {},
        "scratch": scratch,
        "mem_mb": 2048,
        "cpu_s": 60,
    }

    warm = Child()
    _attempt(warm, msg)  # first attempt imports the pipelines
    lat = []
    for _ in range(args.attempts):
        t = time.perf_counter()
        _attempt(warm, msg)
        lat.append(time.perf_counter() - t)
    warm.stop()

    cold = []
    for _ in range(args.cold):
        t = time.perf_counter()
        c = Child()
        _attempt(c, msg)
        cold.append(time.perf_counter() - t)
        c.stop()

    lat.sort()
    p50, p99 = lat[len(lat) // 2] * 1e6, lat[int(len(lat) * 0.99)] * 1e6
    cold_ms = statistics.median(cold) * 1e3
    print(f"command: .venv/bin/python bench/child_overhead.py --attempts {args.attempts}")
    print(
        f"warm child, per attempt:   p50 {p50:.0f} µs   p99 {p99:.0f} µs"
        f"   ({args.attempts} attempts)"
    )
    print(f"fresh process per attempt: median {cold_ms:.1f} ms   ({args.cold} attempts)")
    print(f"ratio fresh / warm (median): {cold_ms * 1000 / p50:.0f}x")


if __name__ == "__main__":
    main()

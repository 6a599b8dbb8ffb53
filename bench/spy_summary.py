"""Summarise a ``py-spy record --format raw`` file (collapsed stacks) as plain text.

``queue_throughput.py --py-spy DIR`` writes one such file per hypermedia worker run.
This prints, per process and thread, the share of samples and the frames where that
thread spends its time (leaf frames, and hypermedia/SQLAlchemy/driver frames on the
way), so "where does the worker's time go" can be read without a flame-graph viewer.

    .venv/bin/python bench/spy_summary.py DIR/worker_pg_b100.txt --top 12
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def short(frame: str) -> str:
    m = FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    f = m.group("file")
    repo = str(Path(__file__).resolve().parent.parent) + "/"
    for marker in ("site-packages/", repo, "lib/python3.11/"):
        if marker in f:
            f = f.split(marker, 1)[1]
            break
    return f"{m.group('func')} ({f}:{m.group('line') or '?'})"


SKIP = ("worker (hypermedia/cli/main.py", "Worker.run (hypermedia/worker/runner.py")


def role(body: list[str]) -> str:
    """Name a thread by its loop: the first hypermedia frame below the CLI entry."""
    for f in body:
        if "hypermedia/" in f and not f.startswith(SKIP):
            return "thread " + f.split(" (", 1)[0]
    return "thread (outside hypermedia)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("raw", type=Path)
    p.add_argument("--top", type=int, default=10)
    p.add_argument(
        "--match",
        default="hypermedia/",
        help="also rank inclusive time of frames whose file contains this",
    )
    args = p.parse_args(argv)

    per_thread: Counter[str] = Counter()
    leaf: dict[str, Counter[str]] = defaultdict(Counter)
    incl: dict[str, Counter[str]] = defaultdict(Counter)
    total = 0
    for line in args.raw.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        count = int(n)
        frames = stack.split(";")
        # py-spy raw: [process "cmd";] thread (id); frames...
        head = [f for f in frames[:2] if f.startswith(("process", "thread"))]
        body = frames[len(head) :]
        procs = [h[:60] for h in head if h.startswith("process")]
        key = " / ".join([*procs, role(body)])
        per_thread[key] += count
        total += count
        if body:
            leaf[key][short(body[-1])] += count
        for fr in {short(f) for f in body if args.match in f}:
            incl[key][fr] += count
    if not total:
        print("no samples")
        return 1
    print(f"{args.raw}: {total} samples")
    for key, n in per_thread.most_common():
        print(f"\n== {key}: {n} samples ({100 * n / total:.1f}%)")
        print("  leaf frames:")
        for fr, c in leaf[key].most_common(args.top):
            print(f"    {100 * c / n:5.1f}%  {fr}")
        if incl[key]:
            print(f"  inclusive, frames in {args.match}:")
            for fr, c in incl[key].most_common(args.top):
                print(f"    {100 * c / n:5.1f}%  {fr}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The attempt duration histogram of ``/metrics``, as data.

Live attempts are counted from ``job_attempts``; the attempts job retention
deleted were added to ``pruned_attempt_durations`` first (cumulative counts
keyed by each bucket's bound in milliseconds), so every counter of the
histogram only ever grows, as Prometheus expects of one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Row = dict[str, Any]

# Bucket bounds in seconds (Prometheus ``le``).  Changing them changes the
# keys of pruned_attempt_durations.buckets: a bound with no count kept there
# takes the count of the nearest lower bound that has one.
BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
BOUNDS_MS = tuple(b * 1000 for b in BUCKETS_S)


def key(bound_ms: float) -> str:
    return f"{bound_ms:g}"


def merged(live: Sequence[Row], pruned: Sequence[Row], bounds_ms: Sequence[float]) -> list[Row]:
    """Rows of the live histogram (job_type, count, sum_ms, le_<i>) plus what
    was pruned, per job type."""
    out = {
        r["job_type"]: {k: (v if k == "job_type" else int(v)) for k, v in r.items()} for r in live
    }
    for p in pruned:
        row = out.setdefault(
            p["job_type"],
            {"job_type": p["job_type"], "count": 0, "sum_ms": 0}
            | {f"le_{i}": 0 for i in range(len(bounds_ms))},
        )
        row["count"] += int(p["attempts"])
        row["sum_ms"] += int(p["sum_ms"])
        counts = {float(k): int(n) for k, n in dict(p["buckets"]).items()}
        for i, bound in enumerate(bounds_ms):
            below = [b for b in counts if b <= bound]
            row[f"le_{i}"] += counts[max(below)] if below else 0
    return sorted(out.values(), key=lambda r: r["job_type"])

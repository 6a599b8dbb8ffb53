"""Merging the live attempt duration histogram with what job retention pruned."""

from __future__ import annotations

from hypermedia.queue.durations import BOUNDS_MS, key, merged

BOUNDS = (10.0, 100.0, 1000.0)


def _live(job_type: str, counts: tuple[int, int, int], total: int, sum_ms: int) -> dict:
    return {"job_type": job_type, "count": total, "sum_ms": sum_ms} | {
        f"le_{i}": n for i, n in enumerate(counts)
    }


def test_pruned_counts_add_to_live_ones_per_job_type() -> None:
    live = [_live("a", (1, 2, 2), 3, 2500)]
    pruned = [
        {"job_type": "a", "attempts": 4, "sum_ms": 40, "buckets": {"10": 4, "100": 4, "1000": 4}},
        {"job_type": "b", "attempts": 2, "sum_ms": 700, "buckets": {"10": 0, "100": 1, "1000": 2}},
    ]
    assert merged(live, pruned, BOUNDS) == [
        _live("a", (5, 6, 6), 7, 2540),
        _live("b", (0, 1, 2), 2, 700),
    ]


def test_a_bound_without_a_kept_count_takes_the_nearest_lower_one() -> None:
    pruned = [{"job_type": "a", "attempts": 9, "sum_ms": 9, "buckets": {"10": 3, "1000": 8}}]
    # 100 ms was not a bound when these were pruned: the count at 10 ms is a
    # lower bound of it, and keeps the buckets cumulative.
    assert merged([], pruned, BOUNDS) == [_live("a", (3, 3, 8), 9, 9)]
    assert merged([], pruned, (5.0,)) == [{"job_type": "a", "count": 9, "sum_ms": 9, "le_0": 0}]


def test_keys_are_the_bounds_in_milliseconds() -> None:
    assert [key(b) for b in BOUNDS_MS[:3]] == ["5", "10", "25"]
    assert key(BOUNDS_MS[-1]) == "600000"

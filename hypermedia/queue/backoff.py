"""Retry delays: exponential with jitter, capped."""

from __future__ import annotations

import random


def retry_delay(attempt: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Seconds before attempt ``attempt + 1`` may start.

    Equal jitter: half the exponential step is fixed, half random, so retries
    of jobs that failed together spread out but never come back immediately.
    """
    step = min(cap, base * (2 ** max(0, attempt - 1)))
    r = (rng or random).random()
    return step / 2 + r * step / 2

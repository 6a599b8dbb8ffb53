"""Retry delays: exponential steps, equal jitter, a cap."""

from __future__ import annotations

import itertools
import random

import pytest

from hypermedia.queue.backoff import retry_delay


class Fixed(random.Random):
    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def random(self) -> float:
        return self.value


@pytest.mark.parametrize(("attempt", "step"), [(0, 2), (1, 2), (2, 4), (3, 8), (4, 16), (6, 64)])
def test_bounds_follow_the_exponential_step(attempt, step):
    assert retry_delay(attempt, 2.0, 1000.0, Fixed(0.0)) == step / 2
    assert retry_delay(attempt, 2.0, 1000.0, Fixed(0.5)) == step * 0.75
    assert retry_delay(attempt, 2.0, 1000.0, Fixed(0.999999)) == pytest.approx(step, rel=1e-5)
    assert retry_delay(attempt, 2.0, 1000.0, Fixed(0.999999)) < step


def test_cap_bounds_every_delay():
    for attempt in range(1, 60):
        d = retry_delay(attempt, 2.0, 600.0, Fixed(0.999))
        assert d <= 600.0
    assert retry_delay(40, 2.0, 600.0, Fixed(0.0)) == 300.0


def test_never_immediate_and_spread_out():
    rng = random.Random(3)
    delays = [retry_delay(3, 1.0, 100.0, rng) for _ in range(500)]
    assert min(delays) >= 2.0 and max(delays) <= 4.0
    assert len({round(d, 6) for d in delays}) > 400  # jitter spreads retries
    assert max(delays) - min(delays) > 1.5


def test_grows_with_attempts_at_fixed_jitter():
    ds = [retry_delay(n, 0.5, 1e9, Fixed(0.3)) for n in range(1, 12)]
    assert all(b == pytest.approx(2 * a) for a, b in itertools.pairwise(ds))


def test_default_rng_is_used_when_none_given():
    random.seed(5)
    a = retry_delay(2, 1.0, 10.0)
    random.seed(5)
    assert retry_delay(2, 1.0, 10.0) == a
    assert 1.0 <= a <= 2.0

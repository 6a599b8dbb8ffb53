"""worker/outage.py: claims held back while the storage is away."""

from __future__ import annotations

from hypermedia.worker.outage import CODE, MAX_PAUSE, Outage


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_no_outage_claims_what_is_wanted() -> None:
    outage = Outage(Clock())
    assert outage.room(10) == (10, 0.0)
    assert outage.result(None) is False
    assert outage.room(10) == (10, 0.0)


def test_an_outage_pauses_then_probes_with_one_job_doubling_on_failure() -> None:
    clock = Clock()
    outage = Outage(clock)
    assert outage.result(CODE) is True  # it began
    assert outage.room(10) == (0, 1.0)
    # Jobs claimed before it began fail too: the pause does not grow for them.
    assert outage.result(CODE) is False
    assert outage.room(10) == (0, 1.0)
    clock.now += 1.0
    assert outage.room(10) == (1, 0.0)  # the probe
    assert outage.room(10) == (0, 1.0)  # one per pause
    outage.result(CODE)  # the probe failed
    assert outage.room(10) == (0, 2.0)
    for _ in range(10):
        clock.now += MAX_PAUSE
        assert outage.room(10)[0] == 1
        outage.result(CODE)
    assert outage.room(10) == (0, MAX_PAUSE)


def test_any_other_result_ends_the_outage() -> None:
    clock = Clock()
    outage = Outage(clock)
    outage.result(CODE)
    clock.now += 1.0
    assert outage.room(5) == (1, 0.0)
    assert outage.result(None) is False  # the probe completed: the store is back
    assert outage.room(5) == (5, 0.0)
    assert outage.result(CODE) is True  # a new outage starts at 1 s again
    assert outage.room(5) == (0, 1.0)

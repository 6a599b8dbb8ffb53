"""The database clock's arithmetic, with a fake server, local clock and
monotonic clock (the real servers: tests/integration/test_clock_skew.py)."""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta

import pytest

from hypermedia.queue import clock as C

T0 = datetime(2026, 12, 2, 12, 0, 0)


class Fake:
    """A local clock ``skew`` off the server's, and a round trip of ``rtt``."""

    def __init__(self, skew: timedelta, rtt: timedelta = timedelta(milliseconds=4)) -> None:
        self.real = T0  # the server's (true) time
        self.skew, self.rtt = skew, rtt
        self.mono = 0.0
        self.reads = 0
        self.fail = False

    def local(self) -> datetime:
        return self.real + self.skew

    def read(self) -> datetime:
        if self.fail:
            raise ConnectionError("server away")
        self.reads += 1
        self.real += self.rtt / 2  # the query reaches the server
        seen = self.real
        self.real += self.rtt / 2  # and its answer comes back
        return seen

    def advance(self, seconds: float) -> None:
        self.real += timedelta(seconds=seconds)
        self.mono += seconds

    def clock(self) -> C.DatabaseClock:
        # No thread: the tests call refresh_if_due() where its loop would.
        return C.DatabaseClock(
            self.read, local=self.local, monotonic=lambda: self.mono, background=False
        )


@pytest.mark.parametrize("minutes", [-10, 0, 10])
def test_the_clock_tells_the_servers_time_whatever_the_local_clock(minutes: int) -> None:
    fake = Fake(timedelta(minutes=minutes))
    clock = fake.clock()
    now = clock()
    assert abs(now - fake.real) < timedelta(milliseconds=1)
    assert abs(clock.offset + timedelta(minutes=minutes)) < timedelta(milliseconds=1)
    fake.advance(30)
    assert abs(clock() - fake.real) < timedelta(milliseconds=1)
    assert fake.reads == C.SAMPLES  # measured once, not on every call


def test_it_measures_again_after_the_refresh_period_never_in_a_call() -> None:
    fake = Fake(timedelta(seconds=-5))
    clock = fake.clock()
    clock()
    fake.skew = timedelta(seconds=3)  # the local clock was stepped
    fake.advance(C.REFRESH - 1)
    assert clock.refresh_if_due() == pytest.approx(1.0)
    assert abs(clock() - fake.real - timedelta(seconds=8)) < timedelta(milliseconds=1)  # stale
    fake.advance(2)
    clock()
    assert fake.reads == C.SAMPLES  # a caller (maybe inside a transaction) never measures
    assert clock.refresh_if_due() == pytest.approx(C.REFRESH)
    assert abs(clock() - fake.real) < timedelta(milliseconds=1)
    assert fake.reads == 2 * C.SAMPLES


def test_a_failed_measurement_keeps_the_last_offset_and_retries_soon() -> None:
    fake = Fake(timedelta(minutes=3))
    clock = fake.clock()
    clock()
    fake.advance(C.REFRESH)
    fake.fail = True
    assert clock.refresh_if_due() == pytest.approx(C.RETRY)  # no exception
    assert abs(clock() - fake.real) < timedelta(milliseconds=1)  # the old offset
    fake.fail = False
    fake.advance(C.RETRY - 1)
    clock.refresh_if_due()
    assert fake.reads == C.SAMPLES
    fake.advance(2)
    clock.refresh_if_due()
    assert fake.reads == 2 * C.SAMPLES


def test_a_slow_round_trip_does_not_replace_a_good_measurement() -> None:
    fake = Fake(timedelta(seconds=20))
    clock = fake.clock()
    clock()
    good = clock.offset
    fake.rtt = timedelta(seconds=3)  # the half-way guess could be 1.5 s off
    fake.advance(C.REFRESH)
    clock.refresh_if_due()
    assert fake.reads == 2 * C.SAMPLES and clock.offset == good
    first = Fake(timedelta(seconds=20), rtt=timedelta(seconds=3)).clock()
    first()  # nothing better yet: kept
    assert abs(first.offset + timedelta(seconds=20)) < timedelta(seconds=2)


def test_a_connection_set_up_on_the_first_read_does_not_skew_the_clock() -> None:
    """The first read of a process opens its connection: all of that time is
    on the way out, so half the round trip is no guess at all.  The quickest
    of the reads counts."""
    fake = Fake(timedelta(0))
    connect = [timedelta(milliseconds=80)]
    plain = fake.read

    def read() -> datetime:
        if connect:
            fake.real += connect.pop()  # TCP, TLS, login: before the query runs
        return plain()

    fake.read = read  # type: ignore[method-assign]
    clock = fake.clock()
    assert abs(clock() - fake.real) < timedelta(milliseconds=1)


def test_a_large_offset_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    fake = Fake(timedelta(minutes=-10))
    clock = fake.clock()
    with caplog.at_level(logging.WARNING, logger="hypermedia.queue.clock"):
        clock()
        fake.advance(C.REFRESH)
        clock.refresh_if_due()
        assert fake.reads == 2 * C.SAMPLES
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "600.0 s behind the database server's" in warnings[0]


def test_the_first_call_measures_and_a_thread_keeps_measuring() -> None:
    reads = []

    def read() -> datetime:
        reads.append(1)
        return C.utcnow() + timedelta(hours=1)

    clock = C.DatabaseClock(read)
    assert abs(clock() - C.utcnow() - timedelta(hours=1)) < timedelta(seconds=1)
    assert len(reads) == C.SAMPLES
    assert [t for t in threading.enumerate() if t.name == "database-clock" and t.daemon]


def test_sqlite_keeps_the_local_clock() -> None:
    class Sqlite:
        name = "sqlite"

    assert C.clock_for(Sqlite()) is C.utcnow

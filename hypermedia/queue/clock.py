"""Whose time: the database server's, wherever the engine runs.

Leases, heartbeats, retry times and the reaper compare timestamps written by
different machines: a worker's lease end against the leader's now, say.  With
each machine's own clock, a worker whose clock runs ten minutes slow takes
leases that look expired the moment it writes them, and the reaper hands its
jobs to others while it still runs them (fencing keeps the results straight,
but the work is done twice); a fast one keeps a dead worker's jobs locked for
as long.  So on PostgreSQL and MariaDB the engine reads the server's clock:
the local clock plus an offset measured against the server (one query,
corrected by half its round trip), measured again every ``REFRESH`` seconds
on a thread of its own.  Each measurement takes ``SAMPLES`` reads and keeps
the quickest: the first read of a process also opens its connection, and
that set-up, all on the way out, put a new CLI's clock tens of milliseconds
ahead of the server's, so a job it queued was not yet due when a worker
woken by it looked (MariaDB's job watch), which then waited for its poll.
SQLite runs on this machine: its time is ours.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

log = logging.getLogger(__name__)

REFRESH = 60.0  # seconds between measurements
SAMPLES = 3  # reads per measurement; the one with the shortest round trip counts
RETRY = 5.0  # after a failed one
# A measurement whose round trip took longer says too little; kept only when
# there is no better one yet.
MAX_ROUND_TRIP = timedelta(seconds=1)
WARN_OFFSET = timedelta(seconds=2)


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


class DatabaseClock:
    """Naive UTC by the server's clock; ``read`` returns the server's now.

    The first call measures the offset; later measurements run on a thread
    of their own, never in a caller's path: a caller may hold a transaction
    and its locks, and a measurement needs a connection of its own.
    """

    def __init__(
        self,
        read: Callable[[], datetime],
        *,
        local: Callable[[], datetime] = utcnow,
        monotonic: Callable[[], float] = time.monotonic,
        background: bool = True,
    ) -> None:
        self._read = read
        self._local = local
        self._monotonic = monotonic
        self._background = background
        self.offset = timedelta(0)
        self._measured = False
        self._started = False
        self._due = -1e18  # monotonic time of the next measurement
        self._lock = threading.Lock()
        self._warned: timedelta | None = None

    def __call__(self) -> datetime:
        if not self._started:
            self._start()
        return self._local() + self.offset

    def _start(self) -> None:
        with self._lock:
            if self._started:
                return
            self.sync()
            self._started = True
            if self._background:
                threading.Thread(target=self._loop, name="database-clock", daemon=True).start()

    def _loop(self) -> None:
        while True:
            time.sleep(self.refresh_if_due())

    def refresh_if_due(self) -> float:
        """Measure again if it is time; the seconds until the next time."""
        if self._monotonic() >= self._due:
            self.sync()
        return max(0.1, self._due - self._monotonic())

    def sync(self) -> None:
        best: tuple[timedelta, datetime, datetime] | None = None
        for _ in range(SAMPLES):
            try:
                before = self._local()
                server = self._read()
                after = self._local()
            except Exception as exc:  # the database is away: the callers will see it
                log.debug("could not read the database's clock (%s)", type(exc).__name__)
                break
            if best is None or after - before < best[0]:
                best = (after - before, server, before)
        if best is None:
            self._due = self._monotonic() + RETRY
            return
        round_trip, server, before = best
        if round_trip <= MAX_ROUND_TRIP or not self._measured:
            self.offset = server - (before + round_trip / 2)
            self._measured = True
            self._warn()
        self._due = self._monotonic() + REFRESH

    def _warn(self) -> None:
        off = self.offset
        if abs(off) < WARN_OFFSET:
            return
        if self._warned is not None and abs(off - self._warned) < WARN_OFFSET:
            return  # said already
        self._warned = off
        side = "behind" if off > timedelta(0) else "ahead of"
        log.warning(
            "this machine's clock is %.1f s %s the database server's: hypermedia keeps "
            "the server's time (leases, heartbeats, retries)",
            abs(off.total_seconds()),
            side,
        )


def clock_for(db: Any) -> Callable[[], datetime]:
    """The engine's clock for this database (a ``Driver``)."""
    if db.name == "sqlite":
        return utcnow
    return DatabaseClock(db.server_now)

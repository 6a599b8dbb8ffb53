"""How many jobs a worker may hold beyond the ones its slots run.

Claiming ahead hides the claim's round trip: a slot that finishes a 1 ms
job finds the next one in the buffer.  For long jobs it buys nothing and
costs the fleet: a worker with two slots that claimed ten 20-second PDFs
runs them two at a time while other workers idle (the jobs sit ``claimed``
meanwhile).  So a worker holds ahead about ``AHEAD_SECONDS`` of work, judged
by the longest of its last ``RECENT`` attempts (one long job stops the
claiming ahead at once; it takes a run of short ones to start it again), and
nothing ahead once a claim has found the queues empty, until a result comes
back: jobs queued while it idled may be of another kind than it ran before.
"""

from __future__ import annotations

import threading
from collections import deque

AHEAD_SECONDS = 1.0  # the work a worker may hold beyond its running slots
RECENT = 16  # attempts the estimate looks back on


class Pace:
    def __init__(self, batch: int) -> None:
        self.batch = batch
        self._recent: deque[int] = deque(maxlen=RECENT)
        self._fresh = False  # a result came back since a claim last found nothing
        self._lock = threading.Lock()

    def finished(self, duration_ms: int | None) -> None:
        """One attempt ended after ``duration_ms``."""
        if duration_ms is None or duration_ms < 0:
            return
        with self._lock:
            self._recent.append(duration_ms)
            self._fresh = True

    def idle(self) -> None:
        """A claim found nothing to take."""
        with self._lock:
            self._fresh = False

    def ahead(self) -> int:
        """Jobs to hold beyond the slots: none for long jobs or after idling,
        up to four batches of short ones."""
        with self._lock:
            if not self._fresh or not self._recent:
                return 0
            longest = max(self._recent)
        return min(4 * self.batch, int(AHEAD_SECONDS * 1000 / max(longest, 0.1)))

"""Claims held back while the storage a worker's jobs need is away.

An attempt that cannot fetch its input or store its output ends
``STORAGE_UNAVAILABLE`` and is retried after a long back-off (errors.py), but
a worker that went on claiming failed every queued job once a second: a
75-second restart of an S3 store failed 58 of 188 jobs for good, none of which
had run.  So after such a failure the worker claims nothing for a while
(1 s, doubling to ``MAX_PAUSE``), then one job alone, a probe: its failure
doubles the pause, any other result ends the outage.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

MAX_PAUSE = 30.0
CODE = "STORAGE_UNAVAILABLE"


class Outage:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._pause = 0.0  # 0: no outage
        self._until = 0.0
        self._probing = False  # a probe was claimed and has not failed yet
        self._lock = threading.Lock()

    def result(self, code: str | None) -> bool:
        """An attempt ended with ``code``; True when it began an outage.

        Only a failed probe doubles the pause: the jobs claimed before the
        outage began, failing one after the other, would have taken it to
        its longest at once."""
        with self._lock:
            if code != CODE:
                self._pause, self._probing = 0.0, False
                return False
            began = self._pause == 0.0
            if began or self._probing:
                self._pause = min(MAX_PAUSE, 2 * self._pause) if self._pause else 1.0
                self._until = self._clock() + self._pause
                self._probing = False
            return began

    def room(self, wanted: int) -> tuple[int, float]:
        """(jobs to claim now, seconds to wait first): all of ``wanted`` with
        no outage, none during a pause, one (the probe) once it is over."""
        with self._lock:
            if self._pause == 0.0:
                return wanted, 0.0
            left = self._until - self._clock()
            if left > 0:
                return 0, left
            # One probe per pause: the next waits for its result.
            self._until = self._clock() + self._pause
            self._probing = True
            return min(1, wanted), 0.0

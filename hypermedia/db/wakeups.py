"""Wake-ups inside one process, where the database cannot push them.

PostgreSQL tells every worker that LISTENs, on any machine, that a job was
queued (dialects.pg_listen).  SQLite and MariaDB cannot, so their workers poll
every HYPERMEDIA_POLL_INTERVAL_SECONDS.  The embedded service (``hypermedia
serve``) runs the API and the workers in one process, though: a job queued
there wakes that process's workers once its transaction has committed (never
before: a claim must find the job), instead of at their next poll.  Other
processes still poll.

Listeners are kept per database URL, so two Drivers on the same database in
one process hear each other.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

Listener = Callable[[str], None]

_lock = threading.Lock()
_listeners: dict[str, list[Listener]] = {}


def listen(url: str, on_wake: Listener, stop: threading.Event) -> None:
    """Call ``on_wake(queue)`` for each queue a commit in this process woke,
    until ``stop``; ``on_wake("*")`` first, as after a LISTEN (look once)."""
    with _lock:
        _listeners.setdefault(url, []).append(on_wake)
    try:
        on_wake("*")
        stop.wait()
    finally:
        with _lock:
            _listeners[url].remove(on_wake)
            if not _listeners[url]:
                del _listeners[url]


def publish(url: str, queues: Iterable[str]) -> None:
    """Tell this process's listeners on ``url`` (after the commit)."""
    with _lock:
        listeners = list(_listeners.get(url, ()))
    for on_wake in listeners:
        for queue in sorted(queues):
            try:
                on_wake(queue)
            except Exception:  # a listener's failure is not the committer's
                log.exception("a wake-up listener failed")

"""Warnings said once a minute per kind while a failure lasts.

A database outage made every thread of every process say its failure at each
retry: 2.5 warnings a second per process through a two-minute outage, the one
line that said why lost among them.  The first failure of a kind is said at
once, then at most one line a minute of it (with how many were not said).
"""

from __future__ import annotations

import logging
import threading
import time

EVERY = 60.0  # seconds between two lines of one kind

_lock = threading.Lock()
_said: dict[str, tuple[float, int]] = {}  # kind -> (when last said, failures unsaid since)


def warning(log: logging.Logger, kind: str, message: str, *args: object) -> None:
    """``log.warning(message, *args)``, unless ``kind`` was said within EVERY seconds."""
    now = time.monotonic()
    with _lock:
        when, unsaid = _said.get(kind, (-EVERY, 0))
        if now - when < EVERY:
            _said[kind] = (when, unsaid + 1)
            return
        _said[kind] = (now, 0)
    text = message % args if args else message  # a "%" of its own stays a "%"
    if unsaid:
        text += f" ({unsaid} more like it not logged)"
    log.warning("%s", text)


def ended(kind: str) -> bool:
    """Forget ``kind`` (it works again): its next failure is said at once.
    True if it was failing.  A dict lookup when it was not: cheap enough for
    a claim loop."""
    if kind not in _said:  # read without the lock: a stale answer costs one line
        return False
    with _lock:
        return _said.pop(kind, None) is not None

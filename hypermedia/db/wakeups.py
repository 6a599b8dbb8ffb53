"""Wake-ups where the database cannot push them.

PostgreSQL tells every worker that LISTENs, on any machine, that a job was
queued (dialects.pg_listen).  SQLite and MariaDB cannot, so their workers poll
every HYPERMEDIA_POLL_INTERVAL_SECONDS.  Two shortcuts, both fired only once
the transaction that queued the job has committed (a claim must find it):

* in one process (``hypermedia serve`` runs the API and the workers in one),
  the committing thread calls that process's listeners directly;
* on SQLite, whose database is a file on this machine, every process touches
  a wake file beside it (``hypermedia.db-wake``) and every listener watches it
  with inotify, so ``hypermedia process`` or ``jobs submit`` in a second
  terminal wakes ``serve``'s workers at once.  Without inotify (not Linux),
  those processes poll as before.

And on MariaDB, whose other processes may be on other machines, a listener
reads the newest job id every ``watch`` seconds (HYPERMEDIA_WATCH_INTERVAL_SECONDS,
0.05 by default: an index's last entry, no transaction of anyone's waits for
it, nothing is written) and looks for work when it grew.  That finds new jobs
from anywhere within ``watch``; jobs queued by an update (a retry promoted, a
held job released) are still found by the poll.  A ``watch`` of 0 turns it
off: the workers only poll.

Listeners are kept per database URL, so two Drivers on the same database in
one process hear each other.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import struct
import threading
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

Listener = Callable[[str], None]
WATCH_SECONDS = 0.05  # the default watch (config.watch_interval_seconds)
MAX_RETRY_SECONDS = 5.0  # the longest wait between reads of a failing server

_lock = threading.Lock()
_listeners: dict[str, list[Listener]] = {}


def listen(
    url: str,
    on_wake: Listener,
    stop: threading.Event,
    wake_file: str | None = None,
    newest: Callable[[], int] | None = None,
    watch: float = WATCH_SECONDS,
) -> None:
    """Call ``on_wake(queue)`` for each queue a commit in this process woke,
    and ``on_wake("*")`` whenever another process touches ``wake_file`` or
    ``newest()`` (the newest job id, read every ``watch`` seconds; 0: never)
    grows, until ``stop``; ``on_wake("*")`` first, as after a LISTEN (look
    once)."""
    with _lock:
        _listeners.setdefault(url, []).append(on_wake)
    try:
        if newest is not None and watch > 0:
            _follow(newest, on_wake, stop, watch)
        elif newest is not None or wake_file is None or not _watch(wake_file, on_wake, stop):
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


def touch(wake_file: str) -> None:
    """Tell the other processes' listeners (a change of the file's times)."""
    try:
        os.utime(wake_file)
    except FileNotFoundError:
        _create(wake_file)
    except OSError:  # nobody can listen there either: they poll
        pass


def _follow(
    newest: Callable[[], int], on_wake: Listener, stop: threading.Event, watch: float
) -> None:
    """``on_wake("*")`` whenever ``newest()`` changes; a failing read (the
    server restarting) is tried again with backoff, then looked past once."""
    seen: int | None = None
    delay = watch
    with contextlib.suppress(Exception):  # read before looking: nothing slips between
        seen = newest()
    on_wake("*")
    while not stop.wait(delay):
        try:
            top = newest()
        except Exception as exc:
            if delay == watch:
                log.warning("job watch cannot read the database (%s); retrying", type(exc).__name__)
            delay = min(delay * 2, max(watch, MAX_RETRY_SECONDS))
            seen = None
            continue
        delay = watch
        if top != seen:
            if seen is not None or top:
                on_wake("*")
            seen = top


# -- inotify (Linux), through libc: the standard library has no binding --------

_IN_ATTRIB = 0x4  # what utime() raises on the watched file
_IN_IGNORED = 0x8000  # the watch is gone (the file was removed)
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name)


def _create(path: str) -> None:
    with contextlib.suppress(OSError):  # then nobody listens there: polling as before
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666))


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.inotify_init1, libc.inotify_add_watch  # noqa: B018 - both must exist
    except (OSError, AttributeError):
        return None
    return libc


def _watch(wake_file: str, on_wake: Listener, stop: threading.Event) -> bool:
    """Watch ``wake_file`` until ``stop``; False at once if inotify is missing."""
    libc = _libc()
    if libc is None:
        return False
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        return False
    try:
        if not _add(libc, fd, wake_file):
            return False
        on_wake("*")  # watching: whatever was queued before is found now
        while not stop.is_set():
            ready, _, _ = select.select([fd], [], [], 0.5)
            if not ready:
                continue
            masks = _masks(os.read(fd, 65536))
            if any(m & _IN_ATTRIB for m in masks):
                on_wake("*")
            if any(m & _IN_IGNORED for m in masks) and not _add(libc, fd, wake_file):
                stop.wait()
        return True
    finally:
        os.close(fd)


def _add(libc: ctypes.CDLL, fd: int, wake_file: str) -> bool:
    _create(wake_file)
    return bool(libc.inotify_add_watch(fd, os.fsencode(wake_file), _IN_ATTRIB) >= 0)


def _masks(data: bytes) -> list[int]:
    out, at = [], 0
    while at + _EVENT.size <= len(data):
        _, mask, _, length = _EVENT.unpack_from(data, at)
        out.append(mask)
        at += _EVENT.size + length
    return out

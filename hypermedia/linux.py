"""prctl(2) through libc, for what Linux lets a process say about itself.

Used by attempt children (parent-death signal, subreaper: worker/child.py) and
by long-lived threads naming themselves for the kernel: Python (before 3.14)
names its threads for itself only, so ``top -H``, ``ps -L`` and
/proc/PID/task/*/comm would show every thread of a worker or of ``serve`` as
"hypermedia" (bench/worker_threads.py reads the names).  Elsewhere: no-ops.
"""

from __future__ import annotations

import ctypes
import functools
import sys
import threading

_PR_SET_NAME = 15


@functools.cache
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def prctl(option: int, arg: int | bytes) -> bool:
    """prctl(option, arg) where there is one (Linux); whether it took."""
    libc = _libc()
    try:
        return libc is not None and libc.prctl(option, arg, 0, 0, 0) == 0
    except AttributeError:
        return False


def name_native() -> None:
    """Give the calling thread's kernel name its Python name (15 bytes kept)."""
    prctl(_PR_SET_NAME, threading.current_thread().name.encode()[:15])

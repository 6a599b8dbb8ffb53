"""A process's threads by name in ``top -H``, ``ps -L`` and /proc/PID/task/*/comm.

Python (before 3.14) names its threads for itself only: the kernel sees every
thread of a worker or of ``serve`` as "hypermedia".  Each long-lived thread calls
``name_native()`` as it starts, so an operator can tell the flusher from a slot
or a storer when one of them is busy (bench/worker_threads.py reads them).
"""

from __future__ import annotations

import ctypes
import functools
import sys
import threading

_PR_SET_NAME = 15


@functools.cache
def _prctl() -> ctypes._NamedFuncPointer | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None).prctl
    except (OSError, AttributeError):
        return None


def name_native() -> None:
    """Give the calling thread's kernel name its Python name (15 bytes kept)."""
    prctl = _prctl()
    if prctl is not None:
        prctl(_PR_SET_NAME, ctypes.c_char_p(threading.current_thread().name.encode()[:15]), 0, 0, 0)

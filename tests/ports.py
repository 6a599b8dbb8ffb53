"""Loopback ports for the servers tests start.

A port the kernel hands out for ``bind(0)`` comes from the ephemeral range,
the same range every outgoing connection (a database session, an HTTP
client) takes its local port from: between picking it and the server
binding it, another test's connection may take it ("address already in
use"). So ports come from below that range, from a slice of its own for each
xdist worker, handed out in turn so a port just freed is not handed out again
at once.
"""

from __future__ import annotations

import itertools
import os
import random
import socket

_LOW, _SLICE = 10_000, 2_000  # ten workers' slices: 10000-29999, under 32768


def _slice() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    start = _LOW + (index % 10) * _SLICE
    return range(start, start + _SLICE)


_ports = _slice()
_turn = itertools.count(random.randrange(len(_ports)))


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))  # no SO_REUSEADDR: a TIME_WAIT port fails too
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback port nothing listens on, outside the ephemeral range."""
    for _ in range(len(_ports)):
        port = _ports[next(_turn) % len(_ports)]
        if _bindable(port):
            return port
    raise AssertionError(f"no free port in {_ports.start}-{_ports.stop - 1}")


def free_ports(n: int) -> list[int]:
    return [free_port() for _ in range(n)]

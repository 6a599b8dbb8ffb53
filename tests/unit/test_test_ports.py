"""The test servers' ports stay out of the kernel's ephemeral range, where an
outgoing connection could take one between its pick and the server's bind."""

from __future__ import annotations

import contextlib
import itertools
import socket
from pathlib import Path

import pytest

from tests import ports
from tests.ports import free_ports


def _ephemeral() -> range:
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return range(int(low), int(high) + 1)


def test_ports_are_outside_the_ephemeral_range_and_not_handed_out_twice() -> None:
    ports = free_ports(50)
    assert not [p for p in ports if p in _ephemeral()]
    assert len(set(ports)) == len(ports)


def test_a_port_someone_listens_on_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    start = 100
    held = []
    try:
        for port in ports._ports[start : start + 10]:  # the next ten in turn
            s = socket.socket()
            with contextlib.suppress(OSError):  # one may be busy already: skipped either way
                s.bind(("127.0.0.1", port))
                s.listen()
            held.append(s)
        monkeypatch.setattr(ports, "_turn", itertools.count(start))
        assert ports.free_port() >= ports._ports[start + 10]
    finally:
        for s in held:
            s.close()

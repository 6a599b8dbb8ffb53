"""seccomp: an attempt child that needs no network cannot open a socket.

Landlock (sandbox.py) governs files and TCP ports, but not ``connect()`` to a
Unix socket by path: a child taken over by a hostile file could still reach
PostgreSQL's ``/var/run/postgresql`` socket (often ``trust`` for local users)
or, with TCP unrestricted, any port on the host.  Only a few pipelines talk to
anything (the virus scan talks to clamd); every other attempt runs in a child
that installs this filter, so ``socket()`` fails with EACCES for every address
family.  No socket, no connection: by path, by port, or abstract.

Every child also loses ``io_uring_setup``: io_uring's own socket and connect
operations do not pass through seccomp, and no decoder needs it.  The filter
refuses any syscall made through another ABI (i386's ``int 0x80``, x32), whose
numbers would slip past a filter written for x86-64's.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import sys

# struct sock_filter opcodes (linux/filter.h) and seccomp return values.
_LD_ABS_W = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ, _JGE = 0x15, 0x35  # BPF_JMP | BPF_JEQ / BPF_JGE | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000
_DENY = 0x00050000 | errno.EACCES  # SECCOMP_RET_ERRNO: the call fails, the child lives
_NR, _ARCH = 0, 4  # offsets in struct seccomp_data
_X32_BIT = 0x40000000
_SET_MODE_FILTER, _FLAG_TSYNC = 1, 1
_PR_SET_NO_NEW_PRIVS = 38


# By machine: (AUDIT_ARCH_*, seccomp, socket, io_uring_setup).
_ARCHES = {
    "x86_64": (0xC000003E, 317, 41, 425),
    "aarch64": (0xC00000B7, 277, 198, 425),
}


class _Filter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Filter))]


def program(machine: str, *, network: bool) -> list[tuple[int, int, int, int]] | None:
    """The filter for this machine as (code, jt, jf, k) rows; None where we
    know no syscall numbers (the child then runs without one)."""
    if machine not in _ARCHES:
        return None
    arch, _, socket_nr, io_uring_nr = _ARCHES[machine]
    refused = [(_JEQ, nr) for nr in ([io_uring_nr] if network else [socket_nr, io_uring_nr])]
    if machine == "x86_64":
        refused.insert(0, (_JGE, _X32_BIT))  # x32's numbers are x86-64's with this bit
    deny_at = 3 + len(refused) + 1  # the last row; jumps count from the next row
    rows = [
        (_LD_ABS_W, 0, 0, _ARCH),
        (_JEQ, 0, deny_at - 2, arch),  # another ABI (i386's int 0x80): refused
        (_LD_ABS_W, 0, 0, _NR),
    ]
    for code, k in refused:
        rows.append((code, deny_at - len(rows) - 1, 0, k))
    return [*rows, (_RET, 0, 0, _ALLOW), (_RET, 0, 0, _DENY)]


def restrict(*, network: bool) -> bool:
    """Install the filter on this process (all its threads) for good; False
    where this machine has none.  OSError if the kernel refuses it."""
    machine = platform.machine() if sys.platform.startswith("linux") else ""
    rows = program(machine, network=network)
    if rows is None:
        return False
    filters = (_Filter * len(rows))(*(_Filter(*r) for r in rows))
    prog = _Program(len(rows), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    # Required to install a filter without privileges (also set for Landlock).
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    seccomp_nr = _ARCHES[machine][1]
    if libc.syscall(seccomp_nr, _SET_MODE_FILTER, _FLAG_TSYNC, ctypes.byref(prog)) != 0:
        raise OSError(ctypes.get_errno(), "seccomp(SECCOMP_SET_MODE_FILTER)")
    return True

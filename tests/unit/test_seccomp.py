"""The seccomp filter of attempt children: its program, and what it refuses in
a real process (a filter is for good, so each check runs in a fresh one).
Whole workers are checked in tests/integration/test_worker_child.py."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import textwrap

import pytest

from hypermedia.worker import seccomp

_RET = 0x06
_ALLOW, _DENY = 0x7FFF0000, 0x00050000 | 13  # SECCOMP_RET_ERRNO | EACCES


def _run(program: list[tuple[int, int, int, int]], arch: int, nr: int) -> int:
    """What the filter returns for syscall ``nr`` under ABI ``arch``: a tiny
    interpreter of the few classic BPF rows the filter uses."""
    data = {0: nr, 4: arch}
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = program[pc]
        if code == 0x20:
            acc = data[k]
        elif code == 0x15:
            pc += jt if acc == k else jf
        elif code == 0x35:
            pc += jt if acc >= k else jf
        elif code == _RET:
            return k
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")
        pc += 1


X86_64, I386 = 0xC000003E, 0x40000003


@pytest.mark.parametrize("network", [False, True])
def test_the_program_refuses_sockets_unless_networked_and_io_uring_always(network: bool) -> None:
    prog = seccomp.program("x86_64", network=network)
    assert prog is not None
    socket_nr, connect_nr, read_nr, io_uring_nr, socketpair_nr = 41, 42, 0, 425, 53
    assert _run(prog, X86_64, socket_nr) == (_ALLOW if network else _DENY)
    assert _run(prog, X86_64, io_uring_nr) == _DENY
    for allowed in (read_nr, connect_nr, socketpair_nr):
        assert _run(prog, X86_64, allowed) == _ALLOW
    # x32's socket(), and anything through i386's ABI (its socketcall is 102).
    assert _run(prog, X86_64, 0x40000000 | socket_nr) == _DENY
    assert _run(prog, I386, 102) == _DENY
    assert _run(prog, I386, 3) == _DENY


def test_aarch64_has_its_own_numbers_and_unknown_machines_none() -> None:
    prog = seccomp.program("aarch64", network=False)
    assert prog is not None
    aarch64 = 0xC00000B7
    assert _run(prog, aarch64, 198) == _DENY  # socket
    assert _run(prog, aarch64, 41) == _ALLOW  # pivot_root's number there, not socket
    assert _run(prog, X86_64, 41) == _DENY  # another ABI
    assert seccomp.program("riscv64", network=False) is None


_PROBE = textwrap.dedent(
    """
    import ctypes, json, socket, sys
    from hypermedia.worker import seccomp
    installed = seccomp.restrict(network=sys.argv[1] == "on")
    def can(fn):
        try:
            fn()
            return True
        except OSError:
            return False
    libc = ctypes.CDLL(None, use_errno=True)
    print(json.dumps({
        "installed": installed,
        "unix": can(lambda: socket.socket(socket.AF_UNIX).close()),
        "inet": can(lambda: socket.socket(socket.AF_INET).close()),
        "inet6": can(lambda: socket.socket(socket.AF_INET6).close()),
        "socketpair": can(lambda: [s.close() for s in socket.socketpair()]),
        "io_uring": libc.syscall(425, 1, ctypes.create_string_buffer(120)) >= 0
            or ctypes.get_errno() != 13,
        "file": can(lambda: open(sys.executable, "rb").close()),
    }))
    """
)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"), reason="no filter here")
@pytest.mark.parametrize("network", ["off", "on"])
def test_a_filtered_process_cannot_open_a_socket(network: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, network], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    on = network == "on"
    assert seen == {
        "installed": True,
        "unix": on,
        "inet": on,
        "inet6": on,
        "socketpair": True,  # a connected pair reaches nobody
        "io_uring": False,  # refused with EACCES whatever the kernel offers
        "file": True,
    }

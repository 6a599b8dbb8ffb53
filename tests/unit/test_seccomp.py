"""The seccomp filter of attempt children: its program, its syscall numbers,
and what it refuses in a real process (a filter is for good, so each check
runs in a fresh one).  Whole workers: tests/integration/test_worker_child.py."""

from __future__ import annotations

import errno
import json
import platform
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hypermedia.worker import seccomp

ALLOW = 0x7FFF0000
DENY = 0x00050000 | errno.EACCES
ENOSYS = 0x00050000 | errno.ENOSYS
X86_64, AARCH64, I386 = 0xC000003E, 0xC00000B7, 0x40000003
CLONE_NEWUSER, CLONE_THREAD = 0x10000000, 0x00010000


def run(program: list[seccomp.Row], arch: int, nr: int, arg0: int = 0, arg1: int = 0) -> int:
    """What the filter answers for syscall ``nr``: a tiny interpreter of the
    classic BPF rows the filter uses."""
    data = {0: nr, 4: arch, 16: arg0, 24: arg1}
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = program[pc]
        if code == 0x20:
            acc = data[k]
        elif code == 0x54:
            acc &= k
        elif code in (0x15, 0x35, 0x45):
            taken = {0x15: acc == k, 0x35: acc >= k, 0x45: acc & k != 0}[code]
            pc += jt if taken else jf
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")
        pc += 1


@pytest.mark.parametrize("network", [False, True])
def test_sockets_are_refused_unless_networked(network: bool) -> None:
    prog = seccomp.program("x86_64", network=network)
    assert prog is not None
    # socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC)
    assert run(prog, X86_64, 41, 2, 1 | 0x80000) == (ALLOW if network else DENY)
    for allowed in (
        0,
        1,
        42,
        53,
        57,
        59,
        9,
    ):  # read, write, connect, socketpair, fork, execve, mmap
        assert run(prog, X86_64, allowed) == ALLOW


def test_a_networked_child_gets_unix_and_ip_sockets_only() -> None:
    AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_PACKET, AF_ALG = 1, 2, 10, 16, 17, 38
    STREAM, DGRAM, RAW, SEQPACKET = 1, 2, 3, 5
    flags = 0x800 | 0x80000  # SOCK_NONBLOCK | SOCK_CLOEXEC
    for machine, arch, nr in (("x86_64", X86_64, 41), ("aarch64", AARCH64, 198)):
        prog = seccomp.program(machine, network=True)
        assert prog is not None
        for family in (AF_UNIX, AF_INET, AF_INET6):
            for kind in (STREAM, DGRAM, STREAM | flags, DGRAM | flags):
                assert run(prog, arch, nr, family, kind) == ALLOW, (machine, family, kind)
            assert run(prog, arch, nr, family, RAW) == DENY
            assert run(prog, arch, nr, family, RAW | flags) == DENY
        assert run(prog, arch, nr, AF_UNIX, SEQPACKET) == DENY
        for family in (0, AF_NETLINK, AF_PACKET, AF_ALG, 40, 0xFF):  # 40: AF_VSOCK
            for kind in (STREAM, DGRAM, RAW):
                assert run(prog, arch, nr, family, kind) == DENY, (machine, family, kind)
        # The family is the whole low half: 0x100 | AF_INET is no AF_INET.
        assert run(prog, arch, nr, 0x100 | AF_INET, STREAM) == DENY


def test_what_no_decoder_needs_is_refused_on_both_machines() -> None:
    for machine, arch, col in (("x86_64", X86_64, 0), ("aarch64", AARCH64, 1)):
        prog = seccomp.program(machine, network=True)
        assert prog is not None
        for name, nrs in seccomp.REFUSED.items():
            if nrs[col] is not None:
                assert run(prog, arch, nrs[col]) == DENY, (machine, name)


def test_clone_may_make_threads_but_no_namespace_and_clone3_falls_back() -> None:
    prog = seccomp.program("x86_64", network=False)
    assert prog is not None
    assert run(prog, X86_64, 56, CLONE_THREAD | 0x11) == ALLOW
    assert run(prog, X86_64, 56, CLONE_NEWUSER) == DENY
    assert run(prog, X86_64, 56, 0x40000000) == DENY  # CLONE_NEWNET
    assert run(prog, X86_64, 435) == ENOSYS  # the C library then uses clone


def test_other_abis_are_refused() -> None:
    prog = seccomp.program("x86_64", network=True)
    assert prog is not None
    assert run(prog, X86_64, 0x40000000 | 41) == DENY  # x32's socket()
    assert run(prog, I386, 102) == DENY  # i386's socketcall
    assert run(prog, I386, 3) == DENY  # even a harmless read
    arm = seccomp.program("aarch64", network=False)
    assert arm is not None
    assert run(arm, AARCH64, 198) == DENY  # socket there
    assert run(arm, X86_64, 0) == DENY
    assert seccomp.program("riscv64", network=False) is None


HEADERS = {
    0: Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
    1: Path("/usr/include/asm-generic/unistd.h"),  # aarch64 uses the generic table
}


@pytest.mark.parametrize("col", [0, 1])
def test_the_numbers_match_the_kernel_headers(col: int) -> None:
    header = HEADERS[col]
    if not header.exists():
        pytest.skip(f"{header} is not installed (linux-libc-dev)")
    known = {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"#define __NR_(\w+)\s+(\d+)\b", header.read_text())
    }
    table = {
        **seccomp.REFUSED,
        "socket": seccomp.SOCKET,
        "clone": seccomp.CLONE,
        "clone3": seccomp.CLONE3,
        "seccomp": seccomp.SECCOMP,
    }
    for name, nrs in table.items():
        if nrs[col] is None:
            assert name not in known, name
        elif name in seccomp.RECENT and name not in known:
            continue  # newer than these headers
        else:
            assert known.get(name) == nrs[col], name


_PROBE = textwrap.dedent(
    """
    import ctypes, json, os, socket, sys, threading
    from hypermedia.worker import seccomp
    installed = seccomp.restrict(network=sys.argv[1] == "on")
    libc = ctypes.CDLL(None, use_errno=True)
    def can(fn):
        try:
            fn()
            return True
        except OSError:
            return False
    def syscall(name, *args):
        nr = seccomp.REFUSED[name][0 if os.uname().machine == "x86_64" else 1]
        return libc.syscall(nr, *args) >= 0 or ctypes.get_errno() != 13
    def refused(*args):
        try:
            socket.socket(*args).close()
            return 0
        except OSError as exc:
            return exc.errno
    def thread():
        t = threading.Thread(target=lambda: None)
        t.start()
        t.join()
    def child():
        pid = os.fork()
        if pid == 0:
            os._exit(7)
        return os.waitpid(pid, 0)[1] >> 8 == 7 or 1 / 0
    print(json.dumps({
        "installed": installed,
        "unix": can(lambda: socket.socket(socket.AF_UNIX).close()),
        "inet": can(lambda: socket.socket(socket.AF_INET).close()),
        "socketpair": can(lambda: [s.close() for s in socket.socketpair()]),
        "udp6": can(lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM).close()),
        # EACCES is the filter's answer (without root, raw and packet sockets
        # fail with EPERM instead; netlink opens for anyone).
        "raw": refused(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) == 13,
        "packet": refused(socket.AF_PACKET, socket.SOCK_RAW) == 13,
        "netlink": refused(socket.AF_NETLINK, socket.SOCK_RAW) == 13,
        "io_uring": syscall("io_uring_setup", 1, ctypes.create_string_buffer(120)),
        "unshare": syscall("unshare", 0x10000000),  # CLONE_NEWUSER
        "ptrace": syscall("ptrace", 16, os.getppid(), 0, 0),  # PTRACE_ATTACH
        "thread": can(thread),
        "fork": can(child),
        "file": can(lambda: open(sys.executable, "rb").close()),
        # A file's metadata by path: refused; on a descriptor the child opened: not.
        "chmod": can(lambda: os.chmod(sys.argv[2], 0o777)),
        "chown": can(lambda: os.chown(sys.argv[2], os.getuid(), -1)),
        "utime": can(lambda: os.utime(sys.argv[2], (0, 0))),
        "setxattr": can(lambda: os.setxattr(sys.argv[2], "user.x", b"1")),
        "fchmod": can(lambda: os.fchmod(os.open(sys.argv[2], os.O_RDONLY), 0o640)),
        "mknod": can(lambda: os.mkfifo(sys.argv[2] + ".fifo")),
        "listen": can(lambda: socket.socket().listen(1)),
    }))
    """
)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"), reason="no filter here")
@pytest.mark.parametrize("network", ["off", "on"])
def test_a_filtered_process(network: str, tmp_path: Path) -> None:
    target = tmp_path / "someone-elses.db"
    target.write_bytes(b"x")
    target.chmod(0o600)
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, network, str(target)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    on = network == "on"
    assert json.loads(done.stdout) == {
        "installed": True,
        "unix": on,
        "inet": on,
        "socketpair": True,  # a connected pair reaches nobody
        "udp6": on,
        "raw": True,  # refused networked or not
        "packet": True,
        "netlink": True,
        "io_uring": False,  # refused with EACCES, whatever the kernel offers
        "unshare": False,
        "ptrace": False,
        "thread": True,  # clone3 refused with ENOSYS: the C library falls back
        "fork": True,
        "file": True,
        "chmod": False,
        "chown": False,
        "utime": False,
        "setxattr": False,
        "fchmod": True,
        "mknod": False,
        "listen": False,  # no socket at all offline; refused networked
    }
    assert target.stat().st_mode & 0o777 == 0o640  # fchmod's, not chmod's 777


def test_available_names_the_machines_with_a_table(monkeypatch: pytest.MonkeyPatch) -> None:
    for machine, expected in (("x86_64", True), ("aarch64", True), ("riscv64", False)):
        monkeypatch.setattr(platform, "machine", lambda m=machine: m)
        assert seccomp.available() is expected
        if not expected:
            assert seccomp.restrict(network=False) is False  # nothing installed, no error

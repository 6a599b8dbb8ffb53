"""seccomp: what an attempt child may not ask of the kernel.

Landlock (sandbox.py) governs files and TCP ports, but not ``connect()`` to a
Unix socket by path: a child taken over by a hostile file could still reach
PostgreSQL's ``/var/run/postgresql`` socket (often ``trust`` for local users)
or, with TCP unrestricted, any port on the host.  Only a few pipelines talk to
anything (the virus scan talks to clamd); every other attempt runs in a child
whose ``socket()`` fails with EACCES for every address family.  No socket, no
connection: by path, by port, or abstract.  A child that may use the network
gets stream and datagram sockets of the Unix and IP families only: no raw or
packet socket (a worker run as root could sniff or forge the host's traffic)
and none of the rarely used families (netlink, AF_ALG, vsock, ...) whose
kernel code is where socket exploits usually live.

Every child also loses the syscalls no decoder needs and an exploit would
(``REFUSED``): tracing and reading other processes, loading kernel code
(modules, kexec, BPF), namespaces (``unshare``, ``setns``, and ``clone`` with a
namespace flag: unprivileged user namespaces are a classic way to the
kernel's root-only code), mounts, keyrings, the clock, and io_uring, whose own
socket and connect operations would not pass through this filter.  A worker
run as root (a container's default) would otherwise hand a compromised child
all of that.  ``clone3`` answers ENOSYS, so the C library falls back to
``clone``, whose flags the filter can read.  Any syscall made through another
ABI (i386's ``int 0x80``, x32) is refused: its numbers would slip past.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import sys

# What an attempt never does, with its number on x86-64 and on aarch64 (None:
# no such syscall there).  tests/unit/test_seccomp.py checks them against the
# kernel headers where those are installed.
REFUSED: dict[str, tuple[int | None, int | None]] = {
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "syslog": (103, 116),
    "perf_event_open": (298, 241),
    "bpf": (321, 280),
    "userfaultfd": (323, 282),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "delete_module": (176, 106),
    "kexec_load": (246, 104),
    "kexec_file_load": (320, 294),
    "reboot": (169, 142),
    "unshare": (272, 97),
    "setns": (308, 268),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "chroot": (161, 51),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    "name_to_handle_at": (303, 264),
    "open_by_handle_at": (304, 265),
    "swapon": (167, 224),
    "swapoff": (168, 225),
    "acct": (163, 89),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "keyctl": (250, 219),
    "settimeofday": (164, 170),
    "clock_settime": (227, 112),
    "adjtimex": (159, 171),
    "clock_adjtime": (305, 266),
    "sethostname": (170, 161),
    "setdomainname": (171, 162),
    "iopl": (172, None),
    "ioperm": (173, None),
    # Every descendant stays in the child's process group, which the worker
    # kills whole (a deadline, a cancel, a process left running).
    "setsid": (112, 157),
    "setpgid": (109, 154),
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
    # Device nodes: one made in the scratch folder opened the kernel log, the
    # memory or the disk of a root worker (Landlock refuses them too).
    "mknod": (133, None),
    "mknodat": (259, 33),
    # A file's metadata by path: Landlock governs reading and writing, not
    # these, and they reached files the child cannot open (chmod 777 of the
    # database, chown or setuid bits anywhere as root).  On an open
    # descriptor (fchmod…) they stay: the child opens only what it may.
    "chmod": (90, None),
    "fchmodat": (268, 53),
    "fchmodat2": (452, 452),
    "chown": (92, None),
    "lchown": (94, None),
    "fchownat": (260, 54),
    "utime": (132, None),
    "utimes": (235, None),
    "futimesat": (261, None),
    "utimensat": (280, 88),
    "setxattr": (188, 5),
    "lsetxattr": (189, 6),
    "removexattr": (197, 14),
    "lremovexattr": (198, 15),
    "setxattrat": (463, 463),
    "removexattrat": (466, 466),
    # No pipeline serves: listen() binds a port of its own, which Landlock's
    # bind rule does not see.
    "listen": (50, 201),
}
# Newer than the kernel headers Debian 12 ships (test_seccomp.py skips them there).
RECENT = frozenset({"fchmodat2", "setxattrat", "removexattrat"})
# Refused unless the child may use the network; then only for these
# families (AF_UNIX, AF_INET, AF_INET6) and types (SOCK_STREAM, SOCK_DGRAM).
SOCKET = (41, 198)
SOCKET_FAMILIES = (1, 2, 10)
SOCKET_TYPES = (1, 2)
_TYPE_MASK = 0xF  # SOCK_NONBLOCK and SOCK_CLOEXEC ride in the type's higher bits
# Checked (clone's flags) or answered ENOSYS (clone3), not refused outright.
CLONE, CLONE3 = (56, 220), (435, 435)
SECCOMP = (317, 277)
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET.
NAMESPACE_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000
NAMESPACE_FLAGS |= 0x10000000 | 0x20000000 | 0x40000000

_MACHINES = {"x86_64": (0, 0xC000003E), "aarch64": (1, 0xC00000B7)}  # column, AUDIT_ARCH_*

# Classic BPF (linux/filter.h) and seccomp's answers.
_LD_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ, _JGE, _JSET = 0x15, 0x35, 0x45  # BPF_JMP | op | BPF_K
_AND = 0x54  # BPF_ALU | BPF_AND | BPF_K
_RET = 0x06
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_NR, _ARCH, _ARG0, _ARG1 = 0, 4, 16, 24  # offsets in struct seccomp_data (args' low halves)
_X32_BIT = 0x40000000
_SET_MODE_FILTER, _FLAG_TSYNC = 1, 1
_PR_SET_NO_NEW_PRIVS = 38

Row = tuple[int, int, int, int]  # (code, jt, jf, k)


class _Filter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Filter))]


def program(machine: str, *, network: bool) -> list[Row] | None:
    """The filter for this machine as rows; None where we know no syscall
    numbers (the child then runs without one)."""
    if machine not in _MACHINES:
        return None
    col, arch = _MACHINES[machine]
    refused = [nr for nrs in REFUSED.values() if (nr := nrs[col]) is not None]
    if not network:
        refused.append(SOCKET[col])
    # Rows with symbolic jump targets, resolved below (jumps count rows
    # skipped, forward only).
    rows: list[tuple[int, int | str, int | str, int]] = [
        (_LD_ABS, 0, 0, _ARCH),
        (_JEQ, 0, "deny", arch),  # another ABI
        (_LD_ABS, 0, 0, _NR),
    ]
    if machine == "x86_64":
        rows.append((_JGE, "deny", 0, _X32_BIT))  # x32: x86-64's numbers with this bit
    rows += [(_JEQ, "deny", 0, nr) for nr in refused]
    if network:
        rows.append((_JEQ, "socket", 0, SOCKET[col]))
    rows += [
        (_JEQ, "enosys", 0, CLONE3[col]),
        (_JEQ, 0, "allow", CLONE[col]),
        (_LD_ABS, 0, 0, _ARG0),
        (_JSET, "deny", "allow", NAMESPACE_FLAGS),
    ]
    labels: dict[str, int] = {}
    if network:
        labels["socket"] = len(rows)
        rows += [(_LD_ABS, 0, 0, _ARG0), *_one_of(SOCKET_FAMILIES, "type")]
        labels["type"] = len(rows)
        rows += [(_LD_ABS, 0, 0, _ARG1), (_AND, 0, 0, _TYPE_MASK)]
        rows += _one_of(SOCKET_TYPES, "allow")
    labels |= {"enosys": len(rows), "allow": len(rows) + 1, "deny": len(rows) + 2}
    rows += [
        (_RET, 0, 0, _ERRNO | errno.ENOSYS),
        (_RET, 0, 0, _ALLOW),
        (_RET, 0, 0, _ERRNO | errno.EACCES),
    ]

    def jump(at: int, to: int | str) -> int:
        return to if isinstance(to, int) else labels[to] - at - 1

    out = [(code, jump(i, jt), jump(i, jf), k) for i, (code, jt, jf, k) in enumerate(rows)]
    assert all(0 <= r[1] <= 255 and 0 <= r[2] <= 255 for r in out)  # a jump is one byte
    return out


def _one_of(values: tuple[int, ...], then: str) -> list[tuple[int, int | str, int | str, int]]:
    """Rows that go to ``then`` if the loaded value is one of ``values``, else deny."""
    *others, last = values
    return [(_JEQ, then, 0, v) for v in others] + [(_JEQ, then, "deny", last)]


def _machine() -> str:
    return platform.machine() if sys.platform.startswith("linux") else ""


def available() -> bool:
    """Whether children on this machine get the filter."""
    return _machine() in _MACHINES


def restrict(*, network: bool) -> bool:
    """Install the filter on this process (all its threads) for good; False
    where this machine has none.  OSError if the kernel refuses it."""
    machine = _machine()
    rows = program(machine, network=network)
    if rows is None:
        return False
    filters = (_Filter * len(rows))(*(_Filter(*r) for r in rows))
    prog = _Program(len(rows), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    # Required to install a filter without privileges (also set for Landlock).
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    seccomp_nr = SECCOMP[_MACHINES[machine][0]]
    if libc.syscall(seccomp_nr, _SET_MODE_FILTER, _FLAG_TSYNC, ctypes.byref(prog)) != 0:
        raise OSError(ctypes.get_errno(), "seccomp(SECCOMP_SET_MODE_FILTER)")
    return True

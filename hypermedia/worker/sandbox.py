"""Landlock: the attempt child confines itself before it reads any job.

The child runs as the worker's own user, so without this a decoder exploited
by a hostile file could read what the worker can: the SQLite database, the
local pool's blobs, ``secret.key``, the admin token, the worker's environment
(database URL, S3 keys) through ``/proc``.  Landlock (Linux 5.13+, no
privileges needed) lets a process give up access for good: the child keeps
read access to what running Python and its libraries needs, read-write access
to its slot's scratch directory only, and (Landlock ABI 6+) may no longer send
signals to, or connect to the abstract sockets of, processes outside its
sandbox (the worker).  With ``connect_ports`` (ABI 4+) it may open TCP
connections to those ports only.  Landlock also keeps it from ptracing the
worker or reading its ``/proc/PID/environ``.  Unless the spec says
``network``, a seccomp filter then takes sockets away altogether
(seccomp.py): Landlock does not cover Unix sockets by path.

The worker builds the ``Spec`` (``spec_for``); the child applies it
(``confine``) at start.  ``HYPERMEDIA_CHILD_SANDBOX``: ``auto`` (confine where
the kernel allows, else run as before and say so once), ``required`` (a worker
refuses to start without it), ``off``.
"""

from __future__ import annotations

import ctypes
import os
import site
import sys
import sysconfig
from dataclasses import asdict, dataclass, field
from typing import Any

from hypermedia.worker import seccomp

# Landlock's syscalls have these numbers on every Linux architecture.
_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446
_VERSION_FLAG = 1  # LANDLOCK_CREATE_RULESET_VERSION
_PATH_BENEATH, _NET_PORT = 1, 2
_PR_SET_NO_NEW_PRIVS = 38

# Filesystem rights, by the ABI version that introduced them.
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FS_V1 = (1 << 13) - 1  # execute … make_sym
_MAKE_CHAR, _MAKE_BLOCK = 1 << 6, 1 << 11
_REFER, _TRUNCATE, _IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_FILE_RIGHTS = _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE | _IOCTL_DEV
_READ = _EXECUTE | _READ_FILE | _READ_DIR
_BIND_TCP, _CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL = 1 << 0, 1 << 1

# What running Python, libvips, pdfium and the tools need to read.  /etc only
# in part: an operator's configuration (database passwords) may live there.
_SYSTEM_READ = (
    "/usr",
    "/lib",
    "/lib64",
    "/bin",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/fonts",
    "/etc/localtime",
    "/etc/mime.types",
    # Name resolution, for a tcp:// clamd named by host name.
    "/etc/hosts",
    "/etc/resolv.conf",
    "/etc/nsswitch.conf",
    "/etc/gai.conf",
    "/etc/host.conf",
    "/etc/services",
    "/dev/urandom",
    "/dev/random",
    "/dev/zero",
    "/proc/cpuinfo",
    "/proc/meminfo",
    "/sys/devices/system/cpu",
)
_READ_WRITE_FILES = ("/dev/null",)

# Whether this process confined itself, and with which Landlock ABI; whether
# it may open sockets (the debug job type reports both, so the tests can tell).
ACTIVE: int | None = None
OFFLINE = False


@dataclass
class Spec:
    mode: str  # auto | required | off
    read: list[str] = field(default_factory=list)
    write: list[str] = field(default_factory=list)
    connect_ports: list[int] | None = None  # None: TCP not restricted
    network: bool = False  # False: no socket at all (seccomp.py)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Spec:
        return cls(**data)


def spec_for(mode: str, scratch: str, connect_ports: list[int] | None) -> Spec:
    """What a child of this worker may touch: its scratch directory, and the
    interpreter, the installed packages and hypermedia's own code to read (no
    sockets: the slot sets ``network`` for the children that need them)."""
    import hypermedia

    paths = sysconfig.get_paths()
    read = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        paths["stdlib"],
        paths["platstdlib"],
        paths["purelib"],
        paths["platlib"],
        *site.getsitepackages(),
        # An editable install runs hypermedia from its source folder: that
        # package folder, not the checkout (HYPERMEDIA_HOME may live there).
        os.path.dirname(hypermedia.__file__),
        *_SYSTEM_READ,
    }
    return Spec(mode, sorted(read), [scratch], connect_ports)


def abi() -> int:
    """The kernel's Landlock ABI version; 0 where there is none."""
    if not sys.platform.startswith("linux"):
        return 0  # the numbers above mean something else elsewhere
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return max(0, int(libc.syscall(_CREATE_RULESET, None, 0, _VERSION_FLAG)))
    except (OSError, AttributeError):
        return 0


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPort(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


def confine(spec: Spec) -> int | None:
    """Apply ``spec`` to this process for good: Landlock where the kernel has
    it (OSError without, in ``required`` mode), and the seccomp filter
    (seccomp.py).  Returns the Landlock ABI used, or None."""
    global ACTIVE, OFFLINE
    if spec.mode == "off":
        return None
    try:
        drop_capabilities()
    except OSError:
        if spec.mode == "required":
            raise  # auto: a kernel or container that refuses capset runs on as before
    version = abi()
    if version == 0 and spec.mode == "required":
        raise OSError("Landlock is not available in this kernel")
    if version:
        _landlock(spec, version)
        ACTIVE = version
    # After Landlock: its rules are opened by path, which needs no socket.
    OFFLINE = seccomp.restrict(network=spec.network) and not spec.network
    return version or None


# capget/capset by machine, the capability ABI they take (v3: two 32-bit
# words per set), and prctl's bounding-set drop.
_CAP_SYSCALLS = {"x86_64": (125, 126), "aarch64": (90, 91)}
_CAP_V3 = 0x20080522
_PR_CAPBSET_DROP = 24


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def drop_capabilities() -> None:
    """Give up every capability for good (a worker run as root, a
    container's default).  Landlock binds root too, but not what capabilities
    grant besides files: CAP_SYS_RESOURCE raised the attempt's hard memory
    and file-size limits again, CAP_MKNOD and CAP_CHOWN reached devices and
    other users' files.  A child needs none: it reads and writes files of its
    own user.  A process without capabilities loses nothing here."""
    import platform

    numbers = _CAP_SYSCALLS.get(platform.machine())
    if numbers is None or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in range(64):  # the bounding set, for what an exec could regain
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the last one, EPERM unprivileged
    header, data = _CapHeader(_CAP_V3, 0), (_CapData * 2)()
    if libc.syscall(numbers[1], ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def _landlock(spec: Spec, version: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fs = _FS_V1 | (_REFER if version >= 2 else 0) | (_TRUNCATE if version >= 3 else 0)
    fs |= _IOCTL_DEV if version >= 5 else 0
    net = (_BIND_TCP | _CONNECT_TCP) if version >= 4 and spec.connect_ports is not None else 0
    scoped = (_SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL) if version >= 6 else 0
    # The struct grew with the ABI: give the kernel the size it knows.
    size = 8 if version < 4 else (16 if version < 6 else 24)
    attr = _RulesetAttr(fs, net, scoped)
    ruleset = libc.syscall(_CREATE_RULESET, ctypes.byref(attr), size, 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        for path in spec.read:
            _allow(libc, ruleset, path, _READ & fs)
        # Truncation too: open(path, "w") asks for it.
        for path in _READ_WRITE_FILES:
            _allow(libc, ruleset, path, (_READ_FILE | _WRITE_FILE | _TRUNCATE) & fs)
        for path in spec.write:
            # No device nodes: one made there opened what /dev keeps closed.
            _allow(libc, ruleset, path, fs & ~(_MAKE_CHAR | _MAKE_BLOCK | _IOCTL_DEV))
        # Its own /proc entry (the peak-memory reset writes clear_refs).
        _allow(libc, ruleset, f"/proc/{os.getpid()}", (_READ | _WRITE_FILE | _TRUNCATE) & fs)
        for port in (spec.connect_ports or []) if net else []:
            rule = _NetPort(_CONNECT_TCP, port)
            if libc.syscall(_ADD_RULE, ruleset, _NET_PORT, ctypes.byref(rule), 0) < 0:
                raise OSError(ctypes.get_errno(), "landlock_add_rule (port)")
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        if libc.syscall(_RESTRICT_SELF, ruleset, 0) < 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(ruleset)


def _allow(libc: Any, ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # not on this system: nothing to allow
    try:
        if not os.path.isdir(path):
            rights &= _FILE_RIGHTS  # a file takes no directory rights
        rule = _PathBeneath(rights, fd)
        if libc.syscall(_ADD_RULE, ruleset, _PATH_BENEATH, ctypes.byref(rule), 0) < 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule ({os.path.basename(path)})")
    finally:
        os.close(fd)

"""debug.noop and debug.sleep: built-in job types for health checks, tests and benchmarks.

debug.sleep takes ``{"ms": N}`` and, to exercise the failure paths:
``{"fail": "CODE"}`` (raise that error code); ``{"crash": true}`` (the child
process dies with SIGKILL, like a segfaulting decoder would); ``{"abort": true}``
(it holds ``alloc_mb`` for ``ms``, then calls abort(), as a C++ library does
when an allocation fails; with ``{"refused_mb": N}`` it first says what GLib
says of a refused allocation of N MB); ``{"alloc_mb": N}``
(allocate memory, to hit the attempt's memory limit); ``{"leak_mb": N}`` (keep
N MB for the rest of the child's life, as a leaking decoder would);
``{"write_mb": N}`` (write an N MB file in scratch, to hit the file-size
limit); ``{"spill_mb": N}`` (write N files of 1 MB each in scratch first, each
under the file-size limit, to hit the scratch folder's total);
``{"output": true}`` (declare a data-only output, to check outputs are
recorded once); ``{"steps": N}`` (report progress N times while sleeping);
``{"nan": true}`` (return a result that is not plain JSON); and
``{"forge": KIND, "marker": PATH}`` (write a forged report on the worker's
pipe, as code that took over the child through a decoder bug would: a
``pickle`` that creates PATH if anybody unpickles it, a ``huge`` frame header,
``junk``, JSON of the wrong shape, or ``warm`` reports again and again).
``{"probe": {"read": [PATH…], "write": [PATH…], "connect": [PORT…],
"unix": [PATH…], "signal": [PID…], "plant": [NAME…]}}`` tries each
(``connect``: TCP on 127.0.0.1; ``unix``: a Unix socket by path;
``plant``: a file left in scratch, the folder's mtime set back) and reports
which it could do, to check the child's sandbox (worker/sandbox.py;
``"$input"`` is the attempt's input file).  Its attempt runs in a child
that may open sockets only with ``{"network": true}`` (worker/seccomp.py),
as a virus scan's does.  ``{"linger": true}`` forks a process half a second
after the attempt ends, from a thread (past the child's check).
``{"stray": true}`` leaves a process running after the attempt (a double
fork that tries setsid first) and reports its pid: the worker must kill it
with its child.  ``{"say": N}`` writes N lines to stderr with a control
character in each, as a chatty native library would (the worker relays
them into its log, worker/stderr.py).

debug.copy reads its input object and stores a byte-for-byte copy as an output
object (type ``copy``): the storage path of a job end to end.  To exercise the
worker's checks on what a pipeline hands back, ``{"name": "..."}`` picks the
output's file name (``"../x"`` must be refused) and ``{"symlink": "/path"}``
makes the output a symlink instead of a file (must be refused too).
"""

from __future__ import annotations

import fcntl
import json
import os
import pickle
import signal
import socket
import stat
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from hypermedia.errors import ERROR_POLICY, JobError
from hypermedia.pipelines.registry import Context, Pipeline, register


def _noop(params: dict[str, Any], ctx: Context) -> dict[str, Any] | None:
    return None


def _validate_noop(params: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    _no_settings(settings, "debug.noop")
    if params:
        raise JobError("INVALID_PARAMS", "debug.noop takes no parameters")
    return {}


_PROBES = ("read", "write", "connect", "unix", "signal", "plant")


# A profile's cap on debug.sleep's ms: the longest attempt timeout (7 days).
MAX_SLEEP_MS = 7 * 86_400_000


def _settings_max_ms(settings: dict[str, Any]) -> int:
    """debug.sleep's one setting, checked (a profile is validated through here)."""
    unknown = set(settings) - {"max_ms"}
    if unknown:
        raise JobError("INVALID_PARAMS", f"unknown settings: {', '.join(sorted(unknown))}")
    max_ms = settings.get("max_ms", 3_600_000)
    if not isinstance(max_ms, int) or isinstance(max_ms, bool) or not 0 <= max_ms <= MAX_SLEEP_MS:
        raise JobError("INVALID_PARAMS", f"max_ms must be an integer from 0 to {MAX_SLEEP_MS}")
    return max_ms


def _no_settings(settings: dict[str, Any], job_type: str) -> None:
    if settings:
        raise JobError("INVALID_PARAMS", f"{job_type} takes no settings")


def _validate_sleep(params: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    allowed = {"ms", "fail", "crash", "abort", "alloc_mb", "steps", "output", "nan", "forge"}
    allowed |= {"marker", "write_mb", "leak_mb", "probe", "network", "stray", "say", "linger"}
    allowed |= {"spill_mb", "refused_mb"}
    unknown = set(params) - allowed
    if unknown:
        raise JobError("INVALID_PARAMS", f"unknown parameters: {', '.join(sorted(unknown))}")
    max_ms = _settings_max_ms(settings)
    ms = params.get("ms", 0)
    if not isinstance(ms, int) or isinstance(ms, bool) or not 0 <= ms <= max_ms:
        raise JobError("INVALID_PARAMS", f"ms must be an integer from 0 to {max_ms}")
    fail = params.get("fail")
    if fail is not None and fail not in ERROR_POLICY:
        raise JobError("INVALID_PARAMS", f"fail must be one of {', '.join(ERROR_POLICY)}")
    if not isinstance(params.get("crash", False), bool):
        raise JobError("INVALID_PARAMS", "crash must be true or false")
    for name in ("alloc_mb", "write_mb", "leak_mb", "say", "spill_mb", "refused_mb"):
        amount = params.get(name, 0)
        if not isinstance(amount, int) or isinstance(amount, bool) or not 0 <= amount <= 65536:
            raise JobError("INVALID_PARAMS", f"{name} must be an integer from 0 to 65536")
    # Fix: steps and output were accepted unchecked, so {"steps": "x"} was
    # queued and then failed in the child as a retried INTERNAL error, and a
    # huge steps flooded the worker with progress frames.
    steps = params.get("steps", 1)
    if not isinstance(steps, int) or isinstance(steps, bool) or not 0 <= steps <= 1000:
        raise JobError("INVALID_PARAMS", "steps must be an integer from 0 to 1000")
    for flag in ("output", "nan", "network", "stray", "abort", "linger"):
        if not isinstance(params.get(flag, False), bool):
            raise JobError("INVALID_PARAMS", f"{flag} must be true or false")
    if params.get("forge", "pickle") not in _FORGED:
        raise JobError("INVALID_PARAMS", f"forge must be one of {', '.join(_FORGED)}")
    if not isinstance(params.get("marker", ""), str):
        raise JobError("INVALID_PARAMS", "marker must be a path")
    probe = params.get("probe", {})
    if not isinstance(probe, dict) or set(probe) - set(_PROBES):
        raise JobError("INVALID_PARAMS", f"probe takes {', '.join(_PROBES)} lists")
    return dict(params)


_LEAKED: list[bytearray] = []


class _Opens:
    """Unpickled, creates a file: proof that the reader ran our code."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return open, (self.path, "w")


_FORGED = {
    "pickle": lambda marker: _frame(pickle.dumps({"op": "done", "x": _Opens(marker)})),
    "huge": lambda marker: struct.pack("!I", 3 << 30),
    "junk": lambda marker: _frame(b'{"op": "done", "status": "owned"}'),
    # A warm child saying it again: it would have pushed the deadline back.
    "warm": lambda marker: _frame(b'{"op": "warm", "cpu_total_ms": 0}') * 20,
}


def _frame(body: bytes) -> bytes:
    return struct.pack("!I", len(body)) + body


def _forge(kind: str, marker: str) -> None:
    """Write a forged report on every pipe this process may write to but
    stdin/stdout/stderr: the worker's report pipe is among them."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            writable = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY
            if fd > 2 and writable and stat.S_ISFIFO(os.fstat(fd).st_mode):
                os.write(fd, _FORGED[kind](marker))
        except OSError:
            continue


def _sleep(params: dict[str, Any], ctx: Context) -> dict[str, Any] | None:
    ms = int(params.get("ms", 0))
    if params.get("abort"):
        held = bytearray(params.get("alloc_mb", 0) * 1024 * 1024)
        held[::4096] = b"x" * len(held[::4096])
        time.sleep(ms / 1000)
        if params.get("refused_mb"):
            said = b"GLib-ERROR **: failed to allocate %d bytes\n" % (params["refused_mb"] << 20)
            os.write(2, said)
        os.abort()
    if params.get("say"):  # straight to fd 2, as C code writes
        os.write(2, b"".join(b"debug.sleep says %d\x1b[2J\n" % i for i in range(params["say"])))
    for i in range(params.get("spill_mb", 0)):
        with open(os.path.join(ctx.scratch, f"spill-{i}.bin"), "wb") as f:
            f.write(os.urandom(1_048_576))  # written out: zeros could be sparse
    steps = max(1, int(params.get("steps", 1)))
    for i in range(steps):
        time.sleep(ms / 1000 / steps)
        if steps > 1:
            ctx.progress(100 * (i + 1) / steps, f"step {i + 1}/{steps}")
    if params.get("alloc_mb"):
        blob = bytearray(params["alloc_mb"] * 1024 * 1024)
        blob[::4096] = b"x" * len(blob[::4096])
    if params.get("crash"):
        os.kill(os.getpid(), signal.SIGKILL)
    if params.get("leak_mb"):
        kept = bytearray(params["leak_mb"] * 1024 * 1024)
        kept[::4096] = b"x" * len(kept[::4096])  # touched: resident, not just reserved
        _LEAKED.append(kept)
    if params.get("write_mb"):
        with open(os.path.join(ctx.scratch, "written.bin"), "wb") as f:
            for _ in range(params["write_mb"]):
                f.write(b"\0" * 1_048_576)
    if params.get("forge"):
        _forge(params["forge"], params.get("marker", "/nonexistent/marker"))
        time.sleep(5)  # the worker must act on the forgery, not on our real report
    if params.get("fail"):
        raise JobError(params["fail"], f"debug.sleep was asked to fail with {params['fail']}")
    if params.get("output"):
        ctx.output("debug_result", "application/json", {"slept_ms": ms, "pid": os.getpid()})
    if params.get("nan"):
        return {"value": float("nan")}  # not JSON: the worker must refuse it
    # What the attempt saw of its sandbox, so tests can check the isolation.
    from hypermedia.worker import sandbox

    if params.get("linger"):
        _linger()
    return {
        **({"stray": _stray()} if params.get("stray") else {}),
        "sandbox": sandbox.ACTIVE,
        "offline": sandbox.OFFLINE,
        "probe": _probe(params.get("probe") or {}, ctx.input_path),
        "slept_ms": ms,
        "pid": os.getpid(),
        "environ": sorted(os.environ),
        # Relative to the attempt's scratch folder: the server's own paths are
        # not for the readers of a job's result.
        "cwd": os.path.relpath(os.getcwd(), ctx.scratch),
        "db_loaded": any(m.startswith(("sqlalchemy", "hypermedia.db")) for m in sys.modules),
    }


def _linger() -> None:
    """Start a process half a second after the attempt ends, past the
    child's check for processes left running (a thread left behind)."""

    def later() -> None:
        time.sleep(0.5)
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)

    threading.Thread(target=later, daemon=True).start()


def _stray() -> dict[str, Any]:
    """Leave a process running, as a daemon would (a double fork, trying to
    leave the process group first): its pid, and whether setsid worked."""
    r, w = os.pipe()
    if os.fork() == 0:  # the intermediate process
        try:
            os.setsid()
            escaped = True
        except OSError:
            escaped = False
        if os.fork() == 0:  # the one left behind
            os.close(r)
            os.write(w, json.dumps({"pid": os.getpid(), "setsid": escaped}).encode())
            os.close(w)
            time.sleep(120)
            os._exit(0)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        return dict(json.loads(f.read()))


def _probe(probe: dict[str, list[Any]], input_path: str | None) -> dict[str, dict[str, bool]]:
    """Which of these it could do; ``"$input"`` names the attempt's input file."""

    def can(action: Callable[[Any], None], target: Any) -> bool:
        try:
            action(target)
            return True
        except OSError:
            return False

    def read(path: str) -> None:
        with open(path, "rb") as f:
            f.read(1)

    def write(path: str) -> None:
        with open(path, "ab") as f:
            f.write(b"!")  # a real change: a write through a hard link would show

    def connect(port: int) -> None:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()

    def unix(path: str) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            s.connect(path)

    def signal_(pid: int) -> None:
        os.kill(pid, 0)

    def plant(name: str) -> None:
        """Leave a file in scratch and set the folder's mtime back, as if
        nothing were there (what a slot once judged emptiness by)."""
        before = os.stat(".")
        with open(name, "w") as f:
            f.write("planted")
        os.utime(".", ns=(before.st_atime_ns, before.st_mtime_ns))

    actions: dict[str, Callable[[Any], None]] = {
        "read": read,
        "write": write,
        "connect": connect,
        "unix": unix,
        "signal": signal_,
        "plant": plant,
    }
    return {
        kind: {str(x): can(action, input_path if x == "$input" else x) for x in probe.get(kind, [])}
        for kind, action in actions.items()
    }


def _validate_copy(params: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    _no_settings(settings, "debug.copy")
    unknown = set(params) - {"name", "symlink"}
    if unknown:
        raise JobError("INVALID_PARAMS", f"unknown parameters: {', '.join(sorted(unknown))}")
    for key in ("name", "symlink"):
        if key in params and (not isinstance(params[key], str) or not params[key]):
            raise JobError("INVALID_PARAMS", f"{key} must be a non-empty string")
        # A file name the child can create (the worker checks where it points).
        if key in params and ("\x00" in params[key] or len(params[key].encode()) > 255):
            raise JobError("INVALID_PARAMS", f"{key} must be at most 255 bytes, without NUL")
    return dict(params)


def _copy(params: dict[str, Any], ctx: Context) -> dict[str, Any] | None:
    if ctx.input_path is None:
        raise JobError("INVALID_PARAMS", "debug.copy needs an input object")
    name = params.get("name", "copy.bin")
    _write_copy(ctx.input_path, os.path.join(ctx.scratch, name), params.get("symlink"))
    ctx.output("copy", "application/octet-stream", {}, path=name)
    return {"copied": True}


def _write_copy(source: str, target: str, symlink: str | None) -> None:
    # The name is a path, so that tests can aim outputs outside scratch (the
    # sandbox and the worker refuse those); one into a folder that is not
    # there is the params' fault, not the worker's (it failed INTERNAL, thrice).
    try:
        if symlink:
            os.symlink(symlink, target)
            return
        out = open(target, "wb")  # noqa: SIM115 (closed by the with below)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as exc:
        raise JobError("INVALID_PARAMS", f"name: cannot write there ({exc.strerror})") from None
    with open(source, "rb") as src, out:
        while chunk := src.read(1 << 20):
            out.write(chunk)


register(Pipeline("debug.noop", "bulk", _validate_noop, _noop))
register(Pipeline("debug.copy", "bulk", _validate_copy, _copy, needs_input=True))
register(
    Pipeline(
        "debug.sleep",
        "bulk",
        _validate_sleep,
        _sleep,
        network=lambda params: bool(params.get("network")),
    )
)

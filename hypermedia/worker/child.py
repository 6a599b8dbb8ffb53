"""The child process that runs attempts, started empty-handed by the worker.

It has no database access (it never imports hypermedia.db, and where the
kernel has Landlock it confines itself before its first job: sandbox.py), an
empty environment, and per-attempt limits: address space (RLIMIT_AS), CPU time
and file size.  It speaks strict JSON to the worker (protocol.py).  It may
serve many attempts in a row; the parent decides when to recycle it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import signal
import sys
import traceback
from typing import Any

from hypermedia.errors import FILE_TOO_LARGE, SCRATCH_FULL, JobError
from hypermedia.linux import prctl
from hypermedia.worker.protocol import (
    FrameReader,
    encode,
    finite_number,
    write_encoded,
    write_frame,
)


def _cpu_ms() -> int:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return int((ru.ru_utime + ru.ru_stime) * 1000)


class _Memory:
    """This process's peak and current RSS, read from /proc/self/status.

    Both files stay open for the child's life: opening them per attempt (and
    parsing text) was most of a tiny attempt's cost in the child (85 of
    133 µs); a read at offset 0 of a kept descriptor makes the kernel write
    the file afresh.
    """

    def __init__(self) -> None:
        self._status = _open("/proc/self/status", os.O_RDONLY)
        self._clear = _open("/proc/self/clear_refs", os.O_WRONLY)

    def reset_peak(self) -> None:
        # Writing 5 resets the peak RSS (VmHWM), so each attempt reports its own.
        if self._clear is not None:
            with contextlib.suppress(OSError):
                os.write(self._clear, b"5")

    def now(self) -> tuple[int, int | None]:
        """(peak RSS of this attempt, RSS now), in MiB: the worker recycles a
        child that holds on to much memory after an attempt (a leak, or a
        heap that never shrinks back)."""
        peak = rss = None
        if self._status is not None:
            try:
                data = os.pread(self._status, 16384, 0)
                peak, rss = _status_field(data, b"VmHWM:"), _status_field(data, b"VmRSS:")
            except OSError:
                pass
        if peak is None:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return peak // 1_048_576, None if rss is None else rss // 1_048_576


def _open(path: str, flags: int) -> int | None:
    try:
        return os.open(path, flags | os.O_CLOEXEC)
    except OSError:
        return None


def _status_field(status: bytes, field: bytes) -> int | None:
    """A "Field:   1234 kB" line of /proc/self/status, in bytes."""
    at = status.find(field)
    if at < 0:
        return None
    end = status.find(b"kB", at)
    try:
        return int(status[at + len(field) : end]) * 1024
    except ValueError:
        return None


def _cap(which: int, mb: int, ceiling_mb: int) -> None:
    """``which`` at ``mb`` MiB for this attempt, and its hard limit at the
    worker's ceiling for any: with the hard limit left as it was, attempt code
    raised the soft one back (400 MiB allocated under a 256 MiB limit).  A
    hard limit only goes down, so every attempt gets the same ceiling."""
    _, hard = resource.getrlimit(which)
    ceiling = ceiling_mb * 1024 * 1024
    if hard == resource.RLIM_INFINITY or hard > ceiling:
        hard = ceiling
    resource.setrlimit(which, (min(mb * 1024 * 1024, hard), hard))


def _limit(
    mem_mb: int | None, cpu_s: int | None, file_mb: int | None, ceiling_mb: int | None = None
) -> None:
    if file_mb:
        # Python ignores SIGXFSZ: a write past this fails with EFBIG instead
        # (and a tool started with subprocess dies of SIGXFSZ).
        _cap(resource.RLIMIT_FSIZE, file_mb, file_mb)
    if mem_mb:
        _cap(resource.RLIMIT_AS, mem_mb, max(mem_mb, ceiling_mb or mem_mb))
    if cpu_s:
        # Fix: RLIMIT_CPU counts user *and* system time.  Counting only
        # ru_utime put the limit below what a warm child had already used once
        # its system time (page faults, I/O) added up, and the next attempt
        # died of SIGXCPU at once, reported as a timeout.
        ru = resource.getrusage(resource.RUSAGE_SELF)
        used = int(ru.ru_utime + ru.ru_stime) + 1
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        resource.setrlimit(resource.RLIMIT_CPU, (used + cpu_s, hard))


def _os_failure(exc: OSError) -> dict[str, Any]:
    """A full scratch disk is the machine's state, not the input's: retried
    (later, as a store that is away) on this or another worker."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return {"status": "failed", "code": "STORAGE_UNAVAILABLE", "message": SCRATCH_FULL}
    if exc.errno == errno.EFBIG:  # RLIMIT_FSIZE: the file may be gone already
        return {"status": "failed", "code": "LIMIT_EXCEEDED", "message": FILE_TOO_LARGE}
    return _internal(exc)


def _internal(exc: Exception) -> dict[str, Any]:
    traceback.print_exc(file=sys.stderr)
    return {"status": "failed", "code": "INTERNAL", "message": type(exc).__name__}


def run_attempt(msg: dict[str, Any], out: int, memory: _Memory) -> bytes:
    """Run one attempt; its report, as the frame to send."""
    from hypermedia.pipelines import registry

    def report(progress: dict[str, Any]) -> None:
        # The frames are strict JSON: a 0/0 percent is dropped here rather
        # than failing the attempt it merely describes.
        percent, step = progress.get("percent"), progress.get("step")
        if not finite_number(percent):
            percent = None
        write_frame(out, {"op": "progress", "percent": percent, "step": step and str(step)})

    def budget(seconds: float | None, reason: str) -> None:
        write_frame(out, {"op": "budget", "seconds": seconds, "reason": reason})

    os.chdir(msg["scratch"])
    memory.reset_peak()
    cpu0 = _cpu_ms()
    _limit(msg.get("mem_mb"), msg.get("cpu_s"), msg.get("file_mb"), msg.get("mem_ceiling_mb"))
    try:
        pipeline = registry.get(msg["job_type"])
        ctx = registry.Context(msg["scratch"], report, msg.get("input"), budget)
        result = pipeline.run(msg.get("params") or {}, ctx)
        done: dict[str, Any] = {"status": "completed", "result": result, "outputs": ctx.outputs}
    except JobError as exc:
        done = {"status": "failed", "code": exc.code, "message": exc.reason}
    except MemoryError:
        done = {"status": "failed", "code": "OOM", "message": "the attempt ran out of memory"}
    except PermissionError:
        done = {
            "status": "failed",
            "code": "PERMISSION_DENIED",
            "message": "the attempt reached outside its sandbox (a file or the network)",
        }
    except OSError as exc:
        done = _os_failure(exc)
    except Exception as exc:  # a pipeline bug: keep the child alive, report it
        done = _internal(exc)
    finally:
        # Lift the per-attempt limits again before talking to the parent.
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
        os.chdir("/")
    if done["status"] == "failed" and _wrote_too_much(msg["scratch"], msg.get("file_mb")):
        # Whatever the decoder made of its failed write, the cause is the limit.
        done = {
            "status": "failed",
            "code": "LIMIT_EXCEEDED",
            "message": f"the attempt wrote a file over its {msg['file_mb']} MB limit",
        }
    peak_mb, rss_mb = memory.now()
    cpu1 = _cpu_ms()
    done.update(
        op="done",
        cpu_ms=cpu1 - cpu0,
        cpu_total_ms=cpu1,
        peak_mb=peak_mb,
        rss_mb=rss_mb,
        stray=_strays(),
    )
    try:
        return encode(done)
    except (TypeError, ValueError):  # NaN, bytes, objects: nothing the worker may store
        done.update(
            status="failed",
            code="INVALID_OUTPUT",
            message="the pipeline returned a result that is not plain JSON",
            result=None,
            outputs=[],
        )
        return encode(done)


def _strays() -> bool:
    """Whether the attempt left a process running.  Every descendant is ours
    to wait for (we are its subreaper, see main) and stays in our process
    group (seccomp refuses setsid and setpgid): the ones that ended are
    reaped here, and one still alive makes the worker kill the whole group
    rather than let it run on beside the next attempts."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False  # none at all
        if pid == 0:
            return True  # one still running
        # one that had ended: reaped, look again


def _wrote_too_much(scratch: str, file_mb: int | None, most: int = 10_000) -> bool:
    """Whether a file in scratch reached the file-size limit (``most`` entries looked at)."""
    if not file_mb:
        return False
    limit, seen = file_mb * 1024 * 1024, 0
    for root, _dirs, files in os.walk(scratch):
        for name in files:
            seen += 1
            if seen > most:
                return False
            try:
                if os.lstat(os.path.join(root, name)).st_size >= limit:
                    return True
            except OSError:
                continue
    return False


def _adopt_orphans() -> None:
    """PR_SET_CHILD_SUBREAPER: a process the attempt starts, and that outlives
    its parent (a daemon's double fork), becomes our child, not init's, so
    _strays sees it."""
    prctl(36, 1)


def _die_with_worker(worker_pid: int | None) -> None:
    """Fix: be killed when the worker dies, instead of running on as an orphan.

    A worker killed with SIGKILL cannot kill its children, and they live in
    their own session, so a child used to run its attempt to the end (an
    hour-long transcode, say) while the reaper handed the job to another
    worker, and nobody would ever read its result.  PR_SET_PDEATHSIG fires
    when the worker thread that started us exits: a slot thread, which lives
    as long as the worker and stops its child before it ends.
    """
    if not sys.platform.startswith("linux"):
        return
    prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if worker_pid is not None and os.getppid() != worker_pid:
        os._exit(1)  # the worker died before we asked: nobody is listening


def _confine(arg: str | None) -> None:
    """Confine this process as the worker asked (sandbox.py), before any job."""
    if not arg:
        return
    from hypermedia.worker import sandbox

    spec = sandbox.Spec.from_json(json.loads(arg))
    try:
        sandbox.confine(spec)
    except OSError as exc:
        print(f"hypermedia child: cannot confine itself: {exc}", file=sys.stderr)
        if spec.mode == "required":
            sys.exit(3)


def main() -> None:
    _die_with_worker(int(sys.argv[1]) if len(sys.argv) > 1 else None)
    _adopt_orphans()
    _confine(sys.argv[2] if len(sys.argv) > 2 else None)
    # The protocol owns the original stdin/stdout; anything a library prints
    # goes to stderr instead of corrupting the frames.
    # Started with env={}, but the interpreter adds LC_CTYPE when it coerces
    # the C locale (PEP 538): a pipeline must see nothing of its host.
    os.environ.clear()
    # No core dumps of hostile input (set here, not in a preexec_fn: see pool.Child).
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    inp, out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    memory = _Memory()
    frames = FrameReader(inp)
    while True:
        msg = frames.read()
        if msg is None or msg.get("op") == "exit":
            return
        if msg.get("op") == "warm":
            from hypermedia.pipelines import registry

            registry.warm(msg.get("job_types") or [])
            # Its start-up CPU, not the next attempt's (slot.py takes it as
            # the baseline: a killed attempt was charged ~150 ms of imports).
            write_frame(out, {"op": "warm", "cpu_total_ms": _cpu_ms()})
            continue
        write_encoded(out, run_attempt(msg, out, memory))


if __name__ == "__main__":
    main()

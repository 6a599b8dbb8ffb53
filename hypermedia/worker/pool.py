"""The worker's side of a child process: spawn, talk, kill, reap.

A child is started once and reused for many attempts (a tiny job then costs
one pipe round trip, not a process start).  One that timed out, crashed, was
cancelled or ran out of memory is killed and never reused.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from hypermedia.worker.protocol import (
    MAX_CHILD_FRAME,
    FrameReader,
    ProtocolError,
    check_report,
    write_frame,
)
from hypermedia.worker.stderr import relay

PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class Exit:
    """How a killed or dead child ended, from wait4's rusage."""

    cpu_total_ms: int
    peak_mb: int
    signal: int | None


class Child:
    def __init__(self, sandbox: dict[str, Any] | None = None) -> None:
        # Our pid, so the child can tell if we died before it armed its
        # parent-death signal (see child._die_with_worker); then what it
        # may touch (see sandbox.py).
        argv = [sys.executable, "-I", "-m", "hypermedia.worker.child", str(os.getpid())]
        if sandbox is not None:
            argv.append(json.dumps(sandbox))
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,  # relayed into the worker's log (stderr.py)
            env={},
            cwd="/",
            # Own session and process group, so a kill takes every grandchild
            # too.  Fix: no preexec_fn (it set RLIMIT_CORE, now done by the
            # child itself): Python documents preexec_fn as unsafe in a
            # threaded program, and the worker starts children from slot
            # threads while others run; a child deadlocked between fork and
            # exec would hang its slot's Popen() for good.
            start_new_session=True,
            close_fds=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._out = self.proc.stdin.fileno()
        self._in = self.proc.stdout.fileno()
        self._frames = FrameReader(self._in, MAX_CHILD_FRAME)
        assert self.proc.stderr is not None
        self.stderr = relay().watch(self.proc.stderr, self.proc.pid)
        self.attempts = 0
        self.cpu_seen_ms = 0  # cumulative CPU the child reported at its last attempt
        self.warmed = False  # it said its libraries are loaded (once: slot.py)
        # Set when the child broke the protocol (it was killed for it).
        self.violation: str | None = None
        self._statm: int | None = None  # /proc/PID/statm, opened at the first vm_mb()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def vm_mb(self) -> int:
        """The child's address space now, in MB (0 once it is gone): what its
        RLIMIT_AS memory limit counts.  One pread of a file kept open."""
        try:
            if self._statm is None:
                self._statm = os.open(f"/proc/{self.proc.pid}/statm", os.O_RDONLY | os.O_CLOEXEC)
            pages = int(os.pread(self._statm, 64, 0).split()[0])
        except (OSError, ValueError, IndexError):
            return 0
        return pages * PAGE // 2**20

    def send(self, message: dict[str, Any]) -> bool:
        try:
            write_frame(self._out, message)
            return True
        except (BrokenPipeError, OSError):
            return False

    def poll(self, timeout: float) -> tuple[bool, Any]:
        """(ready, report). A ready None report means the child is gone: it
        exited, or it sent what no child of ours sends and was killed."""
        if not self._frames.ready():  # else a report came with the last one
            try:
                ready, _, _ = select.select([self._in], [], [], max(0.0, timeout))
            except (OSError, ValueError):
                return True, None
            if not ready:
                return False, None
        try:
            msg = self._frames.read()
            return True, None if msg is None else check_report(msg)
        except ProtocolError as exc:
            self.refuse(str(exc))
            return True, None
        except OSError:
            return True, None

    def refuse(self, why: str) -> None:
        """Kill a child that broke the protocol; the caller reaps it."""
        self.violation = why
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def kill(self) -> Exit:
        """SIGKILL the whole process group and reap the child."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        return self.reap()

    def reap(self) -> Exit:
        try:
            _, status, ru = os.wait4(self.proc.pid, 0)
        except ChildProcessError:
            return Exit(self.cpu_seen_ms, 0, None)
        finally:
            self._close()
        self.proc.returncode = os.waitstatus_to_exitcode(status) if status else 0
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        cpu = int((ru.ru_utime + ru.ru_stime) * 1000)
        return Exit(cpu, ru.ru_maxrss // 1024, sig)

    def stop(self, grace: float = 2.0) -> None:
        """Ask politely, then kill."""
        self.send({"op": "exit"})
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                # Its group too: a process an attempt left running (forked
                # after the attempt's own check) outlived the child, orphaned.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self._close()
                return
            time.sleep(0.01)
        self.kill()

    def _close(self) -> None:
        if self._statm is not None:
            with contextlib.suppress(OSError):
                os.close(self._statm)
            self._statm = None
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream:
                    stream.close()
            except OSError:
                pass

"""The children's stderr, relayed into the worker's log line by line.

What a native library prints (a libvips warning, GLib's last words before an
abort) and a child's own traceback went to the worker's stderr as they came:
no timestamp, no job, interleaved with other children's. Each line is now
logged as ``child PID (job N attempt A): …`` by one thread for every child of
the process. Every line is made printable (a hostile file's metadata echoed
by a loader cannot move the operator's cursor or forge a log line), cut to
``LINE`` characters, and an attempt logs at most ``LINES`` lines: a loader
that warns once per scanline cannot flood the log, and says how many it
left out.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import selectors
import threading
from typing import IO

log = logging.getLogger("hypermedia.child")

# What native libraries say as an allocation fails: GLib ("failed to allocate
# 400000000 bytes"), C++ (std::bad_alloc), libc's strerror and others.
NO_MEMORY = re.compile(
    rb"failed to allocate \d+ bytes|std::bad_alloc|cannot allocate memory|out of memory", re.I
)
LINES = 20  # lines logged per attempt (and per child before its first one)
LINE = 1000  # characters kept of a line
READ = 65536


class Tag:
    """One child's pipe, and whose lines come through it: the slot names the
    attempt as it sends one."""

    def __init__(self, stream: IO[bytes], pid: int) -> None:
        self.stream = stream
        self.pid = pid
        self.who = f"child {pid}"
        self.logged = 0
        self.dropped = 0
        self.partial = b""
        self.ended = False
        # Whether the attempt's child said an allocation failed (GLib's
        # "failed to allocate N bytes" before its abort): an OOM, though its
        # sampled memory never came near the limit (a refused allocation of
        # 400 MB at once, or growth faster than the samples).
        self.no_memory = False
        self._lock = threading.Lock()  # the relay and the slot both read

    def attempt(self, job_id: int, attempt: int) -> None:
        """Lines from now on are this attempt's. What the child printed before
        its last report is in the pipe already: read here, it is told under
        the attempt that printed it, whichever thread gets to it first."""
        self.drain()
        with self._lock:
            self._say_dropped()
            self.who = f"child {self.pid} (job {job_id} attempt {attempt})"
            self.logged = 0
            self.no_memory = False

    def drain(self) -> bool:
        """Log what the pipe holds now; False once it has ended."""
        with self._lock:
            while not self.ended:
                try:
                    chunk = os.read(self.stream.fileno(), READ)
                except BlockingIOError:
                    return True
                except (OSError, ValueError):
                    chunk = b""
                if not chunk:
                    self.ended = True
                    if self.partial:
                        self._line(self.partial)
                        self.partial = b""
                    self._say_dropped()
                    return False
                self._feed(chunk)
            return False

    def _feed(self, chunk: bytes) -> None:
        *lines, self.partial = (self.partial + chunk).split(b"\n")
        for raw in lines:
            self._line(raw)
        if len(self.partial) > LINE:  # a line with no end in sight: logged cut
            self._line(self.partial)
            self.partial = b""

    def _line(self, raw: bytes) -> None:
        if not self.no_memory and NO_MEMORY.search(raw[:LINE]):
            self.no_memory = True
        if self.logged >= LINES:
            self.dropped += 1
            return
        self.logged += 1
        log.warning("%s: %s", self.who, printable(raw))

    def _say_dropped(self) -> None:
        if self.dropped:
            log.warning("%s: %d more lines not logged", self.who, self.dropped)
            self.dropped = 0


def printable(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace").rstrip("\r")
    if len(text) > LINE:
        text = text[:LINE] + "…"
    return "".join(c if c.isprintable() or c == "\t" else "?" for c in text)


class Relay:
    """One thread reading every watched pipe (a thread per child would be up
    to 127 more threads, nearly always asleep)."""

    def __init__(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._new: list[Tag] = []
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread: threading.Thread | None = None

    def watch(self, stream: IO[bytes], pid: int) -> Tag:
        """Relay ``stream`` (a child's stderr) until its end; the relay closes it."""
        os.set_blocking(stream.fileno(), False)
        tag = Tag(stream, pid)
        with self._lock:
            self._new.append(tag)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="child-stderr", daemon=True)
                self._thread.start()
        with contextlib.suppress(BlockingIOError):  # full: it is awake anyway
            os.write(self._wake_w, b"x")
        return tag

    def _run(self) -> None:
        while True:
            for key, _ in self._sel.select():
                if key.data is None:
                    self._adopt()
                elif not key.data.drain():
                    self._sel.unregister(key.fileobj)
                    key.data.stream.close()

    def _adopt(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self._wake_r, 4096)
        with self._lock:
            new, self._new = self._new, []
        for tag in new:
            self._sel.register(tag.stream, selectors.EVENT_READ, tag)


_relay: Relay | None = None
_relay_lock = threading.Lock()


def relay() -> Relay:
    global _relay
    with _relay_lock:
        if _relay is None:
            _relay = Relay()
        return _relay

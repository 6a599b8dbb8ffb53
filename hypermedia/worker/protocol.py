"""Length-prefixed JSON frames between a worker and its child process.

The child decodes hostile files, so the worker treats it as hostile too: a
decoder exploited by a crafted image runs code in the child, and that code
must get no further.  So the frames are plain JSON, never pickle (unpickling
runs code: the worker holds the database and storage credentials); a frame
from a child is at most ``MAX_CHILD_FRAME`` bytes, and its reports are checked
for shape (``check_report``) before the worker acts on them.  Anything else is
a ``ProtocolError``: the child is killed and never reused.
"""

from __future__ import annotations

import json
import math
import os
import struct
from typing import Any

from hypermedia.errors import ERROR_POLICY

_HEADER = struct.Struct("!I")
# Results are capped at 256 KiB (files.MAX_RESULT_BYTES); a frame four times
# that size is a child gone wrong, and must not make the worker buffer 4 GiB.
MAX_CHILD_FRAME = 1 << 20
_TEXT_LIMIT = 1000
_OUTPUT_TEXTS = ("output_type", "mime_type")
# Counters go into INTEGER columns: a forged huge number must not be a value
# the database refuses.
_INT_MAX = 2**31 - 1


class ProtocolError(Exception):
    """A child sent something that is not a report of ours."""


def _no_constants(name: str) -> Any:
    raise ProtocolError(f"{name} is not JSON")


def encode(message: Any) -> bytes:
    """One frame; ValueError/TypeError for what JSON cannot say (NaN, bytes…)."""
    body = json.dumps(message, allow_nan=False, separators=(",", ":")).encode()
    return _HEADER.pack(len(body)) + body


def write_frame(fd: int, message: Any) -> None:
    write_encoded(fd, encode(message))


def write_encoded(fd: int, frame: bytes) -> None:
    data = memoryview(frame)
    while data:
        n = os.write(fd, data)
        data = data[n:]


class FrameReader:
    """The frames of one pipe, in order.  One read takes what the pipe holds:
    the header and body a peer writes at once come in one system call, not
    two, which in a worker of many threads is also one fewer hand-over of
    the GIL per frame.  Bytes past a frame wait here for the next call."""

    CHUNK = 1 << 16  # the most read at once beyond what the frame needs
    MOST = 1 << 20  # ...and the most at all, however long the frame

    def __init__(self, fd: int, limit: int | None = None) -> None:
        self.fd = fd
        self.limit = limit  # a longer frame is a ProtocolError before its body is read
        self._buf = bytearray()

    def ready(self) -> bool:
        """Whether read() answers without waiting for the pipe: a whole frame
        is here, or the header of one over the limit (read() refuses it)."""
        if len(self._buf) < _HEADER.size:
            return False
        size = _HEADER.unpack_from(self._buf)[0]
        too_long = self.limit is not None and size > self.limit
        return too_long or len(self._buf) >= _HEADER.size + size

    def read(self) -> Any | None:
        """The next message, or None when the other end closed the pipe."""
        while True:
            want = _HEADER.size - len(self._buf)
            if want <= 0:
                size = _HEADER.unpack_from(self._buf)[0]
                if self.limit is not None and size > self.limit:
                    raise ProtocolError(f"a frame of {size} bytes")
                end = _HEADER.size + size
                if len(self._buf) >= end:
                    body = bytes(self._buf[_HEADER.size : end])
                    del self._buf[:end]
                    return _decode(body)
                want = end - len(self._buf)
            chunk = os.read(self.fd, min(max(want, self.CHUNK), self.MOST))
            if not chunk:
                return None
            self._buf += chunk


def _decode(body: bytes) -> Any:
    try:
        return json.loads(body, parse_constant=_no_constants)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError("not JSON") from exc


def check_report(msg: Any) -> dict[str, Any]:
    """A child's message as the worker may use it, or ProtocolError.

    Unknown error codes become INTERNAL (retried, category unknown), as the
    engine treats them anyway; texts are cut to a length the database takes.
    """
    if not isinstance(msg, dict):
        raise ProtocolError("a report is not an object")
    op = msg.get("op")
    if op == "warm":  # its CPU so far: the baseline of its first attempt's
        return {"op": "warm", "cpu_total_ms": _count(msg.get("cpu_total_ms"))}
    if op == "progress":
        percent = msg.get("percent")
        if percent is not None and not finite_number(percent):
            percent = None
        return {"op": "progress", "percent": percent, "step": _text(msg.get("step"), None)}
    if op == "budget":
        seconds = msg.get("seconds")
        if seconds is not None and not (finite_number(seconds) and 0 <= seconds <= _INT_MAX):
            raise ProtocolError("a budget that is no number of seconds")
        return {"op": "budget", "seconds": seconds, "reason": _text(msg.get("reason"), "") or ""}
    if op != "done":
        raise ProtocolError("an unknown report")
    status = msg.get("status")
    if status not in ("completed", "failed"):
        raise ProtocolError("an unknown attempt status")
    code = msg.get("code")
    if status == "failed" and code not in ERROR_POLICY:
        code = "INTERNAL"
    return {
        "op": "done",
        "status": status,
        "code": code if status == "failed" else None,
        "message": _text(msg.get("message"), "") or "",
        "result": msg.get("result"),
        "outputs": _outputs(msg.get("outputs")) if status == "completed" else [],
        "cpu_ms": _count(msg.get("cpu_ms")),
        "cpu_total_ms": _count(msg.get("cpu_total_ms")),
        "peak_mb": _count(msg.get("peak_mb")),
        "rss_mb": _count(msg.get("rss_mb")),
        # Processes the attempt left running (child._strays): the worker
        # kills the child's whole process group instead of reusing it.
        "stray": msg.get("stray") is True,
    }


def _outputs(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ProtocolError("outputs is not a list")
    out = []
    for o in value:
        if not isinstance(o, dict):
            raise ProtocolError("an output is not an object")
        for name in _OUTPUT_TEXTS:
            if not isinstance(o.get(name), str) or not o[name]:
                raise ProtocolError(f"an output without {name}")
        metadata, path = o.get("metadata"), o.get("path")
        if metadata is not None and not isinstance(metadata, dict):
            raise ProtocolError("an output's metadata is not an object")
        if path is not None and not isinstance(path, str):
            raise ProtocolError("an output's path is not a string")
        out.append(
            {
                "output_type": o["output_type"][:50],
                "mime_type": o["mime_type"][:255],
                "metadata": metadata,
                "path": path,
            }
        )
    return out


def finite_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _count(value: Any) -> int | None:
    return min(int(value), _INT_MAX) if finite_number(value) and value >= 0 else None


def _text(value: Any, default: str | None) -> str | None:
    return value[:_TEXT_LIMIT] if isinstance(value, str) else default

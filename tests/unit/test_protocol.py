"""The worker-child frames: strict JSON, bounded, checked for shape."""

from __future__ import annotations

import contextlib
import os
import pickle
import struct
from collections.abc import Iterator
from typing import Any

import pytest

from hypermedia.worker.protocol import (
    FrameReader,
    ProtocolError,
    check_report,
    encode,
    write_frame,
)


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    r, w = os.pipe()
    yield r, w
    for fd in (r, w):
        with contextlib.suppress(OSError):
            os.close(fd)


def _raw(w: int, body: bytes) -> None:
    os.write(w, struct.pack("!I", len(body)) + body)


def test_a_frame_round_trips(pipe: tuple[int, int]) -> None:
    r, w = pipe
    msg = {"op": "run", "params": {"ms": 3, "names": ["a", "é"]}, "input": None}
    write_frame(w, msg)
    os.close(w)
    frames = FrameReader(r)
    assert frames.read() == msg
    assert frames.read() is None  # the other end closed


@pytest.mark.parametrize("value", [float("nan"), float("inf"), b"bytes", object()])
def test_what_json_cannot_say_is_refused_when_sent(value: Any) -> None:
    with pytest.raises((ValueError, TypeError)):
        encode({"op": "done", "result": value})


def test_a_pickle_is_refused_without_being_run(pipe: tuple[int, int], tmp_path: Any) -> None:
    marker = tmp_path / "ran"

    class Opens:
        def __reduce__(self) -> tuple[object, tuple[str, str]]:
            return open, (str(marker), "w")

    r, w = pipe
    _raw(w, pickle.dumps(Opens()))
    with pytest.raises(ProtocolError):
        FrameReader(r, 1 << 20).read()
    assert not marker.exists()


@pytest.mark.parametrize("body", [b"NaN", b'{"percent": Infinity}', b"[" * 20_000])
def test_json_extensions_and_deep_nesting_are_refused(pipe: tuple[int, int], body: bytes) -> None:
    r, w = pipe
    _raw(w, body)
    with pytest.raises(ProtocolError):
        FrameReader(r, 1 << 20).read()


def test_an_oversized_frame_is_refused_before_its_body_is_read(pipe: tuple[int, int]) -> None:
    r, w = pipe
    os.write(w, struct.pack("!I", 3 << 30))  # no body follows: reading it would block
    with pytest.raises(ProtocolError, match="bytes"):
        FrameReader(r, 1 << 20).read()


def test_frames_written_at_once_are_read_one_by_one(pipe: tuple[int, int]) -> None:
    r, w = pipe
    first, second = {"op": "progress", "percent": 50}, {"op": "done", "status": "completed"}
    os.write(w, encode(first) + encode(second))  # one write, as a child may send them
    frames = FrameReader(r)
    assert not frames.ready()
    assert frames.read() == first
    assert frames.ready()  # the second came with the first: no need to wait on the pipe
    assert frames.read() == second
    assert not frames.ready()


def test_a_frame_split_across_writes_is_read_whole(pipe: tuple[int, int]) -> None:
    r, w = pipe
    frame = encode({"op": "done", "result": "x" * 200_000})  # longer than one read's chunk
    os.write(w, frame[:3])  # not even the whole header
    frames = FrameReader(r)
    assert not frames.ready()
    pid = os.fork()
    if pid == 0:  # the rest a little later, in pieces
        for at in range(3, len(frame), 50_000):
            os.write(w, frame[at : at + 50_000])
        os._exit(0)
    try:
        assert frames.read() == {"op": "done", "result": "x" * 200_000}
    finally:
        os.waitpid(pid, 0)


def test_an_oversized_header_behind_a_frame_is_refused_without_waiting(
    pipe: tuple[int, int],
) -> None:
    r, w = pipe
    os.write(w, encode({"op": "progress"}) + struct.pack("!I", 3 << 30))
    frames = FrameReader(r, 1 << 20)
    assert frames.read() == {"op": "progress"}
    assert frames.ready()  # the caller must not wait for a body that never comes
    with pytest.raises(ProtocolError, match="bytes"):
        frames.read()


def _done(**kw: Any) -> dict[str, Any]:
    return {"op": "done", "status": "completed", "result": {"a": 1}, "outputs": [], **kw}


@pytest.mark.parametrize(
    "msg",
    [
        ["op", "done"],
        {"op": "exec"},
        _done(status="owned"),
        _done(outputs="x"),
        _done(outputs=[{"output_type": "thumb"}]),
        _done(outputs=[{"output_type": 3, "mime_type": "image/webp"}]),
        _done(outputs=[{"output_type": "t", "mime_type": "m", "metadata": [1]}]),
        _done(outputs=[{"output_type": "t", "mime_type": "m", "path": 7}]),
    ],
)
def test_reports_of_the_wrong_shape_are_refused(msg: Any) -> None:
    with pytest.raises(ProtocolError):
        check_report(msg)


def test_a_report_is_normalised() -> None:
    out = {"output_type": "thumb", "mime_type": "image/webp", "metadata": {"w": 1}, "path": "t"}
    got = check_report(_done(outputs=[out], cpu_ms=12.0, peak_mb=-1, message=None, extra=1))
    assert got == {
        "op": "done",
        "status": "completed",
        "code": None,
        "message": "",
        "result": {"a": 1},
        "outputs": [out],
        "cpu_ms": 12,
        "cpu_total_ms": None,
        "peak_mb": None,
        "rss_mb": None,
        "stray": False,
    }
    # Only a plain true says a process was left running.
    assert check_report(_done(stray=True))["stray"] is True
    assert check_report(_done(stray="yes"))["stray"] is False
    failed = check_report(
        {"op": "done", "status": "failed", "code": "PWNED", "message": "x" * 5000, "outputs": [out]}
    )
    assert (failed["code"], len(failed["message"]), failed["outputs"]) == ("INTERNAL", 1000, [])
    assert check_report({"op": "done", "status": "failed", "code": "OOM"})["code"] == "OOM"


def test_progress_keeps_only_a_finite_number_and_a_text() -> None:
    assert check_report({"op": "progress", "percent": 50, "step": "half"}) == {
        "op": "progress",
        "percent": 50,
        "step": "half",
    }
    odd = check_report({"op": "progress", "percent": True, "step": {"x": 1}})
    assert (odd["percent"], odd["step"]) == (None, None)


def test_a_budget_is_a_number_of_seconds_or_none() -> None:
    said = check_report({"op": "budget", "seconds": 30, "reason": "page 1 is slow" * 200})
    assert said["seconds"] == 30 and len(said["reason"]) == 1000
    assert check_report({"op": "budget", "seconds": None})["seconds"] is None
    for bad in (-1, "30", True, float("inf"), 2**40):
        with pytest.raises(ProtocolError):
            check_report({"op": "budget", "seconds": bad, "reason": ""})


def test_nul_characters_are_scrubbed_before_the_database_sees_them() -> None:
    from hypermedia.worker.files import storable

    declared = [{"output_type": "t", "mime_type": "m", "metadata": {"tag\x00": ["x\x00"]}}]
    result, outs = storable({"text": "a\x00b", "n": 1, "raw": "\\u0000"}, declared)
    assert result == {"text": "a\ufffdb", "n": 1, "raw": "\\u0000"}
    assert outs[0]["metadata"] == {"tag\ufffd": ["x\ufffd"]}
    plain = {"text": "ab"}
    assert storable(plain, [])[0] is plain  # nothing to scrub: nothing copied

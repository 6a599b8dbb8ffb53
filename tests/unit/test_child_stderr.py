"""The relay of a child's stderr (worker/stderr.py), over a real pipe."""

from __future__ import annotations

import logging
import os

import pytest

from hypermedia.worker import stderr
from tests.harness import wait_for


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "hypermedia.child"]


def test_lines_are_told_under_the_attempt_that_printed_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    r, w = os.pipe()
    caplog.set_level(logging.WARNING, logger="hypermedia.child")
    tag = stderr.relay().watch(os.fdopen(r, "rb", buffering=0), 4242)
    os.write(w, b"warming up\n")
    tag.attempt(7, 1)
    # Written before the next attempt is named, read by whichever thread
    # comes first: told under attempt 1 either way.
    os.write(w, b"libvips: bad \x1b]0;x\x07 line\r\nno end yet")
    tag.attempt(8, 2)
    os.write(w, b"x" * (stderr.LINE + 5))
    os.close(w)
    wait_for(lambda: tag.ended, 5, what="the relay ends")
    said = _lines(caplog)
    assert said[:3] == [
        "child 4242: warming up",
        "child 4242 (job 7 attempt 1): libvips: bad ?]0;x? line",
        # A line with no end yet goes with the attempt that finishes it; one
        # longer than LINE is logged cut, whatever is left of it after.
        "child 4242 (job 8 attempt 2): no end yet" + "x" * (stderr.LINE - 10) + "…",
    ]
    assert all(len(line) < stderr.LINE + 40 for line in said)


def test_an_attempt_logs_a_bounded_number_of_lines(caplog: pytest.LogCaptureFixture) -> None:
    r, w = os.pipe()
    caplog.set_level(logging.WARNING, logger="hypermedia.child")
    tag = stderr.relay().watch(os.fdopen(r, "rb", buffering=0), 99)
    tag.attempt(1, 1)
    os.write(w, b"".join(b"line %d\n" % i for i in range(stderr.LINES * 3)))
    os.close(w)
    wait_for(lambda: tag.ended, 5, what="the relay ends")
    said = _lines(caplog)
    assert len(said) == stderr.LINES + 1
    assert said[-1] == f"child 99 (job 1 attempt 1): {stderr.LINES * 2} more lines not logged"

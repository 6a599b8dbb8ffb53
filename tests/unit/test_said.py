"""Warnings said once a minute per kind while a failure lasts (hypermedia/said.py):
a database outage made every thread say its failure at each retry."""

from __future__ import annotations

import logging

import pytest

from hypermedia import said


def test_a_kind_is_said_once_a_minute_with_what_was_not(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    monkeypatch.setattr(said.time, "monotonic", lambda: now[0])
    log = logging.getLogger("test.said")
    kind = "test-kind"
    said.ended(kind)
    with caplog.at_level(logging.WARNING, logger="test.said"):
        for _ in range(5):  # five failures in a second: one line
            said.warning(log, kind, "claim failed (%s)", "away")
            now[0] += 0.2
        said.warning(log, "other-kind", "status failed")  # another kind: its own line
        now[0] += said.EVERY
        said.warning(log, kind, "claim failed (%s)", "away")
    assert [r.getMessage() for r in caplog.records] == [
        "claim failed (away)",
        "status failed",
        "claim failed (away) (4 more like it not logged)",
    ]
    assert said.ended(kind) and not said.ended(kind)
    said.ended("other-kind")

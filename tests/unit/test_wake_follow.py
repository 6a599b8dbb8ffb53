"""The MariaDB listener's watch of the newest job id (db/wakeups._follow), with
a scripted reader: wakes on growth only, survives a failing server."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from hypermedia.db import wakeups


def _follow(answers: list[int | Exception]) -> list[tuple[int, str]]:
    """Run the watch over ``answers`` (one per read); (read number, wake) pairs."""
    stop = threading.Event()
    reads: Iterator[int | Exception] = iter(answers)
    count = 0
    woken: list[tuple[int, str]] = []

    def newest() -> int:
        nonlocal count
        count += 1
        answer = next(reads, None)
        if answer is None:
            stop.set()
            return -1
        if isinstance(answer, Exception):
            raise answer
        return answer

    wakeups._follow(newest, lambda q: woken.append((count, q)), stop, 0.001)
    return [w for w in woken if w[0] <= len(answers)]


def test_looks_once_then_only_when_a_newer_job_appears() -> None:
    # read 1 is the baseline taken before the first look
    assert _follow([5, 5, 5, 7, 7, 9]) == [(1, "*"), (4, "*"), (6, "*")]


def test_a_failing_server_is_read_again_and_looked_past_once(monkeypatch) -> None:
    monkeypatch.setattr(wakeups, "log", _Quiet())
    boom = OSError("server gone")
    # After the failures the watch cannot know what it missed: it looks once.
    assert _follow([3, boom, boom, 3, 3, 4]) == [(1, "*"), (4, "*"), (6, "*")]
    # An empty table (newest 0) right after a failure is nothing to look at.
    assert _follow([0, boom, 0, 0, 1]) == [(1, "*"), (5, "*")]


class _Quiet:
    def warning(self, *args: object) -> None:
        pass

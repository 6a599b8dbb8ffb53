"""How far ahead of its slots a worker claims (worker/pace.py)."""

from __future__ import annotations

from hypermedia.worker.pace import AHEAD_SECONDS, RECENT, Pace


def test_nothing_ahead_before_a_result_or_after_idling() -> None:
    pace = Pace(batch=10)
    assert pace.ahead() == 0  # no attempt seen: it cannot know
    pace.finished(1)
    assert pace.ahead() == 40  # short jobs: four batches
    pace.idle()  # a claim found nothing: what is queued next may be long
    assert pace.ahead() == 0  # ...until a result of the new claim comes back
    pace.finished(2)
    assert pace.ahead() == 40


def test_one_long_attempt_stops_claiming_ahead_until_short_ones_push_it_out() -> None:
    pace = Pace(batch=10)
    pace.finished(50)
    assert pace.ahead() == int(AHEAD_SECONDS * 1000 / 50)  # about a second of work
    pace.finished(5000)
    assert pace.ahead() == 0
    for _ in range(RECENT - 1):
        pace.finished(1)
    assert pace.ahead() == 0  # the long one is still among the recent
    pace.finished(1)
    assert pace.ahead() == 40


def test_unknown_durations_change_nothing() -> None:
    pace = Pace(batch=5)
    pace.finished(None)
    pace.finished(-1)
    assert pace.ahead() == 0

"""Which Accept headers ask /v1/jobs/{id}/events for a stream."""

from __future__ import annotations

import pytest

from hypermedia.api.routes.jobs import wants_stream


@pytest.mark.parametrize(
    ("accept", "stream"),
    [
        ("text/event-stream", True),
        ("application/json, text/event-stream", True),
        ("Text/Event-Stream; q=0.5", True),
        ("text/event-stream;q=0, application/json", False),  # refused: it was streamed
        ("text/event-stream; q=0.0", False),
        ("text/event-stream;q=nan", False),
        ("text/event-stream;q=x", False),
        ("application/json", False),
        ("", False),
        ("*/*", False),  # a JSON answer unless a stream is named
    ],
)
def test_a_stream_is_what_accept_names_with_a_quality_above_0(accept: str, stream: bool) -> None:
    assert wants_stream(accept) is stream

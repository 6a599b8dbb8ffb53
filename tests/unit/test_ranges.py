"""Byte ranges of the signed download (api/ranges.py): RFC 9110 §14 for one range."""

from __future__ import annotations

import pytest

from hypermedia.api.ranges import RangeNotSatisfiable, byte_range, etag

TAG = etag("sha256:ab12")


@pytest.mark.parametrize(
    ("header", "size", "part"),
    [
        ("bytes=0-9", 100, (0, 10)),
        ("bytes=10-", 100, (10, 90)),
        ("bytes=90-500", 100, (90, 10)),  # the end past the last byte: cut to it
        ("bytes=-5", 100, (95, 5)),
        ("bytes=-500", 100, (0, 100)),  # a suffix longer than the body: all of it
        ("bytes=99-99", 100, (99, 1)),
        (" bytes = 3 - 4 ", 100, (3, 2)),
        ("BYTES=0-9", 100, (0, 10)),  # units are case-insensitive (RFC 9110 §14.1)
        # Ignored: the whole body (200), as the RFC allows.
        (None, 100, None),
        ("", 100, None),
        ("bytes=0-1,5-9", 100, None),  # several ranges
        ("items=0-9", 100, None),  # another unit
        ("bytes=9-0", 100, None),  # last before first: invalid
        ("bytes=-", 100, None),
        ("bytes=1 0-20", 100, None),  # a blank inside a number: not 10-20
        ("bytes=\u0661-\u0662", 100, None),  # digits of another script
        ("bytes=" + "9" * 41 + "-", 100, None),  # past any sense: not a range
        # An end past any object's size is cut to its last byte (was ignored: 200).
        ("bytes=0-" + "9" * 20, 100, (0, 100)),
    ],
)
def test_a_range_header_reads_as_rfc_9110_says(
    header: str | None, size: int, part: tuple[int, int] | None
) -> None:
    assert byte_range(header, size, None, TAG) == part


@pytest.mark.parametrize(
    ("header", "size"),
    [
        ("bytes=100-", 100),
        ("bytes=-0", 100),
        ("bytes=0-", 0),
        ("bytes=-1", 0),
        ("bytes=" + "9" * 20 + "-", 100),  # a start past the end, however long
    ],
)
def test_a_range_past_the_end_is_not_satisfiable(header: str, size: int) -> None:
    with pytest.raises(RangeNotSatisfiable):
        byte_range(header, size, None, TAG)


def test_if_range_with_another_validator_asks_for_the_whole_body() -> None:
    assert byte_range("bytes=0-9", 100, TAG, TAG) == (0, 10)
    assert byte_range("bytes=0-9", 100, etag("sha256:cd34"), TAG) is None
    assert byte_range("bytes=0-9", 100, "Wed, 21 Oct 2015 07:28:00 GMT", TAG) is None
    assert TAG == '"sha256-ab12"'

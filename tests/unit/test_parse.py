"""ascii_int: what a client's text may be read as a number."""

from __future__ import annotations

import pytest

from hypermedia.parse import ascii_int


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("0", 0),
        ("42", 42),
        (b"42", 42),
        ("9" * 18, 10**18 - 1),
        ("9" * 19, None),  # past what a BIGINT holds on every backend
        ("", None),
        (None, None),
        ("\u00b2", None),  # '²'.isdigit() is True, int() refuses it
        ("\u0663", None),  # Arabic-Indic three: int() would read it as 3
        (b"\xb2", None),
        ("-1", None),
        ("+1", None),
        (" 1", None),
        ("1.0", None),
    ],
)
def test_only_ascii_digits_within_the_bound_are_numbers(
    raw: str | bytes | None, expected: int | None
) -> None:
    assert ascii_int(raw) == expected


def test_the_bound_is_the_callers() -> None:
    assert ascii_int("123456", 5) is None
    assert ascii_int("12345", 5) == 12345

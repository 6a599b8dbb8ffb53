"""Cursor pages: ``{"items": [...], "next_cursor": ...}``, newest first.

A cursor is the last id of a page, opaque to clients (base64 of ``j<id>``);
pages ask for one row more than they show, to know whether another follows.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Any

from hypermedia.errors import InvalidRequest
from hypermedia.parse import ascii_int

Row = dict[str, Any]


def encode_cursor(last_id: int) -> str:
    return base64.urlsafe_b64encode(f"j{last_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        last_id = ascii_int(raw[1:]) if raw.startswith("j") else None
        if last_id is not None:
            return last_id
    except (binascii.Error, UnicodeDecodeError, ValueError):
        pass
    raise InvalidRequest("cursor is not valid; use next_cursor from a previous page")


def page(rows: list[Row], limit: int, key: str, shape: Callable[[Row], Row]) -> Row:
    """``rows`` were read with ``limit + 1``: show ``limit``, and a cursor if more follow."""
    more = len(rows) > limit
    rows = rows[:limit]
    return {
        "items": [shape(r) for r in rows],
        "next_cursor": encode_cursor(rows[-1][key]) if more else None,
    }

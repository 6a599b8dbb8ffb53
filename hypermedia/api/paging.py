"""Cursor pages: ``{"items": [...], "next_cursor": ...}``, newest first.

A cursor is the last id of a page, opaque to clients (base64 of ``j<id>`` for
jobs, ``o<id>`` for objects: one listing's cursor is refused by another, where
it was taken as an id of the other's); pages ask for one row more than they
show, to know whether another follows.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Any

from hypermedia.errors import InvalidRequest
from hypermedia.parse import ascii_int

Row = dict[str, Any]


TAGS = {"job_id": "j", "object_id": "o"}


def encode_cursor(last_id: int, key: str = "job_id") -> str:
    return base64.urlsafe_b64encode(f"{TAGS[key]}{last_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str, key: str = "job_id") -> int:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        last_id = ascii_int(raw[1:]) if raw.startswith(TAGS[key]) else None
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
        "next_cursor": encode_cursor(rows[-1][key], key) if more else None,
    }

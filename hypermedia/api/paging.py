"""Cursor pages: ``{"items": [...], "next_cursor": ...}``, newest first
(profiles: by key, oldest first).

A cursor is the last id of a page, opaque to clients (base64 of ``j<id>`` for
jobs, ``o<id>`` for objects, ``v<id>`` for profile versions: one listing's cursor is
refused by another, where it was taken as an id of the other's); pages ask for
one row more than they show, to know whether another follows.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Any

from hypermedia.errors import BAD_CURSOR, InvalidRequest
from hypermedia.parse import ascii_int

Row = dict[str, Any]


# /v0's job list is a list of its own (other jobs, other statuses): "l",
# so that neither list takes the other's cursor.
TAGS = {"job_id": "j", "object_id": "o", "v0": "l", "profile_id": "v"}


def encode_cursor(last_id: int, key: str = "job_id", tag: str | None = None) -> str:
    text = f"{TAGS[tag or key]}{last_id}"
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode_cursor(cursor: str, key: str = "job_id", tag: str | None = None) -> int:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        last_id = ascii_int(raw[1:]) if raw.startswith(TAGS[tag or key]) else None
        if last_id is not None:
            return last_id
    except (binascii.Error, UnicodeDecodeError, ValueError):
        pass
    raise InvalidRequest(BAD_CURSOR)


def page(
    rows: list[Row], limit: int, key: str, shape: Callable[[Row], Row], tag: str | None = None
) -> Row:
    """``rows`` were read with ``limit + 1``: show ``limit``, and a cursor if more follow."""
    more = len(rows) > limit
    rows = rows[:limit]
    return {
        "items": [shape(r) for r in rows],
        "next_cursor": encode_cursor(rows[-1][key], key, tag) if more else None,
    }

"""HTTP byte ranges (RFC 9110 §14) for the signed download: one range or
none; and its preconditions (§13: ``If-Match``, ``If-None-Match``).

A client seeking in a video or resuming a cut download asks for a part.  Only
a single range is served; several (``bytes=0-1,5-9``), another unit or a
header that does not parse are ignored, as the RFC allows, and the whole body
is sent (200).  A range that starts past the end is 416.  A cache holding
the object asks with ``If-None-Match`` and is told 304; a client that must
have one version asks with ``If-Match`` and is told 412 for another.
"""

from __future__ import annotations

import re

# ASCII digits, at most 19 of them: int() would read other scripts' digits,
# and no object is larger than 2**63.  The unit in any case (RFC 9110 §14.1),
# blanks only around "=" and "-": "bytes=1 0-20" does not parse.
# Up to 40 digits: an end past any object (RFC 9110: clipped to its last
# byte) is a range still, where 20 digits made it "no range" and a 200.
_SPEC = re.compile(r"[ \t]*bytes[ \t]*=[ \t]*([0-9]{0,40})[ \t]*-[ \t]*([0-9]{0,40})[ \t]*", re.I)


class RangeNotSatisfiable(Exception):
    """The range asked for starts past the object's end."""


def etag(checksum: str) -> str:
    """A strong validator: the bytes are the object's, whose checksum never changes."""
    return '"' + checksum.replace(":", "-") + '"'


# One entity tag of a list: weak or strong, its opaque part quoted.
_TAG = re.compile(r'[ \t]*(W/)?("[\x21\x23-\x7e\x80-\xff]*")[ \t]*')


def precondition(if_match: str | None, if_none_match: str | None, tag: str) -> int | None:
    """The status the preconditions answer for the object whose ETag is
    ``tag`` (412, or 304 for a GET or HEAD), or None to go on (RFC 9110
    §13.2.2: If-Match first, compared strongly; If-None-Match weakly).  A
    header that does not parse matches nothing."""
    if if_match is not None and not _matches(if_match, tag, weak=False):
        return 412
    if if_none_match is not None and _matches(if_none_match, tag, weak=True):
        return 304
    return None


def _matches(header: str, tag: str, *, weak: bool) -> bool:
    if header.strip() == "*":  # any version: the object exists
        return True
    for item in header.split(","):
        found = _TAG.fullmatch(item)
        if found is None:
            continue  # an empty list element, or not a tag
        if found.group(1) and not weak:
            continue  # a weak tag never matches strongly
        if found.group(2) == tag:
            return True
    return False


def byte_range(
    header: str | None, size: int, if_range: str | None, tag: str
) -> tuple[int, int] | None:
    """(start, length) of the part to send, or None for the whole body.

    ``If-Range`` with anything but this object's ETag (another version's, or
    a date: no Last-Modified is sent) asks for the whole body."""
    if not header or (if_range is not None and if_range.strip() != tag):
        return None
    match = _SPEC.fullmatch(header)
    if match is None:
        return None  # several ranges, another unit, or not a range at all
    first, last = match.groups()
    if not first and not last:
        return None
    if not first:  # "-N": the last N bytes
        suffix = int(last)
        if suffix == 0 or size == 0:
            raise RangeNotSatisfiable
        return max(0, size - suffix), min(suffix, size)
    start = int(first)
    if last and int(last) < start:
        return None  # invalid: ignored, as if there were no Range
    if start >= size:
        raise RangeNotSatisfiable
    end = min(int(last), size - 1) if last else size - 1
    return start, end - start + 1

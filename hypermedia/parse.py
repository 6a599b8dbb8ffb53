"""Numbers (and base URLs) read from text someone else wrote (headers, query
strings, settings).

``str.isdigit()`` is true for '²' and '٣', which ``int()`` then refuses or reads
as a digit of another script; and an id past 2**63 overflows every database's
BIGINT.  One check for both, so a stray byte is "not a number", never a 500.
"""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Any
from urllib.parse import urlsplit

from hypermedia.errors import InvalidRequest

MAX_DIGITS = 18  # below 2**63: fits a BIGINT on every backend


def ascii_int(raw: str | bytes | None, max_digits: int = MAX_DIGITS) -> int | None:
    """The value of ``raw`` if it is 1 to ``max_digits`` ASCII digits, else None."""
    if raw is None or not 0 < len(raw) <= max_digits:
        return None
    text = raw.decode("latin-1") if isinstance(raw, bytes) else raw
    if not (text.isascii() and text.isdigit()):
        return None
    return int(text)


# What no database stores alike: PostgreSQL refuses NUL in text and JSONB, and
# a lone surrogate cannot be UTF-8 at all, yet SQLite kept both, and every
# answer that carried the value was a 500 from then on.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable(value: Any) -> bool:
    """Whether every string in ``value`` (a JSON value, keys included) can be stored.

    A loop, not a recursion: JSON nested 330 to 980 deep passed the parser and
    then ran this out of stack (a 500, and 4,000 lines of traceback a request)."""
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, str):
            if _UNSTORABLE.search(item) is not None:
                return False
        elif isinstance(item, dict):
            todo.extend(item.keys())
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
    return True


class DuplicateKey(ValueError):
    """A JSON object that names one key twice."""

    def __init__(self, key: str) -> None:
        super().__init__(f"the key {json.dumps(key[:100])} appears twice in one object")


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise DuplicateKey(key)
        found[key] = value
    return found


def json_unique(text: str | bytes) -> Any:
    """``json.loads``, refusing an object that names a key twice
    (``DuplicateKey``).  Python keeps the last of them, other readers the
    first: ``{"priority": 1, "priority": 10}`` would be one job to a proxy or
    a log reader and another to us."""
    return json.loads(text, object_pairs_hook=_unique)


# RFC 1123 host names (an IPv4 address is one too); an IPv6 address is in brackets.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")
_NETLOC = re.compile(r"(?P<host>\[[^\]]*\]|[^:\[\]]*)(?::(?P<port>[0-9]{1,5}))?")
# A path's characters as RFC 3986 spells them (pchar and "/"), no query or fragment.
_URL_PATH = re.compile(r"(?:/[A-Za-z0-9._~!$&'()*+,;=:@%-]*)*")


def base_url(value: str, option: str = "--base-url") -> str:
    """``value`` as the prefix of signed links, ``http(s)://HOST[:PORT][/PATH]``
    without its trailing slash ("" stays "": links relative to the server).
    Anything else is refused (InvalidRequest, exit 2): a trailing slash made
    "…//v1/objects/…" (a 404), and "javascript:alert(1)" was used as given."""
    if not value:
        return ""

    def refused(why: str) -> InvalidRequest:
        return InvalidRequest(f"{option} takes http(s)://HOST[:PORT][/PATH]: {why}")

    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not value.lower().startswith(parts.scheme + "://"):
        raise refused("it does not start with http:// or https://")
    if any(ch.isspace() or not ch.isprintable() for ch in value):
        raise refused("it has spaces or control characters")
    if "?" in value or "#" in value or "@" in parts.netloc:
        raise refused("a user, query or fragment has no place in it")
    netloc = _NETLOC.fullmatch(parts.netloc)
    if netloc is None or not _is_host(netloc["host"]):
        raise refused("it names no host")
    if netloc["port"] is not None and not 1 <= int(netloc["port"]) <= 65535:
        raise refused("its port is not from 1 to 65535")
    if not _URL_PATH.fullmatch(parts.path):
        raise refused("its path has characters a URL path does not")
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"


def _is_host(host: str) -> bool:
    if host.startswith("["):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return False
        return True
    return _HOST_NAME.fullmatch(host) is not None and len(host) <= 253

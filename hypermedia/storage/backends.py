"""Pool URLs to backends.

* ``file:`` — the default pool: ``HYPERMEDIA_HOME/storage``;
* ``file:///absolute/path`` — a folder on this machine (or a mount shared by workers);
* ``s3://bucket?endpoint=http://host:8333&region=us-east-1`` — any S3-compatible
  store, path-style addressing; credentials come from the settings, never the URL.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from hypermedia.config import Settings
from hypermedia.errors import InvalidRequest
from hypermedia.storage.base import Backend
from hypermedia.storage.local import LocalBackend


def parse_pool_url(url: str, *, strict: bool = True) -> tuple[str, dict[str, str]]:
    """("file", {"path": …}) or ("s3", {"bucket", "endpoint", "region"}); InvalidRequest if bad.

    ``strict`` (a URL being stored: `pools add`, `pools set-url`) adds the
    checks made after pools were stored with URLs that fail them: an empty
    option, a bucket with ".." or shaped as an IP address, a region botocore
    would refuse.  A stored URL is opened without them, as it was before, so
    a pool that worked keeps working (a region botocore refuses fails that
    pool alone, when its client is made)."""
    if not url.isprintable():  # a newline in a folder's name, an escape sequence
        raise InvalidRequest("a pool URL has no control characters")
    try:
        parts = urlsplit(url)
    except ValueError:  # "Invalid IPv6 URL"
        raise InvalidRequest("the pool URL is not a URL") from None
    if parts.fragment:
        raise InvalidRequest("a pool URL has no #fragment")
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise InvalidRequest("file: pool URLs take no host")
        if parts.path and not parts.path.startswith("/"):
            raise InvalidRequest("file: pool URLs need an absolute path")
        if parts.query:  # it was ignored: the folder is the path alone
            raise InvalidRequest("file: pool URLs take no ?options")
        return "file", {"path": parts.path}
    if parts.scheme == "s3":
        if not parts.netloc or parts.path not in ("", "/"):
            raise InvalidRequest("s3 pool URLs look like s3://bucket?endpoint=…&region=…")
        if parts.username or parts.password:
            raise InvalidRequest("put S3 credentials in the settings, not in the pool URL")
        _check_bucket(parts.netloc, strict)
        # keep_blank_values: "&endpoint=" was dropped, so a second, empty
        # option passed as given once and was stored verbatim.
        given = parse_qs(parts.query, keep_blank_values=strict)
        if any(len(v) > 1 for v in given.values()):  # the last one won, silently
            raise InvalidRequest("give each s3 pool option once")
        query = {k: v[0] for k, v in given.items()}
        if not all(f"{k}{v}".isprintable() for k, v in query.items()):
            # Decoded: "endpoint=http://h:9000%0a" passed the check above,
            # was stored, and every client of the pool failed on it.
            raise InvalidRequest("a pool URL has no control characters, %-encoded or not")
        unknown = set(query) - {"endpoint", "region"}
        if unknown:
            raise InvalidRequest(f"unknown s3 pool option(s): {', '.join(sorted(unknown))}")
        if "endpoint" in query:
            _check_endpoint(query["endpoint"])
        if strict and "region" in query and not REGION.fullmatch(query["region"]):
            # botocore refuses it only when a client is made: stored, it broke
            # every GC run and /readyz, and its objects kept `pools rm` away.
            raise InvalidRequest(
                "an S3 region is 1 to 63 of a-z, A-Z, 0-9 and '-', not all digits, no '-' at an end"
            )
        return "s3", {"bucket": parts.netloc, **query}
    raise InvalidRequest("pool URLs start with file: or s3://")


BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
IP_ADDRESS = re.compile(r"\d+\.\d+\.\d+\.\d+")
# botocore's own test of a region name (botocore.utils.validate_region_name),
# not empty: a host label, not all digits.
REGION = re.compile(r"(?![0-9]+$)(?!-)[a-zA-Z0-9-]{1,63}(?<!-)")


def _check_bucket(name: str, strict: bool) -> None:
    """S3's naming rules: 3 to 63 of a-z 0-9 . -, a letter or digit at each end,
    and (``strict``) no two dots in a row, not an IP address."""
    odd = ".." in name or IP_ADDRESS.fullmatch(name) is not None
    if not BUCKET_NAME.fullmatch(name) or (strict and odd):
        raise InvalidRequest(
            "an S3 bucket name has 3 to 63 characters: a-z, 0-9, '.' and '-', "
            "no '..', and is not an IP address"
        )


def _check_endpoint(endpoint: str) -> None:
    """http(s)://host[:port], nothing else: credentials in it would be stored
    with the pool and printed in every presigned link."""
    bad = InvalidRequest("an S3 endpoint looks like http://host:port or https://host")
    try:
        e = urlsplit(endpoint)
        port = e.port  # parsed lazily: 99999 or "x" fail here
    except ValueError:  # "Port out of range 0-65535", "Invalid IPv6 URL"
        raise bad from None
    if e.scheme not in ("http", "https") or not e.hostname or port == 0:
        raise bad  # port 0 was stored, and /readyz said not ready for ever
    if e.username or e.password:
        raise InvalidRequest("put S3 credentials in the settings, not in the pool URL")
    if e.path not in ("", "/") or e.query or e.fragment:
        raise InvalidRequest("an S3 endpoint is a scheme, a host and a port only")


def open_backend(url: str, settings: Settings, *, strict: bool = False) -> Backend:
    """The backend of a pool URL: a stored one by default, ``strict`` for one
    about to be stored (``check_pool``)."""
    kind, opts = parse_pool_url(url, strict=strict)
    if kind == "file":
        return LocalBackend(Path(opts["path"]) if opts["path"] else settings.home / "storage")
    from hypermedia.storage.s3 import S3Backend

    _both_or_neither(settings)
    return S3Backend(
        opts["bucket"],
        endpoint=opts.get("endpoint"),
        region=opts.get("region"),
        access_key_id=settings.s3_access_key_id,
        secret_access_key=settings.s3_secret_access_key,
        timeout=settings.s3_timeout_seconds,
    )


class CredentialsRefused(InvalidRequest):
    """The S3 credential settings cannot be used: the settings are to fix, not the URL."""


def _both_or_neither(settings: Settings) -> None:
    """One S3 credential without the other was sent as is, and S3's "access
    denied" never said which half was missing.  Checked where an S3 pool is
    opened: a node with no S3 pool has no use for them."""
    if bool(settings.s3_access_key_id) == bool(settings.s3_secret_access_key):
        return
    given, empty = "ACCESS_KEY_ID", "SECRET_ACCESS_KEY"
    if not settings.s3_access_key_id:
        given, empty = empty, given
    raise CredentialsRefused(
        f"HYPERMEDIA_S3_{given} is set but HYPERMEDIA_S3_{empty} is empty: set both "
        "(or neither, for boto3's own credential chain)"
    )

"""Pool URLs: what `pools add` stores is checked first, each mistake named
(a port out of range and a broken IPv6 host were ValueErrors, exit 1; a
repeated option, a #fragment or a file: ?query were taken silently)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hypermedia.config import Settings
from hypermedia.errors import InvalidRequest
from hypermedia.storage.backends import open_backend, parse_pool_url


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("s3://media?endpoint=http://127.0.0.1:99999", "an S3 endpoint looks like"),
        ("s3://media?endpoint=http://127.0.0.1:0", "an S3 endpoint looks like"),
        ("s3://media?endpoint=http://127.0.0.1:port", "an S3 endpoint looks like"),
        ("s3://media?endpoint=http://[::1:8333", "an S3 endpoint looks like"),
        ("s3://[::1/x", "the pool URL is not a URL"),
        ("s3://media?endpoint=http://a:1&endpoint=http://b:2", "give each s3 pool option once"),
        ("s3://media?region=a&region=b", "give each s3 pool option once"),
        # An empty second option was dropped before the check, then stored.
        ("s3://media?endpoint=http://a:1&endpoint=", "give each s3 pool option once"),
        # botocore refuses these only when a client is made: stored, one broke
        # every GC run and /readyz.
        ("s3://media?region=us-east-1;rm", "an S3 region is"),
        ("s3://media?region=", "an S3 region is"),
        ("s3://media?region=-eu", "an S3 region is"),
        ("s3://media?region=123", "an S3 region is"),
        ("s3://qa..media", "no '..'"),
        ("s3://192.168.1.1", "not an IP address"),
        ("s3://media#frag", "no #fragment"),
        ("file:///srv/media#frag", "no #fragment"),
        ("file:///srv/media?endpoint=x", "file: pool URLs take no ?options"),
        ("file:///srv/me\ndia", "no control characters"),
        ("file:///srv/\x1b[31mred", "no control characters"),
        # %-encoded: decoded, it passed, was stored, and every client failed on it.
        ("s3://media?endpoint=http://127.0.0.1:9000%0a", "no control characters"),
        ("s3://media?endpoint=http://127.0.0.1:9000%0d", "no control characters"),
        ("s3://media?region=eu%09west", "no control characters"),
    ],
)
def test_a_bad_pool_url_is_refused_with_its_reason(url: str, said: str) -> None:
    with pytest.raises(InvalidRequest, match=said.replace("?", r"\?")):
        parse_pool_url(url)


@pytest.mark.parametrize(
    ("url", "parsed"),
    [
        ("file:///srv/media", ("file", {"path": "/srv/media"})),
        ("file:", ("file", {"path": ""})),
        (
            "s3://media?endpoint=http://[::1]:8333&region=eu-west-1",
            ("s3", {"bucket": "media", "endpoint": "http://[::1]:8333", "region": "eu-west-1"}),
        ),
        ("s3://media.b-1", ("s3", {"bucket": "media.b-1"})),
    ],
)
def test_good_pool_urls_parse(url: str, parsed: tuple[str, dict[str, str]]) -> None:
    assert parse_pool_url(url) == parsed


@pytest.mark.parametrize(
    "url",
    [
        "s3://media?endpoint=http://a:1&region=",
        "s3://my..bucket?endpoint=http://a:1",
        "s3://10.0.0.1?endpoint=http://a:1",
    ],
)
def test_a_stored_url_that_newer_checks_refuse_still_opens(url: str) -> None:
    """Refused when stored now (`pools add`, `set-url`), opened as before when
    already stored: a pool that worked must not stop at an upgrade."""
    with pytest.raises(InvalidRequest):
        parse_pool_url(url)
    kind, opts = parse_pool_url(url, strict=False)
    assert kind == "s3" and opts["endpoint"] == "http://a:1"
    assert "region" not in opts  # an empty one is dropped, as before


@pytest.mark.parametrize(
    ("given", "empty"),
    [("s3_access_key_id", "s3_secret_access_key"), ("s3_secret_access_key", "s3_access_key_id")],
)
def test_half_of_the_s3_credentials_is_refused_by_name(
    tmp_path: Path, given: str, empty: str
) -> None:
    """A key id without its secret reached S3, whose "access denied" never
    said which half was missing.  Refused where an S3 pool is opened (a node
    with no S3 pool runs on)."""
    settings = Settings(home=tmp_path).with_(**{given: "AKIAQA1234567", empty: ""})
    assert open_backend("file:", settings)  # no S3 pool: no use for them
    with pytest.raises(InvalidRequest) as info:
        open_backend("s3://media?endpoint=http://127.0.0.1:9", settings)
    name, other = given.upper(), empty.upper()
    assert str(info.value).startswith(f"HYPERMEDIA_{name} is set but HYPERMEDIA_{other} is empty")
    assert "AKIA" not in str(info.value)

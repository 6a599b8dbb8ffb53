"""Pool URLs: what `pools add` stores is checked first, each mistake named
(a port out of range and a broken IPv6 host were ValueErrors, exit 1; a
repeated option, a #fragment or a file: ?query were taken silently)."""

from __future__ import annotations

import pytest

from hypermedia.errors import InvalidRequest
from hypermedia.storage.backends import parse_pool_url


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

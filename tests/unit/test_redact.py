"""redact(): what may leave the system."""

from __future__ import annotations

import sqlite3

import pytest
import sqlalchemy as sa

from hypermedia.redact import MAX_REASON, brief, redact, tokens


@pytest.mark.parametrize(
    ("text", "secret", "marker"),
    [
        ("open failed: /var/lib/hypermedia/objects/12/in.pdf", "/var/lib", "[path]"),
        ("cannot read C:\\Users\\ann\\secret.png now", "Users", "[path]"),
        ("s3 error at https://AKIA123:s3cr3tKey@s3.example.com/bucket", "s3cr3tKey", "[redacted]@"),
        ("postgresql://hm:hunter2@db:5432/hm refused", "hunter2", "[redacted]@"),
        ("clamd does not answer on tcp://:hunter2@127.0.0.1:3310", "hunter2", "[redacted]@"),
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.abc.def", "eyJhbGci", "Bearer [redacted]"),
        ("password=hunter2 rejected", "hunter2", "password=[redacted]"),
        ("password: YES)hunter2 ok", "hunter2", "password=[redacted]"),
        ("API_KEY: abcd1234efgh", "abcd1234efgh", "=[redacted]"),
        ("secret=xyz token=qqq", "xyz", "secret=[redacted]"),
        ("used hm_AbCdEf1234567890 for auth", "AbCdEf1234567890", "[token]"),
        # Real shapes (auth/tokens.py): the secret after the public part, and sessions.
        (
            "worker hm_xfg2w5w2wd_WPP3fX7DI10MXJccMsKDk9pwgCq-ig7s not found",
            "WPP3fX7DI10",
            "worker [token] not found",
        ),
        ("session hms_Zm9vYmFyYmF6cXV4cXV1eF9fLS0tLS0tLS0tLS0 gone", "Zm9vYmFy", "[token]"),
        (
            "Invalid header value b'AWS4-HMAC-SHA256 Credential=QAKEYAKIA1234567\\r/20261204/"
            "us-east-1/s3/aws4_request, SignedHeaders=host, Signature=9f86d081884c7d65'",
            "QAKEYAKIA",
            "Credential=[redacted]",
        ),
        ("x Signature=9f86d081884c7d659a2feaa0c55ad015 y", "9f86d0818", "Signature=[redacted]"),
    ],
)
def test_secrets_and_paths_are_replaced(text, secret, marker):
    out = redact(text)
    assert secret not in out
    assert marker in out


def test_mysql_says_whether_a_password_was_used_and_that_is_kept() -> None:
    said = """(1045, "Access denied for user 'hm'@'10.0.0.2' (using password: YES)")"""
    assert redact(said) == said
    assert redact(said.replace("YES", "NO")) == said.replace("YES", "NO")


def test_tracebacks_are_cut():
    text = (
        'decoder failed\nTraceback (most recent call last):\n  File "/app/x.py", line 3,'
        " in f\n    raise ValueError('password=abc')\nValueError: boom"
    )
    out = redact(text)
    assert out == "decoder failed [traceback removed]"


def test_plain_text_is_kept_and_whitespace_collapsed():
    text = "unsupported   format image/webp\n at 3/4 scale (see https://example.com/docs)"
    assert redact(text) == (
        "unsupported format image/webp at 3/4 scale (see https://example.com/docs)"
    )


def test_output_is_bounded():
    out = redact("x" * 5000)
    assert len(out) == MAX_REASON and out.endswith("…")
    assert len(redact("y" * 5000, 50)) == 50
    assert redact("short", 50) == "short"
    assert redact("z" * 50, 50) == "z" * 50


def test_any_object_is_accepted():
    assert redact(ValueError("bad /etc/hypermedia/conf")) == "bad [path]"
    assert redact(42) == "42"


def test_relative_and_single_segment_paths_are_kept():
    assert redact("wrote out.webp into tmp/x") == "wrote out.webp into tmp/x"


def test_control_characters_are_replaced() -> None:
    out = redact("tag \x00evil\x1b[31m\x7f end\tand\nnext")
    assert out == "tag \ufffdevil\ufffd[31m\ufffd end and next"


def test_brief_says_what_the_database_said_not_the_statement():
    exc = sa.exc.OperationalError(
        "INSERT INTO t VALUES (?)",
        ("secret-value",),
        sqlite3.OperationalError("database or disk is full"),
    )
    assert brief(exc) == "OperationalError: database or disk is full"
    assert brief(ValueError()) == "ValueError"
    said = brief(OSError(28, "No space left on device", "/srv/data/objects/1"))
    assert said.startswith("OSError: [Errno 28] No space left on device") and "/srv" not in said


def test_the_access_log_writes_no_token_from_a_url() -> None:
    """``?access_token=hm_…`` is refused (401), but the access log wrote it out."""
    import logging

    from hypermedia.api import server  # installs the filter

    token = "hm_xfg2w5w2wd_WPP3fX7DI10MXJccMsKDk9pwgCq-ig7s"
    record = logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5", "GET", f"/v1/jobs?access_token={token}", "1.1", 401), None,
    )  # fmt: skip
    assert any(isinstance(f, server._NoTokens) for f in logging.getLogger("uvicorn.access").filters)
    for f in logging.getLogger("uvicorn.access").filters:
        f.filter(record)
    line = record.getMessage()
    assert token not in line and "/v1/jobs?access_token=[token]" in line


def test_the_access_log_writes_no_download_signature() -> None:
    """A signed URL's ``sig`` stays usable, by whoever reads the log, until it expires."""
    import logging

    from hypermedia.api import server  # noqa: F401  # installs the filter

    path = "/v1/objects/5/content?expires=1796000000&sig=4af8c2d1e0b9&x=1"
    record = logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5", "GET", path, "1.1", 200), None,
    )  # fmt: skip
    for f in logging.getLogger("uvicorn.access").filters:
        f.filter(record)
    line = record.getMessage()
    assert "4af8c2d1e0b9" not in line
    assert "/v1/objects/5/content?expires=1796000000&sig=[sig]&x=1" in line
    assert tokens("/x?design=1&sig=") == "/x?design=1&sig="  # nothing to hide


def test_escaped_tokens_and_signature_names_are_hidden_too() -> None:
    """The server decodes "%73ig=" as "sig=" and "hm%5F…" as a token: the log
    wrote both out whole."""
    token = "hm_xfg2w5w2wd_WPP3fX7DI10MXJccMsKDk9pwgCq-ig7s"
    escaped = token.replace("_", "%5F")
    for name in ("%73ig", "s%69g", "%73%69%67"):
        line = tokens(f"/v1/objects/5/content?expires=1796000000&{name}=4af8c2d1e0b9&x=1")
        assert "4af8c2d1e0b9" not in line and f"&{name}=[sig]&x=1" in line, line
    line = tokens(f"/v1/jobs?api_key={escaped}&status=queued")
    assert escaped not in line and line == "/v1/jobs?api_key=[token]&status=queued"
    assert tokens(f"/v1/photos/{escaped}") == "/v1/photos/[token]"
    # Escapes that hide nothing stay as they were: the path is what was asked.
    plain = "/v1/photos?album=caf%C3%A9&design=%2F&signal=1"
    assert tokens(plain) == plain

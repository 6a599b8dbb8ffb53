"""mail_parts: a mail's parts decoded as clamd decodes them, and surveyed."""

from __future__ import annotations

import binascii
import email
import email.policy
import io
import lzma
import zipfile
from email.message import EmailMessage
from pathlib import Path

import pytest

from hypermedia.pipelines import mail_parts, nested, zipsizes


def mail(*attachments: bytes, cte: str = "base64") -> bytes:
    """A MIME mail with a text body and ``attachments``, each coded by ``cte``."""
    m = EmailMessage()
    m["From"], m["To"], m["Subject"] = "a@example.org", "b@example.org", "files"
    m.set_content("see attached")
    for i, data in enumerate(attachments):
        m.add_attachment(data, "application", "octet-stream", filename=f"a{i}.bin", cte=cte)
    return m.as_bytes()


def lzma_zip(member: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_LZMA) as z:
        z.writestr("m.bin", member)
    return buf.getvalue()


def uu(data: bytes, name: bytes = b"a.zip") -> bytes:
    """``data`` uuencoded as uuencode(1) writes it."""
    lines = [binascii.b2a_uu(data[i : i + 45]) for i in range(0, len(data), 45)]
    return b"begin 644 " + name + b"\n" + b"".join(lines) + b"`\nend\n"


def text_mail(body: bytes) -> bytes:
    """A mail whose plain-text body is ``body`` (no attachment parts)."""
    return b"From: a@example.org\nMIME-Version: 1.0\nContent-Type: text/plain\n\n" + body


def mbox(*messages: bytes) -> bytes:
    return b"".join(b"From a@example.org Sat Jan  1 00:00:00 2000\n" + m + b"\n" for m in messages)


def _payloads(tmp_path: Path, data: bytes) -> list[bytes]:
    path = tmp_path / "mail"
    path.write_bytes(data)
    return [p.data for p in mail_parts.payloads(str(path))]


def test_each_part_is_decoded_as_it_was_sent(tmp_path: Path) -> None:
    data = bytes(range(256)) * 40
    assert _payloads(tmp_path, mail(data, b"two")) == [b"see attached\n", data, b"two"]
    assert _payloads(tmp_path, mail(data, cte="quoted-printable"))[1] == data
    forwarded = EmailMessage()
    forwarded["From"] = "c@example.org"
    forwarded.set_content("fwd")
    inner = email.message_from_bytes(mail(data), policy=email.policy.default)
    forwarded.add_attachment(inner)  # message/rfc822: its parts are walked too
    assert data in _payloads(tmp_path, forwarded.as_bytes())


def test_every_message_of_an_mbox_is_read(tmp_path: Path) -> None:
    got = _payloads(tmp_path, mbox(mail(b"first"), mail(b"second")))
    assert b"first" in got and b"second" in got


@pytest.mark.parametrize(
    ("head", "said"),
    [
        (b"From: a@b\nMIME-Version: 1.0\n", True),
        (b"Received: from x\nContent-Type: multipart/mixed; boundary=z\n", True),
        (b"From a@b Sat Jan  1 00:00:00 2000\nContent-Type: text/plain\n", True),
        (b"Subject: no MIME header at all\n\nbody\n", False),
        (b"Name,Age\nContent-Type,x\n", False),
        (b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR", False),
        # Other text first: clamd reads the mail after it all the same.
        (b"hello world\n<html>\nMIME-Version: 1.0\n", True),
        (b"\xef\xbb\xbfFrom: a@b\n" + b"X-Pad: a\n" * 5000, True),  # BOM; headers go on
        (b"X-\xe9t\xe9: 1\n" + b"X-Pad: a\n" * 5000, True),  # an 8-bit header name
    ],
)
def test_a_mail_is_known_by_a_header_first_and_a_mime_header(head: bytes, said: bool) -> None:
    assert mail_parts.is_mail(head) is said


def _survey(tmp_path: Path, data: bytes, limit: int = 1 << 20) -> zipsizes.Survey:
    path = tmp_path / "input"
    path.write_bytes(data)
    return nested.survey_nested(str(path), str(tmp_path), limit)


def test_layers_attached_to_a_mail_are_surveyed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _survey(tmp_path, mail(lzma_zip(b"x"))).undecoded
    assert _survey(tmp_path, mail(lzma.compress(b"a") + lzma.compress(b"b"))).joined
    assert _survey(tmp_path, mail(lzma.compress(bytes(2 << 20)))).overflowed
    assert _survey(tmp_path, mail(bytes(2 << 20) + b"sig")).overflowed  # plain data too
    assert _survey(tmp_path, mbox(mail(b"plain"), mail(lzma_zip(b"y")))).undecoded
    plain = mail(b"just text", b"PK but no ZIP")
    assert _survey(tmp_path, plain) == zipsizes.Survey()
    monkeypatch.setattr(mail_parts, "MAIL_BYTES", len(plain) - 1)  # parsed in memory: bounded
    assert _survey(tmp_path, plain).unchecked


def test_uuencoded_files_are_decoded_in_text_parts_and_alone(tmp_path: Path) -> None:
    """clamd decodes "begin 644 name" blocks in a mail's text and in a file
    that starts as one; a padded or CRLF line is read as uudecode reads it."""
    data = bytes(range(256)) * 7
    assert list(mail_parts.uu_blocks(uu(data))) == [data]
    crlf = uu(data).replace(b"\n", b"\r\n")
    assert list(mail_parts.uu_blocks(b"Hello\r\n\r\n" + crlf + crlf)) == [data, data]
    body = b"see below\n\n" + uu(b"first") + b"\nand\n" + uu(b"second")
    assert _payloads(tmp_path, text_mail(body))[1:] == [b"first", b"second"]
    assert mail_parts.is_uu(uu(b"x")) and not mail_parts.is_uu(b"begin the story\n")
    assert _survey(tmp_path, text_mail(b"hi\n" + uu(lzma_zip(b"x")))).undecoded
    assert _survey(tmp_path, uu(lzma_zip(b"x"))).undecoded
    assert _survey(tmp_path, uu(b"plain text")) == zipsizes.Survey()

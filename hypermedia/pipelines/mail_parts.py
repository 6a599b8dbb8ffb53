"""What clamd decodes from a mail: each part's payload, its transfer
encoding (base64, quoted-printable, uuencode) undone.

clamd reads a mail's parts and scans each decoded attachment as a file of
its own, with the same limits as at the top: a ZIP in LZMA or xz streams
joined, attached to a mail, were OK from clamd and called clean.
``payloads`` gives each leaf part's decoded bytes (parts of a forwarded
message too, and of every message of an mbox), for ``nested`` to tell
whether one is a layer to survey.

A mail is parsed whole in memory (Python's ``email``), so one larger than
MAIL_BYTES is not looked into (``nested`` says so).  Uuencoded files in a
text part are decoded too (``uu_blocks``), as clamd decodes them there and
in any file that starts as one; BinHex is not.
"""

from __future__ import annotations

import binascii
import mailbox
import re
from collections.abc import Iterator
from dataclasses import dataclass
from email import policy
from email.message import Message
from email.parser import BytesParser

MAIL_BYTES = 128 * 1024 * 1024
MAIL_PARTS = 10_000  # lines that may start a part ("--"), at most
# A header line ("Name: value", RFC 5322 §2.2: printable ASCII but ":" in
# its name) or an mbox "From " line, first.
_FIRST = re.compile(rb"(?:>?From |[^\x00-\x20:\x7f]{1,998}:)")
# Lines of base64 alone (the first of 8 characters at least, a last one
# shorter, with its "="s), and blank lines among them, as many as follow.
# (A run starts at a line of base64: blank lines first would make the search
# quadratic over a file of newlines.)
_BASE64_LINES = re.compile(
    rb"^[A-Za-z0-9+/]{8,}={0,2}[ \t]*\r?(?:\n|\Z)"
    rb"(?:^(?:[A-Za-z0-9+/]{2,}={0,2})?[ \t]*\r?(?:\n|\Z))*",
    re.M,
)
_UU_BEGIN = re.compile(rb"^begin [0-7]{3,4} [^\r\n]+", re.M)
_BLANK_LINE = re.compile(rb"\r?\n\r?\n")
# A part of MIME: what makes clamd decode a mail's body rather than read it.
_MIME = re.compile(rb"^(?:content-type|content-transfer-encoding|mime-version)[ \t]*:", re.I | re.M)


def is_mail(head: bytes) -> bool:
    """Whether ``head`` (a file's first 32 kB) holds a MIME mail: a MIME
    header at a line's start anywhere in it (clamd reads a mail after other
    text), or header lines first that go on past it."""
    if _MIME.search(head) is not None:  # clamd reads a mail after other text too
        return True
    head = head.removeprefix(b"\xef\xbb\xbf")
    start = len(head) - len(head.lstrip(b"\r\n"))  # blank lines first: clamd reads on
    # Or headers that go on past it (40 kB of padding before the MIME ones
    # hid a mail clamd read).
    return _FIRST.match(head, start) is not None and _BLANK_LINE.search(head, start) is None


class TooLarge(Exception):
    """Past MAIL_BYTES, or MAIL_PARTS: too costly to parse here."""


def payloads(path: str) -> Iterator[Payload]:
    """Each leaf part's payload, decoded, in the mail's order (empty ones
    left out); of every message of an mbox (a file starting "From "), as
    clamd splits one.  Raises TooLarge before parsing one too costly."""
    data = _read(path)
    # Python's parser takes ~10 us and ~300 bytes of memory a part: 10 MB of
    # empty parts held an attempt for 19 s and 660 MB.
    if data.count(b"\n--") > MAIL_PARTS:
        raise TooLarge
    if not data.startswith(b"From "):
        yield from _leaves(BytesParser(policy=policy.compat32).parsebytes(data))
        return
    del data
    box = mailbox.mbox(path, create=False)
    try:
        for message in box:
            yield from _leaves(message)
    finally:
        box.close()


def uu_payloads(path: str) -> Iterator[Payload]:
    """Each file uuencoded in the file at ``path`` (one that starts as one),
    decoded.  Raises TooLarge past MAIL_BYTES."""
    return map(Payload, uu_blocks(_read(path)))


def _read(path: str) -> bytes:
    """The file, read whole: at most MAIL_BYTES (past that, TooLarge)."""
    with open(path, "rb") as f:
        data = f.read(MAIL_BYTES + 1)
    if len(data) > MAIL_BYTES:
        raise TooLarge
    return data


def _leaves(message: Message) -> Iterator[Payload]:
    for part in message.walk():
        if part.is_multipart():
            continue
        data = part.get_payload(decode=True)
        if not isinstance(data, bytes) or not data:
            continue
        # As compat32's get_payload reads it (no strip: "base64 " is not decoded).
        encoding = str(part.get("content-transfer-encoding", "")).lower()
        yield Payload(data, as_sent=encoding not in _DECODED)
        yield from map(Payload, uu_blocks(data))  # where mailers put uuencoded files
        if encoding not in _DECODED:
            # Not decoded: clamd decodes base64 whatever the header says (a
            # typo, "base64 " or "7bit base64", two of them, folded), and
            # finds the parts of a multipart without a boundary.
            yield from map(Payload, base64_blocks(data))


@dataclass(frozen=True)
class Payload:
    data: bytes
    # Not decoded from a transfer encoding: a mail's own text (a body whose
    # boundary is missing) is no mail inside it to read again.
    as_sent: bool = False


_DECODED = frozenset({"base64", "quoted-printable", "x-uuencode", "uuencode", "uue", "x-uue"})


def base64_blocks(data: bytes) -> Iterator[bytes]:
    """Each run of lines in ``data`` that are base64 and nothing else (blank
    lines between them too), 64 characters at least, decoded."""
    for block in _BASE64_LINES.finditer(data):
        text = block.group(0)
        if len(text) - text.count(b"\n") >= 64:
            decoded = binascii.a2b_base64(text)
            if decoded:
                yield decoded


def is_uu(head: bytes) -> bool:
    """Whether ``head`` starts a uuencoded file (``begin 644 name``), which
    clamd decodes wherever it is, a mail or not."""
    return _UU_BEGIN.match(head) is not None


def uu_blocks(data: bytes) -> Iterator[bytes]:
    """Each uuencoded file in ``data``, decoded (a damaged line ends it)."""
    for begin in _UU_BEGIN.finditer(data):
        out = bytearray()
        at = data.find(b"\n", begin.end()) + 1  # past its line's end, LF or CRLF
        at = at or len(data)
        while at < len(data):
            end = data.find(b"\n", at)
            end = len(data) if end < 0 else end
            line = data[at:end].rstrip(b"\r")
            at = end + 1
            if line == b"end" or not line:
                break
            # The length character says how many bytes; encoders differ on
            # the padding after them (the binascii documentation's workaround).
            size = (((line[0] - 32) & 63) * 4 + 5) // 3
            try:
                out += binascii.a2b_uu(line[:size])
            except binascii.Error:
                break
        if out:
            yield bytes(out)

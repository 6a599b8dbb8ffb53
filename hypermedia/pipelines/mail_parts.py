"""What clamd decodes from a mail: each part's payload, its transfer
encoding (base64, quoted-printable, uuencode) undone.

clamd reads a mail's parts and scans each decoded attachment as a file of
its own, with the same limits as at the top: a ZIP in LZMA or xz streams
joined, attached to a mail, were OK from clamd and called clean.
``payloads`` gives each leaf part's decoded bytes (parts of a forwarded
message too, and of every message of an mbox), for ``zipsizes`` to tell
whether one is a layer to survey.

A mail is parsed whole in memory (Python's ``email``), so one larger than
MAIL_BYTES is not looked into (``zipsizes`` says so).  Uuencoded files in a
text part are decoded too (``uu_blocks``), as clamd decodes them there and
in any file that starts as one; BinHex is not.
"""

from __future__ import annotations

import binascii
import mailbox
import re
from collections.abc import Iterator
from email import policy
from email.message import Message
from email.parser import BytesParser

MAIL_BYTES = 128 * 1024 * 1024
# A header line ("Name: value", RFC 5322 §2.2: printable ASCII but ":" in
# its name) or an mbox "From " line, first.
_FIRST = re.compile(rb"(?:From |[!-9;-~]{1,76}:)")
_UU_BEGIN = re.compile(rb"^begin [0-7]{3,4} [^\r\n]+", re.M)
# A part of MIME: what makes clamd decode a mail's body rather than read it.
_MIME = re.compile(rb"^(?:content-type|content-transfer-encoding|mime-version)[ \t]*:", re.I | re.M)


def is_mail(head: bytes) -> bool:
    """Whether ``head`` (a file's first bytes) starts a MIME mail: a header
    line first, and a MIME header among the first ones."""
    return _FIRST.match(head) is not None and _MIME.search(head, 0, 64 * 1024) is not None


def payloads(path: str) -> Iterator[bytes]:
    """Each leaf part's payload, decoded, in the mail's order (empty ones
    left out); of every message of an mbox (a file starting "From "), as
    clamd splits one."""
    with open(path, "rb") as f:
        mbox = f.read(5) == b"From "
        if not mbox:
            f.seek(0)
            yield from _leaves(BytesParser(policy=policy.compat32).parse(f))
            return
    box = mailbox.mbox(path, create=False)
    try:
        for message in box:
            yield from _leaves(message)
    finally:
        box.close()


def _leaves(message: Message) -> Iterator[bytes]:
    for part in message.walk():
        if part.is_multipart():
            continue
        data = part.get_payload(decode=True)
        if isinstance(data, bytes) and data:
            yield data
            if part.get_content_maintype() == "text":  # where mailers put uuencoded files
                yield from uu_blocks(data)


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

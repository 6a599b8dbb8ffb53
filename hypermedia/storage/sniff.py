"""Media type and image size from a file's first bytes (never from its name).

Enough to fill the ledger at upload time; the pipelines look deeper later.
"""

from __future__ import annotations

import struct

HEAD_BYTES = 256 * 1024


# Where pdfium looks for a PDF's header: "%PDF" starting at any of the first
# 1,025 offsets (readers take junk before it: a mail gateway's, a server's).
# The ledger and the PDF pipeline agree on it: a PDF with junk first was
# stored as application/octet-stream, then rendered as a PDF.
PDF_HEADER_LAST = 1024


def is_pdf(head: bytes) -> bool:
    """Whether a PDF reader takes a file starting with ``head`` for a PDF."""
    return b"%PDF" in head[: PDF_HEADER_LAST + 4]


def media_type(head: bytes) -> str:
    if head.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    # Classic TIFF (42), then BigTIFF (43, for files past 4 GB: libvips reads both).
    if head[:4] in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):
        return "image/tiff"
    if head.startswith(b"%PDF-"):
        return "application/pdf"
    if head[4:8] == b"ftyp":
        brand = head[8:12]
        if brand in (b"avif", b"avis"):
            return "image/avif"
        if brand in (b"heic", b"heix", b"mif1", b"msf1"):
            return "image/heic"
        if brand == b"qt  ":
            return "video/quicktime"
        return "video/mp4"
    if head[:4] == b"\x1aE\xdf\xa3":
        return "video/webm"
    if head.startswith(b"PK\x03\x04"):
        return "application/zip"  # one that stores a PDF first still renders as one
    if is_pdf(head):
        return "application/pdf"
    if _is_text(head):
        return "text/plain"
    return "application/octet-stream"


def _is_text(head: bytes) -> bool:
    if not head or b"\x00" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A multi-byte character cut at the end of the sample is still text.
        return exc.start >= len(head) - 3
    return True


# PNG allows 2^31 - 1 a side; a header beyond it is a lie the objects'
# INTEGER columns cannot hold (the upload was refused, 422, not stored).
MAX_SIDE = 2**31 - 1


def dimensions(head: bytes, mime: str) -> tuple[int, int]:
    """(width, height) if the header tells, else (0, 0); never raises."""
    try:
        if mime == "image/png" and head[12:16] == b"IHDR":
            w, h = struct.unpack(">II", head[16:24])
            return (w, h) if w <= MAX_SIDE and h <= MAX_SIDE else (0, 0)
        if mime == "image/gif":
            w, h = struct.unpack("<HH", head[6:10])
            return w, h
        if mime == "image/webp":
            return _webp(head)
        if mime == "image/jpeg":
            return _jpeg(head)
    except (struct.error, IndexError, ValueError):
        pass
    return 0, 0


def _webp(head: bytes) -> tuple[int, int]:
    if len(head) < 30:
        return 0, 0
    chunk = head[12:16]
    if chunk == b"VP8X":
        w = int.from_bytes(head[24:27], "little") + 1
        h = int.from_bytes(head[27:30], "little") + 1
        return w, h
    if chunk == b"VP8L":
        bits = int.from_bytes(head[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8 ":
        w, h = struct.unpack("<HH", head[26:30])
        return w & 0x3FFF, h & 0x3FFF
    return 0, 0


_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def _jpeg(head: bytes) -> tuple[int, int]:
    """The size as shown: a camera held upright writes a landscape frame and
    an EXIF orientation of 5-8 (turned a quarter), which every viewer and our
    own pipelines apply, so a gallery laying out by the stored size needs it
    turned too."""
    i, turned = 2, False
    while i + 9 < len(head):
        if head[i] != 0xFF:
            return 0, 0
        marker = head[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        length = struct.unpack(">H", head[i + 2 : i + 4])[0]
        if marker == 0xE1 and head[i + 4 : i + 10] == b"Exif\x00\x00":
            turned = _exif_orientation(head[i + 10 : i + 2 + length]) in (5, 6, 7, 8)
        if marker in _SOF:
            h, w = struct.unpack(">HH", head[i + 5 : i + 9])
            return (h, w) if turned else (w, h)
        i += 2 + length
    return 0, 0


def _exif_orientation(tiff: bytes) -> int:
    """The Orientation tag (0x0112) of an EXIF block's first IFD, else 1."""
    order = {b"II": "<", b"MM": ">"}.get(tiff[:2])
    if order is None or len(tiff) < 8:
        return 1
    ifd = struct.unpack(order + "I", tiff[4:8])[0]
    if ifd + 2 > len(tiff):  # a broken block: the size stays as the frame says
        return 1
    count = struct.unpack(order + "H", tiff[ifd : ifd + 2])[0]
    for n in range(min(count, 200)):  # a hostile count reads no further than the block
        entry = tiff[ifd + 2 + 12 * n : ifd + 14 + 12 * n]
        if len(entry) < 12:
            break
        tag, kind = struct.unpack(order + "HH", entry[:4])
        if tag == 0x0112 and kind == 3:  # SHORT, as the standard says
            return int(struct.unpack(order + "H", entry[8:10])[0])
        if tag == 0x0112 and kind == 4:  # LONG: libvips and Pillow apply it too
            return int(struct.unpack(order + "I", entry[8:12])[0])
    return 1

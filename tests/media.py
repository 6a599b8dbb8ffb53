"""Small media files made in code (no binaries in the repository)."""

from __future__ import annotations

import struct
import zlib


def png(width: int = 3, height: int = 2, rgb: tuple[int, int, int] = (200, 10, 10)) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    raw = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def jpeg_header(width: int, height: int, exif_bytes: int = 0) -> bytes:
    """SOI, an APP1 of ``exif_bytes`` filler, then SOF0: enough for header parsing."""
    out = b"\xff\xd8"
    if exif_bytes:
        out += b"\xff\xe1" + struct.pack(">H", exif_bytes + 2) + b"\x00" * exif_bytes
    sof = struct.pack(">BHHB", 8, height, width, 3) + b"\x01\x22\x00" * 3
    out += b"\xff\xc0" + struct.pack(">H", len(sof) + 2) + sof
    return out + b"\xff\xd9"

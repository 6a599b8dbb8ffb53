"""Object keys are server-made and safe; media types come from bytes, not names."""

from __future__ import annotations

import struct

import pytest

from hypermedia.storage import sniff
from hypermedia.storage.base import UnsafeKey
from hypermedia.storage.keys import check_key, display_name, extension_for, object_key
from tests.media import jpeg_header, png


def test_object_key_shape() -> None:
    assert object_key(42, "original", "image/png") == "objects/42/original.png"
    assert object_key(7, "thumb", "image/jpeg") == "objects/7/thumb.jpg"
    assert object_key(7, "copy", "application/x-unknown-thing") == "objects/7/copy.bin"


@pytest.mark.parametrize("role", ["", "../x", "Thumb", "a/b", "x" * 31, "r\x00"])
def test_object_key_refuses_bad_roles(role: str) -> None:
    with pytest.raises(UnsafeKey):
        object_key(1, role, "image/png")


@pytest.mark.parametrize(
    "key",
    [
        "",
        "/etc/passwd",
        "../x",
        "objects/../../etc/passwd",
        "objects/1/..",
        "objects//x",
        "objects/./x",
        "a\x00b",
        "C:\\x",
        "objects/ü/x",
        "objects/1/\u202ex.png",
        ".hidden/x",
        "x" * 501,
    ],
)
def test_check_key_refuses(key: str) -> None:
    with pytest.raises(UnsafeKey):
        check_key(key)


def test_extension_follows_media_type_only() -> None:
    assert extension_for("image/webp") == "webp"
    assert extension_for("text/html; charset=../../x") == "bin"


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("../../etc/passwd", "passwd"),
        ("C:\\Users\\me\\photo.jpg", "photo.jpg"),
        ("a\x00b\x07c.png", "abc.png"),
        ("caf\u0065\u0301.jpg", "caf\u00e9.jpg"),
        ("...", ""),
        ("x" * 300, "x" * 255),
    ],
)
def test_display_name_is_cleaned(name: str, shown: str) -> None:
    assert display_name(name) == shown


def test_a_local_name_keeps_its_backslashes() -> None:
    # A browser's Windows path is parted at them; a file here named
    # "back\\.png" or "a\\b.png" is one name (it was stored as "" and "b.png").
    assert display_name("C:\\photos\\a.png") == "a.png"
    assert display_name("a\\b.png", local=True) == "a\\b.png"
    assert display_name("back\\.png", local=True) == "back\\.png"
    assert display_name("dir/x.png", local=True) == "x.png"


def test_sniff_media_types() -> None:
    assert sniff.media_type(png()) == "image/png"
    assert sniff.media_type(jpeg_header(10, 20)) == "image/jpeg"
    assert sniff.media_type(b"%PDF-1.7\n...") == "application/pdf"
    assert sniff.media_type(b"GIF89a\x05\x00\x06\x00") == "image/gif"
    assert sniff.media_type("héllo wörld\n".encode()) == "text/plain"
    assert sniff.media_type(b"\x00\x01\x02garbage") == "application/octet-stream"
    # A name would have said "image/png"; the bytes say text.
    assert sniff.media_type(b"not really a png") == "text/plain"


def test_sniff_dimensions() -> None:
    assert sniff.dimensions(png(31, 17), "image/png") == (31, 17)
    assert sniff.dimensions(jpeg_header(640, 480), "image/jpeg") == (640, 480)
    # The size sits after a large EXIF block: still found within the sniffed head.
    assert sniff.dimensions(jpeg_header(4000, 3000, exif_bytes=60000), "image/jpeg") == (4000, 3000)
    assert sniff.dimensions(b"GIF89a\x05\x00\x06\x00", "image/gif") == (5, 6)
    # Truncated or hostile headers give (0, 0), never an exception.
    assert sniff.dimensions(png()[:20], "image/png") == (0, 0)
    assert sniff.dimensions(b"\xff\xd8\xff\xe1\xff\xff", "image/jpeg") == (0, 0)
    assert sniff.dimensions(b"RIFF\x00\x00\x00\x00WEBPVP8X", "image/webp") == (0, 0)

    # PNG's own bound is 2^31 - 1 a side: a header past it says nothing.
    def png_head(w: int, h: int) -> bytes:
        return png(1, 1)[:16] + struct.pack(">II", w, h) + png(1, 1)[24:]

    assert sniff.dimensions(png_head(2**31 - 1, 5), "image/png") == (2**31 - 1, 5)
    assert sniff.dimensions(png_head(0xFFFFFFFF, 0xFFFFFFFF), "image/png") == (0, 0)

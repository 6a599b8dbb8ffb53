"""An upload's stored size is the size as shown: a JPEG's EXIF orientation
5-8 (a quarter turn) swaps it, as libvips' autorotate and every viewer do."""

from __future__ import annotations

import struct

import pytest
import pyvips

from hypermedia.storage import sniff


def _jpeg(orientation: int | None, width: int = 80, height: int = 40) -> bytes:
    image = pyvips.Image.black(width, height, bands=3)
    if orientation is not None:
        image = image.copy()
        image.set_type(pyvips.GValue.gint_type, "orientation", orientation)
    return bytes(image.jpegsave_buffer(keep="exif" if orientation is not None else "none"))


@pytest.mark.parametrize("orientation", [None, 1, 2, 3, 4, 5, 6, 7, 8])
def test_the_stored_size_is_the_shown_one(orientation: int | None) -> None:
    data = _jpeg(orientation)
    shown = pyvips.Image.new_from_buffer(data, "").autorot()
    assert sniff.dimensions(data[: sniff.HEAD_BYTES], "image/jpeg") == (shown.width, shown.height)
    assert (shown.width, shown.height) == ((40, 80) if orientation in (5, 6, 7, 8) else (80, 40))


def _with_exif(tiff: bytes) -> bytes:
    """A JPEG head whose APP1 holds ``tiff`` after the Exif marker."""
    app1 = b"Exif\x00\x00" + tiff
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, 40, 80, 1) + b"\x01\x11\x00"
    return b"\xff\xd8" + b"\xff\xe1" + struct.pack(">H", len(app1) + 2) + app1 + sof


@pytest.mark.parametrize(
    "tiff",
    [
        b"",  # empty block
        b"XX*\x00\x08\x00\x00\x00",  # no byte order
        b"II*\x00\xff\xff\xff\x7f",  # IFD past the block
        b"II*\x00\x08\x00\x00\x00\xff\xff",  # 65,535 entries promised, none there
        b"MM\x00*\x00\x00\x00\x08\x00\x01\x01\x12\x00\x04\x00\x00\x00\x01\x00\x06",  # cut short
        # a RATIONAL: neither a SHORT nor a LONG
        b"MM\x00*\x00\x00\x00\x08\x00\x01\x01\x12\x00\x05\x00\x00\x00\x01\x00\x00\x00\x06",
    ],
)
def test_a_broken_exif_block_leaves_the_size_alone(tiff: bytes) -> None:
    assert sniff.dimensions(_with_exif(tiff), "image/jpeg") == (80, 40)


def test_a_big_endian_orientation_is_read() -> None:
    ifd = b"\x00\x01" + b"\x01\x12\x00\x03\x00\x00\x00\x01\x00\x06\x00\x00" + b"\x00\x00\x00\x00"
    assert sniff.dimensions(_with_exif(b"MM\x00*\x00\x00\x00\x08" + ifd), "image/jpeg") == (40, 80)


def test_an_orientation_stored_as_a_long_is_read() -> None:
    """The standard says SHORT; some writers store a LONG, and libvips and
    Pillow turn the image by it all the same: the stored size must follow."""
    ifd = struct.pack("<H", 1) + struct.pack("<HHII", 0x0112, 4, 1, 6) + bytes(4)
    assert sniff.dimensions(_with_exif(b"II*\x00\x08\x00\x00\x00" + ifd), "image/jpeg") == (40, 80)

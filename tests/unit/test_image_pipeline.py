"""image.thumbnail, image.preview and image.compress on real libvips, with images made in code.

The pipelines are called directly through ``registry.Context`` (the worker's
child does the same); the end-to-end path through a worker is in
tests/integration/test_image_jobs.py, which reuses the hostile files made here
(``HOSTILE``).  No binary fixtures: every input is drawn by pyvips, assembled
with zlib/struct (PNG, GIF) or written as text (SVG, EPS).
"""

from __future__ import annotations

import importlib
import json
import os
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hypermedia.errors import JobError

# debug too: registry loads its built-ins only while it is empty, so importing
# image alone first would leave debug.* unregistered for the rest of the run.
from hypermedia.pipelines import debug, image, imaging, registry  # noqa: F401
from hypermedia.pipelines.schema import clean_settings
from tests.media import jpeg_header, png

IN_CI = os.environ.get("CI", "").lower() == "true"

try:
    import pyvips
except Exception as exc:  # ImportError, or OSError without libvips
    if IN_CI:
        raise
    pytest.skip(f"pyvips/libvips is not available ({exc})", allow_module_level=True)

THUMB = image.THUMBNAIL
PREVIEW = image.PREVIEW
COMPRESS = image.COMPRESS
MIGRATION = importlib.import_module("hypermedia.db.migrations.versions.0004_image_profiles")
SETTINGS = {job_type: settings for _, _, job_type, _, settings, _, _ in MIGRATION.PROFILES}
SETTINGS["image.compress"] = {
    "format": "webp",
    "quality": 80,
    "max_width": 4096,
    "max_height": 4096,
}
META_FIELDS = ("exif-data", "xmp-data", "iptc-data", "icc-profile-data", "orientation")


# -- images made in code -----------------------------------------------------------------


def photo(width: int, height: int) -> Any:
    """An sRGB gradient: red grows to the right, green downwards."""
    xyz = pyvips.Image.xyz(width, height)
    red = xyz[0] * (255 / width)
    green = xyz[1] * (255 / height)
    return red.bandjoin([green, green * 0 + 128]).cast("uchar").copy(interpretation="srgb")


def flat(width: int, height: int, rgb: tuple[int, int, int]) -> Any:
    return pyvips.Image.black(width, height).new_from_image(list(rgb)).copy(interpretation="srgb")


def half_white(width: int, height: int) -> Any:
    """Left half white, right half black: shows which way an image was turned."""
    mask = pyvips.Image.black(width, height).draw_rect(255, 0, 0, width // 2, height, fill=True)
    return mask.bandjoin([mask, mask]).cast("uchar").copy(interpretation="srgb")


def with_metadata(img: Any, orientation: int = 1) -> Any:
    """EXIF (orientation, camera, GPS) and XMP, as a phone would leave them."""
    img = img.copy()
    img.set_type(pyvips.GValue.gint_type, "orientation", orientation)
    img.set_type(pyvips.GValue.gstr_type, "exif-ifd0-Make", "SecretCam")
    img.set_type(pyvips.GValue.gstr_type, "exif-ifd3-GPSLatitudeRef", "N")
    img.set_type(pyvips.GValue.gstr_type, "exif-ifd3-GPSLatitude", "48/1 51/1 2964/100")
    img.set_type(
        pyvips.GValue.blob_type,
        "xmp-data",
        b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><secret>gps 48.85,2.35</secret></x:xmpmeta>',
    )
    return img


def frames(*colours: tuple[int, int, int], width: int = 64, height: int = 48) -> Any:
    """An animation (a strip of frames with page-height) of flat colours."""
    strip = pyvips.Image.arrayjoin([flat(width, height, c) for c in colours], across=1).copy()
    strip.set_type(pyvips.GValue.gint_type, "page-height", height)
    return strip


def _chunk(kind: bytes, data: bytes) -> bytes:
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))


def png_flood(side: int = 12_000) -> bytes:
    """A valid greyscale PNG of side x side black pixels (144 Mpx): < 1 MB on disk."""
    z = zlib.compressobj(1)
    row = bytes(side + 1)  # filter byte + one byte per pixel
    idat = b"".join(z.compress(row) for _ in range(side)) + z.flush()
    ihdr = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")
    )


def png_claiming(width: int, height: int) -> bytes:
    """A 100-byte PNG whose header claims width x height (its data is one row)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" + b"\x00" * 3 * 16)
    return (
        b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")
    )


def gif(frame: tuple[int, int] = (1, 1), screen: tuple[int, int] | None = None) -> bytes:
    """A GIF89a of one frame of ``frame`` pixels claimed, with one pixel of LZW data."""
    screen = screen or frame
    lsd = struct.pack("<HHBBB", *screen, 0x80, 0, 0)  # global colour table of 2 entries
    descriptor = b"\x2c" + struct.pack("<HHHHB", 0, 0, *frame, 0)
    lzw = b"\x02" + b"\x02\x44\x01" + b"\x00"  # min code size 2: clear, 0, end
    return b"GIF89a" + lsd + b"\x00\x00\x00\xff\xff\xff" + descriptor + lzw + b"\x3b"


def gif_flood() -> bytes:
    """35 bytes claiming a 30000 x 30000 frame (900 Mpx)."""
    return gif(frame=(30_000, 30_000))


def tiff_bands(bands: int, side: int = 64) -> bytes:
    """A deflated greyscale-ish TIFF of ``bands`` 8-bit channels: a few KB."""
    data = zlib.compress(bytes(side * side * bands), 9)
    bits_at = 8 + 2 + 10 * 12 + 4  # after the header and the one IFD
    strip_at = bits_at + 2 * bands
    tags = [  # (tag, type 3 = SHORT / 4 = LONG, count, value or offset)
        (256, 4, 1, side),
        (257, 4, 1, side),
        (258, 3, bands, bits_at),
        (259, 3, 1, 8),  # deflate
        (262, 3, 1, 1),  # black is zero
        (273, 4, 1, strip_at),
        (277, 3, 1, bands),
        (278, 4, 1, side),
        (279, 4, 1, len(data)),
        (284, 3, 1, 1),  # chunky
    ]
    ifd = struct.pack("<H", len(tags))
    ifd += b"".join(struct.pack("<HHII", t, k, n, v) for t, k, n, v in tags)
    return b"II*\x00" + struct.pack("<I", 8) + ifd + b"\0\0\0\0" + b"\x08\x00" * bands + data


def webp_frames(count: int) -> bytes:
    """An animated WebP of ``count`` 1x1 frames on a 64x64 canvas (~50 bytes a frame)."""
    import pyvips

    vp8l = bytes(pyvips.Image.black(1, 1).webpsave_buffer(lossless=True, keep="none"))[12:]
    body = b"\0" * 12 + struct.pack("<I", 100)[:3] + b"\0" + vp8l  # x, y, w-1, h-1, 100 ms
    anmf = b"ANMF" + struct.pack("<I", len(body)) + body + b"\0" * (len(body) & 1)
    vp8x = b"VP8X" + struct.pack("<I", 10) + b"\x02\0\0\0" + b"\x3f\0\0\x3f\0\0"
    anim = b"ANIM" + struct.pack("<I", 6) + b"\0" * 6
    riff = b"WEBP" + vp8x + anim + anmf * count
    return b"RIFF" + struct.pack("<I", len(riff)) + riff


def jpeg_scans(side: int, refinements: int) -> bytes:
    """A flat grey progressive JPEG of ``side`` x ``side`` whose AC bands are
    sent one coefficient per scan, each then refined ``refinements`` times:
    1 + 3 * 63 * (1 + refinements) valid scans of a few bytes each (all end
    of band runs).  A QA finding: 2,079 of them at 8000 x 8000 (400 kB) took
    25 s of CPU for one thumbnail."""
    import pyvips

    grey = pyvips.Image.black(side, side).new_from_image([128, 128, 128]).cast("uchar")
    jpeg = bytes(
        grey.copy(interpretation="srgb").jpegsave_buffer(
            interlace=True, Q=90, keep="none", subsample_mode="on"
        )
    )
    head = jpeg[: _end_of_dc_scan(jpeg)]
    # One AC table: end-of-band runs EOB0..EOB14, 4-bit codes 0..14.
    symbols = bytes(k << 4 for k in range(15))
    dht = b"\xff\xc4" + struct.pack(">H", 19 + len(symbols)) + b"\x10"
    dht += bytes([0, 0, 0, 15] + [0] * 12) + symbols
    body = b""
    for comp, blocks in (
        (1, (side + 7) // 8),
        (2, (side // 2 + 7) // 8),
        (3, (side // 2 + 7) // 8),
    ):
        data = _eob_runs(blocks * blocks)
        for k in range(1, 64):
            for ah, al in [(0, refinements)] + [(a + 1, a) for a in range(refinements - 1, -1, -1)]:
                sos = b"\xff\xda" + struct.pack(">H", 8) + bytes([1, comp, 0, k, k, ah << 4 | al])
                body += dht + sos + data
    return head + body + b"\xff\xd9"


def _end_of_dc_scan(jpeg: bytes) -> int:
    """Where the first (DC) scan's entropy-coded data of a progressive JPEG ends."""
    at = 2
    while True:
        marker, length = jpeg[at + 1], struct.unpack(">H", jpeg[at + 2 : at + 4])[0]
        end = at + 2 + length
        if marker != 0xDA:
            at = end
            continue
        while True:  # past the data: FF 00 is a stuffed byte, FF D0-D7 a restart
            end = jpeg.index(b"\xff", end)
            if jpeg[end + 1] != 0 and not 0xD0 <= jpeg[end + 1] <= 0xD7:
                return end
            end += 2


def _eob_runs(blocks: int) -> bytes:
    """``blocks`` blocks of an AC band coded as end-of-band runs."""
    bits = ""
    while blocks > 0:
        run = min(blocks, 32767)
        k = run.bit_length() - 1
        bits += format(k, "04b") + (format(run - (1 << k), f"0{k}b") if k else "")
        blocks -= run
    bits += "1" * (-len(bits) % 8)
    out = bytearray()
    for i in range(0, len(bits), 8):
        out.append(int(bits[i : i + 8], 2))
        if out[-1] == 0xFF:
            out.append(0)
    return bytes(out)


def jpeg_bytes(width: int = 1000, height: int = 800) -> bytes:
    return bytes(photo(width, height).jpegsave_buffer(Q=85))


def truncated_jpeg() -> bytes:
    data = jpeg_bytes()
    return data[: len(data) // 2]


def corrupt_jpeg(damage: str) -> bytes:
    """A JPEG with a damaged scan header, quantisation table or frame header."""
    data = bytearray(jpeg_bytes())
    if damage == "scan":
        sos = data.index(b"\xff\xda")
        data[sos + 3 : sos + 5] = b"\x09\x09"  # a scan of 9 components
    elif damage == "tables":
        data[data.index(b"\xff\xdb") + 1] = 0xFE  # the DQT becomes a comment
    elif damage == "frame":
        data[data.index(b"\xff\xc0") + 4] = 9  # 9-bit samples
    else:
        data = bytearray(b"\xff\xd8\xff" + bytes(range(256)) * 40)
    return bytes(data)


def svg_entity() -> bytes:
    """An SVG with an external entity (XXE) and a file:// image reference."""
    return b"""<?xml version="1.0" standalone="no"?>
<!DOCTYPE svg [<!ENTITY secret SYSTEM "file:///etc/passwd">]>
<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink"
     width="400" height="300">
  <text x="10" y="20">&secret;</text>
  <image xlink:href="file:///etc/hostname" width="100" height="100"/>
</svg>
"""


def svg_file_reference() -> bytes:
    return (
        b'<svg xmlns="http://www.w3.org/2000/svg" width="64" height="64">'
        b'<image href="file:///etc/passwd" width="64" height="64"/></svg>'
    )


def eps() -> bytes:
    """PostScript that would run a command under an unsandboxed Ghostscript."""
    return b"""%!PS-Adobe-3.0 EPSF-3.0
%%BoundingBox: 0 0 100 100
/Helvetica findfont 12 scalefont setfont
10 10 moveto (hello) show
(%pipe%id > /tmp/owned) (w) file
showpage
%%EOF
"""


def dos_eps() -> bytes:
    """The binary (DOS) EPS header, then PostScript."""
    header = b"\xc5\xd0\xd3\xc6" + struct.pack("<IIIIII", 30, len(eps()), 0, 0, 0, 0) + b"\xff\xff"
    return header + eps()


def pdf() -> bytes:
    return b"%PDF-1.4\n1 0 obj<</Type/Catalog>>endobj\ntrailer<</Root 1 0 R>>\n%%EOF\n"


# (test id, file name (it may lie), the bytes, the code the job must fail with)
Hostile = tuple[str, str, Callable[[], bytes], str]
HOSTILE: list[Hostile] = [
    ("png-pixel-flood", "bomb.png", png_flood, "LIMIT_EXCEEDED"),
    (
        "png-claims-10-gigapixels",
        "claim.png",
        lambda: png_claiming(100_000, 100_000),
        "LIMIT_EXCEEDED",
    ),
    ("gif-pixel-flood", "bomb.gif", gif_flood, "LIMIT_EXCEEDED"),
    ("tiff-1000-channels", "bands.tif", lambda: tiff_bands(1000), "LIMIT_EXCEEDED"),
    ("webp-10001-frames", "frames.webp", lambda: webp_frames(10_001), "LIMIT_EXCEEDED"),
    ("jpeg-2080-scans", "scans.jpg", lambda: jpeg_scans(256, 10), "LIMIT_EXCEEDED"),
    ("jpeg-truncated", "cut.jpg", truncated_jpeg, "CORRUPT_INPUT"),
    ("jpeg-bad-scan-header", "scan.jpg", lambda: corrupt_jpeg("scan"), "CORRUPT_INPUT"),
    ("jpeg-missing-tables", "tables.jpg", lambda: corrupt_jpeg("tables"), "CORRUPT_INPUT"),
    ("jpeg-bad-frame-header", "frame.jpg", lambda: corrupt_jpeg("frame"), "CORRUPT_INPUT"),
    ("jpeg-magic-then-noise", "noise.jpg", lambda: corrupt_jpeg("noise"), "CORRUPT_INPUT"),
    ("svg-external-entity", "entity.svg", svg_entity, "UNSUPPORTED_FORMAT"),
    ("svg-file-reference-named-png", "photo.png", svg_file_reference, "UNSUPPORTED_FORMAT"),
    ("eps-named-png", "photo.png", eps, "UNSUPPORTED_FORMAT"),
    ("binary-eps-named-png", "photo.png", dos_eps, "UNSUPPORTED_FORMAT"),
    ("zero-bytes", "empty.jpg", lambda: b"", "CORRUPT_INPUT"),
    ("pdf-named-jpg", "photo.jpg", pdf, "UNSUPPORTED_FORMAT"),
]


def heic_or_skip(path: Path) -> None:
    """``heic(path)``, or skip the test (fail it in CI: scripts/system-packages
    installs Debian's libvips42 for this)."""
    if not heic(path):
        why = "no HEVC encoder here (the system libvips42 with libheif makes the input)"
        if IN_CI:
            pytest.fail(why)
        pytest.skip(why)


def heic(path: Path) -> bool:
    """Write an HEVC-coded HEIC with the system's libvips (its libheif has x265);
    the pyvips-binary build decodes AVIF but carries no HEVC codec at all."""
    code = (
        "import sys\n"
        "sys.modules['_libvips'] = None  # ABI mode: the system's libvips.so.42\n"
        "import pyvips\n"
        "xyz = pyvips.Image.xyz(320, 240)\n"
        "img = xyz[0].bandjoin([xyz[1], 128]).cast('uchar').copy(interpretation='srgb')\n"
        "img.heifsave(sys.argv[1], compression='hevc', Q=60)\n"
    )
    # Not the inherited C environment: once loaded here, the bundled libvips has
    # set VIPSHOME to its own prefix, where the system's would look for modules.
    env = {k: v for k, v in os.environ.items() if k != "VIPSHOME"}
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    return done.returncode == 0 and path.exists() and path.stat().st_size > 0


# -- running a pipeline ------------------------------------------------------------------


class Run:
    def __init__(
        self, ctx: registry.Context, result: dict[str, Any] | None, reports: list[dict[str, Any]]
    ) -> None:
        self.ctx = ctx
        self.result = result
        self.reports = reports

    @property
    def output(self) -> dict[str, Any]:
        assert len(self.ctx.outputs) == 1, self.ctx.outputs
        return self.ctx.outputs[0]

    @property
    def file(self) -> Path:
        return Path(self.ctx.scratch) / self.output["path"]

    @property
    def size(self) -> tuple[int, int]:
        assert self.result is not None
        return self.result["width"], self.result["height"]

    def decoded(self) -> Any:
        return pyvips.Image.new_from_file(str(self.file))


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    d = tmp_path / "scratch"
    d.mkdir()
    return d


def run(
    pipeline: registry.Pipeline,
    scratch: Path,
    input_file: Path | str | None,
    params: dict[str, Any] | None = None,
    settings: dict[str, Any] | None = None,
) -> Run:
    if settings is None:
        settings = SETTINGS[pipeline.job_type]
    validated = pipeline.validate(dict(params or {}), dict(settings))
    reports: list[dict[str, Any]] = []
    path = None if input_file is None else str(input_file)
    ctx = registry.Context(str(scratch), reports.append, path)
    result = pipeline.run(validated, ctx)
    return Run(ctx, result, reports)


def failure(
    pipeline: registry.Pipeline, scratch: Path, input_file: Path, **params: Any
) -> JobError:
    """Run expecting a JobError; check its reason is safe and nothing was left behind."""
    with pytest.raises(JobError) as info:
        run(pipeline, scratch, input_file, params)
    reason = info.value.reason
    assert str(scratch) not in reason and input_file.name not in reason, reason
    assert "/" not in reason and "vips" not in reason.lower(), reason
    assert not [p for p in scratch.iterdir() if p != input_file], "no output on failure"
    return info.value


def write(scratch: Path, name: str, img: Any, **options: Any) -> Path:
    path = scratch / name
    img.write_to_file(str(path), **options)
    return path


# -- job types and settings --------------------------------------------------------------


def test_registered_on_import_with_schemas() -> None:
    assert registry.get("image.thumbnail") is THUMB
    assert registry.get("image.preview") is PREVIEW
    assert registry.get("image.compress") is COMPRESS
    for p in (THUMB, PREVIEW, COMPRESS):
        assert p.queue == "images"
        assert p.schema is not None and p.doc
        assert p.available() is None  # libvips is here (these tests run on it)
    assert registry.availability()["image.compress"] is None


def test_the_default_profiles_are_the_issues() -> None:
    assert SETTINGS["image.thumbnail"] == {
        "width": 200,
        "height": 200,
        "format": "webp",
        "quality": 85,
        "fit": "cover",
        "max_pixels": 100_000_000,
    }
    assert SETTINGS["image.preview"] == {
        "width": 1280,
        "height": 1280,
        "format": "webp",
        "quality": 82,
        "fit": "inside",
        "max_pixels": 100_000_000,
    }
    # Every default profile passes the check a new profile version gets.
    for p in (THUMB, PREVIEW, COMPRESS):
        assert p.schema is not None
        cleaned = clean_settings(p.schema, SETTINGS[p.job_type])
        assert cleaned["keep_metadata"] is False
        assert cleaned["max_pixels"] == 100_000_000


def test_params_default_from_the_profile_and_override_it() -> None:
    assert THUMB.validate({}, SETTINGS["image.thumbnail"]) == {
        **SETTINGS["image.thumbnail"],
        "keep_metadata": False,
    }
    assert PREVIEW.validate({}, {}) == {
        "width": 1280,
        "height": 1280,
        "fit": "inside",
        "format": "webp",
        "quality": 82,
        "keep_metadata": False,
        "max_pixels": 100_000_000,
    }
    assert COMPRESS.validate({}, {}) == {
        "max_width": 4096,
        "max_height": 4096,
        "format": "webp",
        "quality": 80,
        "keep_metadata": False,
        "max_pixels": 100_000_000,
    }
    custom = THUMB.validate(
        {"width": 64, "height": 32, "fit": "fill", "format": "avif", "quality": 1},
        SETTINGS["image.thumbnail"],
    )
    assert (custom["width"], custom["height"], custom["fit"], custom["format"]) == (
        64,
        32,
        "fill",
        "avif",
    )
    assert THUMB.validate({}, {"max_pixels": 10})["max_pixels"] == 10  # the profile's to set
    assert PREVIEW.validate({"width": 8192, "height": 4096}, {})["width"] == 8192
    # An old profile's keys (seed 002's "size") are ignored, not a failure.
    assert THUMB.validate({}, {"size": 256})["width"] == 200


@pytest.mark.parametrize(
    ("pipeline", "params"),
    [
        (THUMB, {"width": 0}),
        (THUMB, {"height": 8193}),
        (THUMB, {"width": 8192, "height": 8192}),  # a 67-Mpx "thumbnail"
        (PREVIEW, {"width": 100_000}),
        (THUMB, {"width": "256"}),
        (THUMB, {"width": True}),
        (THUMB, {"width": 100.0}),
        (THUMB, {"fit": "stretch"}),
        (THUMB, {"fit": None}),
        (THUMB, {"format": "gif"}),
        (THUMB, {"format": "tiff"}),
        (THUMB, {"format": ["webp"]}),  # unhashable: a 4xx, not a TypeError
        (THUMB, {"quality": 0}),
        (THUMB, {"quality": 101}),
        (THUMB, {"keep_metadata": "yes"}),
        (THUMB, {"max_pixels": 10**12}),  # the profile's to set, not the caller's
        (THUMB, {"max_pixels": 10}),
        (THUMB, {"size": 100}),  # seed 002's parameter
        (THUMB, {"max_width": 100}),  # compress's, not a thumbnail's
        (COMPRESS, {"width": 100}),
        (COMPRESS, {"max_width": 0}),
        (COMPRESS, {"max_height": 16_384}),
        (COMPRESS, {"fit": "cover"}),
    ],
)
def test_bad_params_are_refused(pipeline: registry.Pipeline, params: dict[str, Any]) -> None:
    with pytest.raises(JobError) as info:
        pipeline.validate(params, SETTINGS[pipeline.job_type])
    assert info.value.code == "INVALID_PARAMS"


@pytest.mark.parametrize(
    "settings",
    [{"max_pixels": "lots"}, {"max_pixels": 0}, {"max_pixels": 10**10}, {"quality": 500}],
)
def test_bad_profile_settings_are_refused(settings: dict[str, Any]) -> None:
    assert THUMB.schema is not None
    with pytest.raises(JobError):
        clean_settings(THUMB.schema, settings)
    with pytest.raises(JobError):
        THUMB.validate({}, settings)


def test_no_input_object(scratch: Path) -> None:
    with pytest.raises(JobError) as info:
        run(THUMB, scratch, None)
    assert info.value.code == "INVALID_PARAMS"


def test_params_stored_by_an_older_version_still_run(scratch: Path) -> None:
    """A job queued with seed 002's params (``size``) runs with today's defaults."""
    src = write(scratch, "input.jpg", photo(800, 600))
    ctx = registry.Context(str(scratch), lambda _: None, str(src))
    result = THUMB.run({"size": 256, "format": "webp", "quality": 80}, ctx)
    assert (result["width"], result["height"]) == (200, 200)


# -- thumbnails and previews -------------------------------------------------------------


def test_thumbnail_default_is_a_200_square_webp_cover(scratch: Path) -> None:
    src = write(scratch, "input.jpg", photo(4000, 3000), Q=90)
    r = run(THUMB, scratch, src)
    nbytes = r.file.stat().st_size
    assert r.result == {
        "width": 200,
        "height": 200,
        "format": "webp",
        "bytes": nbytes,
    }
    assert r.output["output_type"] == "thumb"
    assert r.output["mime_type"] == "image/webp"
    assert r.output["metadata"] == {"width": 200, "height": 200, "format": "webp", "bytes": nbytes}
    assert r.output["path"] == "thumb.webp"
    out = r.decoded()
    assert (out.width, out.height, out.bands, out.get("vips-loader")) == (200, 200, 3, "webpload")
    # The centre of the picture, shrunk: red still grows to the right, but the
    # cropped sides are gone (a 4:3 picture loses an eighth on each side).
    left, right = out.crop(0, 0, 10, 200)[0].avg(), out.crop(190, 0, 10, 200)[0].avg()
    assert 25 < left < 45 and 210 < right < 230, (left, right)
    assert r.reports == []  # a 50 ms job: its completion says it all


def test_slow_attempts_report_progress_from_libvips(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Progress reports are database writes in the worker: only an attempt
    still running after PROGRESS_AFTER_S sends them, one per PROGRESS_EVERY_S."""
    src = write(scratch, "input.png", photo(2000, 1500))
    monkeypatch.setattr(image, "PROGRESS_AFTER_S", 0.0)
    monkeypatch.setattr(image, "PROGRESS_EVERY_S", 0.0)
    # 3 MP to decode: under PROGRESS_PIXELS, libvips is not even asked.
    assert run(COMPRESS, scratch, src).reports == []
    monkeypatch.setattr(image, "PROGRESS_PIXELS", 2_000_000)
    # libvips signals "eval" from the thread that started the evaluation, once
    # per tile its workers finish, and not after the last tile is handed out: on a loaded machine
    # that thread can sleep through a 3 MP image's whole evaluation.  The
    # feature is there when one of three runs reports along the way.
    for _ in range(3):
        reports = run(COMPRESS, scratch, src).reports
        if len(reports) > 3:
            break
    assert len(reports) > 3
    percents = [r["percent"] for r in reports]
    assert percents == sorted(percents) and percents[0] >= 0 and percents[-1] <= 99
    assert {r["step"] for r in reports} == {"resizing and encoding"}
    monkeypatch.setattr(image, "PROGRESS_EVERY_S", 3600.0)
    assert len(run(COMPRESS, scratch, src).reports) <= 1  # 0 when that thread slept


def test_preview_default_fits_inside_1280(scratch: Path) -> None:
    src = write(scratch, "input.png", photo(1500, 2000))
    r = run(PREVIEW, scratch, src)
    assert r.size == (960, 1280)
    assert r.output["output_type"] == "preview"
    assert r.output["path"] == "preview.webp"
    assert (r.decoded().width, r.decoded().height) == (960, 1280)


@pytest.mark.parametrize(
    ("fit", "size", "left_red", "right_red"),
    [
        ("cover", (100, 100), (85, 110), (145, 170)),  # the middle quarter
        ("fill", (100, 100), (0, 12), (243, 255)),  # all of it, squashed
        ("inside", (100, 25), (0, 12), (243, 255)),  # all of it, smaller
        ("contain", (100, 100), (0, 12), (243, 255)),  # inside, on a transparent box
    ],
)
def test_fit_modes(
    scratch: Path,
    fit: str,
    size: tuple[int, int],
    left_red: tuple[int, int],
    right_red: tuple[int, int],
) -> None:
    src = write(scratch, "input.png", photo(400, 100))
    r = run(THUMB, scratch, src, {"width": 100, "height": 100, "fit": fit, "format": "png"})
    assert r.size == size
    out = r.decoded()
    assert (out.width, out.height) == size
    middle = out.crop(0, size[1] // 2 - 2, out.width, 4)
    left, right = middle.crop(0, 0, 3, 4)[0].avg(), middle.crop(out.width - 3, 0, 3, 4)[0].avg()
    assert left_red[0] <= left <= left_red[1], left
    assert right_red[0] <= right <= right_red[1], right
    if fit == "contain":
        assert out.bands == 4
        assert out.crop(0, 0, 100, 30)[3].max() == 0  # transparent bars above...
        assert out.crop(0, 70, 100, 30)[3].max() == 0  # ... and below
        assert out.crop(0, 40, 100, 20)[3].min() == 255  # the picture, opaque
    else:
        assert out.bands == 3


def test_contain_pads_with_white_for_jpeg(scratch: Path) -> None:
    src = write(scratch, "input.png", flat(400, 100, (0, 0, 0)))
    out = run(
        THUMB, scratch, src, {"width": 100, "height": 100, "fit": "contain", "format": "jpeg"}
    ).decoded()
    assert (out.width, out.height, out.bands) == (100, 100, 3)
    assert out.crop(0, 0, 100, 30).min() > 240  # white bars
    assert out.crop(0, 45, 100, 10).max() < 15  # the black picture


@pytest.mark.parametrize(
    ("fit", "size", "picture"),
    [
        ("cover", (200, 200), (200, 200)),  # the box is the contract: enlarged
        ("fill", (200, 200), (200, 200)),
        ("contain", (200, 200), (50, 40)),  # padded, not enlarged
        ("inside", (50, 40), (50, 40)),  # never enlarged
    ],
)
def test_small_images(
    scratch: Path, fit: str, size: tuple[int, int], picture: tuple[int, int]
) -> None:
    src = write(scratch, "input.png", flat(50, 40, (200, 10, 10)))
    out = run(THUMB, scratch, src, {"fit": fit, "format": "png"}).decoded()
    assert (out.width, out.height) == size
    if fit == "contain":
        opaque = out[3] > 0
        assert opaque.avg() * 200 * 200 / 255 == pytest.approx(picture[0] * picture[1], rel=0.05)


@pytest.mark.parametrize(
    ("fmt", "mime", "loader", "name"),
    [
        ("webp", "image/webp", "webpload", "thumb.webp"),
        ("jpeg", "image/jpeg", "jpegload", "thumb.jpg"),
        ("png", "image/png", "pngload", "thumb.png"),
        ("avif", "image/avif", "heifload", "thumb.avif"),
    ],
)
def test_formats_and_metadata_stripped(
    scratch: Path, fmt: str, mime: str, loader: str, name: str
) -> None:
    src = write(scratch, "input.jpg", with_metadata(photo(800, 600)), profile="srgb")
    fields = pyvips.Image.new_from_file(str(src)).get_fields()
    assert {"exif-data", "xmp-data", "icc-profile-data", "exif-ifd3-GPSLatitude"} <= set(fields)
    assert b"SecretCam" in src.read_bytes()
    r = run(THUMB, scratch, src, {"format": fmt, "fit": "inside"})
    assert r.result is not None
    assert r.result["format"] == fmt
    assert (r.output["mime_type"], r.output["path"]) == (mime, name)
    out = r.decoded()
    assert (out.width, out.height, out.get("vips-loader")) == (200, 150, loader)
    assert not set(META_FIELDS) & set(out.get_fields()), out.get_fields()
    assert not [f for f in out.get_fields() if f.startswith("exif-")]
    data = r.file.read_bytes()
    assert b"gps 48.85" not in data and b"SecretCam" not in data
    assert b"Exif" not in data and b"xmpmeta" not in data


def test_keep_metadata_keeps_exif_and_xmp_but_not_the_orientation(scratch: Path) -> None:
    src = write(scratch, "input.jpg", with_metadata(half_white(400, 300), orientation=6))
    for fmt in ("jpeg", "webp"):
        r = run(THUMB, scratch, src, {"format": fmt, "fit": "inside", "keep_metadata": True})
        out = r.decoded()
        assert (out.width, out.height) == (150, 200)  # upright
        assert out.get("orientation") == 1  # no viewer turns it a second time
        assert "SecretCam" in out.get("exif-ifd0-Make")
        assert "48/1 51/1" in out.get("exif-ifd3-GPSLatitude")
        assert b"gps 48.85" in out.get("xmp-data")
        assert "icc-profile-data" not in out.get_fields()
        # The pixels are sRGB: libexif's default said 65535, "Uncalibrated".
        assert out.get("exif-ifd2-ColorSpace").startswith("1 ("), fmt  # 1: sRGB


@pytest.mark.parametrize("fmt", ["jpeg", "webp", "png", "avif"])
def test_keep_metadata_adds_no_exif_to_an_image_without_any(scratch: Path, fmt: str) -> None:
    """libvips wrote an EXIF block of its own, saying ColorSpace 65535
    ("Uncalibrated"), into the output of a PNG that had none."""
    src = write(scratch, "input.png", photo(300, 200), keep="none")
    assert "exif-data" not in pyvips.Image.new_from_file(str(src)).get_fields()
    r = run(THUMB, scratch, src, {"format": fmt, "fit": "inside", "keep_metadata": True})
    fields = r.decoded().get_fields()
    assert "exif-data" not in fields and not [f for f in fields if f.startswith("exif-")], fields


def test_keep_metadata_sets_the_xmp_orientation_upright_too(scratch: Path) -> None:
    """The EXIF copy said 1, the XMP copy still 6: a reader that trusts XMP
    turned the upright pixels a second time."""
    img = with_metadata(half_white(400, 300), orientation=6)
    xmp = (
        b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF><rdf:Description tiff:Orientation="6"'
        b' xmlns:tiff="http://ns.adobe.com/tiff/1.0/"><tiff:Orientation>6</tiff:Orientation>'
        b"</rdf:Description></rdf:RDF></x:xmpmeta>"
    )
    img.set_type(pyvips.GValue.blob_type, "xmp-data", xmp)
    src = write(scratch, "input.jpg", img)
    for fmt in ("jpeg", "webp"):
        r = run(PREVIEW, scratch, src, {"format": fmt, "keep_metadata": True})
        out = r.decoded()
        assert (out.width, out.height, out.get("orientation")) == (300, 400, 1)
        kept = out.get("xmp-data")
        assert b'tiff:Orientation="1"' in kept, kept
        assert b"<tiff:Orientation>1</tiff:Orientation>" in kept, kept
        assert b"Orientation>6" not in kept and b'Orientation="6"' not in kept


def test_quality_changes_the_encoding(scratch: Path) -> None:
    src = write(scratch, "input.png", photo(1200, 900))
    box = {"width": 400, "height": 400}
    for fmt in ("jpeg", "webp", "avif"):
        low = run(PREVIEW, scratch, src, {**box, "format": fmt, "quality": 5}).result
        high = run(PREVIEW, scratch, src, {**box, "format": fmt, "quality": 100}).result
        assert low is not None and high is not None
        assert low["bytes"] < high["bytes"], fmt


def test_exif_orientation_is_applied(scratch: Path) -> None:
    # Stored 400x300, left half white, tagged "rotate 90 clockwise to view" (6).
    src = write(scratch, "input.jpg", with_metadata(half_white(400, 300), orientation=6))
    assert pyvips.Image.new_from_file(str(src)).get("orientation") == 6
    r = run(THUMB, scratch, src, {"width": 100, "height": 100, "fit": "inside", "format": "png"})
    out = r.decoded()
    assert (out.width, out.height) == (75, 100)  # turned upright: portrait
    # The stored left half is the top half once turned.
    assert out.crop(0, 0, 75, 40).avg() > 200
    assert out.crop(0, 60, 75, 40).avg() < 50
    assert "orientation" not in out.get_fields()


def test_a_colour_profile_is_converted_to_srgb(scratch: Path) -> None:
    green = (30, 200, 40)
    # The same colour as Display P3 numbers, with the P3 profile embedded.
    p3 = flat(64, 64, green).icc_transform("p3", input_profile="srgb", embedded=False)
    src = write(scratch, "input.png", p3.cast("uchar"))
    stored = pyvips.Image.new_from_file(str(src))
    assert "icc-profile-data" in stored.get_fields()
    assert abs(stored.getpoint(5, 5)[0] - green[0]) > 20  # P3 numbers differ from sRGB's
    out = run(THUMB, scratch, src, {"width": 64, "height": 64, "format": "png"}).decoded()
    assert out.interpretation == "srgb" and "icc-profile-data" not in out.get_fields()
    assert out.getpoint(5, 5) == pytest.approx(list(green), abs=4)


@pytest.mark.parametrize("with_profile", [True, False])
def test_cmyk_becomes_srgb(scratch: Path, with_profile: bool) -> None:
    cmyk = flat(64, 64, (200, 60, 30)).icc_transform("cmyk", input_profile="srgb")
    if not with_profile:
        cmyk = cmyk.copy()
        cmyk.remove("icc-profile-data")
    src = write(scratch, "input.jpg", cmyk, Q=95)
    assert pyvips.Image.new_from_file(str(src)).interpretation == "cmyk"
    out = run(THUMB, scratch, src, {"width": 32, "height": 32, "format": "png"}).decoded()
    assert (out.bands, out.interpretation) == (3, "srgb")
    assert out.getpoint(5, 5) == pytest.approx([200, 60, 30], abs=25)


def test_greyscale_and_16_bit_become_8_bit_srgb(scratch: Path) -> None:
    grey16 = (pyvips.Image.xyz(300, 200)[0] * 200).cast("ushort").copy(interpretation="grey16")
    src = write(scratch, "input.png", grey16)
    out = run(THUMB, scratch, src, {"format": "png"}).decoded()
    assert (out.bands, out.format, out.interpretation) == (3, "uchar", "srgb")


def test_transparency_is_flattened_for_jpeg(scratch: Path) -> None:
    rgba = photo(300, 200).bandjoin(64).copy(interpretation="srgb")
    src = write(scratch, "input.png", rgba)
    out = run(THUMB, scratch, src, {"format": "jpeg", "fit": "inside"}).decoded()
    assert (out.width, out.height, out.bands) == (200, 133, 3)
    # The formats with alpha keep it.
    for fmt in ("png", "webp", "avif"):
        assert run(THUMB, scratch, src, {"format": fmt}).decoded().bands == 4, fmt


@pytest.mark.parametrize("suffix", ["gif", "tif", "webp", "avif", "png"])
def test_other_accepted_inputs(scratch: Path, suffix: str) -> None:
    src = write(scratch, f"input.{suffix}", photo(640, 480))
    r = run(THUMB, scratch, src, {"width": 64, "height": 64, "fit": "inside"})
    assert r.size == (64, 48)


def test_bigtiff_is_a_tiff(scratch: Path) -> None:
    src = write(scratch, "input.tif", photo(300, 200), bigtiff=True)
    assert src.read_bytes()[:4] == b"II+\x00"
    assert run(THUMB, scratch, src, {"fit": "inside"}).size == (200, 133)


@pytest.mark.parametrize("suffix", ["jpg", "png"])
@pytest.mark.parametrize(
    ("source", "fit", "box", "size"),
    [
        ((3, 20_000), "inside", (200, 200), (1, 200)),
        ((12_000, 5), "inside", (200, 200), (200, 1)),
        ((12_000, 5), "contain", (200, 200), (200, 200)),
        ((1, 10_000), "cover", (300, 100), (300, 100)),
        ((60_000, 1), "cover", (200, 200), (200, 200)),
        ((1, 1_000), "cover", (4000, 100), (4000, 100)),
        ((7, 9_000), "fill", (200, 200), (200, 200)),
    ],
)
def test_long_thin_images(
    scratch: Path,
    suffix: str,
    source: tuple[int, int],
    fit: str,
    box: tuple[int, int],
    size: tuple[int, int],
) -> None:
    """Strips once failed as CORRUPT_INPUT (a JPEG shrink-on-load past their
    short side) or, with ``cover``, took a minute and gigabytes (libvips
    resized them whole to 300 x 3,000,000 before its crop) or died OOM."""
    w, h = source
    strip = (pyvips.Image.xyz(w, h)[1 if h > w else 0] * (255 / max(w, h))).cast("uchar")
    src = write(scratch, f"input.{suffix}", strip.copy(interpretation="b-w"))
    cpu = time.process_time()
    out = run(THUMB, scratch, src, {"fit": fit, "width": box[0], "height": box[1]})
    assert out.size == size
    # Milliseconds now; 20-60 s of CPU when the strip was resized whole.
    assert time.process_time() - cpu < 5, "no huge intermediate image"


def test_cover_by_crop_shows_the_centre(scratch: Path) -> None:
    """Past the overflow bound ``cover`` cuts the centre from the source first:
    the same picture as resizing whole and cropping (what the normal path does)."""
    bands = pyvips.Image.xyz(40, 2000)[1] < 1000  # top half white, bottom black
    col = (bands * 255).cast("uchar").copy(interpretation="b-w")
    src = write(scratch, "input.png", col)
    out = run(THUMB, scratch, src, {"fit": "cover", "width": 200, "height": 100, "format": "png"})
    img = out.decoded()
    assert (img.width, img.height) == (200, 100)
    # The centre 20 rows of the source: the edge between white and black.
    assert img.crop(0, 0, 200, 40).avg() > 200 and img.crop(0, 60, 200, 40).avg() < 55


def test_a_panorama_cover_keeps_shrink_on_load(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only an image that ``cover`` enlarges is cut first: a wide panorama
    shrinks, and its full-size decode would cost what shrink-on-load saves."""
    cut: list[str] = []
    real = imaging._cover_by_crop
    monkeypatch.setattr(imaging, "_cover_by_crop", lambda *a: (cut.append(str(a[1])), real(*a))[1])
    src = write(scratch, "input.jpg", photo(6000, 300))  # 20:1, shrinks to 4000 x 200
    assert run(THUMB, scratch, src, {"fit": "cover"}).size == (200, 200)
    assert cut == []
    strip = write(scratch, "strip.jpg", photo(3000, 20))  # enlarged 10x: cut first
    assert run(THUMB, scratch, strip, {"fit": "cover"}).size == (200, 200)
    assert cut == [str(strip)]


@pytest.mark.parametrize(
    "words",
    [
        "heifsave: Failed to allocate context buffers",
        # aom when it cannot even set up, and libwebp, whose failure libvips
        # reports without a cause: the frame's pixels were all decoded by then.
        "heif: Encoder plugin generated an error: Initialization problem: "
        "av1_create_context_and_bufferpool() failed (8.5001)",
        "webpsave: unable to encode",
    ],
)
def test_an_encoder_that_cannot_allocate_is_oom(words: str) -> None:
    """aom (AVIF) says "Failed to allocate context buffers" under the attempt's
    address-space limit: more memory helps, so OOM (retried), not CORRUPT_INPUT."""

    class Err(Exception):
        message = "unable to call heifsave"
        detail = words

    header = imaging.Header(10, 10, "jpegload", "image/jpeg", 1, False)
    assert isinstance(imaging.failure(Err(), header), MemoryError)


_TIGHT = """
import json, resource, sys
from hypermedia.pipelines import imaging

vips = imaging.load()
image = vips.Image.xyz(4096, 4096)[0].cast("uchar").bandjoin([128, 200]).copy_memory()
header = imaging.Header(4096, 4096, "pngload", "image/png", 1, False)
size = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmSize"))
_, hard = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, ((size // 1024 + 64) * 2**20, hard))
try:
    imaging.save(vips, image, sys.argv[1] + "/out.jpg", "jpeg", 80, False)
    print(json.dumps("saved"))
except vips.Error as exc:
    print(json.dumps(type(imaging.failure(exc, header)).__name__))
"""


def _isolated(script: str, tmp_path: Path) -> Any:
    """What ``script`` prints as JSON, run in a process of its own (its limits
    must not reach this one)."""
    done = subprocess.run(
        [sys.executable, "-I", "-c", script, str(tmp_path)],
        env={},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_libjpeg_out_of_memory_is_oom(tmp_path: Path) -> None:
    """libjpeg says "Insufficient memory" when it cannot allocate (encoding
    here; decoding a large progressive JPEG too): OOM, retried with more
    memory, not CORRUPT_INPUT, which blamed the file for good."""
    assert _isolated(_TIGHT, tmp_path) == "MemoryError"
    assert not (tmp_path / "out.jpg").exists()  # nothing half-written left


_FSIZE = """
import json, resource, signal, sys
from hypermedia.pipelines import imaging

vips = imaging.load()
noise = vips.Image.gaussnoise(1024, 1024, sigma=80).cast("uchar")
image = noise.bandjoin([noise.rot90(), noise.flip("horizontal")]).copy(interpretation="srgb")
header = imaging.Header(1024, 1024, "pngload", "image/png", 1, False)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # as in the attempt's child: EFBIG, no kill
resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, resource.RLIM_INFINITY))
try:
    imaging.save(vips, image, sys.argv[1] + "/out.png", "png", 80, False)
    print(json.dumps("saved"))
except vips.Error as exc:
    failed = imaging.failure(exc, header)
    print(json.dumps([getattr(failed, "code", type(failed).__name__), str(failed)]))
"""


def test_a_write_past_the_file_size_limit_is_limit_exceeded(tmp_path: Path) -> None:
    """libvips deletes its partial file, so the child found no big file and
    the attempt said CORRUPT_INPUT of a sound input."""
    code, reason = _isolated(_FSIZE, tmp_path)
    assert code == "LIMIT_EXCEEDED" and "HYPERMEDIA_CHILD_MAX_FILE_MB" in reason


def test_heic_is_read_where_libvips_can(scratch: Path) -> None:
    src = scratch / "input.heic"
    heic_or_skip(src)
    try:
        r = run(THUMB, scratch, src, {"width": 64, "height": 64, "fit": "inside"})
    except JobError as exc:
        # pyvips-binary's libheif has no HEVC decoder: a clear, permanent refusal.
        assert exc.code == "UNSUPPORTED_FORMAT"
        assert exc.reason == "HEVC-coded HEIF images cannot be decoded on this server"
        assert not [p for p in scratch.iterdir() if p != src]
    else:
        assert r.size == (64, 48)


@pytest.mark.parametrize("suffix", ["gif", "webp"])
def test_animated_input_gives_the_first_frame(scratch: Path, suffix: str) -> None:
    src = write(scratch, f"input.{suffix}", frames((250, 0, 0), (0, 0, 250), (0, 250, 0)))
    assert pyvips.Image.new_from_file(str(src)).get("n-pages") == 3
    for pipeline in (THUMB, COMPRESS):
        r = run(pipeline, scratch, src, {"format": "png"})
        out = r.decoded()
        assert r.size == ((200, 200) if pipeline is THUMB else (64, 48))
        assert "n-pages" not in out.get_fields()
        red, green, blue = out.getpoint(10, 10)[:3]
        assert red > 200 and green < 30 and blue < 30, (red, green, blue)


@pytest.mark.parametrize(
    ("stored", "orientation", "params", "opened", "size"),
    [
        # 15x too big for the box: decoded at 1/8 scale (at least the box, as sharp does).
        ((4000, 3000), 1, {}, ("jpegload", 8), (200, 200)),
        (
            (4000, 3000),
            1,
            {"width": 1280, "height": 1280, "fit": "inside"},
            ("jpegload", 2),
            (1280, 960),
        ),
        # The box is checked against the upright image: turned, 1000x4000 has
        # nothing to spare for a 1000x250 cover; unturned it has 4x.
        ((4000, 1000), 1, {"width": 1000, "height": 250}, ("jpegload", 4), (1000, 250)),
        ((4000, 1000), 6, {"width": 1000, "height": 250}, ("jpegload", 1), (1000, 250)),
        ((300, 200), 1, {}, ("jpegload", 1), (200, 200)),
    ],
)
def test_jpeg_shrinks_on_load(
    scratch: Path,
    monkeypatch: pytest.MonkeyPatch,
    stored: tuple[int, int],
    orientation: int,
    params: dict[str, Any],
    opened: tuple[str, int],
    size: tuple[int, int],
) -> None:
    """A JPEG is decoded at 1/2, 1/4 or 1/8 scale when the box allows, else
    whole (libvips' thumbnail would shrink it on load regardless of its shape);
    other formats go to libvips' thumbnail, which shrinks WebP and HEIF on load."""
    src = write(scratch, "input.jpg", with_metadata(photo(*stored), orientation))
    calls: list[tuple[str, int]] = []
    for name in ("jpegload", "thumbnail"):
        real = getattr(pyvips.Image, name)

        def spy(*args: Any, _name: str = name, _real: Any = real, **kwargs: Any) -> Any:
            calls.append((_name, kwargs.get("shrink", 1)))
            return _real(*args, **kwargs)

        monkeypatch.setattr(pyvips.Image, name, spy)
    assert run(THUMB, scratch, src, params).size == size
    assert calls == [opened]


def test_other_formats_are_opened_by_libvips_thumbnail(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = write(scratch, "input.webp", photo(2000, 1500))
    calls: list[tuple[Any, ...]] = []
    real = pyvips.Image.thumbnail

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(pyvips.Image, "thumbnail", spy)
    assert run(THUMB, scratch, src).size == (200, 200)
    assert calls == [(str(src), 200)]


def test_no_cache_between_jobs_reading_the_same_path(scratch: Path) -> None:
    """Every attempt of a worker slot reads scratch/input.*: libvips' operation
    cache (keyed by file name) must not hand the next job the last job's image."""
    src = write(scratch, "input.jpg", photo(400, 300))
    first = run(THUMB, scratch, src, {"width": 100, "height": 100, "fit": "inside"})
    write(scratch, "input.jpg", photo(300, 400))
    second = run(THUMB, scratch, src, {"width": 100, "height": 100, "fit": "inside"})
    assert (first.size, second.size) == ((100, 75), (75, 100))


# -- image.compress ----------------------------------------------------------------------


def test_compress_keeps_the_dimensions_and_re_encodes(scratch: Path) -> None:
    src = write(scratch, "input.png", with_metadata(photo(1200, 900)))
    r = run(COMPRESS, scratch, src)
    nbytes = r.file.stat().st_size
    assert r.result == {
        "width": 1200,
        "height": 900,
        "format": "webp",
        "bytes": nbytes,
    }
    assert nbytes < src.stat().st_size
    assert (r.output["output_type"], r.output["mime_type"], r.output["path"]) == (
        "compressed",
        "image/webp",
        "compressed.webp",
    )
    assert r.output["metadata"] == {"width": 1200, "height": 900, "format": "webp", "bytes": nbytes}
    out = r.decoded()
    assert (out.width, out.height) == (1200, 900)
    assert not set(META_FIELDS) & set(out.get_fields())


def test_compress_downscales_only_beyond_the_limits(scratch: Path) -> None:
    src = write(scratch, "input.jpg", photo(3000, 1000))
    assert run(COMPRESS, scratch, src, {"max_width": 1500}).size == (1500, 500)
    assert run(COMPRESS, scratch, src, {"max_height": 250}).size == (750, 250)
    assert run(COMPRESS, scratch, src, {"max_width": 3000, "max_height": 1000}).size == (3000, 1000)
    jpeg = run(COMPRESS, scratch, src, {"format": "jpeg", "quality": 40})
    assert (jpeg.size, jpeg.output["mime_type"]) == ((3000, 1000), "image/jpeg")


def test_compress_turns_the_image_upright(scratch: Path) -> None:
    src = write(scratch, "input.jpg", with_metadata(half_white(400, 300), orientation=6))
    out = run(COMPRESS, scratch, src, {"format": "png"}).decoded()
    assert (out.width, out.height) == (300, 400)
    assert out.crop(0, 0, 300, 150).avg() > 200


# -- hostile input -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "make", "code"), [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE]
)
@pytest.mark.parametrize("pipeline", [THUMB, PREVIEW, COMPRESS], ids=lambda p: p.job_type)
def test_hostile_input_fails_cleanly(
    scratch: Path, pipeline: registry.Pipeline, name: str, make: Callable[[], bytes], code: str
) -> None:
    src = scratch / name
    src.write_bytes(make())
    err = failure(pipeline, scratch, src)
    assert err.code == code, err.reason
    assert "passwd" not in err.reason and "hostname" not in err.reason


def test_a_pixel_flood_is_refused_from_its_header(scratch: Path) -> None:
    src = scratch / "input.png"
    src.write_bytes(png_flood())  # 12000 x 12000 = 144 Mpx in < 1 MB
    assert src.stat().st_size < 1_000_000
    with pytest.raises(JobError, match="12000x12000, over this profile's limit"):
        run(THUMB, scratch, src)
    src.write_bytes(gif_flood())
    assert src.stat().st_size < 100
    with pytest.raises(JobError, match="30000x30000"):
        run(THUMB, scratch, src)


def test_channels_and_webp_frames_are_counted_before_decoding(scratch: Path) -> None:
    """max_pixels counts neither: a 16 MB TIFF of 4,000 channels held 8 GB,
    and 200,000 frames of a 10 MB WebP ran for minutes in libvips."""
    src = scratch / "input.tif"
    src.write_bytes(tiff_bands(17))
    with pytest.raises(JobError, match="the image has 17 channels, more than 16"):
        run(THUMB, scratch, src)
    src.write_bytes(tiff_bands(5))  # CMYK and alpha: made
    assert run(THUMB, scratch, src, {"format": "png"}).size == (200, 200)
    src = scratch / "input.webp"
    src.write_bytes(webp_frames(200_000))
    t0 = time.monotonic()
    with pytest.raises(JobError, match="more than 10000 frames"):
        run(THUMB, scratch, src)
    assert time.monotonic() - t0 < 2
    src.write_bytes(webp_frames(3))
    assert run(THUMB, scratch, src, {"format": "png"}).size == (200, 200)


def test_a_progressive_jpegs_scans_are_counted_before_decoding(scratch: Path) -> None:
    src = scratch / "input.jpg"
    src.write_bytes(jpeg_scans(4000, 10))  # 2,080 scans: ~6 s of CPU to decode here
    t0 = time.monotonic()
    with pytest.raises(JobError, match="more than 500 scans"):
        run(THUMB, scratch, src)
    assert time.monotonic() - t0 < 2
    src.write_bytes(jpeg_scans(256, 1))  # 379 scans: read, and grey as made
    out = run(THUMB, scratch, src, {"format": "png"})
    assert out.size == (200, 200)
    assert out.decoded().getpoint(100, 100) == pytest.approx([128, 128, 128], abs=2)


def test_a_gif_screen_larger_than_its_frames_is_read_at_its_real_size(scratch: Path) -> None:
    src = scratch / "input.gif"
    src.write_bytes(gif(frame=(1, 1), screen=(65_535, 65_535)))
    assert run(THUMB, scratch, src, {"format": "png"}).size == (200, 200)


def jpeg_claiming(width: int, height: int) -> bytes:
    """A real small JPEG whose frame header (SOF0) is rewritten to claim width x height."""
    data = bytearray(photo(64, 64).jpegsave_buffer(Q=50, keep="none"))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def test_a_jpeg_claiming_65000_squared_is_refused(scratch: Path) -> None:
    src = scratch / "input.jpg"
    src.write_bytes(jpeg_claiming(65_000, 65_000))
    header = pyvips.Image.new_from_file(str(src))  # the header parses: only the size is a lie
    assert (header.width, header.height) == (65_000, 65_000)
    assert failure(PREVIEW, scratch, src).code == "LIMIT_EXCEEDED"


def test_the_profile_pixel_limit_applies(scratch: Path) -> None:
    src = write(scratch, "input.png", photo(100, 100))
    base = SETTINGS["image.thumbnail"]
    with pytest.raises(JobError) as info:
        run(THUMB, scratch, src, settings={**base, "max_pixels": 9_999})
    assert info.value.code == "LIMIT_EXCEEDED"
    assert run(THUMB, scratch, src, settings={**base, "max_pixels": 10_000}).result is not None


@pytest.mark.parametrize(
    ("name", "make", "code"),
    [
        ("input.jpg", lambda: jpeg_header(640, 480), "CORRUPT_INPUT"),  # SOF, no tables, no scan
        ("input.png", lambda: b"\x89PNG\r\n\x1a\n" + b"\x00garbage" * 100, "CORRUPT_INPUT"),
        (
            "input.jpg",
            lambda: os.urandom(20_000).replace(b"\xff\xd8", b"\0\0"),
            "UNSUPPORTED_FORMAT",
        ),
    ],
)
def test_damaged_headers(scratch: Path, name: str, make: Callable[[], bytes], code: str) -> None:
    src = scratch / name
    src.write_bytes(make())
    assert failure(THUMB, scratch, src).code == code


def test_png_with_a_bad_data_crc_is_corrupt(scratch: Path) -> None:
    data = bytearray(png(64, 64))
    data[-20] ^= 0xFF  # inside the IDAT chunk: header fine, pixels not
    src = scratch / "input.png"
    src.write_bytes(bytes(data))
    assert failure(THUMB, scratch, src).code == "CORRUPT_INPUT"


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("photo.jpg", lambda p: photo(640, 480).pngsave(p)),  # a PNG
        ("photo.png", lambda p: photo(640, 480).jpegsave(p)),  # a JPEG
        ("photo.gif", lambda p: photo(640, 480).webpsave(p)),  # a WebP
        ("photo", lambda p: photo(640, 480).tiffsave(p)),  # no extension at all
    ],
)
def test_the_content_decides_the_type_not_the_name(scratch: Path, name: str, make: Any) -> None:
    src = scratch / name
    make(str(src))
    r = run(THUMB, scratch, src, {"width": 64, "height": 64, "fit": "inside"})
    assert r.size == (64, 48)


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("input.ppm", lambda p: Path(p).write_bytes(b"P6\n8 8\n255\n" + bytes(range(192)))),
        ("input.v", lambda p: photo(64, 64).vipssave(p)),
        ("input.csv", lambda p: photo(8, 8)[0].csvsave(p)),
        ("input.mat", lambda p: photo(8, 8)[0].matrixsave(p)),
        ("input.svg", lambda p: Path(p).write_bytes(svg_entity())),
        ("input.pdf", lambda p: Path(p).write_bytes(pdf())),
    ],
)
def test_formats_outside_the_allow_list_are_unsupported(
    scratch: Path, name: str, make: Any
) -> None:
    src = scratch / name
    make(str(src))
    assert failure(THUMB, scratch, src).code == "UNSUPPORTED_FORMAT"


def test_other_loaders_are_blocked_inside_libvips(scratch: Path) -> None:
    """Defence in depth: even a loader our sniffer would never pick is blocked,
    and the untrusted ones (SVG, PDF, ImageMagick) are blocked or absent."""
    imaging.load()
    for name, make in (("x.v", "vipssave"), ("x.csv", "csvsave"), ("x.mat", "matrixsave")):
        getattr(photo(8, 8)[0], make)(str(scratch / name))  # saving is not blocked
        with pytest.raises(pyvips.Error):
            pyvips.Image.new_from_file(str(scratch / name))
    svg = scratch / "x.svg"
    svg.write_bytes(svg_file_reference())
    for loader in ("svgload", "magickload", "pdfload"):
        with pytest.raises((pyvips.Error, AttributeError)):
            getattr(pyvips.Image, loader)(str(svg))
    with pytest.raises(pyvips.Error):
        pyvips.Image.new_from_file(str(svg))


def test_the_warm_up_runs_through_the_allowed_loaders(scratch: Path) -> None:
    """A child's warm-up thumbnails a tiny JPEG in memory: with the loaders
    allow-listed, the JPEG buffer loader must still be let in (or the warm-up
    would fail, quietly skipped by the registry, and warm nothing)."""
    assert imaging.warm() is pyvips
    assert THUMB.warm is imaging.warm


# -- the module and the child's sandbox ------------------------------------------------


def test_importing_the_module_does_not_load_pyvips() -> None:
    code = (
        "import sys, hypermedia.pipelines.image as m, hypermedia.pipelines.imaging as v; "
        "assert m.available() is None; "
        "assert 'pyvips' not in sys.modules and v._vips is None"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_missing_libvips_is_a_dependency_failure(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(imaging, "_vips", None)
    monkeypatch.setitem(sys.modules, "pyvips", None)  # import pyvips -> ImportError
    src = scratch / "input.png"
    src.write_bytes(png(4, 4))
    with pytest.raises(JobError) as info:
        run(THUMB, scratch, src)
    assert info.value.code == "DEPENDENCY_FAILED"


def test_available_says_why_not(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "pyvips" else real(name, *a)
    )
    assert THUMB.available() == "pyvips is not installed"
    assert registry.availability()["image.thumbnail"] == "pyvips is not installed"


def test_pyvips_works_in_an_empty_environment_without_imagemagick(tmp_path: Path) -> None:
    """The worker's child runs ``python -I`` with env={}: libvips must load there,
    and nothing of ImageMagick, Ghostscript or poppler may come with it."""
    src = tmp_path / "input.jpg"
    photo(300, 200).jpegsave(str(src))
    code = (
        "import json, sys\n"
        "from hypermedia.pipelines import image, registry\n"
        "ctx = registry.Context(sys.argv[1], lambda p: None, sys.argv[2])\n"
        "params = image.THUMBNAIL.validate({'width': 30, 'height': 30, 'fit': 'inside'}, {})\n"
        "result = image.THUMBNAIL.run(params, ctx)\n"
        "maps = open('/proc/self/maps').read().lower()\n"
        "result['foreign'] = [n for n in ('magick', 'libgs', 'poppler') if n in maps]\n"
        "print(json.dumps(result))\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", code, str(tmp_path), str(src)],
        env={},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert '"width": 30, "height": 20' in done.stdout
    assert '"foreign": []' in done.stdout
    assert (tmp_path / "thumb.webp").exists()


# -- unusual but sound inputs (a QA pass) ------------------------------------------------


@pytest.mark.parametrize(
    ("bands", "interpretation"),
    [
        ([200, 60, 30, 255, 77], "srgb"),  # RGB, alpha, a saved selection
        ([200, 60, 30, 255, 77, 5], "srgb"),  # two extra channels
        ([125, 255, 9], "b-w"),  # grey, alpha, one extra
    ],
)
@pytest.mark.parametrize("fmt", ["jpeg", "png", "webp"])
def test_channels_past_the_alpha_are_dropped_not_taken_for_it(
    scratch: Path, bands: list[int], interpretation: str, fmt: str
) -> None:
    """JPEG's flatten took the last channel for the alpha: an opaque print
    file with a saved selection came out washed out, unlike PNG and WebP."""
    img = (pyvips.Image.black(64, 48) + bands).cast("uchar").copy(interpretation=interpretation)
    src = write(scratch, "print.tif", img)
    out = run(THUMB, scratch, src, {"format": fmt, "fit": "inside", "width": 32, "height": 32})
    pixel = out.decoded().getpoint(5, 5)
    expect = bands[:3] if interpretation == "srgb" else [bands[0]] * 3
    assert all(abs(a - b) <= 3 for a, b in zip(pixel[:3], expect, strict=True)), (fmt, pixel)
    assert out.decoded().bands <= 4


@pytest.mark.parametrize("orientation", [3, 6, 8])
@pytest.mark.parametrize("pipeline", [THUMB, COMPRESS])
def test_a_turned_print_file_with_extra_channels_is_read_whole(
    scratch: Path, orientation: int, pipeline: registry.Pipeline
) -> None:
    """Turned upright from a sequential read, its lines were asked out of
    order: CORRUPT_INPUT for every such TIFF not shrunk much."""
    bands = [200, 60, 30, 255, 77]  # RGB, alpha, a saved selection
    img = (pyvips.Image.black(2400, 1600) + bands).cast("uchar")
    img = img.copy(interpretation="srgb")
    img.set_type(pyvips.GValue.gint_type, "orientation", orientation)
    src = write(scratch, "print.tif", img, compression="deflate")
    params = {"width": 2400, "height": 2400, "fit": "inside"} if pipeline is THUMB else {}
    out = run(pipeline, scratch, src, params)
    upright = (1600, 2400) if orientation in (6, 8) else (2400, 1600)
    assert out.size == upright
    pixel = out.decoded().getpoint(5, 5)
    assert all(abs(a - b) <= 3 for a, b in zip(pixel[:3], (200, 60, 30), strict=True)), pixel


@pytest.mark.parametrize("name", ["strip.jpg", "strip.png"])
@pytest.mark.parametrize(
    ("stored", "box", "size"),
    [
        # Shrunk by 2 on load, 2500 x 1: the resize after took that shape.
        ((5000, 3), (8192, 1), (1667, 1)),
        # No scale keeps the shape, and libvips' thumbnail shrank it on load
        # all the same (513 wide; 10 x 59; 1 x 250; 1 x 3).
        ((2974, 59), (1000, 10), (504, 10)),
        ((23, 945), (10, 1000), (10, 411)),
        ((17, 4000), (1, 500), (1, 235)),
        ((7, 13), (1, 500), (1, 2)),
        # Within a pixel as fractions, a pixel apart once rounded: 288 x 3.79
        # is 4 high, 494 x 6 (shrunk by 2) made it 3.50, so 3.
        ((988, 13), (288, 468), (288, 4)),
        ((1448, 535), (167, 385), (167, 62)),
    ],
)
def test_a_thin_jpeg_keeps_its_shape_when_shrunk_on_load(
    scratch: Path,
    name: str,
    stored: tuple[int, int],
    box: tuple[int, int],
    size: tuple[int, int],
) -> None:
    """The JPEG comes out as the PNG of the same pixels does."""
    strip = pyvips.Image.xyz(*stored)[0].cast("uchar").copy(interpretation="b-w")
    src = write(scratch, name, strip)
    params = {"fit": "inside", "width": box[0], "height": box[1]}
    assert run(THUMB, scratch, src, params).size == size


def test_the_usual_photos_still_shrink_by_eight_on_load() -> None:
    """The shape check costs the benchmarks' photos (and a camera's) nothing:
    3464 x 2309 leaves a remainder of 5 in 2309, under a pixel at 200 x 200."""
    for w, h in ((3464, 2309), (2450, 1633), (4242, 2828), (4899, 3266), (4000, 3000)):
        header = imaging.Header(w, h, "jpegload", "image/jpeg", 0, False)
        assert imaging.jpeg_shrink(header, 200, 200, "cover") == 8, (w, h)


def test_an_8_bit_cielab_tiff_is_unsupported_not_corrupt(scratch: Path) -> None:
    src = write(scratch, "lab8.tif", flat(64, 48, (200, 60, 30)).colourspace("labq"))
    try:
        pyvips.Image.new_from_file(str(src)).avg()
    except pyvips.Error:
        err = failure(THUMB, scratch, src)
        assert (err.code, err.reason) == (
            "UNSUPPORTED_FORMAT",
            "8-bit CIELab TIFF images cannot be decoded on this server",
        )
    else:  # a libvips that reads it (8.14) converts it like any other
        assert run(THUMB, scratch, src).size == (200, 200)


@pytest.mark.parametrize("pipeline", [PREVIEW, COMPRESS], ids=["preview", "compress"])
def test_a_strip_wider_than_libvips_resizes_is_said_as_such(
    scratch: Path, pipeline: registry.Pipeline
) -> None:
    """QA: a sound 100,000,000 x 1 PNG failed "damaged or truncated" (libvips:
    "bad dimensions", a side near its 100,000,000); thumbnails crop first."""
    strip = pyvips.Image.black(100_000_000, 1).cast("uchar").copy(interpretation="b-w")
    src = write(scratch, "input.png", strip)
    err = failure(pipeline, scratch, src)
    assert err.code == "LIMIT_EXCEEDED"
    assert err.reason == "the image is 100,000,000 x 1 pixels: too long a side to resize"
    assert run(THUMB, scratch, src).size == (200, 200)

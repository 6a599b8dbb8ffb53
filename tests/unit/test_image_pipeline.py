"""image.thumbnail and image.preview on real libvips, with images made in code.

The pipelines are called directly through ``registry.Context`` (the worker's
child does the same); the end-to-end path through a worker is in
tests/integration/test_image_jobs.py.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

from hypermedia.errors import JobError

# debug too: registry loads its built-ins only while it is empty, so importing
# image alone first would leave debug.* unregistered for the rest of the run.
from hypermedia.pipelines import debug, image, registry  # noqa: F401
from tests.media import jpeg_header, png

IN_CI = os.environ.get("CI", "").lower() == "true"

try:
    import pyvips
except Exception as exc:  # ImportError, or OSError without libvips.so.42
    if IN_CI:
        raise
    pytest.skip(f"pyvips/libvips is not available ({exc})", allow_module_level=True)

THUMB = image.THUMBNAIL
PREVIEW = image.PREVIEW
THUMB_SETTINGS = {"size": 256, "format": "webp", "quality": 80, "max_pixels": 100_000_000}
PREVIEW_SETTINGS = {"size": 1280, "format": "webp", "quality": 85, "max_pixels": 100_000_000}
META_FIELDS = ("exif-data", "xmp-data", "icc-profile-data", "orientation")


# -- images made in code -----------------------------------------------------------------


def photo(width: int, height: int) -> Any:
    """An sRGB gradient: red grows to the right, green downwards."""
    xyz = pyvips.Image.xyz(width, height)
    red = xyz[0] * (255 / width)
    green = xyz[1] * (255 / height)
    return red.bandjoin([green, green * 0 + 128]).cast("uchar").copy(interpretation="srgb")


def half_white(width: int, height: int) -> Any:
    """Left half white, right half black: shows which way an image was turned."""
    mask = pyvips.Image.black(width, height).draw_rect(255, 0, 0, width // 2, height, fill=True)
    return mask.bandjoin([mask, mask]).cast("uchar").copy(interpretation="srgb")


def with_metadata(img: Any, orientation: int = 1) -> Any:
    img = img.copy()
    img.set_type(pyvips.GValue.gint_type, "orientation", orientation)
    img.set_type(
        pyvips.GValue.blob_type,
        "xmp-data",
        b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><secret>gps 48.85,2.35</secret></x:xmpmeta>',
    )
    return img


def png_bomb(path: Path, side: int = 12_000) -> None:
    """A valid greyscale PNG of side x side black pixels (144 Mpx): < 1 MB on disk."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    z = zlib.compressobj(1)
    row = bytes(side + 1)  # filter byte + one byte per pixel
    idat = b"".join(z.compress(row) for _ in range(side)) + z.flush()
    ihdr = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
    )


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
        settings = THUMB_SETTINGS if pipeline is THUMB else PREVIEW_SETTINGS
    validated = pipeline.validate(dict(params or {}), dict(settings))
    reports: list[dict[str, Any]] = []
    path = None if input_file is None else str(input_file)
    ctx = registry.Context(str(scratch), reports.append, path)
    result = pipeline.run(validated, ctx)
    return Run(ctx, result, reports)


def failure(pipeline: registry.Pipeline, scratch: Path, input_file: Path, **params: Any) -> str:
    """Run expecting a JobError; check its reason is safe; return its code."""
    with pytest.raises(JobError) as info:
        run(pipeline, scratch, input_file, params)
    reason = info.value.reason
    assert str(scratch) not in reason and input_file.name not in reason, reason
    assert "vips" not in reason.lower(), reason
    assert not [p for p in scratch.iterdir() if p != input_file], "no output on failure"
    return info.value.code


# -- the result --------------------------------------------------------------------------


def test_registered_on_import() -> None:
    assert registry.get("image.thumbnail") is THUMB
    assert registry.get("image.preview") is PREVIEW
    assert (THUMB.queue, PREVIEW.queue) == ("images", "images")


def test_thumbnail_fits_the_box_and_keeps_the_aspect(scratch: Path) -> None:
    src = scratch / "input.jpg"
    photo(4000, 3000).jpegsave(str(src), Q=90)
    r = run(THUMB, scratch, src)
    assert r.result is not None
    assert r.result == {
        "width": 256,
        "height": 192,
        "format": "webp",
        "bytes": r.file.stat().st_size,
    }
    assert r.output["output_type"] == "thumb"
    assert r.output["mime_type"] == "image/webp"
    assert r.output["metadata"] == {"width": 256, "height": 192, "format": "webp"}
    assert r.output["path"] == "thumb.webp"
    out = r.decoded()
    assert (out.width, out.height, out.get("vips-loader")) == (256, 192, "webpload")
    # It is the picture, shrunk: red still grows to the right.
    assert out.crop(0, 0, 20, 192).avg() < out.crop(236, 0, 20, 192).avg()
    assert r.reports[-1] == {"percent": 100, "step": "saved"}
    assert all(0 <= p["percent"] <= 100 for p in r.reports)


def test_preview_defaults_to_1280_and_portrait_fits_by_height(scratch: Path) -> None:
    src = scratch / "input.png"
    photo(1500, 2000).pngsave(str(src))
    r = run(PREVIEW, scratch, src)
    assert r.result is not None
    assert (r.result["width"], r.result["height"]) == (960, 1280)
    assert r.output["output_type"] == "preview"
    assert r.output["path"] == "preview.webp"
    assert (r.decoded().width, r.decoded().height) == (960, 1280)


def test_small_images_are_never_upscaled(scratch: Path) -> None:
    src = scratch / "input.png"
    photo(100, 50).pngsave(str(src))
    r = run(PREVIEW, scratch, src, {"size": 4096})
    assert r.result is not None
    assert (r.result["width"], r.result["height"]) == (100, 50)
    assert (r.decoded().width, r.decoded().height) == (100, 50)


@pytest.mark.parametrize(
    ("fmt", "mime", "loader", "name"),
    [
        ("webp", "image/webp", "webpload", "thumb.webp"),
        ("jpeg", "image/jpeg", "jpegload", "thumb.jpg"),
        ("png", "image/png", "pngload", "thumb.png"),
    ],
)
def test_formats_and_metadata_stripped(
    scratch: Path, fmt: str, mime: str, loader: str, name: str
) -> None:
    src = scratch / "input.jpg"
    with_metadata(photo(800, 600)).jpegsave(str(src), profile="srgb")
    fields = pyvips.Image.new_from_file(str(src)).get_fields()
    assert {"exif-data", "xmp-data", "icc-profile-data"} <= set(fields)  # the input has them
    r = run(THUMB, scratch, src, {"format": fmt, "size": 200})
    assert r.result is not None
    assert r.result["format"] == fmt
    assert (r.output["mime_type"], r.output["path"]) == (mime, name)
    out = r.decoded()
    assert (out.width, out.height, out.get("vips-loader")) == (200, 150, loader)
    assert not set(META_FIELDS) & set(out.get_fields()), out.get_fields()
    assert b"gps 48.85" not in r.file.read_bytes()


def test_quality_changes_the_encoding(scratch: Path) -> None:
    src = scratch / "input.png"
    photo(1200, 900).pngsave(str(src))
    low = run(PREVIEW, scratch, src, {"format": "jpeg", "quality": 5}).result
    high = run(PREVIEW, scratch, src, {"format": "jpeg", "quality": 100}).result
    assert low is not None and high is not None
    assert low["bytes"] < high["bytes"]


def test_exif_orientation_is_applied(scratch: Path) -> None:
    src = scratch / "input.jpg"
    # Stored 400x300, left half white, tagged "rotate 90 clockwise to view" (6).
    with_metadata(half_white(400, 300), orientation=6).jpegsave(str(src))
    assert pyvips.Image.new_from_file(str(src)).get("orientation") == 6
    r = run(THUMB, scratch, src, {"size": 100, "format": "png"})
    out = r.decoded()
    assert (out.width, out.height) == (75, 100)  # turned upright: portrait
    # The stored left half is the top half once turned.
    assert out.crop(0, 0, 75, 40).avg() > 200
    assert out.crop(0, 60, 75, 40).avg() < 50
    assert "orientation" not in out.get_fields()  # no viewer turns it a second time


def test_transparency_is_flattened_for_jpeg(scratch: Path) -> None:
    src = scratch / "input.png"
    rgba = photo(300, 200).bandjoin(64).copy(interpretation="srgb")
    rgba.pngsave(str(src))
    out = run(THUMB, scratch, src, {"format": "jpeg"}).decoded()
    assert (out.width, out.height, out.bands) == (256, 171, 3)
    # The PNG output keeps the alpha channel.
    assert run(THUMB, scratch, src, {"format": "png"}).decoded().bands == 4


@pytest.mark.parametrize("suffix", ["gif", "tif", "webp", "avif", "heic"])
def test_other_accepted_inputs(scratch: Path, suffix: str) -> None:
    src = scratch / f"input.{suffix}"
    try:
        photo(640, 480).write_to_file(str(src))
    except pyvips.Error:
        pytest.skip(f"this libvips cannot write .{suffix} to make the input")
    r = run(THUMB, scratch, src, {"size": 64})
    assert r.result is not None
    assert (r.result["width"], r.result["height"]) == (64, 48)


def test_no_cache_between_jobs_reading_the_same_path(scratch: Path) -> None:
    """Every attempt of a worker slot reads scratch/input.*: libvips' operation
    cache (keyed by file name) must not hand the next job the last job's image."""
    src = scratch / "input.jpg"
    photo(400, 300).jpegsave(str(src))
    first = run(THUMB, scratch, src, {"size": 100}).result
    photo(300, 400).jpegsave(str(src))
    second = run(THUMB, scratch, src, {"size": 100}).result
    assert first is not None and second is not None
    assert (first["width"], first["height"]) == (100, 75)
    assert (second["width"], second["height"]) == (75, 100)


# -- params ------------------------------------------------------------------------------


def test_params_default_from_the_profile_settings() -> None:
    assert THUMB.validate({}, THUMB_SETTINGS) == {
        "size": 256,
        "format": "webp",
        "quality": 80,
        "max_pixels": 100_000_000,
    }
    assert PREVIEW.validate({}, PREVIEW_SETTINGS)["size"] == 1280
    assert PREVIEW.validate({}, {}) == {
        "size": 1280,
        "format": "webp",
        "quality": 85,
        "max_pixels": 100_000_000,
    }
    custom = {"size": 64, "format": "png", "quality": 50, "max_pixels": 10}
    assert THUMB.validate({}, custom) == custom
    assert THUMB.validate({"size": 16, "format": "jpeg", "quality": 1}, THUMB_SETTINGS) == {
        "size": 16,
        "format": "jpeg",
        "quality": 1,
        "max_pixels": 100_000_000,
    }
    assert PREVIEW.validate({"size": 4096}, PREVIEW_SETTINGS)["size"] == 4096


@pytest.mark.parametrize(
    ("pipeline", "params"),
    [
        (THUMB, {"size": 15}),
        (THUMB, {"size": 1025}),
        (PREVIEW, {"size": 4097}),
        (THUMB, {"size": "256"}),
        (THUMB, {"size": True}),
        (THUMB, {"size": 100.0}),
        (THUMB, {"format": "gif"}),
        (THUMB, {"format": None}),
        (THUMB, {"format": ["webp"]}),  # unhashable: a 4xx, not a TypeError
        (THUMB, {"quality": 0}),
        (THUMB, {"quality": 101}),
        (THUMB, {"max_pixels": 10**12}),  # the profile's to set, not the caller's
        (THUMB, {"width": 100}),
    ],
)
def test_bad_params_are_refused(pipeline: registry.Pipeline, params: dict[str, Any]) -> None:
    with pytest.raises(JobError) as info:
        pipeline.validate(params, THUMB_SETTINGS)
    assert info.value.code == "INVALID_PARAMS"


def test_a_bad_profile_max_pixels_is_refused() -> None:
    with pytest.raises(JobError, match="max_pixels"):
        THUMB.validate({}, {"max_pixels": "lots"})


def test_no_input_object(scratch: Path) -> None:
    with pytest.raises(JobError) as info:
        run(THUMB, scratch, None)
    assert info.value.code == "INVALID_PARAMS"


# -- hostile input -----------------------------------------------------------------------


def test_truncated_jpeg_is_corrupt(scratch: Path) -> None:
    whole = scratch / "whole.jpg"
    photo(1000, 800).jpegsave(str(whole))
    src = scratch / "input.jpg"
    src.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    whole.unlink()
    assert failure(THUMB, scratch, src) == "CORRUPT_INPUT"


def test_random_bytes_named_jpg_are_unsupported(scratch: Path) -> None:
    src = scratch / "input.jpg"
    src.write_bytes(os.urandom(20_000).replace(b"\xff\xd8", b"\x00\x00"))
    assert failure(THUMB, scratch, src) == "UNSUPPORTED_FORMAT"


def test_empty_file_is_corrupt(scratch: Path) -> None:
    src = scratch / "input.jpg"
    src.write_bytes(b"")
    assert failure(THUMB, scratch, src) == "CORRUPT_INPUT"


def test_magic_bytes_then_garbage_is_corrupt(scratch: Path) -> None:
    src = scratch / "input.png"
    src.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00garbage" * 100)
    assert failure(THUMB, scratch, src) == "CORRUPT_INPUT"


def test_png_with_a_bad_data_crc_is_corrupt(scratch: Path) -> None:
    data = bytearray(png(64, 64))
    data[-20] ^= 0xFF  # inside the IDAT chunk: header fine, pixels not
    src = scratch / "input.png"
    src.write_bytes(bytes(data))
    assert failure(THUMB, scratch, src) == "CORRUPT_INPUT"


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("input.ppm", lambda p: photo(64, 64).ppmsave(p)),  # libvips reads it; we do not
        ("input.v", lambda p: photo(64, 64).vipssave(p)),
        ("input.csv", lambda p: photo(8, 8)[0].csvsave(p)),
        ("input.svg", lambda p: Path(p).write_text('<svg xmlns="http://www.w3.org/2000/svg"/>')),
        ("input.pdf", lambda p: Path(p).write_bytes(b"%PDF-1.4\n%%EOF\n")),
    ],
)
def test_formats_outside_the_allow_list_are_unsupported(
    scratch: Path, name: str, make: Any
) -> None:
    src = scratch / name
    make(str(src))
    assert failure(THUMB, scratch, src) == "UNSUPPORTED_FORMAT"


def test_other_loaders_are_blocked_inside_libvips(scratch: Path) -> None:
    """Defence in depth: even a loader our sniffer would never pick is blocked."""
    image._pyvips()
    src = scratch / "x.ppm"
    photo(8, 8).ppmsave(str(src))
    with pytest.raises(pyvips.Error):
        pyvips.Image.new_from_file(str(src))


def test_decompression_bomb_is_refused_before_decoding(scratch: Path) -> None:
    src = scratch / "input.png"
    png_bomb(src)  # 12000 x 12000 = 144 Mpx in < 1 MB
    assert src.stat().st_size < 1_000_000
    assert failure(THUMB, scratch, src) == "LIMIT_EXCEEDED"
    with pytest.raises(JobError, match="12000x12000"):
        run(THUMB, scratch, src)


def jpeg_claiming(path: Path, width: int, height: int) -> None:
    """A real small JPEG whose frame header (SOF0) is rewritten to claim width x height."""
    path.write_bytes(photo(64, 64).jpegsave_buffer(Q=50, strip=True))
    data = bytearray(path.read_bytes())
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    path.write_bytes(bytes(data))


def test_a_jpeg_claiming_65000_squared_is_refused(scratch: Path) -> None:
    src = scratch / "input.jpg"
    jpeg_claiming(src, 65_000, 65_000)
    header = pyvips.Image.new_from_file(str(src))  # the header parses: only the size is a lie
    assert (header.width, header.height) == (65_000, 65_000)
    assert failure(PREVIEW, scratch, src) == "LIMIT_EXCEEDED"


def test_a_bare_jpeg_header_is_corrupt(scratch: Path) -> None:
    src = scratch / "input.jpg"
    src.write_bytes(jpeg_header(640, 480))  # SOF but no tables and no scan
    assert failure(THUMB, scratch, src) == "CORRUPT_INPUT"


def test_the_profile_pixel_limit_applies(scratch: Path) -> None:
    src = scratch / "input.png"
    photo(100, 100).pngsave(str(src))
    with pytest.raises(JobError) as info:
        run(THUMB, scratch, src, settings={**THUMB_SETTINGS, "max_pixels": 9_999})
    assert info.value.code == "LIMIT_EXCEEDED"
    ok = run(THUMB, scratch, src, settings={**THUMB_SETTINGS, "max_pixels": 10_000})
    assert ok.result is not None


# -- the module and the child's sandbox ------------------------------------------------


def test_importing_the_module_does_not_load_pyvips() -> None:
    code = (
        "import sys, hypermedia.pipelines.image as m; "
        "assert 'pyvips' not in sys.modules and m._vips is None"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_missing_libvips_is_a_dependency_failure(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(image, "_vips", None)
    monkeypatch.setitem(sys.modules, "pyvips", None)  # import pyvips -> ImportError
    src = scratch / "input.png"
    src.write_bytes(png(4, 4))
    with pytest.raises(JobError) as info:
        run(THUMB, scratch, src)
    assert info.value.code == "DEPENDENCY_FAILED"


def test_pyvips_works_in_an_empty_environment(tmp_path: Path) -> None:
    """The worker's child runs ``python -I`` with env={}: libvips must load there."""
    src = tmp_path / "input.jpg"
    photo(300, 200).jpegsave(str(src))
    code = (
        "import json, sys\n"
        "from hypermedia.pipelines import image, registry\n"
        "ctx = registry.Context(sys.argv[1], lambda p: None, sys.argv[2])\n"
        "params = image.THUMBNAIL.validate({'size': 30}, {})\n"
        "print(json.dumps(image.THUMBNAIL.run(params, ctx)))\n"
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
    assert (tmp_path / "thumb.webp").exists()

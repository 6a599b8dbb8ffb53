"""image.thumbnail, image.preview and image.compress: re-encoded copies of a photo, on libvips.

* ``image.thumbnail`` and ``image.preview`` fit the image to a ``width`` x
  ``height`` box (``fit``: cover, contain, inside or fill) and save it as
  WebP, JPEG, PNG or AVIF.  Outputs of type ``thumb`` and ``preview``.
* ``image.compress`` re-encodes it at ``quality``, downscaled only when it is
  larger than ``max_width`` x ``max_height`` (aspect kept), its dimensions
  kept otherwise.  Output of type ``compressed``.

All three read JPEG, PNG, WebP, AVIF, GIF, TIFF and HEIC (where this libvips
has an HEVC decoder), decided by the file's content, never its name; shrink
on load; turn the image upright by its EXIF orientation; convert it to 8-bit
sRGB (through its ICC profile when it has one); read the first frame of an
animated image; and strip the metadata (EXIF, XMP, GPS, IPTC, ICC) unless the
profile sets ``keep_metadata`` (then EXIF, XMP and IPTC are kept, with the
orientation reset since the pixels are upright).  An output's metadata and the
job's result are ``{width, height, format, bytes}``.  They report no
``usage``: credits charge the input's exact size, which the engine knows (a
rounded ``usage.mb`` charged a 69-byte file nothing at 1,000 credits/MB).

The settings are data (``SCHEMAS``): a profile version is checked against them
when it is created, and a job's params override the profile's, except
``max_pixels``, which only a profile sets.  See docs/pipelines.md.

pyvips is imported on the first run (``imaging.load``), not at import time, so
the registry loads without libvips installed; a job then fails with
DEPENDENCY_FAILED, and ``available()`` says so beforehand.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from hypermedia.errors import JobError
from hypermedia.pipelines import imaging
from hypermedia.pipelines.imaging import DEFAULT_MAX_PIXELS, FORMATS
from hypermedia.pipelines.registry import Context, Pipeline, Runner, register
from hypermedia.pipelines.schema import Field, Schema, clean_settings, validator
from hypermedia.storage import sniff

FITS = ("cover", "contain", "inside", "fill")
MAX_SIDE = 8192  # a thumbnail or preview box side
MAX_BOX_PIXELS = 40_000_000  # and its area: a box this size is a copy, not a preview
MAX_COMPRESS_SIDE = 16_383  # the largest WebP; larger images are downscaled to it
MAX_PIXELS_LIMIT = 1_000_000_000  # what a profile may raise max_pixels to


def _max_pixels() -> Field:
    return Field(
        int,
        DEFAULT_MAX_PIXELS,
        1,
        MAX_PIXELS_LIMIT,
        overridable=False,
        doc="images with more pixels are refused before decoding (LIMIT_EXCEEDED)",
    )


def _common(quality: int) -> dict[str, Field]:
    return {
        "format": Field(str, "webp", choices=tuple(FORMATS), doc="output format"),
        "quality": Field(int, quality, 1, 100, doc="encoder quality (PNG ignores it)"),
        "keep_metadata": Field(
            bool, False, doc="keep EXIF (with GPS), XMP and IPTC; stripped by default"
        ),
        "max_pixels": _max_pixels(),
    }


def _box_schema(side: int, quality: int, fit: str) -> dict[str, Field]:
    return {
        "width": Field(int, side, 1, MAX_SIDE, doc="box width in pixels"),
        "height": Field(int, side, 1, MAX_SIDE, doc="box height in pixels"),
        "fit": Field(str, fit, choices=FITS, doc="how the image meets the box"),
        **_common(quality),
    }


THUMBNAIL_SCHEMA: Schema = _box_schema(200, 85, "cover")
PREVIEW_SCHEMA: Schema = _box_schema(1280, 82, "inside")
COMPRESS_SCHEMA: Schema = {
    "max_width": Field(int, 4096, 1, MAX_COMPRESS_SIDE, doc="downscale wider images to this"),
    "max_height": Field(int, 4096, 1, MAX_COMPRESS_SIDE, doc="downscale taller images to this"),
    **_common(80),
}


def _check_box(values: dict[str, Any]) -> None:
    if values["width"] * values["height"] > MAX_BOX_PIXELS:
        raise JobError("INVALID_PARAMS", f"width x height must be at most {MAX_BOX_PIXELS} pixels")


# Shared with the other libvips pipelines (pdf.preview, storage.dedup_check),
# which take libvips, the input checks and the encoders from here.
ACCEPTED = frozenset(imaging.LOADER_FOR)


def _pyvips() -> Any:
    return imaging.load()


def _check_input(vips: Any, path: str, max_pixels: int) -> imaging.Header:
    return imaging.check_input(vips, path, max_pixels)


def _save(vips: Any, image: Any, path: str, fmt: str, quality: int, keep: bool = False) -> None:
    imaging.save(vips, image, path, fmt, quality, keep)


def available() -> str | None:
    """None when libvips (8.13 or newer) is there for the image job types, else why not."""
    return imaging.probe()


# -- running ---------------------------------------------------------------------------

# Progress is reported for slow attempts only: each report is a database write
# in the worker, and a 50 ms thumbnail has nothing to report (its completion
# says it all).  libvips says how far its evaluation got, strip by strip.
PROGRESS_AFTER_S = 0.5
PROGRESS_EVERY_S = 1.0
# Only an attempt with more work than this (in pixels) is watched at all:
# libvips then calls into Python for every strip it finishes (~6% of a 4-16 MP
# thumbnail's CPU), which pays only for attempts that can run past 0.5 s.
PROGRESS_PIXELS = 8_000_000


class Progress:
    """A libvips "eval" callback sending throttled progress reports."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.next = time.monotonic() + PROGRESS_AFTER_S

    def __call__(self, image: Any, progress: Any) -> None:
        now = time.monotonic()
        if now >= self.next:
            self.next = now + PROGRESS_EVERY_S
            self.ctx.progress(min(99, int(progress.percent)), "resizing and encoding")


# Formats whose size the ledger reads from their header as they are stored
# (storage/sniff.py; a JPEG's EXIF orientation too): reported again, the
# completion would leave the fast path (a result with input facts writes the
# input object too) for nothing.  Each is checked (_sniffed_as_shown): a
# JPEG's frame header can lie past the head the ledger reads, a GIF's screen
# can say another size than its frames.
SNIFFED = frozenset({"jpegload", "pngload", "webpload", "gifload"})


def _runner(job_type: str, schema: Schema, output_type: str) -> Runner:
    box = "fit" in schema

    def run(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        if ctx.input_path is None:
            raise JobError("INVALID_PARAMS", f"{job_type} needs an input object")
        # The stored params were validated at enqueue; cleaning them again fills
        # in what a job queued by an older version of this module lacks.
        p = clean_settings(schema, {k: v for k, v in params.items() if k in schema})
        vips = imaging.load()
        imaging.temp_in(ctx.scratch)
        header = imaging.check_input(vips, ctx.input_path, p["max_pixels"])
        fmt = p["format"]
        ext, mime = FORMATS[fmt]
        name = f"{output_type}.{ext}"
        try:
            # Lazy: the decode, shrink and encode all happen inside the save.
            if box:
                image = imaging.fit(vips, ctx.input_path, header, p["width"], p["height"], p["fit"])
            else:
                image = imaging.fit(
                    vips, ctx.input_path, header, p["max_width"], p["max_height"], "inside"
                )
            if _work_pixels(header, p, box) > PROGRESS_PIXELS:
                image.set_progress(True)
                image.signal_connect("eval", Progress(ctx))
            path = os.path.join(ctx.scratch, name)
            imaging.save(vips, image, path, fmt, p["quality"], p["keep_metadata"])
            width, height = int(image.width), int(image.height)
        except vips.Error as exc:
            raise imaging.failure(exc, header) from None
        meta = {"width": width, "height": height, "format": fmt, "bytes": os.path.getsize(path)}
        ctx.output(output_type, mime, dict(meta), path=name)
        sniffed = header.loader == "jpegload" or (header.loader in SNIFFED and not header.turned)
        if sniffed and _sniffed_as_shown(ctx.input_path, header):
            return meta
        # Only a decoder knows a TIFF's or a HEIF's size, or that a PNG or a
        # WebP is turned (their EXIF may lie past the head the ledger
        # sniffs): the input object takes its size as shown from here.
        width, height = header.upright
        return {**meta, "input_facts": {"width": width, "height": height}}

    return run


def _sniffed_as_shown(path: str, header: imaging.Header) -> bool:
    """Whether the ledger read this image's size as shown from its head when
    it was stored.  Not when a JPEG's frame header lies past the head it
    reads (a press profile or a large XMP block before it), nor when libvips
    turns the image by an orientation the sniffer does not read, nor when a
    GIF's screen says another size than its frames (libvips shows a 120 x 80
    GIF whose screen says 10 x 10 or 0 x 0 at 120 x 80).  Usually the first
    16 kB tell."""
    try:
        with open(path, "rb") as f:
            head = f.read(16 * 1024)
            if sniff.dimensions(head, header.mime) == header.upright:
                return True
            head += f.read(sniff.HEAD_BYTES - len(head))
    except OSError:
        return False
    return sniff.dimensions(head, header.mime) == header.upright


def _work_pixels(header: imaging.Header, p: dict[str, Any], box: bool) -> int:
    """The attempt's work in pixels, roughly.  A JPEG that shrinks on load by
    s decodes pixels/s² of them, but its entropy decoding still reads every
    coefficient: counted as pixels/s."""
    pixels = header.width * header.height
    if header.loader != "jpegload":
        return pixels
    width, height, mode = (
        (p["width"], p["height"], p["fit"]) if box else (p["max_width"], p["max_height"], "inside")
    )
    return pixels // imaging.jpeg_shrink(header, width, height, mode)


def _pipeline(
    job_type: str, schema: Schema, output_type: str, check: Callable[..., None] | None, doc: str
) -> Pipeline:
    return register(
        Pipeline(
            job_type,
            "images",
            validator(schema, check),
            _runner(job_type, schema, output_type),
            schema=schema,
            available=available,
            doc=doc,
            warm=imaging.warm,
            needs_input=True,
        )
    )


THUMBNAIL = _pipeline(
    "image.thumbnail",
    THUMBNAIL_SCHEMA,
    "thumb",
    _check_box,
    "a small copy fitted to a box (default 200x200 WebP, cover)",
)
PREVIEW = _pipeline(
    "image.preview",
    PREVIEW_SCHEMA,
    "preview",
    _check_box,
    "a screen-sized copy fitted inside a box (default 1280x1280 WebP)",
)
COMPRESS = _pipeline(
    "image.compress",
    COMPRESS_SCHEMA,
    "compressed",
    None,
    "the image re-encoded (default WebP q80), downscaled only beyond max_width x max_height",
)

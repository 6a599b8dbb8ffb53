"""image.thumbnail and image.preview: a downscaled, re-encoded copy of a photo, on libvips.

Both fit the image inside a ``size`` x ``size`` box (aspect kept, never
upscaled), turn it upright by its EXIF orientation, and save it as WebP, JPEG
or PNG with all metadata (EXIF, XMP, GPS, ICC) stripped.  The output is a new
object of type ``thumb`` or ``preview``.

Params (defaults from the profile's settings): ``size`` (16..1024 for a
thumbnail, 16..4096 for a preview), ``format`` (webp, jpeg, png), ``quality``
(1..100).  The profile's ``max_pixels`` (default 100 million) is copied into
the params at enqueue time, so a job records the limit it ran under.

Hostile input (DESIGN §10): the file's magic bytes must name an allowed format,
every other libvips loader is blocked in the process, the header is read
before any pixel is decoded and an image over ``max_pixels`` is refused
(decompression bombs), and decoding fails on the first error instead of
producing garbage from a damaged file.  Failure reasons never carry the file's
path or libvips' own words.

pyvips is imported on the first run, not at import time, so the registry
loads without libvips installed; a job then fails with DEPENDENCY_FAILED.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from hypermedia.errors import JobError
from hypermedia.pipelines.registry import Context, Pipeline, Runner, Validator, register
from hypermedia.storage.sniff import media_type

MIN_SIZE = 16
DEFAULT_MAX_PIXELS = 100_000_000
FORMATS = {
    "webp": ("webp", "image/webp"),
    "jpeg": ("jpg", "image/jpeg"),
    "png": ("png", "image/png"),
}
# What the sniffer may call an input (magic bytes, never the name).
ACCEPTED = {
    "image/jpeg",
    "image/png",
    "image/webp",
    "image/gif",
    "image/tiff",
    "image/heic",
    "image/avif",
}
# The only libvips loaders left unblocked, by class and by the nickname an
# opened image reports in its ``vips-loader`` field.
LOADER_CLASSES = (
    "VipsForeignLoadJpeg",
    "VipsForeignLoadPng",
    "VipsForeignLoadWebp",
    "VipsForeignLoadNsgif",
    "VipsForeignLoadTiff",
    "VipsForeignLoadHeif",
)
LOADERS = {"jpegload", "pngload", "webpload", "gifload", "tiffload", "heifload"}

_vips: Any = None


def _pyvips() -> Any:
    """Import and configure pyvips once per process (the child)."""
    global _vips
    if _vips is not None:
        return _vips
    try:
        import pyvips
    except Exception:  # ImportError, or OSError when libvips.so.42 is missing
        raise JobError("DEPENDENCY_FAILED", "libvips is not installed") from None
    # The operation cache is keyed by file name, and every attempt of a slot
    # reads the same scratch/input.*: a cache would hand one job another's image.
    pyvips.cache_set_max(0)
    pyvips.cache_set_max_mem(0)
    pyvips.cache_set_max_files(0)
    # One job, one core: the worker runs one child per slot.
    pyvips.concurrency_set(1)
    # Allow-list the decoders: block every loader, then let the few we accept back in.
    pyvips.block_untrusted_set(True)
    pyvips.operation_block_set("VipsForeignLoad", True)
    for cls in LOADER_CLASSES:
        pyvips.operation_block_set(cls, False)
    _vips = pyvips
    return pyvips


# -- params ----------------------------------------------------------------------------


def _int_in(value: Any, name: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise JobError("INVALID_PARAMS", f"{name} must be an integer from {low} to {high}")
    return value


def _validator(job_type: str, default_size: int, max_size: int, default_quality: int) -> Validator:
    def validate(params: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
        unknown = set(params) - {"size", "format", "quality"}
        if unknown:
            raise JobError("INVALID_PARAMS", f"unknown parameters: {', '.join(sorted(unknown))}")
        size = params.get("size", settings.get("size", default_size))
        size = _int_in(size, "size", MIN_SIZE, max_size)
        fmt = params.get("format", settings.get("format", "webp"))
        if not isinstance(fmt, str) or fmt not in FORMATS:
            raise JobError("INVALID_PARAMS", f"format must be one of {', '.join(FORMATS)}")
        quality = _int_in(
            params.get("quality", settings.get("quality", default_quality)), "quality", 1, 100
        )
        max_pixels = settings.get("max_pixels", DEFAULT_MAX_PIXELS)
        if not isinstance(max_pixels, int) or isinstance(max_pixels, bool) or max_pixels < 1:
            raise JobError("INVALID_PARAMS", f"the {job_type} profile has a bad max_pixels")
        return {"size": size, "format": fmt, "quality": quality, "max_pixels": max_pixels}

    return validate


# -- running ---------------------------------------------------------------------------


def _check_input(vips: Any, path: str, max_pixels: int) -> None:
    """Refuse what must not be decoded, reading only the magic bytes and the header."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        raise JobError("CORRUPT_INPUT", "the input file could not be read") from None
    if not head:
        raise JobError("CORRUPT_INPUT", "the input file is empty")
    if media_type(head) not in ACCEPTED:
        raise JobError(
            "UNSUPPORTED_FORMAT", "not a supported image format (JPEG, PNG, WebP, GIF, TIFF, HEIF)"
        )
    try:
        header = vips.Image.new_from_file(path, access="sequential", fail_on="error")
        loader = header.get("vips-loader")
        width, height = int(header.width), int(header.height)
    except vips.Error:
        raise JobError("CORRUPT_INPUT", "the image header is damaged or unreadable") from None
    if loader not in LOADERS:
        raise JobError("UNSUPPORTED_FORMAT", "not a supported image format")
    if width * height > max_pixels:
        raise JobError(
            "LIMIT_EXCEEDED",
            f"the image is {width}x{height}, over this profile's limit of {max_pixels} pixels",
        )


# Header properties of every image; anything else an image carries is metadata.
_PROPERTIES = {
    *("width", "height", "bands", "format", "coding", "interpretation"),
    *("xoffset", "yoffset", "xres", "yres", "filename"),
}


def _bare(image: Any) -> Any:
    """A copy of ``image`` without its metadata (EXIF, XMP, IPTC, ICC, orientation...)."""
    image = image.copy()
    for name in image.get_fields():
        if name not in _PROPERTIES:
            image.remove(name)
    return image


def _strip_webp(path: str) -> None:
    """Drop the ICCP, EXIF and XMP chunks from a WebP file we wrote.

    libvips 8.14's webpsave ignores ``strip`` and always writes an EXIF chunk
    (rebuilt from nothing, but EXIF all the same); this is our own output, so
    the RIFF container is rewritten here rather than trusted to the saver.
    """
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"RIFF" or data[8:12] != b"WEBP" or data[12:16] != b"VP8X":
        return  # a simple (VP8 / VP8L only) file has no room for metadata
    chunks, i = [], 12
    while i + 8 <= len(data):
        kind = data[i : i + 4]
        size = int.from_bytes(data[i + 4 : i + 8], "little")
        end = i + 8 + size + (size & 1)
        if kind == b"VP8X":
            flags = data[i + 8] & ~(0x20 | 0x08 | 0x04)  # ICC, EXIF, XMP present
            chunks.append(data[i : i + 8] + bytes([flags]) + data[i + 9 : end])
        elif kind not in (b"ICCP", b"EXIF", b"XMP "):
            chunks.append(data[i:end])
        i = end
    body = b"WEBP" + b"".join(chunks)
    with open(path, "wb") as f:
        f.write(b"RIFF" + len(body).to_bytes(4, "little") + body)


def _save(vips: Any, image: Any, path: str, fmt: str, quality: int) -> None:
    if vips.at_least_libvips(8, 15):
        strip: dict[str, Any] = {"keep": "none"}
    else:
        strip = {"strip": True}
    image = _bare(image)
    if fmt == "webp":
        image.webpsave(path, Q=quality, **strip)
        _strip_webp(path)
    elif fmt == "jpeg":
        if image.hasalpha():
            image = image.flatten(background=[255] * (image.bands - 1))
        image.jpegsave(path, Q=quality, optimize_coding=True, **strip)
    else:
        image.pngsave(path, compression=6, **strip)


def _runner(output_type: str, default_size: int) -> Runner:
    def run(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
        if ctx.input_path is None:
            raise JobError("INVALID_PARAMS", f"image.{output_type} needs an input object")
        vips = _pyvips()
        size = int(params.get("size", default_size))
        fmt = params.get("format", "webp")
        quality = int(params.get("quality", 80))
        ctx.progress(5, "reading header")
        _check_input(vips, ctx.input_path, int(params.get("max_pixels", DEFAULT_MAX_PIXELS)))
        ext, mime = FORMATS[fmt]
        name = f"{output_type}.{ext}"
        out = os.path.join(ctx.scratch, name)
        ctx.progress(20, "resizing")
        try:
            # Lazy: the decode, shrink and encode all happen inside the save.
            image = vips.Image.thumbnail(
                ctx.input_path, size, height=size, size="down", no_rotate=False, fail_on="error"
            )
            _save(vips, image, out, fmt, quality)
            width, height = int(image.width), int(image.height)
        except vips.Error as exc:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(out)  # no half-written output left behind
            if "out of memory" in f"{exc.message} {exc.detail}".lower():
                raise MemoryError from None
            raise JobError("CORRUPT_INPUT", "the image data is damaged or truncated") from None
        nbytes = os.path.getsize(out)
        ctx.progress(100, "saved")
        ctx.output(output_type, mime, {"width": width, "height": height, "format": fmt}, path=name)
        return {"width": width, "height": height, "format": fmt, "bytes": nbytes}

    return run


THUMBNAIL = Pipeline(
    "image.thumbnail", "images", _validator("image.thumbnail", 256, 1024, 80), _runner("thumb", 256)
)
PREVIEW = Pipeline(
    "image.preview", "images", _validator("image.preview", 1280, 4096, 85), _runner("preview", 1280)
)
register(THUMBNAIL)
register(PREVIEW)

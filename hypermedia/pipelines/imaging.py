"""libvips for the image pipelines: set up once per child, check, fit, save.

Everything here runs in the worker's child (empty environment, memory and CPU
limits), except ``probe()``, which the worker may call to tell whether the
image job types can run on this host at all.

Hostile input (DESIGN §10) is met in layers:

* the file's magic bytes (``storage.sniff``, never its name) must name one of
  the accepted formats, and libvips must then pick the loader that format
  implies;
* every libvips loader is blocked in the process except that allow-list, and
  so are the "untrusted" operations, so an SVG, a PDF, PostScript or anything
  through ImageMagick can never be decoded, even by mistake;
* the header is read before any pixel is decoded and an image over the
  profile's ``max_pixels`` is refused (pixel floods: a small file claiming
  enormous dimensions), and so is one of more than ``MAX_BANDS`` channels (a
  16 MB TIFF of 4,000 channels held 8 GB) or, for a WebP, more than
  ``MAX_WEBP_FRAMES`` frames, counted from its chunk headers before libvips
  opens it (libvips walks a WebP's frames in quadratic time: 200,000 tiny
  frames in 10 MB ran for minutes), and for a progressive JPEG, more than
  ``MAX_JPEG_SCANS`` scans (each scan is decoded whole, whatever the
  shrink-on-load: 2,079 scans of 15 bytes each in a 400 kB flat 8000 x 8000
  held a worker slot for 25 s of CPU for one thumbnail);
* decoding fails on the first error (``fail_on="error"``) instead of handing on
  garbage, and a failure's reason never carries a path or libvips' own words.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import math
import mmap
import os
import re
import struct
from dataclasses import dataclass
from typing import Any

from hypermedia.errors import FILE_TOO_LARGE, SCRATCH_FULL, JobError
from hypermedia.storage.sniff import media_type

MIN_LIBVIPS = (8, 13)  # block_untrusted_set / operation_block_set / fail_on
DEFAULT_MAX_PIXELS = 100_000_000
# CMYK with alpha and a few spot colours fit; a thumbnail's memory grows with
# the channels, which max_pixels does not count.
MAX_BANDS = 16
MAX_WEBP_FRAMES = 10_000  # libvips reads 10,000 in well under a second
# libjpeg-turbo's advice for untrusted input (its fuzzers' limit); encoders
# write at most a few dozen.  At max_pixels, 500 scans decode in about 10 s.
MAX_JPEG_SCANS = 500

# Output format → (file extension, media type).
FORMATS = {
    "webp": ("webp", "image/webp"),
    "jpeg": ("jpg", "image/jpeg"),
    "png": ("png", "image/png"),
    "avif": ("avif", "image/avif"),
}
# What the sniffer may call an input → the loader libvips must then pick for it.
LOADER_FOR = {
    "image/jpeg": "jpegload",
    "image/png": "pngload",
    "image/webp": "webpload",
    "image/gif": "gifload",
    "image/tiff": "tiffload",
    "image/heic": "heifload",
    "image/avif": "heifload",
}
# The only libvips loader classes left unblocked (their file/buffer/source
# subclasses follow their base class).
LOADER_CLASSES = (
    "VipsForeignLoadJpeg",
    "VipsForeignLoadPng",
    "VipsForeignLoadWebp",
    "VipsForeignLoadNsgif",
    "VipsForeignLoadTiff",
    "VipsForeignLoadHeif",
)
ACCEPTED_NAMES = "JPEG, PNG, WebP, AVIF, GIF, TIFF, HEIC"

_vips: Any = None


def load() -> Any:
    """Import and configure pyvips once per process (the child)."""
    global _vips
    if _vips is not None:
        return _vips
    try:
        import pyvips
    except Exception:  # ImportError, or OSError when no libvips can be loaded
        raise JobError("DEPENDENCY_FAILED", "libvips is not installed") from None
    if not pyvips.at_least_libvips(*MIN_LIBVIPS):
        raise JobError("DEPENDENCY_FAILED", "libvips is too old (8.13 or newer is needed)")
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


def temp_in(scratch: str) -> None:
    """Make libvips write its temporary files into the attempt's scratch directory.

    libvips decodes an image it cannot stream into a temporary file once the
    pixels are over 100 MB (an animated WebP's canvas of 5,200 x 5,200 and up:
    its frames are composited there), in ``$TMPDIR``, else ``/tmp``.  The
    child runs with an empty environment and its sandbox lets it write in its
    scratch directory only: ``/tmp`` was refused, and a valid image failed as
    CORRUPT_INPUT.  libvips reads ``TMPDIR`` each time it makes a file (so
    per attempt, not once per child); the file is unlinked when the image is
    freed, and the worker empties the scratch directory after the attempt.
    """
    os.environ["TMPDIR"] = scratch


def warm() -> Any:
    """``load``, then one tiny JPEG to WebP thumbnail in memory (a child's
    warm-up, before its first job): the first attempt then finds libjpeg,
    libwebp and the resize code set up, instead of paying 2-3 ms for it.
    A failure here is the registry's to ignore: the attempt reports it."""
    vips = load()
    jpeg = vips.Image.black(64, 48, bands=3).jpegsave_buffer(Q=90)
    vips.Image.thumbnail_buffer(jpeg, 16, height=16, crop="centre").webpsave_buffer(Q=85)
    return vips


def probe() -> str | None:
    """None if libvips can run the image pipelines here, else a short reason.

    Cheap and safe in the worker itself: libvips is not initialised (no
    threads, no loaders), only found and asked its version.
    """
    if importlib.util.find_spec("pyvips") is None:
        return "pyvips is not installed"
    version = _bundled_version() or _system_version()
    if version is None:
        return "libvips is not installed (pip install pyvips-binary)"
    if version[:2] < MIN_LIBVIPS:
        return f"libvips {'.'.join(map(str, version))} is too old (8.13 or newer is needed)"
    return None


def _bundled_version() -> tuple[int, ...] | None:
    """libvips' version from the pyvips-binary wheel (its own copy of the library)."""
    if importlib.util.find_spec("_libvips") is None:
        return None
    try:
        text = importlib.metadata.version("pyvips-binary")
    except importlib.metadata.PackageNotFoundError:
        return None  # a _libvips built from source against the system library
    try:
        return tuple(int(p) for p in text.split(".")[:3])
    except ValueError:
        return None


def _system_version() -> tuple[int, ...] | None:
    import ctypes

    try:
        lib = ctypes.CDLL("libvips.so.42")
        return tuple(int(lib.vips_version(i)) for i in range(3))  # no vips_init needed
    except (OSError, AttributeError):
        return None


# -- checking the input ------------------------------------------------------------------


@dataclass(frozen=True)
class Header:
    width: int
    height: int
    loader: str
    mime: str
    size: int  # bytes on disk
    icc: bool  # an embedded colour profile: convert through it to sRGB
    compression: str = ""  # HEIF containers: "hevc" or "av1"
    turned: bool = False  # its EXIF orientation swaps width and height (5..8)
    extra_bands: bool = False  # channels past its colour and alpha (see fit)

    @property
    def upright(self) -> tuple[int, int]:
        return (self.height, self.width) if self.turned else (self.width, self.height)


def check_input(vips: Any, path: str, max_pixels: int) -> Header:
    """Refuse what must not be decoded, reading only the magic bytes and the header."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        raise JobError("CORRUPT_INPUT", "the input file could not be read") from None
    if not head:
        raise JobError("CORRUPT_INPUT", "the input file is empty")
    mime = media_type(head)
    if mime not in LOADER_FOR:
        raise JobError("UNSUPPORTED_FORMAT", f"not a supported image format ({ACCEPTED_NAMES})")
    if mime == "image/webp" and webp_frames(path, MAX_WEBP_FRAMES) > MAX_WEBP_FRAMES:
        raise JobError("LIMIT_EXCEEDED", f"the animation has more than {MAX_WEBP_FRAMES} frames")
    try:
        header = vips.Image.new_from_file(path, access="sequential", fail_on="error")
        loader = str(header.get("vips-loader"))
        width, height, bands = int(header.width), int(header.height), int(header.bands)
        fields = set(header.get_fields())
        compression = str(header.get("heif-compression")) if "heif-compression" in fields else ""
        turned = "orientation" in fields and header.get("orientation") in (5, 6, 7, 8)
        progressive = "jpeg-multiscan" in fields and bool(header.get("jpeg-multiscan"))
        extra = bands > _COLOUR_BANDS.get(str(header.interpretation), 3) + 1
    except vips.Error as exc:
        if "labq" in str(exc).lower():
            # The bundled libvips (8.18) cannot read any 8-bit CIELab TIFF,
            # not even its own: the file is sound, this server cannot read it.
            raise JobError(
                "UNSUPPORTED_FORMAT", "8-bit CIELab TIFF images cannot be decoded on this server"
            ) from None
        raise JobError("CORRUPT_INPUT", "the image header is damaged or unreadable") from None
    if loader != LOADER_FOR[mime]:
        raise JobError("UNSUPPORTED_FORMAT", "the file's content does not match its image format")
    if width * height > max_pixels:
        raise JobError(
            "LIMIT_EXCEEDED",
            f"the image is {width}x{height}, over this profile's limit of {max_pixels} pixels",
        )
    if bands > MAX_BANDS:
        raise JobError("LIMIT_EXCEEDED", f"the image has {bands} channels, more than {MAX_BANDS}")
    # Baseline JPEGs (one scan) are not read again: only progressive ones.
    if progressive and jpeg_scans(path, MAX_JPEG_SCANS) > MAX_JPEG_SCANS:
        raise JobError("LIMIT_EXCEEDED", f"the JPEG has more than {MAX_JPEG_SCANS} scans")
    icc = "icc-profile-data" in fields
    return Header(width, height, loader, mime, size, icc, compression, turned, extra)


# Colour channels by interpretation (sRGB, RGB16, LAB, scRGB... have three).
_COLOUR_BANDS = {"b-w": 1, "grey16": 1, "cmyk": 4}


def webp_frames(path: str, cap: int) -> int:
    """How many animation frames (ANMF chunks) a WebP has, counted up to
    ``cap + 1`` by walking its RIFF chunk headers (nothing is decoded)."""
    count = 0
    try:
        with open(path, "rb") as f:
            f.seek(12)  # RIFF, size, WEBP
            while count <= cap and len(head := f.read(8)) == 8:
                size = struct.unpack_from("<I", head, 4)[0]
                count += head[:4] == b"ANMF"
                f.seek(size + (size & 1), os.SEEK_CUR)
    except OSError:
        pass  # libvips says what is wrong with it next
    return count


def jpeg_scans(path: str, cap: int) -> int:
    """How many scans (SOS markers) a JPEG has, counted up to ``cap + 1``.
    FF DA is a marker wherever it is: in entropy-coded data an FF is always
    followed by 00 or a restart marker (metadata segments may add to it)."""
    count = at = 0
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            while count <= cap and (at := m.find(b"\xff\xda", at) + 1):
                count += 1
    except (OSError, ValueError):
        pass  # libvips says what is wrong with it next
    return count


_NO_MEMORY = (
    "out of memory",
    "allocat",
    "insufficient memory",
    "bufferpool",
    "webpsave: unable to encode",
)


# A side past which libvips' "bad dimensions" is about the side, not damage:
# it refuses to make an image with a side near 100,000,000 (VIPS_MAX_COORD,
# with its resize kernels' margins), however few its pixels.
LONG_SIDE = 10_000_000


def failure(exc: Any, header: Header) -> BaseException:
    """What a libvips error while decoding or saving means for the job."""
    text = f"{getattr(exc, 'message', '')} {getattr(exc, 'detail', '')}".lower()
    # libvips says "out of memory"; its encoders' libraries (aom: "Failed to
    # allocate context buffers") speak of allocating: a retry with more helps.
    # So do libjpeg ("Insufficient memory", decoding or encoding), aom when it
    # cannot set up ("av1_create_context_and_bufferpool() failed") and
    # libwebp, whose failure libvips reports as "unable to encode" only: its
    # pixels were all decoded by then, so the input is not what is wrong.
    if any(words in text for words in _NO_MEMORY):
        return MemoryError()
    if "no space left" in text:
        return JobError("STORAGE_UNAVAILABLE", SCRATCH_FULL)
    if "file too large" in text:  # libvips deleted its partial file: only this tells
        return JobError("LIMIT_EXCEEDED", FILE_TOO_LARGE)
    if "permission denied" in text:
        # The sandbox refused a file libvips wanted (see temp_in): the
        # attempt's doing, not the input's (PERMISSION_DENIED in the child).
        return PermissionError()
    if "bad dimensions" in text and max(header.upright) > LONG_SIDE:
        # A sound strip wider than libvips works with (a 100,000,000 x 1 PNG):
        # it was "damaged or truncated", which sent the user looking for damage.
        w, h = header.upright
        return JobError(
            "LIMIT_EXCEEDED", f"the image is {w:,} x {h:,} pixels: too long a side to resize"
        )
    if header.loader == "heifload" and ("not been built in" in text or "plugin" in text):
        kind = (header.compression or "this").upper()
        return JobError(
            "UNSUPPORTED_FORMAT", f"{kind}-coded HEIF images cannot be decoded on this server"
        )
    return JobError("CORRUPT_INPUT", "the image data is damaged or truncated")


# -- resizing ----------------------------------------------------------------------------


def fit(vips: Any, path: str, header: Header, width: int, height: int, mode: str) -> Any:
    """The image at ``path`` fitted to a width x height box, upright and in sRGB.

    ``cover`` fills the box and crops the overflow around the centre; ``fill``
    stretches to the box; ``inside`` fits inside it, aspect kept, never
    upscaled; ``contain`` is ``inside`` centred on a transparent box of exactly
    width x height.  The image shrinks on load where the format allows (JPEG,
    WebP, HEIF), is turned by its EXIF orientation and, when animated, read
    for its first frame only.
    """
    if mode == "cover" and _enlarged_overflow(header, width, height) > MAX_COVER_OVERFLOW:
        return _cover_by_crop(vips, path, header, width, height)
    options: dict[str, Any] = {"height": height}
    if mode == "cover":
        options["crop"] = "centre"
    elif mode == "fill":
        options["size"] = "force"
    else:  # inside, contain
        options["size"] = "down"
    if header.icc:
        # Through the embedded profile (Display P3, Adobe RGB, CMYK...) to
        # sRGB, after the shrink; without one libvips assumes sRGB already.
        options["export_profile"] = "srgb"
    shrink = jpeg_shrink(header, width, height, mode) if header.loader == "jpegload" else 1
    if header.extra_bands:
        image = _colour_and_alpha(vips, path, header).thumbnail_image(width, **options)
    elif header.loader == "jpegload":
        # libvips' thumbnail leaves a factor of two for its own resize after a
        # JPEG's shrink-on-load; decoding straight to the smallest DCT scale
        # still at least the box (as sharp does by default) saves ~10% of the
        # work for the same result.  And where no scale keeps the shape
        # (shrink 1), thumbnail would shrink on load all the same: a 2974 x 59
        # strip inside 1000 x 10 came out 513 wide, not 504.
        loaded = vips.Image.jpegload(path, shrink=shrink, access="sequential", fail_on="error")
        image = loaded.thumbnail_image(width, **options)
    else:
        image = vips.Image.thumbnail(path, width, fail_on="error", **options)
    image = srgb(image)
    if mode == "contain" and (image.width, image.height) != (width, height):
        if not image.hasalpha():
            image = image.bandjoin(255)
        image = image.gravity("centre", width, height, extend="background", background=[0] * 4)
    return image


# How much larger than the box ``cover`` may enlarge an image before its crop,
# as libvips' thumbnail does: a 1 x 10000 strip into 300 x 100 became
# 300 x 3,000,000 (a minute and 2.6 GB, or an OOM).  Past it the centre is cut
# from the source first.  An image that only shrinks (a 20000 x 1200 panorama)
# keeps libvips' path and its shrink-on-load: what it resizes to is no larger
# than itself.
MAX_COVER_OVERFLOW = 16.0


def _enlarged_overflow(header: Header, width: int, height: int) -> float:
    """How many times the box's area ``cover`` enlarges the image to before its
    crop (0 when it does not enlarge it)."""
    w, h = header.upright
    scale = max(width / w, height / h)
    return 0.0 if scale <= 1 else scale**2 * w * h / (width * height)


def _cover_by_crop(vips: Any, path: str, header: Header, width: int, height: int) -> Any:
    """``cover`` for a very long, thin image: the region the box shows, cut
    from the source (upright, in sRGB, first frame), then resized to the box."""
    w, h = header.upright
    options = {"export_profile": "srgb"} if header.icc else {}
    # At its own size: only loaded, turned upright and converted.
    if header.extra_bands:
        image = _colour_and_alpha(vips, path, header).thumbnail_image(w, height=h, **options)
    else:
        image = vips.Image.thumbnail(path, w, height=h, size="down", fail_on="error", **options)
    scale = max(width / w, height / h)
    cw, ch = min(w, max(1, round(width / scale))), min(h, max(1, round(height / scale)))
    image = image.extract_area((w - cw) // 2, (h - ch) // 2, cw, ch)
    return srgb(image.thumbnail_image(width, height=height, size="force"))


def _colour_and_alpha(vips: Any, path: str, header: Header) -> Any:
    """An image with channels past its alpha (a print TIFF's saved selections,
    spot colours), loaded upright without them: libvips' resize premultiplies
    by the last channel, taking the extra one for the alpha.  Random access:
    turning a sequential read upright asks for its lines out of order, and
    every such TIFF with an orientation of 3 to 8 failed CORRUPT_INPUT unless
    much shrunk (a TIFF's strips are read where they lie, not all at once)."""
    image = vips.Image.new_from_file(path, access="random", fail_on="error").autorot()
    keep = _COLOUR_BANDS.get(str(image.interpretation), 3) + 1
    return image.extract_band(0, n=keep)


def jpeg_shrink(header: Header, width: int, height: int, mode: str) -> int:
    """The largest JPEG shrink-on-load (8, 4, 2 or 1) that keeps the box covered."""
    w, h = header.upright
    ratios = (w / width, h / height)
    # cover and fill are limited by the axis that shrinks least; inside and
    # contain by the one that shrinks most.
    factor = min(ratios) if mode in ("cover", "fill") else max(ratios)
    # libjpeg refuses a scale that leaves a side under one pixel (a 3 x 20000 strip).
    short = min(header.width, header.height)
    return next(
        (
            s
            for s in (8, 4, 2)
            if factor >= s and short >= s and _true_to_shape(w, h, s, width, height, mode)
        ),
        1,
    )


def _true_to_shape(w: int, h: int, shrink: int, width: int, height: int, mode: str) -> bool:
    """Whether shrinking on load by ``shrink`` keeps the output's shape within
    a pixel.  The shrunk sides are rounded down, and the resize after takes its
    aspect ratio from them (a 5000 x 3 strip shrunk by 2 is 2500 x 1, and came
    out 2500 wide instead of 1667): the image is fitted to the box from both
    sizes, and each side of the two must be within a pixel (before a cover's
    crop).  A fill stretches to the box whatever the shape."""
    if mode == "fill":
        return True
    true = _fitted(w, h, width, height, mode)
    loaded = _fitted(w // shrink, h // shrink, width, height, mode)
    if mode == "cover":  # cropped to the box after: its aspect within a pixel is enough
        return all(abs(a - b) < 1 for a, b in zip(true, loaded, strict=True))
    # inside and contain: these are the output's sides, rounded as libvips
    # rounds them (988 x 13 inside 288 x 468 is 288 x 3.79, so 4 high; shrunk
    # by 2 on load, 494 x 6 made it 288 x 3.50, so 3).
    return all(_whole(a) == _whole(b) for a, b in zip(true, loaded, strict=True))


def _whole(side: float) -> int:
    return math.floor(side + 0.5)


def _fitted(w: int, h: int, width: int, height: int, mode: str) -> tuple[float, float]:
    """The size of a w x h image scaled to the box (cover: to fill it; else to fit in it)."""
    scale = (max if mode == "cover" else min)(width / w, height / h)
    return w * scale, h * scale


def srgb(image: Any) -> Any:
    """8-bit sRGB (greyscale, 16-bit, CMYK without a profile, LAB...), alpha kept."""
    if image.interpretation != "srgb" or image.format != "uchar":
        image = image.colourspace("srgb")
    if image.format != "uchar":
        image = image.cast("uchar")
    return image


# -- saving ------------------------------------------------------------------------------

# Header properties of every image; anything else an image carries is metadata.
_PROPERTIES = {
    *("width", "height", "bands", "format", "coding", "interpretation"),
    *("xoffset", "yoffset", "xres", "yres", "filename"),
}
# What keep_metadata keeps: never the colour profile (the pixels are sRGB now)
# nor the orientation (the pixels are upright now: libvips writes 1).  libvips
# rebuilds EXIF from the ``exif-ifdN-*`` fields when it saves, so those stay too.
_KEPT = ("exif-data", "xmp-data", "iptc-data")
_ORIENTATION = ("orientation", "exif-ifd0-Orientation")


def _kept(name: str) -> bool:
    return (name in _KEPT or name.startswith("exif-ifd")) and name not in _ORIENTATION


def _bare(image: Any, keep: bool) -> Any:
    """A copy of ``image`` without its metadata (EXIF, XMP, IPTC, ICC, orientation...)."""
    image = image.copy()
    for name in image.get_fields():
        if name not in _PROPERTIES and not (keep and _kept(name)):
            image.remove(name)
    if keep and image.get_typeof("exif-data"):
        # The pixels are sRGB now: libexif wrote 65535 ("Uncalibrated") into
        # kept EXIF, which colour-managed readers take as unmanaged.
        image.set_type(GSTR, SRGB_TAG, "1 (sRGB, Short, 1 components, 2 bytes)")
    if keep and (blob := image.get_typeof("xmp-data")):
        image.set_type(blob, "xmp-data", _upright_xmp(image.get("xmp-data")))
    return image


def _carried(image: Any) -> str:
    """The kinds of metadata ``image`` has, as libvips' ``keep`` flags: "exif"
    for an image that had none made libvips write an EXIF block of its own,
    saying ColorSpace 65535 ("Uncalibrated")."""
    kinds = [k for k in ("exif", "xmp", "iptc") if image.get_typeof(f"{k}-data")]
    return "|".join(kinds) or "none"


# XMP's copy of the orientation, as an attribute or an element: the pixels
# are upright now, and a reader that trusts XMP turned them a second time.
_XMP_ORIENTATION = re.compile(
    rb"(tiff:Orientation\s*=\s*[\"'])\s*[2-8]\s*([\"'])|(<tiff:Orientation>)\s*[2-8]\s*(</tiff:Orientation>)"
)


def _upright_xmp(xmp: bytes) -> bytes:
    return _XMP_ORIENTATION.sub(lambda m: (m[1] or m[3]) + b"1" + (m[2] or m[4]), xmp)


SRGB_TAG = "exif-ifd2-ColorSpace"
GSTR = 64  # G_TYPE_STRING (pyvips.GValue.gstr_type): pyvips is imported lazily


def strip_webp(path: str) -> None:
    """Drop the ICCP, EXIF and XMP chunks from a WebP file we wrote.

    libvips 8.14's webpsave ignores ``strip`` and always writes an EXIF chunk
    (rebuilt from nothing, but EXIF all the same); this is our own output, so
    the RIFF container is rewritten here rather than trusted to the saver.
    """
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"RIFF" or data[8:12] != b"WEBP" or data[12:16] != b"VP8X":
        return  # a simple (VP8 / VP8L only) file has no room for metadata
    chunks, i, dropped = [], 12, False
    while i + 8 <= len(data):
        kind = data[i : i + 4]
        size = int.from_bytes(data[i + 4 : i + 8], "little")
        end = i + 8 + size + (size & 1)
        if kind == b"VP8X":
            flags = data[i + 8] & ~(0x20 | 0x08 | 0x04)  # ICC, EXIF, XMP present
            chunks.append(data[i : i + 8] + bytes([flags]) + data[i + 9 : end])
        elif kind in (b"ICCP", b"EXIF", b"XMP "):
            dropped = True
        else:
            chunks.append(data[i:end])
        i = end
    if not dropped:
        return
    body = b"WEBP" + b"".join(chunks)
    with open(path, "wb") as f:
        f.write(b"RIFF" + len(body).to_bytes(4, "little") + body)


def save(vips: Any, image: Any, path: str, fmt: str, quality: int, keep: bool) -> None:
    """Encode ``image`` to ``path``; metadata stripped unless ``keep`` (EXIF, XMP, IPTC)."""
    image = _bare(image, keep)
    if vips.at_least_libvips(8, 15):
        meta: dict[str, Any] = {"keep": _carried(image) if keep else "none"}
    else:
        meta = {"strip": not keep}
    if fmt == "jpeg" and image.hasalpha():
        image = image.flatten(background=[255] * (image.bands - 1))
    try:
        if fmt == "webp":
            image.webpsave(path, Q=quality, **meta)
            if not keep:
                strip_webp(path)
        elif fmt == "jpeg":
            image.jpegsave(path, Q=quality, optimize_coding=True, **meta)
        elif fmt == "avif":
            image.heifsave(path, Q=quality, compression="av1", **meta)
        else:
            image.pngsave(path, compression=6, **meta)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # no half-written output left behind
        raise

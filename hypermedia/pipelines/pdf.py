"""pdf.preview: pages of a PDF rendered with pdfium, saved as WebP, PNG or JPEG by libvips.

The profile (``pdf-preview:v1``) picks the pages, ``first_page`` to
``last_page`` (1-based; the range is clamped to the document), and their size:
``width`` pixels wide, height by the page's aspect, or, with ``dpi`` > 0, the
page's own size at that resolution.  Each rendered page becomes an output
object of type ``page_preview_{n}`` named ``page-{n}.{ext}``, with its page
number, pixel size, format and byte size as metadata (one type per page: a
job's outputs are unique by type and profile version, ``uk_job_type_profile``,
which is what makes a re-run idempotent).  The result carries the
document's page count (``input_facts`` for the input object's ``pages``
column) and the number of pages rendered (``usage``, what credits charge).

Limits, set by the profile and never by a job: ``max_pages`` (a document with
more pages is refused), ``max_page_pixels`` (a page whose rendered size would
be larger is refused before anything is rendered: a 200,000-point MediaBox at
300 dpi is 833,333 pixels wide), ``max_rendered_pages`` (the longest page
range a job may ask for).  WebP and JPEG also cap a side (16,383 and 65,500
pixels).

Hostile input (DESIGN §10): the content must say PDF (``%PDF`` starting in
the first 1025 bytes, where pdfium looks; the name is never trusted); an
empty file is corrupt; a PDF that needs a password is UNSUPPORTED_FORMAT ("encrypted PDFs are not
supported"; one encrypted with an owner password only opens without one and
renders); a damaged one is CORRUPT_INPUT.  The page count and every chosen
page's size are read from the page tree before any content stream is parsed.
pdfium renders into a buffer we allocate and an encoder reads it in place:
libvips for WebP and PNG, Pillow's libjpeg-turbo for JPEG (twice as fast as
the wheel's libvips on a page: 9.6 against 15-17 ms at 1280 px).  Pillow
only ever encodes that bitmap: it never opens a file, so no Pillow decoder
sees untrusted bytes.  Reasons never carry a path or pdfium's own words.

pypdfium2 and pyvips are imported on the first run, not at import time, so the
registry loads without them; a job then fails with DEPENDENCY_FAILED.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import importlib.util
import math
import os
import time
from importlib import metadata
from typing import Any

from hypermedia.errors import SCRATCH_FULL, JobError
from hypermedia.pipelines import imaging, pdf_images, pdf_streams
from hypermedia.pipelines.registry import Context, Pipeline, register
from hypermedia.pipelines.schema import Field, validator
from hypermedia.storage import sniff

MIN_PYPDFIUM2 = (4, 30)
# Output format -> (file extension, media type).
FORMATS = {f: imaging.FORMATS[f] for f in ("webp", "png", "jpeg")}
# Largest side each encoder can write.
MAX_SIDE = {"webp": 16_383, "jpeg": 65_500, "png": 1_000_000}
OUTPUT_TYPE = "page_preview_{}"  # .format(page number)
WEBP_EFFORT = 2  # libwebp's 0..6; libvips' default is 4
PNG_COMPRESSION = 6  # zlib level, as libpng (and so pdftoppm) writes by default

SCHEMA = {
    "first_page": Field(int, 1, 1, 1_000_000, doc="first page to render (1-based)"),
    "last_page": Field(
        int, 1, 1, 1_000_000, doc="last page to render; clamped to the document's last page"
    ),
    "width": Field(int, 1280, 16, 8192, doc="pixel width of each page (used when dpi is 0)"),
    "dpi": Field(int, 0, 0, 1200, doc="render at this resolution instead of width; 0: use width"),
    "format": Field(str, "webp", choices=tuple(FORMATS), doc="output format"),
    "quality": Field(int, 85, 1, 100, doc="WebP and JPEG quality"),
    "max_pages": Field(
        int, 5000, 1, 1_000_000, overridable=False, doc="refuse documents with more pages"
    ),
    "max_page_pixels": Field(
        int,
        50_000_000,
        1,
        16_384 * 16_384,
        overridable=False,
        doc="refuse a page whose rendered width x height would be larger",
    ),
    "max_rendered_pages": Field(
        int, 50, 1, 10_000, overridable=False, doc="the most pages one job may render"
    ),
    "max_page_seconds": Field(
        int,
        30,
        1,
        3600,
        overridable=False,
        doc="refuse a page that takes pdfium longer than this to draw (a render bomb)",
    ),
}


def pages_asked(params: dict[str, Any], total: int | None) -> int:
    """The pages a job renders: its range, clamped to the document once its
    page count is known (an upper bound before: the estimate holds no less)."""
    first, last = params["first_page"], params["last_page"]
    if total is not None:
        last = min(last, total)
    return max(0, last - first + 1)


def _cross_check(values: dict[str, Any]) -> None:
    first, last = values["first_page"], values["last_page"]
    if last < first:
        raise JobError("INVALID_PARAMS", "last_page must not be before first_page")
    if first > values["max_pages"]:  # past the end of every document it may open
        raise JobError(
            "INVALID_PARAMS",
            f"first_page {first} is past max_pages ({values['max_pages']}): "
            "no document this profile opens has that page",
        )
    if last - first + 1 > values["max_rendered_pages"]:
        raise JobError(
            "INVALID_PARAMS",
            f"at most {values['max_rendered_pages']} pages may be rendered by one job "
            f"(asked for pages {first} to {last})",
        )


validate = validator(SCHEMA, _cross_check)


# -- tools -------------------------------------------------------------------------------

_pdfium: Any = None


def _pypdfium2() -> Any:
    global _pdfium
    if _pdfium is None:
        try:
            import pypdfium2
            import pypdfium2.raw
        except Exception:  # ImportError, or OSError when libpdfium cannot load
            raise JobError("DEPENDENCY_FAILED", "pdfium (pypdfium2) is not installed") from None
        _pdfium = pypdfium2
    return _pdfium


def _version_tuple(version: str) -> tuple[int, ...]:
    out = []
    for part in version.split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        out.append(int(digits or 0))
    return tuple(out)


def versions() -> str | None:
    """'pypdfium2 5.15.2, pdfium 159.0.8149.0', or None when it is not installed."""
    try:
        pkg = metadata.version("pypdfium2")
    except metadata.PackageNotFoundError:
        return None
    engine = "unknown"
    with contextlib.suppress(Exception):
        from pypdfium2 import version as v

        engine = str(getattr(v, "PDFIUM_INFO", "")).split("@")[0] or engine
    return f"pypdfium2 {pkg}, pdfium {engine}"


def available() -> str | None:
    """None when pdf.preview can run here, else a short reason.

    Cheap and safe in the worker itself: neither pdfium nor libvips is loaded,
    only found and asked its version (the child imports them).
    """
    try:
        found = importlib.util.find_spec("pypdfium2") is not None
        pkg = metadata.version("pypdfium2") if found else ""
    except (ImportError, ValueError, metadata.PackageNotFoundError):
        found = False
    if not found:
        return "pdfium (pypdfium2) is not installed"
    if _version_tuple(pkg) < MIN_PYPDFIUM2:
        return f"pypdfium2 {pkg} is too old (4.30 or newer is needed)"
    if importlib.util.find_spec("PIL") is None:
        return "Pillow (the JPEG encoder) is not installed"
    return imaging.probe()  # libvips encodes the other formats


# -- running -------------------------------------------------------------------------------


def _check_magic(path: str) -> None:
    try:
        with open(path, "rb") as f:
            head = f.read(sniff.PDF_HEADER_LAST + 4)
    except OSError:
        raise JobError("CORRUPT_INPUT", "the input file could not be read") from None
    if not head:
        raise JobError("CORRUPT_INPUT", "the input file is empty")
    if not sniff.is_pdf(head):
        raise JobError("UNSUPPORTED_FORMAT", "not a PDF document")


def _open(pdfium: Any, path: str) -> Any:
    """The document, opened by pdfium, or the JobError saying why it cannot be.

    Loaded through pdfium's own call, not ``PdfDocument(path)``: pypdfium2
    raises for a document that loads with no pages too, with pdfium's "last
    error", which only a failed load sets.  That error was then the one left
    by an earlier document in the same child: a PDF with no pages after an
    encrypted one was "encrypted PDFs are not supported".  Here the error is
    read only after a load that failed, and no pages is told apart by itself.
    """
    raw = pdfium.raw
    handle = raw.FPDF_LoadDocument(os.fsencode(path), None)
    if not handle:
        code = raw.FPDF_GetLastError()  # set by this failed load
        if code == raw.FPDF_ERR_PASSWORD:
            raise JobError("UNSUPPORTED_FORMAT", "encrypted PDFs are not supported")
        if code == raw.FPDF_ERR_SECURITY:
            raise JobError("UNSUPPORTED_FORMAT", "this PDF's encryption is not supported")
        raise JobError("CORRUPT_INPUT", "the PDF is damaged or unreadable")
    if raw.FPDF_GetPageCount(handle) < 1:
        raw.FPDF_CloseDocument(handle)
        raise JobError("CORRUPT_INPUT", "the PDF has no pages")
    doc = pdfium.PdfDocument(handle)
    # Before anything else reads the document (pypdfium2's rule): a form
    # environment, for _render to draw fields.  No JavaScript: pdfium here
    # has no JS platform, and none is given.
    try:
        doc.init_forms()
    except pdfium.PdfiumError:
        doc.close()
        raise JobError("CORRUPT_INPUT", "the PDF's form is damaged") from None
    return doc


def _page_points(pdfium: Any, doc: Any, index: int) -> tuple[float, float]:
    """Page ``index``'s size as shown, in points.  A CropBox that misses its
    MediaBox leaves pdfium no area to draw (the page failed CORRUPT_INPUT
    for good): the page is shown whole instead, as pdf.js and Ghostscript
    show it, by setting its CropBox (in memory) to its own MediaBox."""
    points = doc.get_page_size(index)
    if all(math.isfinite(v) and v > 0 for v in points):
        return points
    raw = pdfium.raw
    page = raw.FPDF_LoadPage(doc.raw, index)
    if not page:
        return points
    try:
        box = [ctypes.c_float() for _ in range(4)]
        if raw.FPDFPage_GetMediaBox(page, *(ctypes.byref(v) for v in box)):
            raw.FPDFPage_SetCropBox(page, *(v.value for v in box))
    finally:
        raw.FPDF_ClosePage(page)
    return doc.get_page_size(index)  # pdfium reads the page's dictionary again


def _target_size(page: int, points: tuple[float, float], params: dict[str, Any]) -> tuple[int, int]:
    """The pixel size page ``page`` renders at, refused if over a limit; nothing rendered yet."""
    pw, ph = points
    if not (math.isfinite(pw) and math.isfinite(ph) and pw > 0 and ph > 0):
        raise JobError("CORRUPT_INPUT", f"page {page} has no valid size")
    dpi = params["dpi"]
    if dpi:
        width, height = round(pw * dpi / 72), round(ph * dpi / 72)
    else:
        width, height = params["width"], round(params["width"] * ph / pw)
    width, height = max(1, width), max(1, height)
    limit = params["max_page_pixels"]
    if width * height > limit:
        raise JobError(
            "LIMIT_EXCEEDED",
            f"page {page} would render at {width}x{height} pixels, over this profile's "
            f"limit of {limit} pixels",
        )
    fmt = params["format"]
    if max(width, height) > MAX_SIDE[fmt]:
        raise JobError(
            "LIMIT_EXCEEDED",
            f"page {page} would render at {width}x{height} pixels; {fmt} images are at most "
            f"{MAX_SIDE[fmt]} pixels on a side",
        )
    return width, height


def _cut_short(size: tuple[int, int], page: int | None = None) -> str:
    where = "the document" if page is None else f"page {page}"
    return (
        f"{where} holds an image of {size[0]}x{size[1]} pixels whose data is over the "
        "renderer's 1 GiB: a page drawing it would be drawn in part"
    )


def _render(
    pdfium: Any,
    doc: Any,
    index: int,
    size: tuple[int, int],
    seconds: int,
    images: pdf_images.Scan | None = None,
) -> Any:
    """Page ``index`` as an RGB buffer of ``size`` pixels on white (RGBx),
    drawn in at most ``seconds``."""
    width, height = size
    raw = pdfium.raw
    stride = width * 4
    buf = (ctypes.c_ubyte * (stride * height))()  # MemoryError under the attempt's limit
    page = raw.FPDF_LoadPage(doc.raw, index)
    if not page:
        raise JobError("CORRUPT_INPUT", f"page {index + 1} is damaged or unreadable")
    # Form fields (widgets) are drawn only through the document's form
    # environment: without it a filled form renders with blank fields.
    form = doc.formenv.raw if doc.formenv else None
    if form:
        raw.FORM_OnAfterLoadPage(page, form)
    try:
        known = images.sizes if images is not None else set()
        if cut := pdf_images.inline_cut_short(raw, page, known):
            raise JobError("LIMIT_EXCEEDED", _cut_short(cut, index + 1))
        bitmap = raw.FPDFBitmap_CreateEx(width, height, raw.FPDFBitmap_BGRx, buf, stride)
        if not bitmap:
            raise MemoryError
        try:
            raw.FPDFBitmap_FillRect(bitmap, 0, 0, width, height, 0xFFFFFFFF)
            flags = raw.FPDF_ANNOT | raw.FPDF_REVERSE_BYTE_ORDER  # RGBx, not BGRx
            if not _draw(raw, bitmap, page, width, height, flags, seconds):
                raise JobError("LIMIT_EXCEEDED", too_slow(index + 1, seconds))
            if form:
                raw.FPDF_FFLDraw(form, bitmap, page, 0, 0, width, height, 0, flags)
        finally:
            raw.FPDFBitmap_Destroy(bitmap)
    finally:
        if form:
            raw.FORM_OnBeforeClosePage(page, form)
        raw.FPDF_ClosePage(page)
    return buf


def too_slow(page: int, seconds: int) -> str:
    return f"page {page} takes longer than this profile's limit of {seconds} s to draw"


def _draw(
    raw: Any, bitmap: Any, page: Any, width: int, height: int, flags: int, seconds: int
) -> bool:
    """Draw ``page`` into ``bitmap``; False if that took longer than ``seconds``.

    Through pdfium's progressive renderer, which asks whether to pause
    between every hundred page objects: a content stream of millions of
    paths (a render bomb) is stopped at its budget, a permanent
    LIMIT_EXCEEDED, instead of holding the attempt to its timeout, which is
    retried, and every retry again to its timeout.  One object can take
    longer on its own (a tiling pattern of 0.003-point cells over the page, a
    form drawing 700,000 lines): the worker kills the child then (``run``
    gives it the page's budget through ``Context.budget``).
    """
    deadline = time.monotonic() + seconds
    pause = raw.IFSDK_PAUSE(version=1)
    # Kept referenced until the render is closed: pdfium holds the pointer.
    late = type(pause.NeedToPauseNow)(lambda _: time.monotonic() > deadline)
    pause.NeedToPauseNow = late
    try:
        status = raw.FPDF_RenderPageBitmap_Start(bitmap, page, 0, 0, width, height, 0, flags, pause)
        while status == raw.FPDF_RENDER_TOBECONTINUED and time.monotonic() <= deadline:
            status = raw.FPDF_RenderPage_Continue(page, pause)
    finally:
        raw.FPDF_RenderPage_Close(page)
    return bool(status != raw.FPDF_RENDER_TOBECONTINUED)


def _encode(
    vips: Any, buf: Any, width: int, height: int, path: str, params: dict[str, Any]
) -> None:
    """Save the RGBx buffer as the profile's format.

    Not ``imaging.save``: a bitmap from pdfium has no metadata to strip, and
    previews of pages favour speed where photos favour bytes.  JPEG without
    optimised Huffman tables (libjpeg's default, as pdftoppm writes it: about
    10% larger, twice as fast to write), WebP at effort 2 (half the time of the
    default 4 for about 1.5% more bytes on text pages).  No EXIF, XMP or ICC
    is written (``imaging.strip_webp`` covers libvips 8.14's WebP EXIF chunk).
    """
    fmt, quality = params["format"], params["quality"]
    if fmt == "jpeg":
        _jpeg(buf, width, height, path, quality)
        return
    rgb = vips.Image.new_from_memory(buf, width, height, 4, "uchar").extract_band(0, n=3)
    rgb = rgb.copy(interpretation="srgb")
    meta: dict[str, Any] = {"keep": "none"} if vips.at_least_libvips(8, 15) else {"strip": True}
    try:
        if fmt == "webp":
            rgb.webpsave(path, Q=quality, effort=WEBP_EFFORT, **meta)
            imaging.strip_webp(path)
        else:
            rgb.pngsave(path, compression=PNG_COMPRESSION, **meta)
    except vips.Error as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # no half-written page left behind
        text = f"{getattr(exc, 'message', '')} {getattr(exc, 'detail', '')}".lower()
        if "out of memory" in text or "memory allocation" in text:
            raise MemoryError from None
        if "no space left" in text:
            raise JobError("STORAGE_UNAVAILABLE", SCRATCH_FULL) from None
        raise JobError("INTERNAL", f"a page could not be saved as {fmt}") from None


def _pillow() -> Any:
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - a dependency of the package
        raise JobError("DEPENDENCY_FAILED", "the JPEG encoder (Pillow) is not installed") from None
    return Image


def _jpeg(buf: Any, width: int, height: int, path: str, quality: int) -> None:
    """The RGBx buffer as a baseline JPEG: libjpeg's standard Huffman tables and
    4:2:0 chroma, as pdftoppm writes it; Pillow reads the buffer in place."""
    image = _pillow().frombuffer("RGBX", (width, height), buf, "raw", "RGBX", 0, 1)
    try:
        image.save(path, "JPEG", quality=quality)
    except OSError as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # no half-written page left behind
        if exc.errno == errno.ENOSPC:
            raise JobError("STORAGE_UNAVAILABLE", SCRATCH_FULL) from None
        raise JobError("INTERNAL", "a page could not be saved as jpeg") from None


# How long a document's streams are inflated to find one pdfium would cut.
STREAM_CHECK_SECONDS = 10.0


def _check_streams(path: str) -> None:
    """Refuse a document one of whose page-drawing streams pdfium would cut
    at its 1 GiB (pdf_streams.inflated_past_cap)."""
    if pdf_streams.inflated_past_cap(path, STREAM_CHECK_SECONDS):
        raise JobError(
            "LIMIT_EXCEEDED",
            "the document holds a stream (a page's content, a form or a font) that inflates "
            "past the renderer's 1 GiB: a page drawing it would be drawn in part",
        )


def run(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    if ctx.input_path is None:
        raise JobError("INVALID_PARAMS", "pdf.preview needs an input object")
    p = {name: params.get(name, f.default) for name, f in SCHEMA.items()}
    ctx.progress(1, "checking the file")
    _check_magic(ctx.input_path)
    pdfium = _pypdfium2()
    vips = imaging.load()
    doc = _open(pdfium, ctx.input_path)
    try:
        images = pdf_images.scan(ctx.input_path)
        if images.over is not None:
            raise JobError("LIMIT_EXCEEDED", _cut_short(images.over))
        if images.unfinished:  # a file made to be slow to read: as a render bomb is
            raise JobError(
                "LIMIT_EXCEEDED",
                f"the document's images could not all be checked within "
                f"{pdf_images.SCAN_SECONDS:g} s (too many streams)",
            )
        _check_streams(ctx.input_path)
        total = len(doc)
        if total > p["max_pages"]:
            raise JobError(
                "LIMIT_EXCEEDED",
                f"the document has {total} pages, over this profile's limit of {p['max_pages']}",
            )
        first, last = p["first_page"], min(p["last_page"], total)
        if first > total:
            raise JobError(
                "INVALID_PARAMS",
                f"first_page is {first} but the document has {total} page"
                + ("s" if total != 1 else ""),
            )
        if last - first + 1 > p["max_rendered_pages"]:
            raise JobError("INVALID_PARAMS", f"at most {p['max_rendered_pages']} pages per job")
        # Every chosen page's size, from the page tree, before anything is rendered.
        sizes = {}
        for n in range(first, last + 1):
            try:
                points = _page_points(pdfium, doc, n - 1)
            except pdfium.PdfiumError:
                raise JobError("CORRUPT_INPUT", f"page {n} is damaged or unreadable") from None
            sizes[n] = _target_size(n, points, p)
        ext, mime = FORMATS[p["format"]]
        rendered = []
        count = len(sizes)
        for i, (n, (width, height)) in enumerate(sizes.items()):
            # The step counts what the bar counts: pages 1-10 of 60 were
            # "page 2 of 60" at 14.5 %.
            step = f"{n} of {total}" if count == total else f"{n} ({i + 1} of {count})"
            ctx.progress(5 + 95 * i / count, f"rendering page {step}")
            ctx.budget(p["max_page_seconds"], too_slow(n, p["max_page_seconds"]))
            buf = _render(pdfium, doc, n - 1, (width, height), p["max_page_seconds"], images)
            ctx.budget(None)
            name = f"page-{n}.{ext}"
            _encode(vips, buf, width, height, os.path.join(ctx.scratch, name), p)
            del buf
            meta = {
                "page": n,
                "width": width,
                "height": height,
                "format": p["format"],
                "bytes": os.path.getsize(os.path.join(ctx.scratch, name)),
            }
            ctx.output(OUTPUT_TYPE.format(n), mime, meta, path=name)
            rendered.append(meta)
    finally:
        doc.close()
    ctx.progress(100, f"{count} page{'s' if count != 1 else ''} rendered")
    return {
        "pages": total,
        "rendered": rendered,
        "usage": {"pages": count},
        "input_facts": {"pages": total},
    }


PREVIEW = register(
    Pipeline(
        "pdf.preview",
        "documents",
        validate,
        run,
        schema=SCHEMA,
        available=available,
        doc="Pages of a PDF rendered by pdfium to WebP, PNG or JPEG at a width or a DPI.",
        warm=lambda: (_pypdfium2(), imaging.load(), _pillow()),
        needs_input=True,
        pages=pages_asked,
    )
)

"""Images in a PDF that pdfium would draw only in part.

pdfium inflates at most 1 GiB of one Flate- or LZW-coded stream and draws
the rest of such an image black, with no error anything could see: a
20,000 x 20,000 RGB image lost its last tenth and the preview completed.

pdfium's API cannot tell: it shows the image objects of a page and its forms,
not those of annotations, patterns or soft masks, and gives the bits per
pixel of its own decoded bitmap (24 for 16-bit RGB and CMYK alike), not of
the stream.  So the file's image dictionaries are read here instead, as
bytes: a stream's dictionary is never compressed (PDF 7.5.7: streams are
not stored in object streams) nor encrypted.  Each image's inflated size is
its width x height x components x bits per component, when the last of its
filters is Flate or LZW (``[/FlateDecode /DCTDecode]`` inflates a JPEG,
which is not capped).  Nothing is decompressed.

An inline image (``BI … ID … EI`` inside a content stream, which may be
compressed) has no dictionary in the file's bytes: the image objects of each
page drawn that no dictionary accounts for are sized through pdfium
(``inline_cut_short``), with its bits per pixel, the best it can tell.
"""

from __future__ import annotations

import ctypes
import mmap
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

INFLATE_CAP = 1 << 30
MAX_STREAMS = 500_000  # dictionaries looked at in one file: bounds a hostile one
MAX_DICT = 64 * 1024  # how far back a stream's dictionary may start

_STREAM = re.compile(rb">>\s{0,8}stream(?:\r\n|\n|\r)")
_INT = rb"\s*(\d{1,10})(?![\d.])"
_WIDTH = re.compile(rb"/Width" + _INT)
_HEIGHT = re.compile(rb"/Height" + _INT)
_BPC = re.compile(rb"/BitsPerComponent" + _INT)
_MASK = re.compile(rb"/ImageMask\s*true")
_FILTER = re.compile(rb"/Filter\s*(/[^\s/\[\]<>()]+|\[[^\]]{0,512}\])")
_COLORSPACE = re.compile(rb"/ColorSpace\s*(/[^\s/\[\]<>()]+|\[[^\]]{0,4096}\]|\d+\s+\d+\s+R)")
_NAME = re.compile(rb"/([^\s/\[\]<>()]+)")
_REF = re.compile(rb"(\d{1,10})\s+(\d{1,5})\s+R")
_N = re.compile(rb"/N" + _INT)

_CAPPED = {b"FlateDecode", b"Fl", b"LZWDecode", b"LZW"}
_COMPONENTS = {
    b"DeviceGray": 1, b"G": 1, b"CalGray": 1, b"Indexed": 1, b"I": 1, b"Separation": 1,
    b"DeviceRGB": 3, b"RGB": 3, b"CalRGB": 3, b"Lab": 3,
    b"DeviceCMYK": 4, b"CMYK": 4,
}  # fmt: skip
_MOST_COMPONENTS = 4  # a colour space not read here: the most a common one has


@dataclass
class Scan:
    over: tuple[int, int] | None = None  # (width, height) of an image over INFLATE_CAP
    sizes: set[tuple[int, int]] = field(default_factory=set)  # of every image dictionary


def scan(path: str) -> Scan:
    """The image dictionaries of the PDF at ``path``: their sizes, and the
    first whose inflated data is over INFLATE_CAP."""
    with open(path, "rb") as f:
        try:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file
            return Scan()
    with data:
        return _scanned(data, _Objects(data))


def _scanned(data: mmap.mmap, objects: _Objects) -> Scan:
    out = Scan()
    for n, match in enumerate(_STREAM.finditer(data)):
        if n >= MAX_STREAMS:
            break
        start = _dict_start(data, match.start())
        if start < 0:
            continue
        head = data[start : match.start() + 2]
        if b"/Image" not in head:
            continue
        width, height = _WIDTH.search(head), _HEIGHT.search(head)
        if width and height:
            out.sizes.add((int(width.group(1)), int(height.group(1))))
        if out.over is None:
            out.over = _over(head, objects)
    return out


def _dict_start(data: mmap.mmap, end: int) -> int:
    """Where the dictionary whose ``>>`` is at ``end`` begins, or -1."""
    low, pos, depth = max(0, end - MAX_DICT), end + 2, 0
    while True:
        close, opening = data.rfind(b">>", low, pos), data.rfind(b"<<", low, pos)
        if opening < 0:
            return -1
        if close > opening:
            depth, pos = depth + 1, close
        else:
            depth, pos = depth - 1, opening
            if depth == 0:
                return opening


def _over(head: bytes, objects: _Objects) -> tuple[int, int] | None:
    width, height = _WIDTH.search(head), _HEIGHT.search(head)
    found = _FILTER.search(head)
    if not (width and height and found):
        return None
    filters = _NAME.findall(found.group(1))
    if not filters or filters[-1] not in _CAPPED:
        return None
    w, h = int(width.group(1)), int(height.group(1))
    if _MASK.search(head):
        bits = 1
    else:
        bpc = _BPC.search(head)
        bits = (int(bpc.group(1)) if bpc else 8) * _components(head, objects.body)
    return (w, h) if (w * bits + 7) // 8 * h > INFLATE_CAP else None


def _components(head: bytes, body: Callable[[int], bytes | None]) -> int:
    found = _COLORSPACE.search(head)
    if not found:
        return 1  # none given: a mask, or a JPEG 2000 (not Flate-coded)
    space = found.group(1)
    if (ref := _REF.fullmatch(space)) is not None:  # the space is an object of its own
        space = body(int(ref.group(1))) or b""
    names = _NAME.findall(space)
    if not names:
        return _MOST_COMPONENTS
    if names[0] == b"ICCBased" and (ref := _REF.search(space)) is not None:
        n = _N.search(body(int(ref.group(1))) or b"")
        return int(n.group(1)) if n else _MOST_COMPONENTS
    if names[0] == b"DeviceN":
        inks = re.search(rb"\[([^\]]*)\]", space)
        return len(_NAME.findall(inks.group(1))) if inks else _MOST_COMPONENTS
    return _COMPONENTS.get(names[0], _MOST_COMPONENTS)


class _Objects:
    """The start of each ``N G obj`` in the file, found on first use."""

    _OBJ = re.compile(rb"(?<!\d)(\d{1,10})\s+\d{1,5}\s+obj\b")

    def __init__(self, data: mmap.mmap) -> None:
        self.data = data
        self._at: dict[int, int] | None = None

    def body(self, number: int) -> bytes | None:
        """The first 4 kB of object ``number``'s body."""
        if self._at is None:
            self._at = {int(m.group(1)): m.end() for m in self._OBJ.finditer(self.data)}
        at = self._at.get(number)
        return None if at is None else self.data[at : at + 4096]


# -- inline images, through pdfium ------------------------------------------------------

MAX_OBJECTS = 100_000  # per page: a page of millions of paths is the renderer's to stop
_END = object()


def inline_cut_short(raw: Any, page: Any, known: set[tuple[int, int]]) -> tuple[int, int] | None:
    """(width, height) of an image object on ``page`` (pdfium's handle), or
    in a form it draws, of a size no image dictionary has, whose inflated
    data is over INFLATE_CAP by pdfium's bits per pixel."""
    stack, seen = [_children(raw, page, None)], 0
    while stack and seen < MAX_OBJECTS:
        obj = next(stack[-1], _END)
        if obj is _END:
            stack.pop()
            continue
        seen += 1
        if not obj:  # pdfium had none at that index
            continue
        kind = raw.FPDFPageObj_GetType(obj)
        if kind == raw.FPDF_PAGEOBJ_FORM and len(stack) < 32:
            stack.append(_children(raw, None, obj))
        elif kind == raw.FPDF_PAGEOBJ_IMAGE and (size := _inline_over(raw, page, obj, known)):
            return size
    return None


def _children(raw: Any, page: Any, form: Any) -> Any:
    if form is None:
        count, get = raw.FPDFPage_CountObjects(page), raw.FPDFPage_GetObject
        return (get(page, i) for i in range(count))
    count, get = raw.FPDFFormObj_CountObjects(form), raw.FPDFFormObj_GetObject
    return (get(form, i) for i in range(max(count, 0)))


def _inline_over(
    raw: Any, page: Any, obj: Any, known: set[tuple[int, int]]
) -> tuple[int, int] | None:
    width, height = ctypes.c_uint(), ctypes.c_uint()
    if not raw.FPDFImageObj_GetImagePixelSize(obj, width, height):
        return None
    w, h = width.value, height.value
    if (w, h) in known or w * h * 32 <= INFLATE_CAP * 8 or not _inflated_last(raw, obj):
        return None
    meta = raw.FPDF_IMAGEOBJ_METADATA()
    if not raw.FPDFImageObj_GetImageMetadata(obj, page, meta):
        return None
    bits = meta.bits_per_pixel or 32  # unknown: the most a pixel takes
    return (w, h) if (w * bits + 7) // 8 * h > INFLATE_CAP else None


def _inflated_last(raw: Any, obj: Any) -> bool:
    """Whether the last of the image's filters is Flate or LZW."""
    count = raw.FPDFImageObj_GetImageFilterCount(obj)
    if count < 1:
        return False
    buf = ctypes.create_string_buffer(64)
    n = raw.FPDFImageObj_GetImageFilter(obj, count - 1, buf, len(buf))
    return 0 < n <= len(buf) and buf.value in _CAPPED

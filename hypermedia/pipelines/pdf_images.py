"""Images on a PDF page that pdfium would draw only in part.

pdfium inflates at most 1 GiB of one Flate (or LZW) stream (its flate
module's ``kMaxTotalOutSize``) and draws the rest of such an image black,
with no error anything could see: a 20,000 x 20,000 RGB image lost its last
tenth and the preview completed.  The page's image objects (and those of
the forms it draws) are looked at before the page is: their pixel size, bits
per pixel and filters come from their dictionaries, nothing is decoded.  A
JPEG (DCTDecode) is not capped that way and is drawn whole.
"""

from __future__ import annotations

import ctypes
from typing import Any

INFLATE_CAP = 1 << 30
_CAPPED = frozenset({"FlateDecode", "LZWDecode", "Fl", "LZW"})
# Objects looked at per page: a page of millions of paths (a render bomb) is
# the renderer's budget to stop, not this look's to walk.
MAX_OBJECTS = 100_000
_END = object()


def cut_short(raw: Any, page: Any) -> tuple[int, int] | None:
    """(width, height) of an image on ``page`` (pdfium's page handle) whose
    inflated data is over INFLATE_CAP, if there is one."""
    stack = [_children(raw, page, None)]
    seen = 0
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
        elif kind == raw.FPDF_PAGEOBJ_IMAGE and (size := _over_cap(raw, page, obj)):
            return size
    return None


def _children(raw: Any, page: Any, form: Any) -> Any:
    if form is None:
        count, get = raw.FPDFPage_CountObjects(page), raw.FPDFPage_GetObject
        return (get(page, i) for i in range(count))
    count, get = raw.FPDFFormObj_CountObjects(form), raw.FPDFFormObj_GetObject
    return (get(form, i) for i in range(max(count, 0)))


def _over_cap(raw: Any, page: Any, obj: Any) -> tuple[int, int] | None:
    width, height = ctypes.c_uint(), ctypes.c_uint()
    if not raw.FPDFImageObj_GetImagePixelSize(obj, width, height):
        return None
    w, h = width.value, height.value
    if w * h < INFLATE_CAP // 32 or not _inflated(raw, obj):  # 32 bits a pixel at most
        return None
    meta = raw.FPDF_IMAGEOBJ_METADATA()
    if not raw.FPDFImageObj_GetImageMetadata(obj, page, meta):
        return None
    bits = meta.bits_per_pixel or 32  # unknown: the most a pixel can take
    return (w, h) if (w * bits + 7) // 8 * h > INFLATE_CAP else None


def _inflated(raw: Any, obj: Any) -> bool:
    buf = ctypes.create_string_buffer(64)
    for i in range(raw.FPDFImageObj_GetImageFilterCount(obj)):
        n = raw.FPDFImageObj_GetImageFilter(obj, i, buf, len(buf))
        if 0 < n <= len(buf) and buf.value.decode("ascii", "replace") in _CAPPED:
            return True
    return False

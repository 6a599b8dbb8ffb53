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
its width x height x components x bits per component, times what the
codings after its last Flate or LZW spell each byte in (``[/FlateDecode
/ASCIIHexDecode]`` inflates two hex digits a byte), when those are only such
text codings (``[/FlateDecode /DCTDecode]`` inflates a JPEG, which is not
capped).  Streams are found as pdfium finds them (blanks or a comment before
``stream``, a dictionary of any length, keys inside strings are no keys).
Nothing is decompressed.

An inline image (``BI … ID … EI`` inside a content stream, which may be
compressed) has no dictionary in the file's bytes: the image objects of each
page drawn that no dictionary accounts for are sized through pdfium
(``inline_cut_short``), with its bits per pixel, the best it can tell.
"""

from __future__ import annotations

import ctypes
import mmap
import re
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

INFLATE_CAP = 1 << 30
MAX_STREAMS = 500_000  # dictionaries looked at in one file: bounds a hostile one
MAX_DICT = 16 * 1024  # how far back a stream's dictionary may start
MAX_STEPS = 32  # nested dictionaries passed on the way back to its start
# The look as a whole: a file of thousands of ">>stream" in a row held an
# attempt for hours (each one looked back over all the others).
SCAN_SECONDS = 20.0

# ">>", blanks and comments, "stream", blanks, an end of line: pdfium (and
# clamd, pdf_streams) find a stream past 20 spaces or a comment line, where
# an image drawn by an annotation was not seen and was drawn in part.
STREAM = re.compile(
    rb">>(?:[ \t\r\n\f\0]{1,1024}|%[^\r\n]{0,1024}){0,16}stream[ \t\f\0]{0,64}(?:\r\n|\n|\r)"
)
LOOK_BACK = 1024 * 1024  # how far back a dictionary too long for _dict_start may begin
_INT = rb"\s*(\d{1,10})(?![\d.])"
_MASK = re.compile(rb"/ImageMask\s*true")
_NAME = re.compile(rb"/([^\s/\[\]<>()]+)")
_REF = re.compile(rb"(\d{1,10})\s+(\d{1,5})\s+R")
_N = re.compile(rb"/N" + _INT)

_CAPPED = {b"FlateDecode", b"Fl", b"LZWDecode", b"LZW"}
# Codings that only spell bytes out, each byte in this many characters: after
# a capped one, the cap counts the characters, not the pixels' bytes.
_SPELLED = {b"ASCIIHexDecode": 2.0, b"AHx": 2.0, b"ASCII85Decode": 1.25, b"A85": 1.25}
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
    unfinished: bool = False  # SCAN_SECONDS passed before every dictionary was read


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
    deadline = time.monotonic() + SCAN_SECONDS
    floor = 0
    for n, match in enumerate(STREAM.finditer(data)):
        if n >= MAX_STREAMS:
            break
        if n % 256 == 0 and time.monotonic() > deadline:
            out.unfinished = True
            break
        head, floor = dictionary(data, match.start(), floor), match.end()
        if not _is_image(head, objects):
            continue
        w, h = _number(head, b"Width", objects), _number(head, b"Height", objects)
        if w is not None and h is not None:
            out.sizes.add((w, h))
        if out.over is None:
            out.over = _over(head, objects)
    return out


def dictionary(data: mmap.mmap, end: int, floor: int) -> bytes:
    """The dictionary whose ``>>`` is at ``end``, its strings blanked out; ``floor``:
    where the stream before it ended (no dictionary begins before that)."""
    start = _dict_start(data, end)
    if start < 0:
        # Too long or too nested for that look (padded past 16 kB, or more
        # than 32 dictionaries deep): from its object's start instead.
        start = data.rfind(b"obj", max(floor, end - LOOK_BACK), end)
    return _without_strings(data[start : end + 2]) if start >= 0 else b""


# A literal string (balanced parentheses, escapes) or a hex string: what a
# key inside one says is no key ("/Desc (/Filter /DCTDecode)" hid a stream).
_STRING = re.compile(rb"\((?:[^()\\]|\\.)*\)|<[0-9A-Fa-f\s]*>(?!>)")
_NESTING = 8  # strings inside strings, innermost first


def _without_strings(head: bytes) -> bytes:
    for _ in range(_NESTING):
        if b"(" not in head and b"<" not in head:
            break
        head, n = _STRING.subn(b" ", head)
        if not n:
            break
    return head


def _is_image(head: bytes, objects: _Objects) -> bool:
    if b"/Image" in head:
        return True
    # "/Subtype 9 0 R", object 9 the name /Image: pdfium follows it.
    return b"/Subtype" in head and _value(head, b"Subtype", objects) == b"/Image"


def _dict_start(data: mmap.mmap, end: int) -> int:
    """Where the dictionary whose ``>>`` is at ``end`` begins, or -1."""
    low, pos, depth = max(0, end - MAX_DICT), end + 2, 0
    for _ in range(2 * MAX_STEPS):
        close, opening = data.rfind(b">>", low, pos), data.rfind(b"<<", low, pos)
        if opening < 0:
            return -1
        if close > opening:
            depth, pos = depth + 1, close
        else:
            depth, pos = depth - 1, opening
            if depth == 0:
                return opening
    return -1


def _over(head: bytes, objects: _Objects) -> tuple[int, int] | None:
    w, h = _number(head, b"Width", objects), _number(head, b"Height", objects)
    spelled = _spelled(_NAME.findall(_value(head, b"Filter", objects) or b""))
    if w is None or h is None or spelled is None:
        return None
    if _MASK.search(head):
        bits = 1
    else:
        bpc = _number(head, b"BitsPerComponent", objects)
        bits = (bpc or 8) * _components(head, objects)
    return (w, h) if (w * bits + 7) // 8 * h * spelled > INFLATE_CAP else None


def _spelled(filters: list[bytes]) -> float | None:
    """Characters the last capped filter puts out per byte of pixels, or None
    when no filter is capped or one after it is not a text coding (what a
    JPEG's or a run-length coding's input is, the pixels do not say)."""
    capped = [i for i, name in enumerate(filters) if name in _CAPPED]
    if not capped:
        return None
    factor = 1.0
    for name in filters[capped[-1] + 1 :]:
        if name not in _SPELLED:
            return None
        factor *= _SPELLED[name]
    return factor


def _value(head: bytes, key: bytes, objects: _Objects) -> bytes | None:
    """The value of ``/key`` in the dictionary ``head``: a name, a number, an
    array (brackets balanced), or what an ``N G R`` reference points to."""
    found = re.search(rb"/" + key + rb"(?![^\s/\[\]<>()%])\s*", head)
    if found is None:
        return None
    value = _token(head, found.end())
    if (ref := _REF.fullmatch(value)) is not None:  # an object of its own
        body = objects.body(int(ref.group(1))) or b""
        value = _token(body, len(body) - len(body.lstrip()))
    return value


def _token(text: bytes, at: int) -> bytes:
    """The value starting at ``at``: an array to its matching bracket, a
    reference, a name or a number."""
    if text[at : at + 1] == b"[":
        depth = 0
        for i in range(at, min(len(text), at + 8192)):
            depth += {91: 1, 93: -1}.get(text[i], 0)  # [ and ]
            if depth == 0:
                return text[at : i + 1]
        return text[at : at + 8192]
    ref = _REF.match(text, at)
    if ref is not None:
        return ref.group(0)
    word = re.match(rb"/?[^\s/\[\]<>()%]*", text[at:])
    return word.group(0) if word else b""


def _number(head: bytes, key: bytes, objects: _Objects) -> int | None:
    value = _value(head, key, objects)
    try:  # 20000, +20000, 20000.0: what pdfium reads as the same number
        return int(float(value)) if value else None
    except ValueError:
        return None


def _components(head: bytes, objects: _Objects) -> int:
    space = _value(head, b"ColorSpace", objects)
    if space is None:
        return 1  # none given: a mask, or a JPEG 2000 (not Flate-coded)
    names = _NAME.findall(space)
    if not names:
        return _MOST_COMPONENTS
    if names[0] == b"ICCBased" and (ref := _REF.search(space)) is not None:
        n = _N.search(objects.body(int(ref.group(1))) or b"")
        return int(n.group(1)) if n else _MOST_COMPONENTS
    if names[0] == b"DeviceN":  # [/DeviceN [inks…] alternate tint]
        inner = space[1:].lstrip()[len(b"/DeviceN") :].lstrip()
        inks = _token(inner, 0) if inner.startswith(b"[") else b""
        return len(_NAME.findall(inks)) if inks else _MOST_COMPONENTS
    return _COMPONENTS.get(names[0], _MOST_COMPONENTS)


class _Objects:
    """Objects by number: each ``N G obj`` in the file, and those compressed
    in object streams (PDF 1.5; a colour space there was counted as 4
    components: an RGB scan of 972 MB refused, a 6-ink one drawn in part).
    Found on first use; the last definition wins (an incremental update)."""

    _OBJ = re.compile(rb"(?<!\d)(\d{1,10})\s+\d{1,5}\s+obj\b")
    _PACKED = 64 * 1024 * 1024  # object streams inflated in all, at most

    def __init__(self, data: mmap.mmap) -> None:
        self.data = data
        self._at: dict[int, int] | None = None
        self._packed: dict[int, bytes] | None = None

    def body(self, number: int) -> bytes | None:
        """The first 4 kB of object ``number``'s body."""
        if self._at is None:
            self._at = {int(m.group(1)): m.end() for m in self._OBJ.finditer(self.data)}
        at = self._at.get(number)
        if at is not None:
            return self.data[at : at + 4096]
        if self._packed is None:
            self._packed = {}  # a reference met while unpacking finds none, not a loop
            self._packed = self._unpack()
        return self._packed.get(number)

    def _unpack(self) -> dict[int, bytes]:
        """The objects of every object stream (Flate-coded or not), by number."""
        found: dict[int, bytes] = {}
        left, floor = self._PACKED, 0
        for match in STREAM.finditer(self.data):
            head, floor = dictionary(self.data, match.start(), floor), match.end()
            if b"/ObjStm" not in head or left <= 0:
                continue
            length = _number(head, b"Length", self)
            first, count = _number(head, b"First", self), _number(head, b"N", self)
            if length is None or first is None or count is None:
                continue
            raw = self.data[match.end() : match.end() + min(length, left)]
            filters = _NAME.findall(_value(head, b"Filter", self) or b"")
            if filters and filters != [b"FlateDecode"] and filters != [b"Fl"]:
                continue  # another coding: its objects stay unknown (4 components)
            try:
                packed = zlib.decompressobj().decompress(raw, left) if filters else raw
            except zlib.error:
                continue
            left -= len(packed)
            pairs = [int(x) for x in packed[:first].split()[: 2 * count]]
            for number, offset in zip(pairs[::2], pairs[1::2], strict=False):
                found[number] = packed[first + offset : first + offset + 4096]
        return found


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
    spelled = _spelled(_filters(raw, obj))
    if (w, h) in known or spelled is None or w * h * 32 * spelled <= INFLATE_CAP * 8:
        return None
    meta = raw.FPDF_IMAGEOBJ_METADATA()
    if not raw.FPDFImageObj_GetImageMetadata(obj, page, meta):
        return None
    bits = meta.bits_per_pixel or 32  # unknown: the most a pixel takes
    return (w, h) if (w * bits + 7) // 8 * h * spelled > INFLATE_CAP else None


def _filters(raw: Any, obj: Any) -> list[bytes]:
    """The image's filters by name, as pdfium read them."""
    names = []
    buf = ctypes.create_string_buffer(64)
    for i in range(max(raw.FPDFImageObj_GetImageFilterCount(obj), 0)):
        n = raw.FPDFImageObj_GetImageFilter(obj, i, buf, len(buf))
        names.append(buf.value if 0 < n <= len(buf) else b"")
    return names

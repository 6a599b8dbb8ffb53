"""PDFs written by hand, in code, for the pdf.preview tests and benchmark.

No binaries in the repository and no PDF library on the writing side: a PDF is
a header, numbered objects, a cross-reference table and a trailer, and that is
all ``Writer`` does.  On top of it:

* ``document``: pages of given sizes, each filled with its own colour
  (``page_color``) and labelled with its number, so a test can tell from the
  rendered pixels which page it got;
* ``many_pages``: thousands of pages sharing one content stream (a few hundred
  KB, written in milliseconds);
* ``encrypted``: the standard security handler (RC4, 128-bit, revision 3) with
  a user password: a reader must ask for the password before it can open it;
* ``realistic``: vector drawings and paragraphs of text, compressed, for the
  benchmark.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import random
import struct
import zlib
from collections.abc import Sequence

LETTER = (612.0, 792.0)
A4 = (595.0, 842.0)


class Writer:
    """Numbered objects in, a complete PDF (with a correct xref table) out."""

    def __init__(self) -> None:
        self.objects: list[bytes | None] = []

    def reserve(self) -> int:
        self.objects.append(None)
        return len(self.objects)

    def add(self, body: bytes) -> int:
        self.objects.append(body)
        return len(self.objects)

    def set(self, num: int, body: bytes) -> None:
        self.objects[num - 1] = body

    @staticmethod
    def stream(data: bytes, extra: bytes = b"") -> bytes:
        return b"<< /Length %d %s>>\nstream\n%s\nendstream" % (len(data), extra, data)

    def build(self, root: int, trailer_extra: bytes = b"", version: bytes = b"1.7") -> bytes:
        parts = [b"%PDF-" + version + b"\n%\xe2\xe3\xcf\xd3\n"]
        size = len(parts[0])
        offsets = []
        for num, body in enumerate(self.objects, start=1):
            if body is None:
                raise ValueError(f"object {num} was reserved but never set")
            offsets.append(size)
            chunk = b"%d 0 obj\n%s\nendobj\n" % (num, body)
            parts.append(chunk)
            size += len(chunk)
        xref = [b"xref\n0 %d\n0000000000 65535 f \n" % (len(self.objects) + 1)]
        xref += [b"%010d 00000 n \n" % off for off in offsets]
        parts += xref
        parts.append(
            b"trailer\n<< /Size %d /Root %d 0 R %s>>\nstartxref\n%d\n%%%%EOF\n"
            % (len(self.objects) + 1, root, trailer_extra, size)
        )
        return b"".join(parts)


def _num(x: float) -> bytes:
    return (b"%.2f" % x).rstrip(b"0").rstrip(b".") or b"0"


def page_color(n: int) -> tuple[int, int, int]:
    """The colour page ``n`` (1-based) is filled with by ``document``."""
    palette = [(220, 40, 40), (40, 160, 60), (40, 70, 220), (230, 180, 20), (150, 40, 170)]
    return palette[(n - 1) % len(palette)]


def _page_content(n: int, width: float, height: float) -> bytes:
    r, g, b = (c / 255 for c in page_color(n))
    m = min(width, height) / 10
    fs = max(1.0, min(width, height) / 12)
    return b"\n".join(
        [
            b"q %s %s %s rg %s %s %s %s re f Q" % (
                _num(r), _num(g), _num(b),
                _num(m), _num(m), _num(width - 2 * m), _num(height - 2 * m),
            ),
            b"q 0 0 0 RG 2 w %s %s %s %s re S Q" % (
                _num(m / 2), _num(m / 2), _num(width - m), _num(height - m)
            ),
            b"BT /F1 %s Tf %s %s Td (Page %d) Tj ET" % (_num(fs), _num(m), _num(m / 3), n),
        ]
    )  # fmt: skip


def document(
    pages: int | Sequence[tuple[float, float]] = 1,
    *,
    rotate: int = 0,
    version: bytes = b"1.7",
    crop: tuple[float, float, float, float] | None = None,
) -> bytes:
    """A PDF of ``pages`` pages (a count, of Letter size, or a list of (width, height));
    ``rotate``: every page's /Rotate (a multiple of 90); ``crop``: every page's
    /CropBox.  ``document(0)`` has no pages."""
    sizes = [LETTER] * pages if isinstance(pages, int) else list(pages)
    w = Writer()
    catalog, tree = w.reserve(), w.reserve()
    font = w.add(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    kids = []
    cropbox = b" /CropBox [%s]" % b" ".join(_num(v) for v in crop) if crop else b""
    for n, (width, height) in enumerate(sizes, start=1):
        content = w.add(Writer.stream(_page_content(n, width, height)))
        kids.append(
            w.add(
                b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 %s %s] /Contents %d 0 R "
                b"/Rotate %d /Resources << /Font << /F1 %d 0 R >> >>%s >>"
                % (tree, _num(width), _num(height), content, rotate, font, cropbox)
            )
        )
    w.set(catalog, b"<< /Type /Catalog /Pages %d 0 R >>" % tree)
    refs = b" ".join(b"%d 0 R" % k for k in kids)
    w.set(tree, b"<< /Type /Pages /Kids [%s] /Count %d >>" % (refs, len(kids)))
    return w.build(catalog, version=version)


def filled_form(*, appearance: bool = True) -> bytes:
    """One blank Letter page whose only content is a filled text field in the
    box (50, 600)-(300, 640): a yellow box with FILLED in it as its appearance
    stream, or, with ``appearance=False``, no appearance and the form's
    NeedAppearances flag (a reader draws the value itself)."""
    w = Writer()
    catalog, tree, page = w.reserve(), w.reserve(), w.reserve()
    font = w.add(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    field = b"/Type /Annot /Subtype /Widget /FT /Tx /T (name) /V (FILLED) /F 4"
    field += b" /Rect [50 600 300 640] /DA (/Helv 20 Tf 0 g) /P %d 0 R" % page
    form = b"/Fields [%d 0 R] /DR << /Font << /Helv %d 0 R >> >>"
    if appearance:
        look = w.add(
            Writer.stream(
                b"1 1 0 rg 0 0 250 40 re f BT 0 g /Helv 20 Tf 5 10 Td (FILLED) Tj ET",
                b"/Type /XObject /Subtype /Form /BBox [0 0 250 40] "
                b"/Resources << /Font << /Helv %d 0 R >> >> " % font,
            )
        )
        widget = w.add(b"<< %s /AP << /N %d 0 R >> >>" % (field, look))
    else:
        widget = w.add(b"<< %s >>" % field)
        form += b" /NeedAppearances true"
    content = w.add(Writer.stream(b""))
    w.set(
        page,
        b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 612 792] /Contents %d 0 R "
        b"/Annots [%d 0 R] /Resources << >> >>" % (tree, content, widget),
    )
    w.set(tree, b"<< /Type /Pages /Kids [%d 0 R] /Count 1 >>" % page)
    w.set(
        catalog,
        b"<< /Type /Catalog /Pages %d 0 R /AcroForm << %s >> >>" % (tree, form % (widget, font)),
    )
    return w.build(catalog)


def many_pages(count: int, size: tuple[float, float] = LETTER) -> bytes:
    """``count`` pages sharing one content stream, MediaBox and resources (inherited)."""
    w = Writer()
    catalog, tree = w.reserve(), w.reserve()
    font = w.add(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    content = w.add(Writer.stream(_page_content(1, *size)))
    first = len(w.objects) + 1
    page = b"<< /Type /Page /Parent %d 0 R /Contents %d 0 R >>" % (tree, content)
    w.objects.extend([page] * count)
    w.set(catalog, b"<< /Type /Catalog /Pages %d 0 R >>" % tree)
    refs = b" ".join(b"%d 0 R" % k for k in range(first, first + count))
    w.set(
        tree,
        b"<< /Type /Pages /Kids [%s] /Count %d /MediaBox [0 0 %s %s] "
        b"/Resources << /Font << /F1 %d 0 R >> >> >>"
        % (refs, count, _num(size[0]), _num(size[1]), font),
    )
    return w.build(catalog)


def inflating(megabytes: int) -> bytes:
    """One page whose Flate content stream inflates to ``megabytes`` MB of
    path operators: about a megabyte of file that pdfium inflates in memory."""
    chunk = b"0 0 m 1 1 l S\n" * 75_000  # ~1 MB
    deflate = zlib.compressobj(1)
    return _one_page(b"".join(deflate.compress(chunk) for _ in range(megabytes)) + deflate.flush())


PAST_CAP = (1 << 30) + (8 << 20)  # pdfium keeps 1 GiB of one Flate coding's output


@functools.cache
def blanks_past_cap(tail: bytes = b"") -> bytes:
    """A GiB and 8 MiB of blanks, then ``tail``, Flate-coded: a 1 MB stream
    whose end pdfium drops (built once per test process, ~3 s)."""
    deflate, chunk = zlib.compressobj(9), b" " * (1 << 20)
    parts = [deflate.compress(chunk) for _ in range(PAST_CAP >> 20)]
    return b"".join(parts) + deflate.compress(tail) + deflate.flush()


def content_past_cap(twice: bool = False) -> bytes:
    """One page whose content stream draws a black fill after a GiB of
    blanks: pdfium drew it white.  ``twice``: Flate-coded once more (a few
    kB of file, ``[/FlateDecode /FlateDecode]``)."""
    flated = blanks_past_cap(b"\n0 0 612 792 re f\n")
    if not twice:
        return _one_page(flated)
    w = Writer()
    content = w.add(
        Writer.stream(zlib.compress(flated, 9), b"/Filter [/FlateDecode /FlateDecode] ")
    )
    return _letter_page(w, content)


def render_bomb(paths: int) -> bytes:
    """One page of ``paths`` separately stroked dashed curves: a small file
    (Flate) that takes pdfium seconds per hundred thousand to draw."""
    ops = b"[1 1] 0 d 0.1 w " + b"".join(
        b"%d %d m %d %d %d %d %d %d c S\n"
        % (k % 600, k % 780, k % 610, 5 + k % 770, 3 + k % 590, k % 700, 7 + k % 580, k % 790)
        for k in range(paths)
    )
    return _one_page(zlib.compress(ops, 1))


def tiling_bomb(step: float = 0.003) -> bytes:
    """One page filled with a tiling pattern of ``step``-point cells: under a
    kilobyte, and one page object pdfium draws for minutes without asking
    whether to pause."""
    w = Writer()
    pattern = w.add(
        Writer.stream(
            b"0 0 0.001 0.001 re f",
            b"/Type /Pattern /PatternType 1 /PaintType 1 /TilingType 1 "
            b"/BBox [0 0 0.001 0.001] /XStep %r /YStep %r /Resources << >> " % (step, step),
        )
    )
    content = w.add(Writer.stream(b"/Pattern cs /P scn 0 0 612 792 re f"))
    return _letter_page(w, content, b"/Resources << /Pattern << /P %d 0 R >> >>" % pattern)


def _one_page(flated: bytes) -> bytes:
    """A one-page Letter PDF whose content stream is ``flated`` (Flate-coded)."""
    w = Writer()
    content = w.add(Writer.stream(flated, b"/Filter /FlateDecode "))
    return _letter_page(w, content)


def _letter_page(w: Writer, content: int, extra: bytes = b"") -> bytes:
    """``w``'s objects and one Letter page drawing the stream ``content``, as a PDF."""
    catalog, tree, page = w.reserve(), w.reserve(), w.reserve()
    w.set(
        page,
        b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 612 792] /Contents %d 0 R %s>>"
        % (tree, content, extra),
    )
    w.set(tree, b"<< /Type /Pages /Kids [%d 0 R] /Count 1 >>" % page)
    w.set(catalog, b"<< /Type /Catalog /Pages %d 0 R >>" % tree)
    return w.build(catalog)


# -- the standard security handler (PDF 1.7, 7.6.3: RC4, revision 3) ------------------

_PAD = bytes.fromhex("28BF4E5E4E758A4164004E56FFFA01082E2E00B6D0683E802F0CA9FE6453697A")


def attached(body: bytes, filters: bytes = b"/FlateDecode", name: bytes = b"a.bin") -> bytes:
    """A one-page PDF with an embedded file: ``body``, already coded by
    ``filters`` (a name or an array, written as given)."""
    w = Writer()
    data = w.add(w.stream(body, b"/Type /EmbeddedFile /Filter %s " % filters))
    spec = w.add(b"<< /Type /Filespec /F (%s) /EF << /F %d 0 R >> >>" % (name, data))
    pages = w.reserve()
    page = w.add(b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 100 100] >>" % pages)
    w.set(pages, b"<< /Type /Pages /Kids [%d 0 R] /Count 1 >>" % page)
    files = b"<< /EmbeddedFiles << /Names [(%s) %d 0 R] >> >>" % (name, spec)
    return w.build(w.add(b"<< /Type /Catalog /Pages %d 0 R /Names %s >>" % (pages, files)))


def lzw(data: bytes) -> bytes:
    """``data`` coded as PDF's LZWDecode undoes it (PDF 32000 §7.4.4.2: the
    first 10-bit code follows the creation of entry 511, and so on; a clear
    code when the table is full), written here from the standard's text."""
    table = {bytes([i]): i for i in range(256)}
    codes, width, word = [(256, 9)], 9, b""
    for byte in data:
        grown = word + bytes([byte])
        if grown in table:
            word = grown
            continue
        codes.append((table[word], width))
        table[grown] = len(table) + 2  # 256 and 257 are taken
        if len(table) + 2 == 4095:
            codes.append((256, width))
            table, width = {bytes([i]): i for i in range(256)}, 9
        elif len(table) + 2 >= 1 << width:
            width += 1
        word = bytes([byte])
    if word:
        codes.append((table[word], width))
    codes.append((257, width))
    bits, held, out = 0, 0, bytearray()
    for code, size in codes:
        bits, held = (bits << size) | code, held + size
        while held >= 8:
            held -= 8
            out.append((bits >> held) & 0xFF)
    if held:
        out.append((bits << (8 - held)) & 0xFF)
    return bytes(out)


def rc4(key: bytes, data: bytes) -> bytes:
    s = list(range(256))
    j = 0
    for i in range(256):
        j = (j + s[i] + key[i % len(key)]) & 0xFF
        s[i], s[j] = s[j], s[i]
    out = bytearray(len(data))
    i = j = 0
    for k, byte in enumerate(data):
        i = (i + 1) & 0xFF
        j = (j + s[i]) & 0xFF
        s[i], s[j] = s[j], s[i]
        out[k] = byte ^ s[(s[i] + s[j]) & 0xFF]
    return bytes(out)


def _padded(password: str) -> bytes:
    return (password.encode("latin-1") + _PAD)[:32]


def _rc4_rounds(key: bytes, data: bytes) -> bytes:
    """RC4 with ``key``, then 19 more times with each byte of the key XOR i."""
    data = rc4(key, data)
    for i in range(1, 20):
        data = rc4(bytes(b ^ i for b in key), data)
    return data


def _security(user: str, owner: str, permissions: int, file_id: bytes) -> tuple[bytes, ...]:
    """(O, U, file key) for revision 3 with a 128-bit key (algorithms 2, 3 and 5)."""
    n = 16
    digest = hashlib.md5(_padded(owner or user)).digest()
    for _ in range(50):
        digest = hashlib.md5(digest[:n]).digest()
    o = _rc4_rounds(digest[:n], _padded(user))
    h = hashlib.md5(_padded(user) + o + struct.pack("<i", permissions) + file_id).digest()
    for _ in range(50):
        h = hashlib.md5(h[:n]).digest()
    key = h[:n]
    u = _rc4_rounds(key, hashlib.md5(_PAD + file_id).digest()) + bytes(16)
    return o, u, key


def _object_key(key: bytes, num: int) -> bytes:
    """The RC4 key of object ``num`` (generation 0): algorithm 1, 128-bit."""
    return hashlib.md5(key + num.to_bytes(3, "little") + b"\x00\x00").digest()[:16]


def encrypted(
    user_password: str = "secret",
    owner_password: str = "owner",
    pages: int = 1,
    attachment: bytes | None = None,
) -> bytes:
    """``document(pages)`` encrypted with RC4-128; empty ``user_password``:
    opens without one.  With ``attachment``: an embedded file, Flate-coded
    then encrypted as every stream is."""
    file_id = hashlib.md5(b"hypermedia test " + user_password.encode()).digest()
    permissions = -3904  # print and copy allowed, the rest not (bits 1-2 and 13-32 set)
    o, u, key = _security(user_password, owner_password, permissions, file_id)
    w = Writer()
    catalog, tree = w.reserve(), w.reserve()
    font = w.add(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    kids = []
    for n in range(1, pages + 1):
        num = len(w.objects) + 1
        obj_key = _object_key(key, num)
        content = w.add(Writer.stream(rc4(obj_key, _page_content(n, *LETTER))))
        kids.append(
            w.add(
                b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 612 792] /Contents %d 0 R "
                b"/Resources << /Font << /F1 %d 0 R >> >> >>" % (tree, content, font)
            )
        )
    names = b""
    if attachment is not None:
        num = len(w.objects) + 1
        obj_key = _object_key(key, num)
        coded = rc4(obj_key, zlib.compress(attachment))
        data = w.add(Writer.stream(coded, b"/Type /EmbeddedFile /Filter /FlateDecode "))
        num += 1
        obj_key = _object_key(key, num)
        name = rc4(obj_key, b"a.bin").hex().encode()  # strings are encrypted too
        spec = w.add(b"<< /Type /Filespec /F <%s> /EF << /F %d 0 R >> >>" % (name, data))
        names = b"/Names << /EmbeddedFiles << /Names [(a) %d 0 R] >> >>" % spec
    w.set(catalog, b"<< /Type /Catalog /Pages %d 0 R %s >>" % (tree, names))
    refs = b" ".join(b"%d 0 R" % k for k in kids)
    w.set(tree, b"<< /Type /Pages /Kids [%s] /Count %d >>" % (refs, len(kids)))
    enc = w.add(
        b"<< /Filter /Standard /V 2 /R 3 /Length 128 /P %d /O <%s> /U <%s> >>"
        % (permissions, o.hex().encode(), u.hex().encode())
    )
    fid = file_id.hex().encode()
    return w.build(catalog, b"/Encrypt %d 0 R /ID [<%s> <%s>] " % (enc, fid, fid))


# -- realistic pages, for the benchmark -------------------------------------------------

# fmt: off
_WORDS = (
    "media", "pipeline", "worker", "queue", "render", "page", "preview", "document", "storage",
    "ledger", "object", "profile", "credit", "attempt", "scratch", "limit", "hostile", "input",
    "encode", "decode", "vector", "text", "bezier", "curve", "table", "figure", "chart",
    "report", "annual", "summary", "revenue", "quarter", "growth",
)
# fmt: on


def _text(s: str) -> bytes:
    return s.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)").encode("latin-1")


def _realistic_content(rng: random.Random, n: int, width: float, height: float) -> bytes:
    ops: list[bytes] = []
    # A heading, then two columns of justified-looking paragraphs.
    ops.append(b"BT /F2 18 Tf 54 %s Td (%s) Tj ET" % (_num(height - 60), _text(f"Section {n}")))
    col_w = (width - 54 * 2 - 18) / 2
    for col in range(2):
        x = 54 + col * (col_w + 18)
        y = height - 90
        ops.append(b"BT /F1 9 Tf 11 TL %s %s Td" % (_num(x), _num(y)))
        for _ in range(48):
            line = " ".join(rng.choice(_WORDS) for _ in range(int(col_w / 36)))
            ops.append(b"(%s) '" % _text(line))
        ops.append(b"ET")
    # A chart: axes, a grid, a filled area under a curve, bars, a Bezier line.
    cx, cy, cw, ch = 54.0, 80.0, width - 108, 150.0
    ops.append(b"q 0.85 0.85 0.85 RG 0.5 w")
    for i in range(11):
        gy = cy + ch * i / 10
        ops.append(b"%s %s m %s %s l S" % (_num(cx), _num(gy), _num(cx + cw), _num(gy)))
    ops.append(b"Q q 0 0 0 RG 1 w %s %s m %s %s l %s %s l S Q" % (
        _num(cx), _num(cy + ch), _num(cx), _num(cy), _num(cx + cw), _num(cy)
    ))  # fmt: skip
    bars = 24
    for i in range(bars):
        r, g, b = rng.random(), rng.random(), rng.random()
        bh = ch * rng.uniform(0.1, 0.95)
        bx = cx + 4 + i * (cw - 8) / bars
        ops.append(b"q %s %s %s rg %s %s %s %s re f Q" % (
            _num(r), _num(g), _num(b), _num(bx), _num(cy), _num((cw - 8) / bars - 3), _num(bh)
        ))  # fmt: skip
    pts = [(cx + cw * i / 12, cy + ch * rng.uniform(0.2, 0.9)) for i in range(13)]
    path = [b"%s %s m" % (_num(pts[0][0]), _num(pts[0][1]))]
    for (x0, y0), (x1, y1) in itertools.pairwise(pts):
        dx = (x1 - x0) / 3
        path.append(b"%s %s %s %s %s %s c" % (
            _num(x0 + dx), _num(y0), _num(x1 - dx), _num(y1), _num(x1), _num(y1)
        ))  # fmt: skip
    ops.append(b"q 0.1 0.3 0.8 RG 2 w 1 J 1 j " + b" ".join(path) + b" S Q")
    # Decorative circles (four Bezier arcs each), some filled, some stroked.
    k = 0.5523
    for _ in range(12):
        x, y, rad = rng.uniform(60, width - 60), rng.uniform(260, height - 120), rng.uniform(4, 20)
        c = rad * k
        circle = b"%s %s m %s %s %s %s %s %s c %s %s %s %s %s %s c %s %s %s %s %s %s c " % (
            _num(x + rad), _num(y),
            _num(x + rad), _num(y + c), _num(x + c), _num(y + rad), _num(x), _num(y + rad),
            _num(x - c), _num(y + rad), _num(x - rad), _num(y + c), _num(x - rad), _num(y),
            _num(x - rad), _num(y - c), _num(x - c), _num(y - rad), _num(x), _num(y - rad),
        ) + b"%s %s %s %s %s %s c h" % (
            _num(x + c), _num(y - rad), _num(x + rad), _num(y - c), _num(x + rad), _num(y),
        )  # fmt: skip
        op = b"f" if rng.random() < 0.5 else b"S"
        ops.append(b"q 0.9 0.5 0.1 rg 0.2 0.2 0.2 RG 0.8 w %s %s Q" % (circle, op))
    ops.append(b"BT /F1 8 Tf %s 30 Td (%s) Tj ET" % (_num(width / 2 - 10), _text(f"- {n} -")))
    return b"\n".join(ops)


def realistic(pages: int = 10, seed: int = 0, size: tuple[float, float] = A4) -> bytes:
    """A report-like document: text in two columns, a chart and shapes on every page;
    content streams Flate-compressed as real producers write them."""
    rng = random.Random(seed)
    w = Writer()
    catalog, tree = w.reserve(), w.reserve()
    f1 = w.add(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    f2 = w.add(b"<< /Type /Font /Subtype /Type1 /BaseFont /Times-Bold >>")
    kids = []
    for n in range(1, pages + 1):
        data = zlib.compress(_realistic_content(rng, n, *size), 6)
        content = w.add(Writer.stream(data, b"/Filter /FlateDecode "))
        kids.append(
            w.add(
                b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 %s %s] /Contents %d 0 R "
                b"/Resources << /Font << /F1 %d 0 R /F2 %d 0 R >> >> >>"
                % (tree, _num(size[0]), _num(size[1]), content, f1, f2)
            )
        )
    w.set(catalog, b"<< /Type /Catalog /Pages %d 0 R >>" % tree)
    refs = b" ".join(b"%d 0 R" % k for k in kids)
    w.set(tree, b"<< /Type /Pages /Kids [%s] /Count %d >>" % (refs, len(kids)))
    return w.build(catalog)


def image_page(
    width: int,
    height: int,
    *,
    bits: int = 8,
    colorspace: bytes = b"/DeviceRGB",
    filters: bytes = b"/FlateDecode",
    data: bytes | None = None,
    via: str = "page",
    icc_components: int | None = None,
) -> bytes:
    """A Letter page filled by one image of ``width`` x ``height`` pixels,
    drawn ``via`` the page itself, a form XObject ("form"), an annotation's
    appearance ("annot"), a tiling pattern ("pattern"), as the soft mask of
    a 1 x 1 image ("smask"), or inline in the content stream ("inline").
    ``icc_components``: the colour space is an ICCBased stream with that /N.
    ``data`` defaults to a little Flate of zeros: what the image's dictionary
    claims is what a check before rendering reads."""
    w = Writer()
    body = zlib.compress(bytes(4096)) if data is None else data
    draw = b"q 612 0 0 792 0 0 cm /Im1 Do Q"
    if icc_components is not None:
        icc = w.add(Writer.stream(b"", b"/N %d " % icc_components))
        colorspace = b"[/ICCBased %d 0 R]" % icc
    if via == "inline":
        inline = b"BI /W %d /H %d /CS %s /BPC %d /F /Fl ID\n" % (width, height, colorspace, bits)
        return _letter_page(
            w, w.add(Writer.stream(b"q 612 0 0 792 0 0 cm " + inline + body + b"\nEI Q"))
        )

    def image(w_: int, h_: int, data_: bytes, space: bytes, extra: bytes = b"") -> int:
        return w.add(
            Writer.stream(
                data_,
                b"/Type /XObject /Subtype /Image /Width %d /Height %d /ColorSpace %s "
                b"/BitsPerComponent %d /Filter %s %s" % (w_, h_, space, bits, filters, extra),
            )
        )

    if via == "smask":
        mask = image(width, height, body, b"/DeviceGray")
        bits, filters = 8, b"/FlateDecode"
        shown = image(1, 1, zlib.compress(bytes(3)), b"/DeviceRGB", b"/SMask %d 0 R" % mask)
    else:
        shown = image(width, height, body, colorspace)
    resources = b"/Resources << /XObject << /Im1 %d 0 R >> >> " % shown
    form = b"/Type /XObject /Subtype /Form /BBox [0 0 612 792] " + resources
    if via in ("page", "smask"):
        return _letter_page(w, w.add(Writer.stream(draw)), resources)
    if via == "form":
        fm = w.add(Writer.stream(draw, form))
        page_res = b"/Resources << /XObject << /Fm1 %d 0 R >> >> " % fm
        return _letter_page(w, w.add(Writer.stream(b"/Fm1 Do")), page_res)
    if via == "annot":
        appearance = w.add(Writer.stream(draw, form))
        annot = w.add(
            b"<< /Type /Annot /Subtype /Square /Rect [0 0 612 792] /F 4 /AP << /N %d 0 R >> >>"
            % appearance
        )
        return _letter_page(w, w.add(Writer.stream(b"")), b"/Annots [%d 0 R] " % annot)
    if via == "pattern":
        pattern = w.add(
            Writer.stream(
                draw,
                b"/Type /Pattern /PatternType 1 /PaintType 1 /TilingType 1 "
                b"/BBox [0 0 612 792] /XStep 612 /YStep 792 " + resources,
            )
        )
        fill = w.add(Writer.stream(b"/Pattern cs /P scn 0 0 612 792 re f"))
        return _letter_page(w, fill, b"/Resources << /Pattern << /P %d 0 R >> >> " % pattern)
    raise ValueError(via)

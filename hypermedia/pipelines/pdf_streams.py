"""What clamd decodes from a PDF: each stream, its filters undone.

clamd reads every stream of a PDF through its filters (Flate, ASCIIHex,
ASCII85, LZW, RunLength) and scans what comes out as a file of its own: a
ZIP there is unzipped, an xz stream unpacked, each with the same limits as
at the top.  So a ZIP whose member clamd cannot decode (LZMA), a RAR, or
xz streams joined, embedded in a PDF, were OK from clamd and called clean.
``streams`` finds each stream as clamd finds one and ``decoded`` undoes its
filters lazily, in chunks, for ``nested`` to tell whether what comes out
is a layer to survey, or holds one after other bytes.

A picture's coding (DCT, JPX, JBIG2, CCITT) or a Crypt filter ends the
chain: what came before it is the stream, as clamd scans it; a name not
known is passed over, as clamd does.  Predictors (``/DecodeParms``) are
not undone.  An encrypted
file's streams are ciphertext as bytes: clamd decrypts one that opens
without a password, so its embedded files are read through pdfium instead
(``decrypted_attachments``), and one that needs a password is ``Locked``.
"""

from __future__ import annotations

import base64
import binascii
import functools
import math
import mmap
import re
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from hypermedia.pipelines import pdf_images

_CHUNK = 1024 * 1024
# Codings of pictures, and encryption: clamd undoes none of them, and stops
# there.  Any other name it does not know it passes over (so is it here).
_FINAL = frozenset(
    {b"DCTDecode", b"DCT", b"JPXDecode", b"JBIG2Decode", b"CCITTFaxDecode", b"CCF", b"Crypt"}
)
_SLICE = 64 * 1024  # input taken at a time by decoders whose output may swell
_NAME = re.compile(rb"/([^\s/\[\]<>()]+)")
_ENDSTREAM = b"endstream"
_A85_GROUPS = re.compile(rb"(?:z|[!-u]{5})*")


def is_pdf(head: bytes) -> bool:
    """Whether ``head`` (a file's first bytes) starts a PDF as clamd tells one:
    ``%PDF-`` in its first kilobyte (readers allow junk before it)."""
    return b"%PDF-" in head[:1024]


@dataclass(frozen=True)
class Stream:
    filters: tuple[bytes, ...]  # by name, first applied first
    start: int  # the raw data's first byte in the file
    end: int  # one past its last
    kind: bytes = b""  # b"Image", else its /Type (b"EmbeddedFile", b"XObject"…) or b""


def streams(data: mmap.mmap) -> Iterator[Stream]:
    """Every stream of the PDF in ``data``, in file order.  Its data ends at
    the next ``endstream`` (or without one, the next stream's start), or at
    ``/Length`` (a number, or a reference to one) when that says more, or
    what is between is only the end of its line."""
    objects = pdf_images._Objects(data)
    floor = 0  # the last stream's start: no dictionary begins before it
    ahead = -2  # the next "endstream" found, -1 if there is none
    matches = pdf_images.STREAM.finditer(data)  # as clamd finds them too
    following = next(matches, None)
    while (match := following) is not None:
        following = next(matches, None)
        head = pdf_images.dictionary(data, match.start(), floor)
        floor = match.end()
        begin = match.end()
        length = pdf_images._number(head, b"Length", objects)
        if ahead != -1 and ahead < begin:  # -1: none after an earlier stream, so none here
            ahead = data.find(_ENDSTREAM, begin)  # (each search to the end was quadratic)
        end = ahead  # without an "endstream" after it, the next stream's start ends it
        if ahead < 0:
            end = len(data) if following is None else following.start()
        if length is not None and 0 <= length <= len(data) - begin:
            # The furthest of the two: clamd reads to "endstream" past a
            # /Length that says less, and data may hold "endstream" itself;
            # the end of line before "endstream" is no data.
            told = begin + length
            if ahead < 0 or ahead < told or not data[told:ahead].strip():
                end = told
        filters = _NAME.findall(pdf_images._value(head, b"Filter", objects) or b"")
        yield Stream(tuple(filters), begin, end, _kind(head, objects))


def _kind(head: bytes, objects: pdf_images._Objects) -> bytes:
    if pdf_images._is_image(head, objects):
        return b"Image"
    return (pdf_images._value(head, b"Type", objects) or b"").lstrip(b"/")


# pdfium keeps at most INFLATE_CAP of what one Flate or LZW coding puts out
# and carries on with that: a content stream (or a form, pattern or font)
# past it draws its page without the end, and nothing says so (a fill after
# a GiB of blanks was not drawn, and the preview completed).  A stream is
# inflated to see only when its codings could put out that much: each puts
# out at most this many bytes a byte (Flate 1,032; LZW under 4,096, as no
# entry of its table is longer than the table; a run of 128 for 2 bytes).
_MOST_OUT = {
    b"FlateDecode": 1032.0, b"Fl": 1032.0, b"LZWDecode": 4096.0, b"LZW": 4096.0,
    b"RunLengthDecode": 64.0, b"RL": 64.0,
    b"ASCIIHexDecode": 0.5, b"AHx": 0.5, b"ASCII85Decode": 0.8, b"A85": 0.8,
}  # fmt: skip
# Read by nobody drawing a page; images are sized from their dictionaries
# (pdf_images.scan), not inflated.
_NOT_DRAWN = frozenset({b"Image", b"EmbeddedFile", b"Metadata"})


def inflated_past_cap(path: str, seconds: float) -> bool:
    """Whether a stream of the PDF at ``path`` that pdfium reads to draw a
    page inflates past pdf_images.INFLATE_CAP through its last Flate or LZW
    coding, as far as ``seconds`` of looking tell: zlib inflates a bomb's
    GiB in ~3 s here, and a document of gigabytes of drawing (a set of
    plans) would take minutes to look through whole, for pages it mostly
    does not render.  Past them, the rest is not looked at."""
    deadline = time.monotonic() + seconds
    with open(path, "rb") as f:
        try:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file
            return False
    with data:
        try:
            for stream in streams(data):
                if time.monotonic() > deadline:
                    return False
                if _inflates_past_cap(data, stream, deadline):
                    return True
        except Late:
            return False
    return False


def _inflates_past_cap(data: mmap.mmap, stream: Stream, deadline: float) -> bool:
    capped = [i for i, name in enumerate(stream.filters) if name in pdf_images._CAPPED]
    if stream.kind in _NOT_DRAWN or not capped:
        return False
    upto = Stream(stream.filters[: capped[-1] + 1], stream.start, stream.end)
    most = float(upto.end - upto.start)
    for name in upto.filters:
        if name in _FINAL:  # decoded() stops there: nothing capped comes after
            return False
        most *= _MOST_OUT.get(name, 1.0)
    if most <= pdf_images.INFLATE_CAP:
        return False
    total = 0
    for chunk in decoded(data, upto, deadline):
        total += len(chunk)
        if total > pdf_images.INFLATE_CAP:
            return True
    return False


class Late(Exception):
    """The deadline passed while a stream was decoded."""


def decoded(data: mmap.mmap, stream: Stream, deadline: float = math.inf) -> Iterator[bytes]:
    """The stream's data with each filter undone in turn, in chunks, up to
    a picture's coding (``_FINAL``); a name not known is passed over, as
    clamd does.  A filter's data found damaged ends the stream where it went
    wrong (clamd scans what it decoded so far).  Raises Late past ``deadline``
    (a chunk, maybe empty, comes at least every 64 kB of input)."""
    chunks: Iterator[bytes] = _raw(data, stream.start, stream.end)
    for name in stream.filters:
        if name in _FINAL:
            break
        decoder = _DECODERS.get(name)
        if decoder is not None:
            chunks = decoder(chunks)
    return _timed(_tolerant(chunks), deadline)


def _timed(chunks: Iterator[bytes], deadline: float) -> Iterator[bytes]:
    for chunk in chunks:
        if time.monotonic() > deadline:
            raise Late
        yield chunk


class Locked(Exception):
    """The PDF needs a password to open: clamd cannot read what is inside either."""


def decrypted_attachments(path: str) -> Iterator[Callable[[], Iterator[bytes]]]:
    """Each embedded file (of the name tree) of the PDF at ``path``,
    decrypted and decoded by pdfium, as a function giving its chunks: for an
    encrypted PDF, whose streams are ciphertext as bytes.  Raises Locked if
    it needs a password; a file pdfium cannot open otherwise has none to give."""
    import pypdfium2

    try:
        doc = pypdfium2.PdfDocument(path)
    except pypdfium2.PdfiumError as exc:
        if exc.err_code == pypdfium2.raw.FPDF_ERR_PASSWORD:
            raise Locked from None
        return
    try:
        for i in range(doc.count_attachments()):
            try:
                data = memoryview(doc.get_attachment(i).get_data()).cast("B")
            except pypdfium2.PdfiumError:  # a spec without a stream
                continue
            yield functools.partial(_pieces, data)
    finally:
        doc.close()


def _pieces(data: memoryview) -> Iterator[bytes]:
    for at in range(0, len(data), _SLICE):
        yield data[at : at + _SLICE].tobytes()


def _raw(data: mmap.mmap, start: int, end: int) -> Iterator[bytes]:
    for at in range(start, end, _SLICE):
        yield data[at : min(end, at + _SLICE)]


def _tolerant(chunks: Iterator[bytes]) -> Iterator[bytes]:
    try:
        yield from chunks
    except (ValueError, zlib.error, binascii.Error):
        return


def _slices(chunks: Iterator[bytes]) -> Iterator[bytes]:
    for chunk in chunks:
        for at in range(0, len(chunk), _SLICE):
            yield chunk[at : at + _SLICE]


def _flate(chunks: Iterator[bytes]) -> Iterator[bytes]:
    d = zlib.decompressobj()
    for chunk in chunks:
        data = chunk
        while data and not d.eof:
            out = d.decompress(data, _SLICE)
            data = d.unconsumed_tail
            yield out  # empty too: the deadline is checked between
        if d.eof:
            return
    if tail := d.flush():
        yield tail


def _text_coded(
    chunks: Iterator[bytes],
    end: bytes,
    whole: Callable[[bytes], int],
    decode: Callable[[bytes], bytes],
) -> Iterator[bytes]:
    """A text coding's data (blanks anywhere), up to ``end``: ``whole(text)``
    says how much of it is whole groups, decoded now; the rest waits for the
    next chunk; the last, maybe short, group is decoded as it is."""
    carry = b""
    for chunk in chunks:
        text = carry + re.sub(rb"\s+", b"", chunk)
        at = text.find(end)
        if at >= 0:
            yield decode(text[:at])
            return
        keep = whole(text)
        text, carry = text[:keep], text[keep:]
        yield decode(text)
    if carry:
        yield decode(carry)


def _hex(chunks: Iterator[bytes]) -> Iterator[bytes]:
    def whole(text: bytes) -> int:
        return len(text) - len(text) % 2

    def decode(text: bytes) -> bytes:
        return binascii.unhexlify(text + b"0" * (len(text) % 2))  # an odd digit: 0 follows

    return _text_coded(chunks, b">", whole, decode)


def _a85(chunks: Iterator[bytes]) -> Iterator[bytes]:
    def whole(text: bytes) -> int:
        groups = _A85_GROUPS.match(text)  # always matches: "" at least
        keep = groups.end() if groups else 0
        if len(text) - keep >= 5:  # not a group: a character ASCII85 does not use
            raise ValueError("not ASCII85")
        return keep

    return _text_coded(chunks, b"~>", whole, base64.a85decode)  # a short last group is padded


def _run_length(chunks: Iterator[bytes]) -> Iterator[bytes]:
    carry, out = b"", bytearray()
    for chunk in _slices(chunks):
        data, at = carry + chunk, 0
        while at < len(data):
            n = data[at]
            if n == 128:  # end of data
                yield bytes(out)
                return
            if n < 128:  # the next n + 1 bytes as they are
                if at + 1 + n + 1 > len(data):
                    break
                out += data[at + 1 : at + n + 2]
                at += n + 2
            else:  # the next byte, 257 - n times
                if at + 1 >= len(data):
                    break
                out += data[at + 1 : at + 2] * (257 - n)
                at += 2
            if len(out) >= _CHUNK:
                yield bytes(out)
                out.clear()
        carry = data[at:]
        yield bytes(out)  # empty too: the deadline is checked between
        out.clear()


def _lzw(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """PDF's LZW (codes of 9 to 12 bits, first bit first; 256 clears the
    table, 257 ends the data; the code grows one entry early, the default
    ``EarlyChange`` of 1)."""
    table = [bytes([i]) for i in range(256)] + [b"", b""]
    width, bits, held, prev = 9, 0, 0, b""
    out = bytearray()
    for chunk in _slices(chunks):
        for byte in chunk:
            bits, held = (bits << 8) | byte, held + 8
            if held < width:
                continue
            held -= width
            code, bits = bits >> held, bits & ((1 << held) - 1)
            if code == 256:
                del table[258:]
                width, prev = 9, b""
                continue
            if code == 257:
                yield bytes(out)
                return
            if code < len(table):
                entry = table[code]
            elif code == len(table) and prev:
                entry = prev + prev[:1]
            else:
                raise ValueError("an LZW code past its table")
            if prev and len(table) < 4096:
                table.append(prev + entry[:1])
            out += entry
            prev = entry
            if len(table) + 1 >= 1 << width and width < 12:
                width += 1
            if len(out) >= _CHUNK:
                yield bytes(out)
                out.clear()
        yield bytes(out)  # empty too: the deadline is checked between
        out.clear()


_DECODERS: dict[bytes, Callable[[Iterator[bytes]], Iterator[bytes]]] = {
    b"FlateDecode": _flate,
    b"Fl": _flate,
    b"ASCIIHexDecode": _hex,
    b"AHx": _hex,
    b"ASCII85Decode": _a85,
    b"A85": _a85,
    b"LZWDecode": _lzw,
    b"LZW": _lzw,
    b"RunLengthDecode": _run_length,
    b"RL": _run_length,
}

"""What a ZIP declares of its members, and those of ZIPs inside it.

The virus scan needs this because clamd's ZIP reader calls OK what it did
not read: the part of a member past MaxFileSize, an encrypted member, and
(ClamAV 1.4) any member of a ZIP whose central directory it cannot find
(a cut tail: "central not found, using localhdrs", then nothing extracted).
So both the directory and the local headers are read here: sizes from each
(and from a member's data descriptor, which the directory may understate),
the encryption flag of each, and whether the file is a ZIP whose members
only local headers show.  ``survey`` decompresses nothing (the file is read
once, in chunks, plus a few small reads); ``survey_nested`` unpacks the
layers clamd would (ZIP and tar members, gzip, bzip2 and xz streams) to
survey the ZIPs inside them too, and notes a RAR archive in any of them
(without the non-free libclamunrar, Debian's clamd does not unpack RAR).
"""

from __future__ import annotations

import bisect
import bz2
import contextvars
import functools
import io
import itertools
import lzma
import math
import mmap
import os
import struct
import tarfile
import tempfile
import time
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any, cast

from hypermedia.pipelines import archives, mail_parts, pdf_streams

LOCAL = b"PK\x03\x04"
RAR = b"Rar!\x1a\x07"
# signature, version, flags, method, time, date, crc, compressed, size, name, extra
_HEADER = struct.Struct("<4sHHHHHIIIHH")
# Methods the ZIP note (APPNOTE 4.4.5) assigns; a match with another is a chance
# "PK\3\4" inside other data, not a member.
_METHODS = frozenset(
    {0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 12, 14, 16, 18, 19, 93, 94, 95, 96, 97, 98, 99}
)
_DESCRIPTOR = 0x0008  # flag bit 3: sizes follow the data, the header holds zeros
_ZIP64 = 0xFFFFFFFF
_CHUNK = 1024 * 1024

UNKNOWN = -1  # a member whose size nothing readable declares
_ENCRYPTED = 0x0001  # flag bit 0
# What ClamAV's unzip decodes: stored, shrunk, reduced, imploded, deflated,
# deflate64, bzip2.  A member of another method (LZMA, PPMd, XZ, Zstandard)
# it reads as bytes.
CLAMD_ZIP_METHODS = frozenset({0, 1, 2, 3, 4, 5, 6, 8, 9, 12})
_SIGNED_DESCRIPTOR = b"PK\x07\x08"


@dataclass
class Survey:
    largest: int = 0  # the largest uncompressed size declared; UNKNOWN: see largest_member
    encrypted: bool = False  # a member is encrypted: nothing can read it
    hidden: bool = False  # a ZIP whose members no readable central directory lists
    unchecked: bool = False  # ZIPs inside it too many, too large or too deep to survey
    unsized: bool = False  # a ZIP inside it has a member of UNKNOWN size
    overflowed: bool = False  # a compressed stream in it unpacks past clamd's MaxFileSize
    rar: bool = False  # a RAR archive in it (clamd unpacks RAR only with libclamunrar)
    joined: bool = False  # a gzip, bzip2 or xz file in it with streams after its first
    undecoded: bool = False  # a ZIP member in it compressed by a method clamd lacks
    found: str = ""  # a signature clamd found in a member sent to it alone (MemberScan)
    unscanned: str = ""  # why a member sent to clamd alone was not fully scanned
    unopened: str = ""  # a format in it that clamd does not unpack (archives.UNOPENED)
    overlarge: int = 0  # the largest member past MaxFileSize of another archive in it
    unread: bool = False  # a layer in it could not be unpacked here to be checked
    locked: bool = False  # a PDF in it needs a password to open

    @property
    def settled(self) -> bool:
        """Whether it can no longer be clean (a RAR aside: the profile says):
        looking on changes no verdict, and a file of 25 members full of fake
        ZIP headers held the survey for a minute."""
        return bool(
            self.encrypted or self.hidden or self.unchecked or self.unsized
            or self.overflowed or self.joined or self.undecoded or self.found
            or self.unscanned or self.unopened or self.overlarge or self.unread
            or self.locked
        )  # fmt: skip

    def add(self, inner: Survey) -> None:
        """What a ZIP inside this one declares, counted as this one's (the
        largest known size kept: UNKNOWN is -1)."""
        self.largest = max(self.largest, inner.largest)
        self.unsized |= inner.unsized or inner.largest == UNKNOWN
        self.encrypted |= inner.encrypted
        self.hidden |= inner.hidden
        self.unchecked |= inner.unchecked
        self.overflowed |= inner.overflowed
        self.rar |= inner.rar
        self.joined |= inner.joined
        self.undecoded |= inner.undecoded
        self.found = self.found or inner.found
        self.unscanned = self.unscanned or inner.unscanned
        self.unopened = self.unopened or inner.unopened
        self.overlarge = max(self.overlarge, inner.overlarge)
        self.unread |= inner.unread
        self.locked |= inner.locked


def survey(path: str) -> Survey:
    """What the file at ``path`` declares of its ZIP members (none: ``Survey()``)."""
    out = Survey()
    listed = _directory(path)
    for _, _, size, encrypted in listed:
        out.largest = max(out.largest, size)
        out.encrypted |= encrypted
    covers = _Cover([(start, end) for start, end, _, _ in listed])
    unknown = False
    with open(path, "rb") as f:
        starts_as_zip = f.read(4) == LOCAL
    for offset, size, flags, method in _local_headers(path):
        out.encrypted |= bool(flags & _ENCRYPTED)
        # Also of a ZIP after other bytes whose directory Python cannot find
        # (more junk after it): clamd finds its members by these headers.
        out.undecoded |= method not in CLAMD_ZIP_METHODS
        unknown |= size == UNKNOWN
        out.largest = max(out.largest, size)
        if starts_as_zip and not covers(offset):
            out.hidden = True  # a member the directory does not list, or no directory
    if unknown and not listed:
        out.largest = UNKNOWN
    return out


class _Cover:
    """Whether an offset lies in one of a directory's members: a search per
    local header (a scan of every member per header took 150 s for a 20 MB
    ZIP of 5,000 members full of fake headers).  Hostile members may overlap:
    the furthest end reached by a member starting at or before the offset."""

    def __init__(self, spans: list[tuple[int, int]]) -> None:
        spans.sort()
        self.starts = [a for a, _ in spans]
        self.reach: list[int] = []
        for _, end in spans:
            self.reach.append(max(end, self.reach[-1]) if self.reach else end)

    def __call__(self, offset: int) -> bool:
        i = bisect.bisect_right(self.starts, offset) - 1
        return i >= 0 and offset < self.reach[i]


# clamd unpacks what holds other files — a ZIP's members, a tar's, what a
# gzip, bzip2 or xz stream compresses — and reads a ZIP it finds in any of
# them with the same ZIP reader (a ZIP in a stored member of a ZIP, a ZIP in
# a .tar.gz: 30 kB hid a signature behind 26 MB of padding, called clean).
# Those layers are unpacked here to be surveyed, within these bounds (past
# them: ``unchecked``).
NESTED_DEPTH = 8
NESTED_BYTES = 512 * 1024 * 1024
NESTED_MEMBERS = 10_000  # archives and compressed streams looked into, in all
NESTED_HEADS = 200_000  # members whose first bytes are read to tell whether they are one
NESTED_SCANS = 10_000  # members sent to clamd alone (MemberScan), a few ms each
NESTED_READ = 8 * NESTED_BYTES  # members read to their end for an archive after other bytes
# PDFs' streams decoded, at most, in all (a hostile one has millions, or
# decodes to nothing for minutes; a ZIP of PDFs holds many).
PDF_SECONDS = 20.0
_PDF_DEADLINE: contextvars.ContextVar[float] = contextvars.ContextVar("pdf", default=math.inf)
_HEAD = archives.HEAD_BYTES  # enough to tell a layer by its magic (an ISO's is at 32 kB)


# Sends a file to clamd alone: (verdict, signature, reason), as virus.verdict.
MemberScan = Callable[[str], tuple[str, str | None, str | None]]
_SCAN: contextvars.ContextVar[MemberScan | None] = contextvars.ContextVar("scan", default=None)


def survey_nested(
    path: str, scratch: str, limit: int, scan_member: MemberScan | None = None
) -> Survey:
    """``survey``, and that of every ZIP inside another layer clamd unpacks
    (a ZIP member, a tar member, a gzip, bzip2 or xz stream), down to
    NESTED_DEPTH, unpacking at most NESTED_BYTES and looking into at most
    NESTED_MEMBERS members and streams in all.  Members over ``limit``
    (clamd's MaxFileSize) are not unpacked: a ZIP's are reported already, a
    tar's clamd reports itself (AlertExceedsMax).  A compressed stream that
    unpacks past ``limit`` is ``overflowed``: clamd reads no further than
    that.  A layer that cannot be read whole (a bad CRC, a size that lies, a
    method Python lacks, a cut stream) is ``unchecked``: clamd may have read
    it all the same.

    With ``scan_member``, each member of an archive walked through
    libarchive is unpacked and sent to clamd on its own: whether clamd
    decoded it inside the archive cannot be told from outside (a 7-Zip
    member compressed by BZip2, Deflate or BCJ2, a zisofs ISO's file: it
    read their bytes as they are, and EICAR in them was clean)."""
    token = _SCAN.set(scan_member)
    late = _PDF_DEADLINE.set(time.monotonic() + PDF_SECONDS)
    try:
        budget = [NESTED_BYTES, NESTED_MEMBERS, NESTED_HEADS, NESTED_SCANS, NESTED_READ]
        return _nested(path, scratch, limit, 0, budget)
    finally:
        _PDF_DEADLINE.reset(late)
        _SCAN.reset(token)


def _layer(head: bytes) -> str | None:
    """The kind of container ``head`` (a file's first bytes) starts, if clamd unpacks it."""
    if head.startswith(LOCAL):
        return "zip"
    if head.startswith(RAR):  # RAR 1.5-4.x and 5.0 alike
        return "rar"
    if head[257:262] == b"ustar" or _v7_tar(head):  # POSIX and GNU tar, and the older one
        return "tar"
    stream = next((kind for kind, whole in _STREAM_HEADS.items() if whole(head)), None)
    if stream or (stream := archives.kind_of(head)):
        return stream
    if pdf_streams.is_pdf(head):
        return "pdf"
    if mail_parts.is_mail(head):
        return "mail"
    return "uu" if mail_parts.is_uu(head) else None


def _v7_tar(head: bytes) -> bool:
    """A tar header without the POSIX magic (pre-1988), known by its
    checksum: the sum of its 512 bytes with the checksum field as spaces."""
    if len(head) < 512 or head[0] == 0:
        return False
    field = head[148:156].replace(b"\0", b" ").strip()
    if not field or not all(48 <= c <= 55 for c in field):  # octal digits
        return False
    return int(field, 8) == sum(head[:148]) + 8 * 32 + sum(head[156:512])


_STREAMS = {"gzip": b"\x1f\x8b", "bzip2": b"BZh", "xz": b"\xfd7zXZ\x00"}
# A stream's start, past its magic: two or three bytes alone begin one in
# 65,536 pictures (a PDF's pixels of (31, 139, 34) were "a gzip stream that
# could not be unpacked").  gzip: deflate, no reserved flag, an XFL of 0, 2
# or 4 and a known OS (RFC 1952 §2.3); bzip2: a level, then a block's or the
# end's magic.
_STREAM_HEADS: dict[str, Callable[[bytes], bool]] = {
    "gzip": lambda h: (
        h[:3] == b"\x1f\x8b\x08"
        and len(h) >= 10
        and h[3] & 0xE0 == 0
        and h[8] in (0, 2, 4)
        and (h[9] <= 13 or h[9] == 255)
    ),
    "bzip2": lambda h: (
        h[:3] == b"BZh"
        and h[3:4] in (b"1", b"2", b"3", b"4", b"5", b"6", b"7", b"8", b"9")
        and h[4:10] in (b"1AY&SY", b"\x17\x72\x45\x38\x50\x90")
    ),
    "xz": lambda h: h.startswith(_STREAMS["xz"]),
}
_DECOMPRESSORS: dict[str, Callable[[], Any]] = {
    "gzip": lambda: zlib.decompressobj(31),
    "bzip2": bz2.BZ2Decompressor,
    "xz": lzma.LZMADecompressor,
}


class _FirstStream(io.RawIOBase):
    """The first gzip, bzip2 or xz stream of a file, decompressed: clamd
    unpacks that one and stops, where Python's openers read on through
    every stream joined after it (EICAR gzipped after a gzipped "hello" was
    called clean).  A stream cut short raises EOFError."""

    def __init__(self, path: str, kind: str) -> None:
        self._file = open(path, "rb")  # noqa: SIM115 - closed with this reader
        self._inflate = _DECOMPRESSORS[kind]()
        self._zlib = kind == "gzip"
        self._magic = _STREAMS[kind]
        self.joined = False  # once read to its end: another stream of its kind after it

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        most = _CHUNK if size is None or size < 0 else size
        d = self._inflate
        while not d.eof:
            if self._zlib:
                data = d.unconsumed_tail or self._file.read(_CHUNK)
                if not data:
                    raise EOFError("the compressed stream is cut short")
                got = d.decompress(data, most)
            else:
                data = b"" if not d.needs_input else self._file.read(_CHUNK)
                if d.needs_input and not data:
                    raise EOFError("the compressed stream is cut short")
                got = d.decompress(data, most)
            if got:
                return bytes(got)
        if not self.joined:
            # Another stream, after any NULs of padding: a stray byte after
            # it (a newline) is no stream, and clamd reads it as it is.
            rest = d.unused_data
            while rest and not rest.strip(b"\0"):
                rest = self._file.read(_CHUNK)
            rest = rest.lstrip(b"\0")
            if len(rest) < 6:
                rest += self._file.read(6)
            self.joined = rest.startswith(self._magic)
        return b""

    def close(self) -> None:
        self._file.close()
        super().close()


def _nested(path: str, scratch: str, limit: int, depth: int, budget: list[int]) -> Survey:
    out = survey(path)
    # Anywhere in it: a RAR stored in any container, or behind a program (an
    # SFX), which clamd finds and cannot open.  Not opened here: whether
    # clamd could is the profile's to say.
    out.rar = _holds_rar(path)
    with open(path, "rb") as f:
        kind = _layer(f.read(_HEAD))
    if kind == "rar":
        return out
    if kind in archives.UNOPENED:
        out.unopened = kind
    elif kind in _STREAMS:
        _stream(path, kind, out, scratch, limit, depth, budget)
    elif kind in archives.WALKED:
        _archived(path, kind, out, scratch, limit, depth, budget)
    else:
        if kind == "pdf":
            _pdf(path, out, scratch, limit, depth, budget)
        elif kind in ("mail", "uu"):
            _mail(path, out, scratch, limit, depth, budget, uu=kind == "uu")
        boxed = _boxed(path, kind == "tar", out, scratch, limit, depth, budget)
        if not boxed and kind in (None, "pdf", "mail", "uu"):
            _seven_zip_within(path, out, scratch, limit, depth, budget)
    return out


def _pdf(path: str, out: Survey, scratch: str, limit: int, depth: int, budget: list[int]) -> None:
    """Each stream of a PDF whose decoded data is a layer (clamd scans every
    decoded stream as a file of its own), unpacked and surveyed.  A
    stream's first bytes are decoded to tell, and count against NESTED_HEADS."""
    deadline = _PDF_DEADLINE.get()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        try:
            for stream in pdf_streams.streams(data):
                if out.settled:
                    return
                if time.monotonic() > deadline:
                    raise pdf_streams.Late
                decode = functools.partial(pdf_streams.decoded, data, stream, deadline)
                if not _decoded_layer(decode, out, scratch, limit, depth, budget):
                    return
        except pdf_streams.Late:  # for all the PDFs in it together
            out.unchecked = True
            return
        encrypted = data.find(b"/Encrypt") >= 0
    if encrypted:
        try:
            for attached in pdf_streams.decrypted_attachments(path):
                if not _decoded_layer(attached, out, scratch, limit, depth, budget):
                    return
        except pdf_streams.Locked:
            out.locked = True


def _mail(
    path: str, out: Survey, scratch: str, limit: int, depth: int, budget: list[int], *, uu: bool
) -> None:
    """Each part of a mail (or each file uuencoded in a file that starts as
    one) whose decoded payload is a layer, surveyed: clamd scans every
    attachment as a file of its own."""
    try:
        payloads = mail_parts.uu_payloads(path) if uu else mail_parts.payloads(path)
        for payload in payloads:
            if out.settled:
                return
            decode = functools.partial(iter, [payload.data])
            again = "mail" if payload.as_sent else None  # its own text: read already
            if not _decoded_layer(decode, out, scratch, limit, depth, budget, skip=again):
                return
    except mail_parts.TooLarge:  # read in memory: too large to look into here
        out.unchecked = True
    except Exception:  # not a mail Python's parser reads: clamd may have read it
        out.unread = True


def _decoded_layer(
    decode: Callable[[], Iterator[bytes]],
    out: Survey,
    scratch: str,
    limit: int,
    depth: int,
    budget: list[int],
    skip: str | None = None,
) -> bool:
    """What a PDF stream or a mail part decodes to (``decode()``'s chunks),
    surveyed when it is a layer, or holds one after other bytes (clamd finds
    a ZIP, a RAR or a 7-Zip anywhere: a program's, a picture's, a NUL's);
    one past ``limit`` is ``overflowed``; of the kind ``skip``, not read again
    as one.  False once a budget is spent."""
    budget[2] -= 1
    if budget[2] < 0:
        out.unchecked = True
        return False
    chunks = decode()
    head = _first(chunks, _HEAD)
    kind = _layer(head)
    if kind == skip:  # a kind the caller has read this already as
        kind = None
    if kind == "rar":
        out.rar = True
    if kind == "rar" or (kind is None and not _marked(head, chunks)):
        return True
    if kind is None:  # read to the marker: from the start again, to be kept
        chunks = decode()
        head = _first(chunks, _HEAD)
    budget[1] -= 1
    if depth >= NESTED_DEPTH or budget[1] < 0:
        out.unchecked = True
        return False
    cap = min(limit, budget[0])
    inner = archives.spooled(head, chunks, scratch, cap + 1)
    try:
        size = os.path.getsize(inner)
        budget[0] -= size
        if size > limit:
            out.overflowed = True
        elif size > cap:
            out.unchecked = True
        else:
            out.add(_nested(inner, scratch, limit, depth + 1, budget))
    finally:
        os.unlink(inner)
    return True


_MARKERS = (LOCAL, RAR, archives.SEVEN_ZIP)
_LONGEST = max(len(m) for m in _MARKERS)


def _marked(head: bytes, chunks: Iterator[bytes]) -> bool:
    """Whether an archive's marker is in ``head`` or what follows it."""
    tail = b""
    for chunk in itertools.chain([head], chunks):
        window = tail + chunk
        if any(m in window for m in _MARKERS):
            return True
        tail = window[-(_LONGEST - 1) :]
    return False


def _read_through(f: IO[bytes], head: bytes, size: int, out: Survey, budget: list[int]) -> bool:
    """Whether the rest of an archive member holds an archive's marker (a
    program with a ZIP after its code: clamd finds and unpacks it).  Every
    such member is read to its end, within NESTED_READ in all."""
    budget[4] -= size
    if budget[4] < 0:
        out.unchecked = True
        return False
    try:
        return _marked(head, iter(functools.partial(f.read, _CHUNK), b""))
    except Exception:  # a CRC that fails at its end: no layer in it, as before
        return False


def _marked_file(path: str) -> bool:
    with open(path, "rb") as f:
        return _marked(b"", iter(functools.partial(f.read, _CHUNK), b""))


def _first(chunks: Iterator[bytes], most: int) -> bytes:
    """At least ``most`` bytes from ``chunks`` (fewer only at their end)."""
    head = bytearray()
    while len(head) < most and (chunk := next(chunks, None)) is not None:
        head += chunk
    return bytes(head)


def _seven_zip_within(
    path: str, out: Survey, scratch: str, limit: int, depth: int, budget: list[int]
) -> None:
    """A 7-Zip after other bytes (a program that unpacks it, an SFX), which
    clamd finds and unpacks: walked from where it starts."""
    at = archives.seven_zip_at(path)
    if at <= 0:
        return
    inner = _tail(path, at, scratch)
    try:
        _archived(inner, "7z", out, scratch, limit, depth, budget)
    finally:
        os.unlink(inner)


def _tail(path: str, at: int, scratch: str) -> str:
    """The file from byte ``at`` on, as a file in ``scratch``."""
    fd, inner = tempfile.mkstemp(dir=scratch, suffix=".layer")
    with open(path, "rb") as src, os.fdopen(fd, "wb") as dst:
        src.seek(at)
        while chunk := src.read(_CHUNK):
            dst.write(chunk)
    return inner


def _holds_rar(path: str) -> bool:
    """Whether a RAR archive starts anywhere in the file: its marker followed
    by a header whose CRC holds (the marker alone is in every program that
    knows RAR files: file(1)'s magic database was "a RAR archive")."""
    return archives.marked_at(path, RAR, lambda data, at: _rar_header(data, at + len(RAR))) >= 0


def _rar_header(data: Any, at: int) -> bool:
    """A RAR 1.5-4 archive header (``\0``, then CRC-16, type 0x73, flags,
    size) or a RAR 5 main or encryption header (``\1\0``, then CRC-32, size,
    type 1 or 4) at ``at``."""
    if data[at : at + 1] == b"\0" and data[at + 3 : at + 4] == b"\x73":
        size = int.from_bytes(data[at + 6 : at + 8], "little")
        block = data[at + 1 : at + 1 + size]
        crc = int.from_bytes(block[:2], "little")
        # Its CRC covers the whole block, or (RAR 1.5-2.x with a comment)
        # its 13 bytes of fixed fields only.
        whole, fixed = zlib.crc32(block[2:]) & 0xFFFF, zlib.crc32(block[2:13]) & 0xFFFF
        return size >= 13 and len(block) == size and crc in (whole, fixed)
    if data[at : at + 2] == b"\1\0":
        size, n = _vint(data, at + 6)
        body = data[at + 6 : at + 6 + n + size]
        kind, _ = _vint(data, at + 6 + n)
        crc = int.from_bytes(data[at + 2 : at + 6], "little")
        # A main header, or an encryption header (headers encrypted: rar -hp).
        return n > 0 and len(body) == n + size and zlib.crc32(body) == crc and kind in (1, 4)
    return False


def _vint(data: Any, at: int) -> tuple[int, int]:
    """RAR 5's variable-length integer at ``at``: (value, bytes taken); (0, 0) if cut."""
    value = 0
    for i in range(10):
        byte = data[at + i : at + i + 1]
        if not byte:
            return 0, 0
        value |= (byte[0] & 0x7F) << (7 * i)
        if not byte[0] & 0x80:
            return value, i + 1
    return 0, 0


def _boxed(
    path: str, tar: bool, out: Survey, scratch: str, limit: int, depth: int, budget: list[int]
) -> bool:
    """A ZIP (found from its end, whatever precedes it) or a tar, surveyed
    through Python; False if it is neither."""
    try:
        box = _Box(path, tar=tar)
    except Exception:  # not a ZIP or tar Python reads: what survey saw stands
        return False
    with box:  # opened once: a ZIP's directory read once
        try:
            _members(box, out, scratch, limit, depth, budget)
        except Exception:  # a tar cut or damaged past a member: clamd may read on
            out.unread = True
    return True


def _archived(
    path: str, kind: str, out: Survey, scratch: str, limit: int, depth: int, budget: list[int]
) -> None:
    """Another archive clamd unpacks (7-Zip, CAB, XAR, cpio, ISO, LHA, old
    tar), walked through libarchive: a member past ``limit`` is ``overlarge``
    (clamd skips a CAB's silently), one that is a layer is surveyed in turn.

    Every member's size counts against NESTED_BYTES, those passed over too:
    in a solid archive (a 7-Zip) passing a member over decompresses it, and
    a few kB of LZMA that unpack to gigabytes held the attempt to its timeout."""
    scan = _SCAN.get()
    try:
        with archives.opened(path, kind) as members:
            for entry, size in members:
                if size < 0:  # not said: past clamd's limits, for all we know, and ours
                    out.overlarge = max(out.overlarge, limit + 1)
                    return
                budget[2] -= 1
                if size > budget[0] or budget[2] < 0:
                    out.unchecked = True
                    return
                budget[0] -= size
                if size > limit:
                    out.overlarge = max(out.overlarge, size)
                    continue
                if size == 0:
                    continue  # nothing to scan, nothing inside
                if scan is not None:
                    budget[3] -= 1
                    if budget[3] < 0:  # 100,000 tiny members: as many scans of clamd's
                        out.unchecked = True
                        return
                seen = _Kind(every=scan is not None)
                inner = archives.unpack(entry, scratch, size, _HEAD, seen)
                if inner is None:
                    continue
                try:
                    if scan is not None and _scanned_alone(scan, inner, out):
                        return  # found: nothing more to learn
                    if seen.kind is None and not _marked_file(inner):
                        continue
                    budget[1] -= 1
                    if depth >= NESTED_DEPTH or budget[1] < 0:
                        out.unchecked = True
                        return
                    out.add(_nested(inner, scratch, limit, depth + 1, budget))
                finally:
                    os.unlink(inner)
    except Exception:  # damaged, or a method libarchive lacks: clamd may read on
        out.unread = True


class _Kind:
    """``archives.unpack``'s test of a member's first bytes: keeps its kind
    of layer, and wants it when it is one, or (``every``) whatever it is."""

    def __init__(self, *, every: bool) -> None:
        self.every = every
        self.kind: str | None = None

    def __call__(self, head: bytes) -> bool:
        self.kind = _layer(head)
        return self.every or self.kind is not None


def _scanned_alone(scan: MemberScan, path: str, out: Survey) -> bool:
    """The member at ``path`` sent to clamd on its own; True once it found something."""
    verdict, signature, reason = scan(path)
    if verdict == "infected":
        out.found = signature or "a signature"
        return True
    if verdict != "clean":
        out.unscanned = out.unscanned or (reason or verdict)
    return False


def _members(
    box: _Box, out: Survey, scratch: str, limit: int, depth: int, budget: list[int]
) -> None:
    """Each member of ``box`` that is itself a layer, unpacked and surveyed."""
    for member, size in box.members():
        if out.settled:
            return
        if not 0 < size <= limit:
            continue  # empty, or past what clamd reads (said by survey or by clamd)
        budget[2] -= 1
        if budget[2] < 0:
            out.unchecked = True  # too many to look at
            return
        try:
            if box.undecoded(member):
                out.undecoded = True
                continue
            with box.open(member) as f:
                head = f.read(_HEAD)
                kind = _layer(head)
                if kind is None and not _read_through(f, head, size, out, budget):
                    continue
            if kind == "rar":  # known by its start: nothing to unpack
                out.rar = True
                continue
            budget[1] -= 1  # counted as what it is: a ZIP of 2,001 texts holds no archive
            if depth >= NESTED_DEPTH or budget[1] < 0 or size > budget[0]:
                out.unchecked = True  # too deep, too many or too large to look further
                return
            budget[0] -= size
            inner = _unpacked(functools.partial(box.open, member), scratch, size)
        except Exception:  # not read whole (a bad CRC, a size that lies, a method
            out.unread = True  # Python lacks): clamd may have read it all the same
            continue
        try:
            out.add(_nested(inner, scratch, limit, depth + 1, budget))
        finally:
            os.unlink(inner)


class _Box:
    """A ZIP's or a tar's members, by name and uncompressed size (encrypted
    ZIP members left out: survey said so already)."""

    def __init__(self, path: str, *, tar: bool) -> None:
        # Closed by __exit__; a compressed tar is a stream layer, read as such.
        self.zip = None if tar else zipfile.ZipFile(path)
        self.tar = tarfile.open(path, "r:") if tar else None  # noqa: SIM115

    def members(self) -> Iterator[tuple[Any, int]]:
        if self.zip is not None:
            for m in self.zip.infolist():
                if not m.flag_bits & _ENCRYPTED:
                    yield m, m.file_size
            return
        assert self.tar is not None
        while (t := self.tar.next()) is not None:
            # Read as it goes, and not kept: a tar of a million empty members
            # held a million TarInfo objects.
            self.tar.members.clear()  # type: ignore[attr-defined]
            if t.isreg():
                yield t, t.size

    def undecoded(self, member: Any) -> bool:
        """Whether clamd decodes none of the member: a ZIP's compressed by
        a method its unzip lacks (an LZMA member, method 14, was clean)."""
        return self.zip is not None and member.compress_type not in CLAMD_ZIP_METHODS

    def open(self, member: Any) -> IO[bytes]:
        if self.zip is not None:
            return self.zip.open(member)
        assert self.tar is not None
        got = self.tar.extractfile(member)
        if got is None:
            raise tarfile.ReadError("not a regular member")
        return got

    def __enter__(self) -> _Box:
        return self

    def __exit__(self, *_: object) -> None:
        if self.zip is not None:
            self.zip.close()
        if self.tar is not None:
            self.tar.close()


def _stream(
    path: str, kind: str, out: Survey, scratch: str, limit: int, depth: int, budget: list[int]
) -> None:
    """What a gzip, bzip2 or xz stream unpacks to, surveyed in turn; past
    ``limit`` bytes it is ``overflowed`` (clamd reads no further)."""
    budget[1] -= 1
    if depth >= NESTED_DEPTH or budget[1] < 0:
        out.unchecked = True
        return
    cap = min(limit, budget[0])
    first = _FirstStream(path, kind)
    try:
        # Read to its end (b""), unless past cap: ``joined`` is known then.
        inner = _unpacked(lambda: cast(IO[bytes], first), scratch, cap + 1)
    except Exception:  # a cut or damaged stream: clamd may have read more of it
        out.unread = True
        return
    finally:
        first.close()
    try:
        out.joined |= first.joined
        size = os.path.getsize(inner)
        budget[0] -= size
        if size > limit:
            out.overflowed = True
        elif size > cap:  # what is left of the budget is not enough to look
            out.unchecked = True
        else:
            out.add(_nested(inner, scratch, limit, depth + 1, budget))
    finally:
        os.unlink(inner)


def _unpacked(open_: Callable[[], IO[bytes]], scratch: str, most: int) -> str:
    """What ``open_()`` reads, to a file in ``scratch``: no more than ``most``
    bytes (a ZIP member stops at its declared size itself, and checks its
    CRC at the end)."""
    fd, inner = tempfile.mkstemp(dir=scratch, suffix=".layer")
    try:
        with open_() as src, os.fdopen(fd, "wb") as dst:
            left = most
            while left > 0 and (chunk := src.read(min(_CHUNK, left))):
                dst.write(chunk)
                left -= len(chunk)
    except BaseException:
        os.unlink(inner)
        raise
    return inner


def largest_member(path: str) -> int:
    """The largest uncompressed size the ZIP at ``path`` declares for a member.

    0 when ``path`` holds no ZIP member; ``UNKNOWN`` when a member's local
    header defers its size to a data descriptor and no readable central
    directory says it.
    """
    return survey(path).largest


def _directory(path: str) -> list[tuple[int, int, int, bool]]:
    """(start, end, size, encrypted) of each member the central directory
    lists, start to end being its local header and data in the file; empty
    when there is no directory Python can read.  A member whose sizes
    follow its data (flag bit 3) is as large as the larger of what the
    directory and the data descriptor say."""
    try:
        if not zipfile.is_zipfile(path):
            return []
        with zipfile.ZipFile(path) as z, open(path, "rb") as f:
            out = []
            for i in z.infolist():
                data_at = _data_offset(f.fileno(), i.header_offset)
                end = data_at + i.compress_size
                size = i.file_size
                if i.flag_bits & _DESCRIPTOR:
                    wide = _zip64_local(f.fileno(), i.header_offset)
                    size = max(
                        size, _descriptor_size(f.fileno(), end, i.CRC, i.compress_size, wide)
                    )
                out.append((i.header_offset, end, size, bool(i.flag_bits & _ENCRYPTED)))
            return out
    except Exception:  # a hostile directory: BadZipFile, struct.error, MemoryError...
        return []


def _data_offset(fd: int, header_at: int) -> int:
    """Where the data of the member whose local header is at ``header_at`` starts."""
    head = os.pread(fd, _HEADER.size, header_at)
    if len(head) < _HEADER.size or head[:4] != LOCAL:
        raise zipfile.BadZipFile("no local header where the directory says")
    name_len, extra_len = struct.unpack_from("<HH", head, _HEADER.size - 4)
    return header_at + _HEADER.size + name_len + extra_len


def _zip64_local(fd: int, header_at: int) -> bool:
    """Whether the local header at ``header_at`` carries a ZIP64 extra field:
    only then are its data descriptor's sizes 8 bytes each (APPNOTE 4.3.9)."""
    head = os.pread(fd, _HEADER.size, header_at)
    name_len, extra_len = struct.unpack_from("<HH", head, _HEADER.size - 4)
    extra = os.pread(fd, extra_len, header_at + _HEADER.size + name_len)
    return _zip64_size(extra) != UNKNOWN or _has_field(extra, 1)


def _has_field(extra: bytes, kind: int) -> bool:
    i = 0
    while i + 4 <= len(extra):
        found, length = struct.unpack_from("<HH", extra, i)
        if found == kind:
            return True
        i += 4 + length
    return False


def _descriptor_size(fd: int, at: int, crc: int, compressed: int, wide: bool) -> int:
    """The uncompressed size in the data descriptor at ``at``, recognised by
    the member's CRC and compressed size (its signature is optional; its
    sizes take 4 bytes, or 8 when ``wide``: a ZIP64 member's); UNKNOWN if
    none is there.  Read as 8 bytes when its first 12 happened to match, a
    Maven JAR's empty folder entry (CRC 0, 2 bytes compressed, size 0) took
    the next header's bytes for a size of 5.8 x 10^17."""
    raw = os.pread(fd, 28, at)
    if raw[:4] == _SIGNED_DESCRIPTOR:
        raw = raw[4:]
    if wide and len(raw) >= 20 and struct.unpack_from("<IQ", raw) == (crc, compressed):
        return int(struct.unpack_from("<Q", raw, 12)[0])
    if len(raw) >= 12 and struct.unpack_from("<II", raw) == (crc, compressed & _ZIP64):
        return int(struct.unpack_from("<I", raw, 8)[0])
    return UNKNOWN


def _local_headers(path: str) -> Iterator[tuple[int, int, int, int]]:
    """(offset, declared size, flags, method) of each plausible local file
    header, in file order."""
    keep = _HEADER.size - 1  # a header that starts in a chunk's last bytes ends in the next
    with open(path, "rb") as f:
        fd, base, data = f.fileno(), 0, b""
        while chunk := f.read(_CHUNK):
            data += chunk
            end = len(data) - keep  # headers starting before this are whole in data
            found = data.find(LOCAL)
            while -1 < found < end:
                header = _declared(fd, base + found, data, found)
                if header is not None:
                    yield (base + found, *header)
                found = data.find(LOCAL, found + 1)
            base += max(end, 0)
            data = data[max(end, 0) :]


def _declared(fd: int, offset: int, data: bytes, at: int) -> tuple[int, int, int] | None:
    """(size, flags, method) the header at ``data[at:]`` (file ``offset``)
    declares; None: no header.

    Plausible only: its method one the ZIP note names, a version needed of
    1.0 to 6.3, a name of printable characters, its data inside the file.
    "PK\\3\\4" occurs in programs that read ZIPs, and such a chance match
    in a shared library was "a ZIP member is encrypted" (libzip's table of
    signatures, version "0", in a wheel's .so)."""
    fields = _HEADER.unpack_from(data, at)
    _, version, flags, method, _, _, _, compressed, size, name_len, extra_len = fields
    if method not in _METHODS or not 10 <= version & 0xFF <= 63 or name_len == 0:
        return None
    name = os.pread(fd, name_len, offset + _HEADER.size)
    data_at = offset + _HEADER.size + name_len + extra_len
    if not name.decode("utf-8", "replace").isprintable() or (
        not flags & _DESCRIPTOR
        and compressed != _ZIP64
        and data_at + compressed > os.fstat(fd).st_size
    ):
        return None
    if flags & _DESCRIPTOR and size == 0:
        return UNKNOWN, flags, method
    if size == _ZIP64:
        extra = os.pread(fd, extra_len, offset + _HEADER.size + name_len)
        return _zip64_size(extra), flags, method
    return int(size), flags, method


def _zip64_size(extra: bytes) -> int:
    """The uncompressed size in a ZIP64 extra field (id 1); UNKNOWN without one."""
    i = 0
    while i + 4 <= len(extra):
        kind, length = struct.unpack_from("<HH", extra, i)
        if kind == 1 and length >= 8:
            return int(struct.unpack_from("<Q", extra, i + 4)[0])
        i += 4 + length
    return UNKNOWN

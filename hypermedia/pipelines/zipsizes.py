"""What a ZIP declares of its members (``nested`` surveys the ZIPs inside it).

The virus scan needs this because clamd's ZIP reader calls OK what it did
not read: the part of a member past MaxFileSize, an encrypted member, and
(ClamAV 1.4) any member of a ZIP whose central directory it cannot find
(a cut tail: "central not found, using localhdrs", then nothing extracted).
So both the directory and the local headers are read here: sizes from each
(and from a member's data descriptor, which the directory may understate),
the encryption flag of each, and whether the file is a ZIP whose members
only local headers show.  ``survey`` decompresses nothing (the file is read
once, in chunks, plus a few small reads).  ``_holds_rar`` tells a RAR
archive in a file by its headers (without the non-free libclamunrar,
Debian's clamd does not unpack RAR).
"""

from __future__ import annotations

import bisect
import os
import struct
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hypermedia.pipelines import archives

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

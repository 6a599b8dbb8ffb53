"""What a ZIP declares of its members, read without unpacking it.

The virus scan needs this because clamd's ZIP reader calls OK what it did
not read: the part of a member past MaxFileSize, an encrypted member, and
(ClamAV 1.4) any member of a ZIP whose central directory it cannot find
(a cut tail: "central not found, using localhdrs", then nothing extracted).
So both the directory and the local headers are read here: sizes from each
(and from a member's data descriptor, which the directory may understate),
the encryption flag of each, and whether the file is a ZIP whose members
only local headers show.  Nothing is decompressed; the file is read once,
in chunks, plus a few small reads.
"""

from __future__ import annotations

import os
import struct
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass

LOCAL = b"PK\x03\x04"
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
_SIGNED_DESCRIPTOR = b"PK\x07\x08"


@dataclass
class Survey:
    largest: int = 0  # the largest uncompressed size declared; UNKNOWN: see largest_member
    encrypted: bool = False  # a member is encrypted: nothing can read it
    hidden: bool = False  # a ZIP whose members no readable central directory lists


def survey(path: str) -> Survey:
    """What the file at ``path`` declares of its ZIP members (none: ``Survey()``)."""
    out = Survey()
    listed = _directory(path)
    covered = [(start, end) for start, end, _, _ in listed]
    for _, _, size, encrypted in listed:
        out.largest = max(out.largest, size)
        out.encrypted |= encrypted
    unknown = False
    with open(path, "rb") as f:
        starts_as_zip = f.read(4) == LOCAL
    for offset, size, flags in _local_headers(path):
        out.encrypted |= bool(flags & _ENCRYPTED)
        unknown |= size == UNKNOWN
        out.largest = max(out.largest, size)
        if starts_as_zip and not any(a <= offset < b for a, b in covered):
            out.hidden = True  # a member the directory does not list, or no directory
    if unknown and not listed:
        out.largest = UNKNOWN
    return out


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
                    size = max(size, _descriptor_size(f.fileno(), end, i.CRC, i.compress_size))
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


def _descriptor_size(fd: int, at: int, crc: int, compressed: int) -> int:
    """The uncompressed size in the data descriptor at ``at``, recognised by
    the member's CRC and compressed size (its signature is optional; its
    sizes take 4 bytes, or 8 in a ZIP64 archive); UNKNOWN if none is there."""
    raw = os.pread(fd, 28, at)
    if raw[:4] == _SIGNED_DESCRIPTOR:
        raw = raw[4:]
    if len(raw) >= 20 and struct.unpack_from("<IQ", raw) == (crc, compressed):
        return int(struct.unpack_from("<Q", raw, 12)[0])
    if len(raw) >= 12 and struct.unpack_from("<II", raw) == (crc, compressed & _ZIP64):
        return int(struct.unpack_from("<I", raw, 8)[0])
    return UNKNOWN


def _local_headers(path: str) -> Iterator[tuple[int, int, int]]:
    """(offset, declared size, flags) of each plausible local file header, in file order."""
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


def _declared(fd: int, offset: int, data: bytes, at: int) -> tuple[int, int] | None:
    """(size, flags) the header at ``data[at:]`` (file ``offset``) declares; None: no header."""
    _, version, flags, method, _, _, _, _, size, name_len, extra_len = _HEADER.unpack_from(data, at)
    if method not in _METHODS or version & 0xFF > 100 or name_len == 0:
        return None
    if flags & _DESCRIPTOR and size == 0:
        return UNKNOWN, flags
    if size == _ZIP64:
        return _zip64_size(os.pread(fd, extra_len, offset + _HEADER.size + name_len)), flags
    return int(size), flags


def _zip64_size(extra: bytes) -> int:
    """The uncompressed size in a ZIP64 extra field (id 1); UNKNOWN without one."""
    i = 0
    while i + 4 <= len(extra):
        kind, length = struct.unpack_from("<HH", extra, i)
        if kind == 1 and length >= 8:
            return int(struct.unpack_from("<Q", extra, i + 4)[0])
        i += 4 + length
    return UNKNOWN

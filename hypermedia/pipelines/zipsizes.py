"""How large a ZIP's members are, as the archive itself declares it.

The virus scan needs this because clamd's ZIP reader scans only the first
MaxFileSize bytes of a larger member and still answers OK.  clamd finds
members by their local headers as well as by the central directory, so both
are read here: a directory that Python's ``zipfile`` cannot read (a comment
holding a fake end record, bytes appended after the archive, a truncated
tail) must not hide a member that clamd scans in part.  Nothing is
decompressed; the file is read once, in chunks.
"""

from __future__ import annotations

import os
import struct
import zipfile
from collections.abc import Iterator

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


def largest_member(path: str) -> int:
    """The largest uncompressed size the ZIP at ``path`` declares for a member.

    0 when ``path`` holds no ZIP member; ``UNKNOWN`` when a member's local
    header defers its size to a data descriptor and no readable central
    directory says it.
    """
    directory = _directory_sizes(path)
    largest = max(directory, default=0)
    for size in _local_sizes(path):
        if size == UNKNOWN and not directory:
            return UNKNOWN
        largest = max(largest, size)
    return largest


def _directory_sizes(path: str) -> list[int]:
    """Sizes in the central directory; empty when there is none Python can read."""
    try:
        if not zipfile.is_zipfile(path):
            return []
        with zipfile.ZipFile(path) as z:
            return [i.file_size for i in z.infolist()]
    except Exception:  # a hostile directory: BadZipFile, struct.error, MemoryError...
        return []


def _local_sizes(path: str) -> Iterator[int]:
    """The size each plausible local file header declares, in file order."""
    keep = _HEADER.size - 1  # a header that starts in a chunk's last bytes ends in the next
    with open(path, "rb") as f:
        fd, base, data = f.fileno(), 0, b""
        while chunk := f.read(_CHUNK):
            data += chunk
            end = len(data) - keep  # headers starting before this are whole in data
            found = data.find(LOCAL)
            while -1 < found < end:
                size = _declared(fd, base + found, data, found)
                if size is not None:
                    yield size
                found = data.find(LOCAL, found + 1)
            base += max(end, 0)
            data = data[max(end, 0) :]


def _declared(fd: int, offset: int, data: bytes, at: int) -> int | None:
    """The size the header at ``data[at:]`` (file ``offset``) declares; None: no header."""
    _, version, flags, method, _, _, _, _, size, name_len, extra_len = _HEADER.unpack_from(data, at)
    if method not in _METHODS or version & 0xFF > 100 or name_len == 0:
        return None
    if flags & _DESCRIPTOR and size == 0:
        return UNKNOWN
    if size == _ZIP64:
        return _zip64_size(os.pread(fd, extra_len, offset + _HEADER.size + name_len))
    return int(size)


def _zip64_size(extra: bytes) -> int:
    """The uncompressed size in a ZIP64 extra field (id 1); UNKNOWN without one."""
    i = 0
    while i + 4 <= len(extra):
        kind, length = struct.unpack_from("<HH", extra, i)
        if kind == 1 and length >= 8:
            return int(struct.unpack_from("<Q", extra, i + 4)[0])
        i += 4 + length
    return UNKNOWN

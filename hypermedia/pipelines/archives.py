"""Archives other than ZIP and tar, as far as the virus scan must know them.

clamd unpacks 7-Zip, CAB, XAR, cpio, ISO 9660 and LHA itself, and reads what
it finds inside with the same readers as at the top: a ZIP compressed inside
a 7-Zip hid a signature past MaxFileSize, a RAR inside a CAB went unopened
(Debian's clamd has no unrar), a CAB member past MaxFileSize was skipped,
all called clean.  These are walked here through libarchive, member by
member, for ``nested`` to survey what is inside.  Only a file whose first
bytes say it is one of them is opened so (``kind_of``), in that format
alone: libarchive guessing at any file read a CSV as an mtree listing and
failed on it.

Some data clamd does not unpack at all (``UNOPENED``): it reads its bytes as
they are, so no hash signature can match what is inside, and EICAR in an
``ar`` (a ``.deb``), a zstd stream or a WIM image was clean.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
import zlib
from collections.abc import Callable, Iterator
from typing import Any

# What starts each format (offsets in the file's first bytes).
SEVEN_ZIP = b"7z\xbc\xaf\x27\x1c"
MAGIC = (
    ("7z", 0, SEVEN_ZIP),
    ("cab", 0, b"MSCF\0\0\0\0"),
    ("xar", 0, b"xar!"),
    ("cpio", 0, b"070707"),
    ("cpio", 0, b"070701"),
    ("cpio", 0, b"070702"),
    ("lha", 2, b"-lh"),
    ("iso", 32769, b"CD001"),
    ("ar", 0, b"!<arch>\n"),
    ("zstd", 0, b"\x28\xb5\x2f\xfd"),
    ("lz4", 0, b"\x04\x22\x4d\x18"),
    ("lz4", 0, b"\x02\x21\x4c\x18"),  # its legacy frame
    ("lzip", 0, b"LZIP"),
    ("WIM", 0, b"MSWIM\0\0\0"),
    ("WARC", 0, b"WARC/"),
)
HEAD_BYTES = 32769 + 5  # enough for every magic above (an ISO's is at 32 kB)
# Read by clamd as plain bytes: a file holding one is never called clean.
UNOPENED = frozenset({"ar", "zstd", "lz4", "lzip", "compress", "lzma", "WIM", "WARC"})
# libarchive's name of each format clamd unpacks and nested does not read.
_FORMATS = {
    "7z": "7zip",
    "cab": "cab",
    "xar": "xar",
    "cpio": "cpio",
    "lha": "lha",
    "iso": "iso9660",
}
WALKED = frozenset(_FORMATS)
_CHUNK = 1024 * 1024


def kind_of(head: bytes) -> str | None:
    """The format ``head`` (a file's first HEAD_BYTES) starts, if any here."""
    found = next((k for k, at, magic in MAGIC if head[at : at + len(magic)] == magic), None)
    if found is None and head[:1] and 0x50 <= head[0] <= 0x5F and head[1:4] == b"\x2a\x4d\x18":
        found = "zstd"  # a skippable frame (zstd's and lz4's alike), then the data
    if found is None and _binary_cpio(head):
        found = "cpio"
    if found is None and head[:2] == b"\x1f\x9d" and head[2:3]:
        # compress (.Z): a flags byte of 9 to 16 bits a code, its bits 5-6 unused
        found = "compress" if head[2] & 0x60 == 0 and 9 <= head[2] & 0x1F <= 16 else None
    return found or ("lzma" if _lzma_alone(head) else None)


def _binary_cpio(head: bytes) -> bool:
    """The old binary cpio header (magic 070707 in 2 bytes, either order):
    two bytes alone start one file in 65,536, so its name must fit too: a
    name size of 1 to 1024 bytes, the name ending in its NUL."""
    for order in ("little", "big"):
        if head[:2] != (0o070707).to_bytes(2, order) or len(head) < 26:
            continue
        size = int.from_bytes(head[20:22], order)
        if 1 <= size <= 1024 and head[26 + size - 1 : 26 + size] == b"\0":
            return True
    return False


def seven_zip_at(path: str) -> int:
    """Where a 7-Zip archive starts in the file (its signature header's CRC
    holding), or -1."""

    def holds(data: Any, at: int) -> bool:
        fields = data[at + 12 : at + 32]
        crc = int.from_bytes(data[at + 8 : at + 12], "little")
        return len(fields) == 20 and zlib.crc32(fields) == crc

    return marked_at(path, SEVEN_ZIP, holds)


def marked_at(path: str, marker: bytes, holds: Callable[[Any, int], bool]) -> int:
    """The first offset of ``marker`` in the file where ``holds(data, at)``
    (what follows it checks out), or -1; a marker alone is a chance match in
    any program that knows the format.  At most 10,000 candidates."""
    with open(path, "rb") as f:
        try:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # empty
            return -1
    with data:
        at, looked = data.find(marker), 0
        while at >= 0 and looked < 10_000:
            if holds(data, at):
                return at
            at, looked = data.find(marker, at + 1), looked + 1
    return -1


def _lzma_alone(head: bytes) -> bool:
    """An .lzma stream (LZMA_Alone): a properties byte (lc, lp, pb), a
    dictionary of 2^n bytes, then its size or "unknown" (all ones) in 8 bytes.
    Properties of 0 (lc = lp = pb = 0), which no tool's presets write, are
    taken for other data: a MATLAB v4 file starts so (scipy's wheels hold
    some) and was "lzma data, which clamd does not unpack"."""
    if len(head) < 13 or not 0 < head[0] < 9 * 5 * 5:  # lc < 9, lp < 5, pb < 5
        return False
    dictionary = int.from_bytes(head[1:5], "little")
    size = int.from_bytes(head[5:13], "little")
    said = size <= 1 << 48 or size == (1 << 64) - 1
    return dictionary.bit_count() == 1 and dictionary >= 1 << 12 and said


@contextlib.contextmanager
def opened(path: str, kind: str) -> Iterator[Iterator[tuple[Any, int]]]:
    """The regular members of the ``kind`` archive at ``path`` (one of
    WALKED), each with its size (-1 when the archive does not say).  Raises
    libarchive's error for one it cannot read."""
    import libarchive  # the child only, on a clean answer

    with libarchive.file_reader(path, format_name=_FORMATS[kind], filter_name="none") as archive:
        yield _regular(iter(archive))


def _regular(entries: Iterator[Any]) -> Iterator[tuple[Any, int]]:
    for entry in entries:
        if entry.isfile:
            yield entry, -1 if entry.size is None else int(entry.size)


def unpack(
    entry: Any, scratch: str, most: int, head_bytes: int, wanted: Callable[[bytes], bool]
) -> str | None:
    """The member, to a file in ``scratch`` (at most ``most`` bytes), if
    ``wanted(its first head_bytes)``; None when it is not (nothing written)."""
    blocks = entry.get_blocks(_CHUNK)
    head = b""
    for block in blocks:
        head += block
        if len(head) >= head_bytes:
            break
    if not wanted(head[:head_bytes]):
        return None
    return spooled(head, blocks, scratch, most)


def spooled(head: bytes, rest: Iterator[bytes], scratch: str, most: int) -> str:
    """``head`` and what follows it in ``rest``, to a new file in
    ``scratch``: no more than ``most`` bytes."""
    fd, inner = tempfile.mkstemp(dir=scratch, suffix=".layer")
    try:
        with os.fdopen(fd, "wb") as dst:
            dst.write(head[:most])
            left = most - len(head)
            while left > 0 and (block := next(rest, None)) is not None:
                dst.write(block[:left])
                left -= len(block)
    except BaseException:
        os.unlink(inner)
        raise
    return inner

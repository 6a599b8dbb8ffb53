"""Archives other than ZIP and tar, as far as the virus scan must know them.

clamd unpacks 7-Zip, CAB, XAR, cpio, ISO 9660, LHA and pre-POSIX tar
itself, and reads what it finds inside with the same readers as at the top:
a ZIP compressed inside a 7-Zip hid a signature past MaxFileSize, a RAR
inside a CAB went unopened (Debian's clamd has no unrar), a CAB member past
MaxFileSize was skipped, all called clean.  These are walked here through
libarchive, member by member, for ``zipsizes`` to survey what is inside.

Some formats clamd does not unpack at all (``UNOPENED``): it reads their
bytes as they are, so no hash signature can match a member, and EICAR in an
``ar`` (a ``.deb``), a zstd stream or a WIM image was clean.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

# What starts each format, as clamd and libarchive tell them (offsets in the
# file's first bytes).
MAGIC = (
    ("7z", 0, b"7z\xbc\xaf\x27\x1c"),
    ("cab", 0, b"MSCF\0\0\0\0"),
    ("xar", 0, b"xar!"),
    ("cpio", 0, b"070707"),
    ("cpio", 0, b"070701"),
    ("cpio", 0, b"070702"),
    ("cpio", 0, b"\xc7\x71"),
    ("cpio", 0, b"\x71\xc7"),
    ("lha", 2, b"-lh"),
    ("ar", 0, b"!<arch>\n"),
    ("zstd", 0, b"\x28\xb5\x2f\xfd"),
    ("lz4", 0, b"\x04\x22\x4d\x18"),
    ("WIM", 0, b"MSWIM\0\0\0"),
    ("WARC", 0, b"WARC/"),
)
# Read by clamd as plain bytes: a file holding one is never called clean.
UNOPENED = frozenset({"ar", "zstd", "lz4", "WIM", "WARC"})
# Compressions libarchive undoes and clamd does not.
_UNOPENED_FILTERS = {b"zstd": "zstd", b"lz4": "lz4", b"lzip": "lzip", b"lzop": "lzop"}
# libarchive's names of the formats clamd unpacks (those not read by
# zipsizes itself), by their start.
_WALKED = (b"7-Zip", b"CAB", b"xar", b"ISO9660", b"lha", b"tar (non-POSIX)")
_CHUNK = 1024 * 1024


def kind_of(head: bytes) -> str | None:
    """The format ``head`` (a file's first bytes) starts, from MAGIC."""
    return next((k for k, at, magic in MAGIC if head[at : at + len(magic)] == magic), None)


@contextlib.contextmanager
def opened(path: str) -> Iterator[tuple[Iterator[tuple[Any, int]] | None, str | None]]:
    """(its members, None) for an archive clamd unpacks and zipsizes does not
    read itself; (None, name) for one clamd does not unpack; (None, None) for
    anything else (not an archive libarchive knows).  Each member comes with
    its size (-1 when the archive does not say); regular files only."""
    import libarchive  # the child only, on a clean answer

    try:
        reader = libarchive.file_reader(path)
        archive = reader.__enter__()
    except libarchive.ArchiveError:
        yield None, None
        return
    try:
        entries = iter(archive)
        # The format is known once the first member's header is read.
        first = next(entries, None)
        filters = [f for f in archive.filter_names if f in _UNOPENED_FILTERS]
        name = archive.format_name or b""
        if filters:
            yield None, _UNOPENED_FILTERS[filters[0]]
        elif name == b"ar" or name.startswith(b"ar "):
            yield None, "ar"
        elif first is not None and (b"cpio" in name or name.startswith(_WALKED)):
            yield _regular(itertools.chain([first], entries)), None
        else:
            yield None, None
    finally:
        with contextlib.suppress(libarchive.ArchiveError):
            reader.__exit__(None, None, None)


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
    fd, inner = tempfile.mkstemp(dir=scratch, suffix=".layer")
    try:
        with os.fdopen(fd, "wb") as dst:
            dst.write(head[:most])
            left = most - len(head)
            for block in blocks:
                if left <= 0:
                    break
                dst.write(block[:left])
                left -= len(block)
    except BaseException:
        os.unlink(inner)
        raise
    return inner

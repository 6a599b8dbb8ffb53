"""The layers clamd unpacks, unpacked here to survey the ZIPs inside them.

clamd reads a ZIP it finds inside another layer with the same ZIP reader
that ``zipsizes`` is there for, so ``survey_nested`` unpacks the layers
clamd would (ZIP and tar members, gzip, bzip2 and xz streams, the
archives libarchive walks, a PDF's streams, a mail's parts) to survey the
ZIPs inside them too with ``zipsizes.survey``, and notes a RAR archive in
any of them (without the non-free libclamunrar, Debian's clamd does not
unpack RAR).  The walk is bounded: NESTED_DEPTH layers deep, NESTED_BYTES
unpacked, NESTED_MEMBERS layers looked into, NESTED_HEADS members' first
bytes read, NESTED_SCANS members sent to clamd alone, NESTED_READ read
through for an archive after other bytes, PDF_SECONDS decoding PDFs'
streams; past any of them the survey is ``unchecked``.
"""

from __future__ import annotations

import bz2
import contextvars
import functools
import io
import itertools
import lzma
import math
import mmap
import os
import tarfile
import tempfile
import time
import zipfile
import zlib
from collections.abc import Callable, Iterator
from typing import IO, Any, cast

from hypermedia.pipelines import archives, mail_parts, pdf_streams, zipsizes
from hypermedia.pipelines.zipsizes import Survey

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
    """``zipsizes.survey``, and that of every ZIP inside another layer clamd unpacks
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
    if head.startswith(zipsizes.LOCAL):
        return "zip"
    if head.startswith(zipsizes.RAR):  # RAR 1.5-4.x and 5.0 alike
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
        most = zipsizes._CHUNK if size is None or size < 0 else size
        d = self._inflate
        while not d.eof:
            if self._zlib:
                data = d.unconsumed_tail or self._file.read(zipsizes._CHUNK)
                if not data:
                    raise EOFError("the compressed stream is cut short")
                got = d.decompress(data, most)
            else:
                data = b"" if not d.needs_input else self._file.read(zipsizes._CHUNK)
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
                rest = self._file.read(zipsizes._CHUNK)
            rest = rest.lstrip(b"\0")
            if len(rest) < 6:
                rest += self._file.read(6)
            self.joined = rest.startswith(self._magic)
        return b""

    def close(self) -> None:
        self._file.close()
        super().close()


def _nested(path: str, scratch: str, limit: int, depth: int, budget: list[int]) -> Survey:
    out = zipsizes.survey(path)
    # Anywhere in it: a RAR stored in any container, or behind a program (an
    # SFX), which clamd finds and cannot open.  Not opened here: whether
    # clamd could is the profile's to say.
    out.rar = zipsizes._holds_rar(path)
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
    one past ``limit``, layer or plain data, is ``overflowed``; of the kind
    ``skip``, not read again as one.  False once a budget is spent."""
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
        return True
    if kind is None:
        seen = [len(head)]
        if not _marked(head, _counted(chunks, seen)):
            # Read to its end: plain data clamd scans only MaxFileSize of (a
            # marker 30 MiB into a PDF's stream was called clean).
            out.overflowed |= seen[0] > limit
            return True
        # Read to the marker: from the start again, to be kept.
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


_MARKERS = (zipsizes.LOCAL, zipsizes.RAR, archives.SEVEN_ZIP)
_LONGEST = max(len(m) for m in _MARKERS)


def _counted(chunks: Iterator[bytes], seen: list[int]) -> Iterator[bytes]:
    for chunk in chunks:
        seen[0] += len(chunk)
        yield chunk


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
        return _marked(head, iter(functools.partial(f.read, zipsizes._CHUNK), b""))
    except Exception:  # a CRC that fails at its end: no layer in it, as before
        return False


def _marked_file(path: str) -> bool:
    with open(path, "rb") as f:
        return _marked(b"", iter(functools.partial(f.read, zipsizes._CHUNK), b""))


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
        while chunk := src.read(zipsizes._CHUNK):
            dst.write(chunk)
    return inner


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
                if not m.flag_bits & zipsizes._ENCRYPTED:
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
        return self.zip is not None and member.compress_type not in zipsizes.CLAMD_ZIP_METHODS

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
            while left > 0 and (chunk := src.read(min(zipsizes._CHUNK, left))):
                dst.write(chunk)
                left -= len(chunk)
    except BaseException:
        os.unlink(inner)
        raise
    return inner

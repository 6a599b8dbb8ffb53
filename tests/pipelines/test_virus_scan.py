"""security.virus_scan against a real clamd (see conftest.py): verdicts, limits, outages.

Most tests run the pipeline as the child would (input file in a scratch
directory, settings validated from a profile); the last two run a real
``hypermedia worker`` on the ledger, including a clamd outage that the job
waits out in retry_wait.
"""

from __future__ import annotations

import base64
import bz2
import contextlib
import gzip
import io
import lzma
import os
import socket
import struct
import tarfile
import threading
import time
import uuid
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import libarchive
import pytest

from hypermedia.db.driver import Driver
from hypermedia.errors import ERROR_POLICY, JobError
from hypermedia.pipelines import registry, virus, zipsizes
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import NewJob
from hypermedia.storage.ledger import Storage
from tests import pdfs
from tests.integration._procs import Procs, attempts, eventually, sqlite_only, tail, wait_job
from tests.pipelines.conftest import (
    EICAR,
    EICAR_NAME,
    MARKER,
    MARKER_NAME,
    MAX_FILE,
    STREAM_MAX,
    Clamd,
)
from tests.unit.test_mail_parts import mail, mbox, text_mail, uu
from tests.unit.test_zipsizes import _streamed

pytestmark = pytest.mark.timeout(120)

CLEAN = b"just some harmless text, nothing to see here\n" * 200


def _scan(
    scratch: Path, data: bytes, settings: dict[str, Any]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run the pipeline on ``data`` as the child would; (result, declared outputs)."""
    path = scratch / "input.bin"
    path.write_bytes(data)
    params = virus.VIRUS_SCAN.validate({}, settings)
    ctx = registry.Context(str(scratch), lambda _: None, str(path))
    result = virus.VIRUS_SCAN.run(params, ctx)
    assert result is not None
    return result, ctx.outputs


def _clamd_alone(tmp_path: Path, clamd: Clamd, data: bytes) -> str:
    """What clamd itself answers for ``data``: the yardstick of a survey's finding."""
    path = tmp_path / "alone.bin"
    path.write_bytes(data)
    return virus.instream(virus.parse_address(clamd.unix_url), str(path), 10**9, 30)[0].strip("\0")


@pytest.fixture(params=["unix", "tcp"])
def url(request: pytest.FixtureRequest, clamd: Clamd) -> str:
    return clamd.unix_url if request.param == "unix" else clamd.tcp_url


# -- verdicts ------------------------------------------------------------------------


def test_a_clean_file_is_clean(tmp_path: Path, url: str) -> None:
    result, outputs = _scan(tmp_path, CLEAN, {"clamd": url})
    assert result["verdict"] == "clean"
    assert result["signature"] is None and result["reason"] is None
    assert result["bytes_sent"] == len(CLEAN)
    assert result["engine"].startswith("ClamAV 1.")
    assert outputs == [
        {
            "output_type": "virus_verdict",
            "mime_type": "application/json",
            "metadata": {"verdict": "clean", "signature": None},
            "path": None,
        }
    ]


def test_eicar_is_infected_with_the_signature_name(tmp_path: Path, url: str) -> None:
    result, outputs = _scan(tmp_path, EICAR, {"clamd": url})
    assert result["verdict"] == "infected"
    assert result["signature"] == f"{EICAR_NAME}.UNOFFICIAL"
    assert outputs[0]["metadata"] == {"verdict": "infected", "signature": result["signature"]}


def test_a_body_signature_inside_a_larger_file_is_found(tmp_path: Path, clamd: Clamd) -> None:
    data = os.urandom(100_000) + MARKER + os.urandom(50_000)
    result, _ = _scan(tmp_path, data, {"clamd": clamd.unix_url})
    assert (result["verdict"], result["signature"]) == ("infected", f"{MARKER_NAME}.UNOFFICIAL")


def test_a_strip_png_is_scanned_with_the_advised_clamd_conf(tmp_path: Path, clamd: Clamd) -> None:
    """QA: a sound 97 kB PNG of 100,000,000 x 1 pixels made clamd 1.4 allocate
    51 GB for its fuzzy hash and die; with ScanImageFuzzyHash off (as
    docs/pipelines.md advises, and this clamd runs) it is scanned, and clamd
    lives on to find EICAR next."""
    pixels = zlib.compress(b"\0" * (1 + 100_000_000), 9)
    header = struct.pack(">IIBBBBB", 100_000_000, 1, 8, 0, 0, 0, 0)  # 8-bit grey
    png = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", pixels)
    png += _chunk(b"IEND", b"")
    result, _ = _scan(tmp_path, png, {"clamd": clamd.unix_url})
    assert result["verdict"] == "clean", result
    assert _scan(tmp_path, EICAR, {"clamd": clamd.unix_url})[0]["verdict"] == "infected"


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def test_an_empty_file_is_clean(tmp_path: Path, clamd: Clamd) -> None:
    result, _ = _scan(tmp_path, b"", {"clamd": clamd.unix_url})
    assert (result["verdict"], result["bytes_sent"]) == ("clean", 0)


# -- limits: never "clean" -----------------------------------------------------------


def test_over_clamds_stream_limit_is_not_fully_scanned(tmp_path: Path, url: str) -> None:
    # Larger than what the kernel buffers on a loopback connection.
    data = b"a" * (24 * STREAM_MAX)
    result, outputs = _scan(tmp_path, data, {"clamd": url})
    assert result["verdict"] == "not_fully_scanned"
    assert "size limit exceeded" in result["reason"]
    assert result["signature"] is None
    assert result["bytes_sent"] < len(data)  # stopped sending once clamd refused
    assert outputs[0]["metadata"] == {"verdict": "not_fully_scanned", "signature": None}


def test_over_clamds_file_size_limit_is_not_fully_scanned(tmp_path: Path, clamd: Clamd) -> None:
    # Under StreamMaxLength, over MaxFileSize: clamd (AlertExceedsMax) names the limit.
    result, _ = _scan(tmp_path, b"b" * (MAX_FILE + 4096), {"clamd": clamd.unix_url})
    assert result["verdict"] == "not_fully_scanned"
    assert result["reason"] == "clamd stopped at its scan limit (MaxFileSize)"
    assert result["signature"] is None


def test_over_max_bytes_is_not_fully_scanned_and_only_a_prefix_is_sent(
    tmp_path: Path, clamd: Clamd
) -> None:
    settings = {"clamd": clamd.unix_url, "max_bytes": 10_000}
    result, _ = _scan(tmp_path, CLEAN * 3, settings)
    assert result["verdict"] == "not_fully_scanned"
    assert result["bytes_sent"] == 10_000
    assert "max_bytes" in result["reason"]
    # What the scanned part shows is still reported.
    result, _ = _scan(tmp_path, MARKER + CLEAN * 3, settings)
    assert (result["verdict"], result["signature"]) == ("infected", f"{MARKER_NAME}.UNOFFICIAL")


def _zip(member: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("member.bin", member)
    return buf.getvalue()


def test_a_zip_member_over_clamds_max_file_size_is_never_clean(
    tmp_path: Path, clamd: Clamd
) -> None:
    # clamd's ZIP reader scans a member only up to MaxFileSize and says OK,
    # AlertExceedsMax or not: the marker past it goes unseen.
    hidden = _zip(b"\0" * (MAX_FILE + 4096) + MARKER)
    assert len(hidden) < MAX_FILE  # the archive itself is well under every limit
    assert _clamd_alone(tmp_path, clamd, hidden) == "stream: OK"
    settings = {"clamd": clamd.unix_url, "clamd_max_file_size": MAX_FILE}
    result, outputs = _scan(tmp_path, hidden, settings)
    assert (result["verdict"], result["signature"]) == ("not_fully_scanned", None)
    assert result["reason"] == (
        f"a ZIP member of {MAX_FILE + 4096 + len(MARKER)} bytes is over clamd's MaxFileSize "
        f"({MAX_FILE}): clamd scanned only its first MaxFileSize bytes"
    )
    assert outputs[0]["metadata"] == {"verdict": "not_fully_scanned", "signature": None}
    # Under the limit the member is scanned whole; what clamd finds still wins.
    assert _scan(tmp_path, _zip(CLEAN), settings)[0]["verdict"] == "clean"
    result, _ = _scan(tmp_path, _zip(b"\0" * (MAX_FILE + 4096) + EICAR), settings)
    assert result["verdict"] == "not_fully_scanned"
    result, _ = _scan(tmp_path, _zip(MARKER + b"\0" * (MAX_FILE + 4096)), settings)
    assert (result["verdict"], result["signature"]) == ("infected", f"{MARKER_NAME}.UNOFFICIAL")
    # Not a ZIP: clamd's answer stands.
    assert _scan(tmp_path, b"PK\x05\x06" + os.urandom(40), settings)[0]["verdict"] == "clean"


def test_a_zip_in_a_compressed_member_is_surveyed_too(tmp_path: Path, clamd: Clamd) -> None:
    """clamd unpacks a ZIP inside a ZIP and reads only MaxFileSize of its
    members as well, yet only the outer ZIP was surveyed: 248 bytes hid a
    signature behind MaxFileSize of padding, called clean."""
    inner = _zip(b"\0" * (MAX_FILE + 4096) + MARKER)
    nested = _zip(inner)  # deflated: the inner local headers are not in the file's bytes
    assert nested.count(zipsizes.LOCAL) == 1
    settings = {"clamd": clamd.unix_url, "clamd_max_file_size": MAX_FILE}
    result, _ = _scan(tmp_path, nested, settings)
    assert (result["verdict"], result["signature"]) == ("not_fully_scanned", None)
    assert f"over clamd's MaxFileSize ({MAX_FILE})" in result["reason"]
    assert _scan(tmp_path, _zip(_zip(CLEAN)), settings)[0]["verdict"] == "clean"
    assert not list(tmp_path.glob("tmp*.zip"))  # what was unpacked to look is gone


def test_a_zip_in_a_gzip_a_tar_or_a_stored_zip_is_surveyed_too(
    tmp_path: Path, clamd: Clamd
) -> None:
    """clamd unpacks gzip and tar as well and reads the ZIP inside with the
    same ZIP reader: the padded ZIP above, gzipped, in a .tar.gz, or deflated
    in a ZIP stored in a ZIP, was called clean."""
    padded = _zip(b"\0" * (MAX_FILE + 4096) + MARKER)
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w:gz") as t:
        info = tarfile.TarInfo("p.zip")
        info.size = len(padded)
        t.addfile(info, io.BytesIO(padded))
    stored = io.BytesIO()
    with zipfile.ZipFile(stored, "w", zipfile.ZIP_STORED) as z:
        z.writestr("inner.zip", _zip(padded))
    settings = {"clamd": clamd.unix_url, "clamd_max_file_size": MAX_FILE}
    for data in (gzip.compress(padded), tar.getvalue(), stored.getvalue()):
        result, _ = _scan(tmp_path, data, settings)
        assert (result["verdict"], result["signature"]) == ("not_fully_scanned", None)
        assert f"over clamd's MaxFileSize ({MAX_FILE})" in result["reason"]
    # A gzip stream past MaxFileSize: clamd read only its start.
    result, _ = _scan(tmp_path, gzip.compress(b"\0" * (MAX_FILE + 4096) + MARKER), settings)
    assert result["verdict"] == "not_fully_scanned", result
    # Small enough to be read whole: clamd's answer stands, either way.
    assert _scan(tmp_path, gzip.compress(_zip(CLEAN)), settings)[0]["verdict"] == "clean"
    result, _ = _scan(tmp_path, gzip.compress(_zip(MARKER)), settings)
    assert (result["verdict"], result["signature"]) == ("infected", f"{MARKER_NAME}.UNOFFICIAL")
    assert not list(tmp_path.glob("tmp*.layer"))  # what was unpacked to look is gone


def _rar(member: bytes, name: bytes = b"member.bin", comment: bytes = b"") -> bytes:
    """A RAR 4 archive holding ``member`` stored (method 0x30): no RAR tool
    is needed to write one, and clamd reads it as any RAR.  With a
    ``comment``, its archive header carries one as RAR 1.5-2.x wrote it, the
    header's CRC over its fixed fields only."""

    def block(kind: int, flags: int, fields: bytes, covered: int | None = None) -> bytes:
        head = struct.pack("<BHH", kind, flags, 7 + len(fields)) + fields
        return struct.pack("<H", zlib.crc32(head[:covered]) & 0xFFFF) + head

    archive = block(0x73, 0x0002 if comment else 0, bytes(6) + comment, 11)
    # packed and unpacked size, host OS, CRC, time, version, method, name length, attributes
    fixed = struct.pack(
        "<IIBIIBBHI", len(member), len(member), 3, zlib.crc32(member), 0, 20, 0x30, len(name), 0o644
    )
    member_head = block(0x74, 0x8000, fixed + name)  # 0x8000: data follows the header
    return b"Rar!\x1a\x07\x00" + archive + member_head + member + block(0x7B, 0x4000, b"")


def test_rars_of_every_kind_and_streams_known_by_odd_starts_are_never_clean(
    tmp_path: Path, clamd: Clamd
) -> None:
    """Called clean with EICAR inside: a RAR 2 with a comment (its header's
    CRC covers the fixed fields only), a RAR 5 with encrypted headers (type
    4 first), a legacy lz4 frame, a zstd stream behind a skippable frame, an
    .lzma of other lc/lp/pb; and a 7-Zip behind a program (an SFX).  A
    newline after a gzip stream is no second stream."""
    settings = {"clamd": clamd.unix_url}
    rar5 = b"\x04\x00\x00\x00" + bytes(16)  # type 4 (encryption), flags, version, salt
    rar5 = bytes([len(rar5)]) + rar5
    encrypted = b"Rar!\x1a\x07\x01\x00" + struct.pack("<I", zlib.crc32(rar5)) + rar5 + EICAR
    lc0 = [{"id": lzma.FILTER_LZMA1, "lc": 0, "lp": 0, "pb": 1}]  # all three 0: no .lzma
    zstd = _archive(tmp_path, "ustar", {"eicar.com": EICAR}, "zstd")
    for data, reason in (
        (_rar(EICAR, b"eicar.com", comment=b"a comment"), virus.RAR_UNOPENED),
        (encrypted, virus.RAR_UNOPENED),
        (b"\x02\x21\x4c\x18" + bytes(40), "it holds lz4 data"),
        (b"\x50\x2a\x4d\x18" + struct.pack("<I", 4) + b"skip" + zstd, "it holds zstd data"),
        (lzma.compress(EICAR, format=lzma.FORMAT_ALONE, filters=lc0), "it holds lzma data"),
    ):
        result, _ = _scan(tmp_path, data, settings)
        assert result["verdict"] == "not_fully_scanned", reason
        assert result["reason"].startswith(reason), result["reason"]
    seven = _archive(tmp_path, "7zip", {"eicar.com": EICAR}, compression="bzip2")
    sfx = b"MZ" + os.urandom(5000) + seven
    assert _clamd_alone(tmp_path, clamd, sfx) == "stream: OK"  # clamd alone misses it
    result, _ = _scan(tmp_path, sfx, settings)
    assert (result["verdict"], result["signature"]) == ("infected", f"{EICAR_NAME}.UNOFFICIAL")
    result, _ = _scan(tmp_path, gzip.compress(CLEAN) + b"\n", settings)
    assert (result["verdict"], result["reason"]) == ("clean", None)


def test_a_rar_is_never_clean_where_clamd_cannot_unpack_it(tmp_path: Path, clamd: Clamd) -> None:
    """Debian's clamd has no libclamunrar: it reads a RAR's bytes as they
    are, so a hash signature never matches a member, and EICAR stored in a
    RAR was OK, called clean (in a ZIP it is found)."""
    assert _clamd_alone(tmp_path, clamd, _rar(EICAR, b"eicar.com")) == "stream: OK"
    settings = {"clamd": clamd.unix_url}
    stored = io.BytesIO()
    with zipfile.ZipFile(stored, "w", zipfile.ZIP_STORED) as z:
        z.writestr("inner.rar", _rar(CLEAN))
    with tarfile.open(fileobj=(tgz := io.BytesIO()), mode="w:gz") as t:
        info = tarfile.TarInfo("inner.rar")
        info.size = len(_rar(CLEAN))
        t.addfile(info, io.BytesIO(_rar(CLEAN)))
    for data in (
        _rar(EICAR, b"eicar.com"),
        _rar(CLEAN),
        _zip(_rar(CLEAN)),
        stored.getvalue(),
        tgz.getvalue(),
        gzip.compress(_rar(CLEAN)),
    ):
        result, outputs = _scan(tmp_path, data, settings)
        assert (result["verdict"], result["reason"]) == ("not_fully_scanned", virus.RAR_UNOPENED)
        assert outputs[0]["metadata"] == {"verdict": "not_fully_scanned", "signature": None}
    # What clamd finds in a RAR's raw bytes still wins.
    result, _ = _scan(tmp_path, _rar(b"x" + MARKER), settings)
    assert (result["verdict"], result["signature"]) == ("infected", f"{MARKER_NAME}.UNOFFICIAL")
    # An operator whose clamd has libclamunrar says so in the profile.
    trusted = {**settings, "clamd_unpacks_rar": True}
    assert _scan(tmp_path, _rar(CLEAN), trusted)[0]["verdict"] == "clean"
    assert _scan(tmp_path, _zip(CLEAN), settings)[0]["verdict"] == "clean"  # no RAR: as before


def _archive(
    tmp_path: Path,
    fmt: str,
    members: dict[str, bytes],
    filter_name: str | None = None,
    **options: str,
) -> bytes:
    """An archive written by libarchive (7zip, xar, cpio, iso9660, v7tar, ar_bsd, warc…)."""
    path = tmp_path / f"made.{fmt}"
    opts = ",".join(f"{k}={v}" for k, v in options.items())
    with libarchive.file_writer(str(path), fmt, filter_name, options=opts) as archive:
        for name, data in members.items():
            archive.add_file_from_memory(name, len(data), data)
    made = path.read_bytes()
    path.unlink()
    return made


# 7-Zip compressed (what is inside is in no byte of the file), XAR (its
# members gzipped), cpio, ISO 9660 and a pre-POSIX tar: clamd unpacks each
# and reads a ZIP or a RAR inside with the same readers as at the top.
UNPACKED_BY_CLAMD = [
    ("7zip", {"compression": "lzma2"}),
    ("xar", {}),
    ("cpio", {}),
    ("iso9660", {}),
    ("v7tar", {}),
]


@pytest.mark.parametrize(
    ("fmt", "options"), UNPACKED_BY_CLAMD, ids=[f for f, _ in UNPACKED_BY_CLAMD]
)
def test_what_other_archives_hold_is_surveyed_too(
    tmp_path: Path, clamd: Clamd, fmt: str, options: dict[str, str]
) -> None:
    """A ZIP with a member past MaxFileSize, or a RAR, inside a compressed
    7-Zip (or XAR, cpio, ISO, old tar) was called clean: clamd unpacked them
    and read what was inside as at the top, where it is not_fully_scanned."""
    settings = {"clamd": clamd.unix_url, "clamd_max_file_size": MAX_FILE}
    padded = _zip(b"\0" * (MAX_FILE + 4096) + MARKER)
    result, _ = _scan(tmp_path, _archive(tmp_path, fmt, {"p.zip": padded}, **options), settings)
    assert (result["verdict"], result["signature"]) == ("not_fully_scanned", None)
    assert f"over clamd's MaxFileSize ({MAX_FILE})" in result["reason"]
    result, _ = _scan(
        tmp_path, _archive(tmp_path, fmt, {"x.rar": _rar(CLEAN)}, **options), settings
    )
    assert (result["verdict"], result["reason"]) == ("not_fully_scanned", virus.RAR_UNOPENED)
    # A member past MaxFileSize itself: these clamd says (AlertExceedsMax).
    big = _archive(tmp_path, fmt, {"big.bin": os.urandom(MAX_FILE + 1)}, **options)
    assert _scan(tmp_path, big, settings)[0]["verdict"] == "not_fully_scanned"
    # What clamd finds still wins, and a harmless archive is clean.
    result, _ = _scan(tmp_path, _archive(tmp_path, fmt, {"m.txt": MARKER}, **options), settings)
    assert (result["verdict"], result["signature"]) == ("infected", f"{MARKER_NAME}.UNOFFICIAL")
    clean = _archive(tmp_path, fmt, {"a.txt": CLEAN, "b.zip": _zip(CLEAN)}, **options)
    assert _scan(tmp_path, clean, settings)[0]["verdict"] == "clean"
    assert not list(tmp_path.glob("tmp*.layer"))  # what was unpacked to look is gone


def _cab(name: bytes, member: bytes) -> bytes:
    """A Microsoft cabinet holding ``member`` MSZIP-compressed (libarchive
    reads CAB but does not write it): header, one folder, one file, then
    blocks of 32 kB, each "CK" and a deflate stream of its own."""
    blocks = [member[i : i + 32768] for i in range(0, len(member), 32768)] or [b""]

    def deflated(block: bytes) -> bytes:
        c = zlib.compressobj(9, zlib.DEFLATED, -15)
        return b"CK" + c.compress(block) + c.flush()

    packed = [(deflated(b), len(b)) for b in blocks]
    entry = struct.pack("<IIHHHH", len(member), 0, 0, 0, 0, 0x20) + name + b"\0"
    files_at = 36 + 8
    data_at = files_at + len(entry)
    data = b"".join(struct.pack("<IHH", 0, len(p), n) + p for p, n in packed)
    size = data_at + len(data)
    header = b"MSCF" + struct.pack("<IIIIIBBHHHHH", 0, size, 0, files_at, 0, 3, 1, 1, 1, 0, 0, 0)
    folder = struct.pack("<IHH", data_at, len(packed), 1)  # 1: MSZIP
    return header + folder + entry + data


@pytest.mark.parametrize(
    ("fmt", "options"),
    [
        ("7zip", {"compression": "bzip2"}),
        ("7zip", {"compression": "deflate"}),
    ],
    ids=["7z bzip2", "7z deflate"],
)
def test_members_clamd_does_not_decode_in_place_are_scanned_alone(
    tmp_path: Path, clamd: Clamd, fmt: str, options: dict[str, str]
) -> None:
    """clamd reads a 7-Zip member compressed by BZip2 or Deflate as the bytes
    it is: EICAR in one was clean.  Each member
    of such an archive is sent to clamd on its own, and what it finds wins."""
    made = _archive(tmp_path, fmt, {"eicar.com": EICAR, "a.txt": CLEAN}, **options)
    assert _clamd_alone(tmp_path, clamd, made) == "stream: OK"
    result, outputs = _scan(tmp_path, made, {"clamd": clamd.unix_url})
    assert (result["verdict"], result["signature"]) == ("infected", f"{EICAR_NAME}.UNOFFICIAL")
    assert outputs[0]["metadata"] == {"verdict": "infected", "signature": result["signature"]}
    harmless = _archive(tmp_path, fmt, {"a.txt": CLEAN}, **options)
    assert _scan(tmp_path, harmless, {"clamd": clamd.unix_url})[0]["verdict"] == "clean"


def test_ordinary_files_stay_clean(tmp_path: Path, clamd: Clamd) -> None:
    """What the survey took for archives: a CRLF CSV (libarchive guessed an
    mtree listing, failed, and it was "could not be unpacked"), a ZIP of
    2,001 texts ("archives inside it are too many"), a text naming RAR's
    marker ("a RAR archive is in it")."""
    settings = {"clamd": clamd.unix_url}
    many = io.BytesIO()
    with zipfile.ZipFile(many, "w", zipfile.ZIP_DEFLATED) as z:
        for i in range(2001):
            z.writestr(f"t{i}.txt", b"line %d\n" % i)
    matlab = struct.pack("<iiiii", 0, 1, 1, 0, 2) + b"x\0" + struct.pack("<d", 3.5)  # v4 .mat
    # libzip's table of signatures in a program: a "local header" of version
    # 0 whose flags say encrypted (a wheel's .so was "a ZIP member is encrypted").
    libzip = b"PK\x03\x04\x00PK\x01\x02\x00AE\x00PK\x06\x06\x00PK\x06\x07\x00PK\x05\x06\x00"
    program = b"\x7fELF" + bytes(1000) + libzip + b"TORRENTZIPPED-%08X\x00" + bytes(1000)
    for data in (
        b"Name,Age\r\nAlice,30\r\nBob,25\r\n",
        matlab,  # taken for .lzma (lc = lp = pb = 0): scipy's wheels were not_fully_scanned
        _zip(matlab),
        program,
        _zip(program),
        many.getvalue(),
        b"RAR files start with Rar!\x1a\x07\x00 and then a header." + CLEAN,
        gzip.compress(b"Name,Age\r\nAlice,30\r\n"),
    ):
        result, _ = _scan(tmp_path, data, settings)
        assert (result["verdict"], result["reason"]) == ("clean", None), data[:40]


def test_archives_known_by_their_start_inside_another_are_surveyed(
    tmp_path: Path, clamd: Clamd
) -> None:
    """An ISO (its magic 32 kB in) or a pre-POSIX tar (no magic: its header's
    checksum) deflated in a ZIP was not looked into; an .lzma or a .tar.Z
    stream, which clamd does not unpack, was clean."""
    settings = {"clamd": clamd.unix_url, "clamd_max_file_size": MAX_FILE}
    padded = _zip(b"\0" * (MAX_FILE + 4096) + MARKER)
    for fmt in ("iso9660", "v7tar"):
        nested = _zip(_archive(tmp_path, fmt, {"p.zip": padded}))
        result, _ = _scan(tmp_path, nested, settings)
        assert result["verdict"] == "not_fully_scanned", fmt
        assert f"over clamd's MaxFileSize ({MAX_FILE})" in result["reason"]
    for data, name in (
        (lzma.compress(EICAR, format=lzma.FORMAT_ALONE), "lzma"),
        (_archive(tmp_path, "ustar", {"eicar.com": EICAR}, "compress"), "compress"),
    ):
        result, _ = _scan(tmp_path, data, settings)
        assert result["reason"] == (
            f"it holds {name} data, which clamd does not unpack: what is inside was not scanned"
        )


def test_a_cab_member_clamd_skips_past_max_file_size_is_never_clean(
    tmp_path: Path, clamd: Clamd
) -> None:
    """clamd skips a CAB member past MaxFileSize and says OK, AlertExceedsMax
    or not: a signature at its end was called clean."""
    cab = _cab(b"big.bin", b"\0" * (MAX_FILE + 4096) + MARKER)
    assert _clamd_alone(tmp_path, clamd, cab) == "stream: OK"
    settings = {"clamd": clamd.unix_url, "clamd_max_file_size": MAX_FILE}
    result, _ = _scan(tmp_path, cab, settings)
    assert (result["verdict"], result["reason"]) == (
        "not_fully_scanned",
        f"an archive member of {MAX_FILE + 4096 + len(MARKER)} bytes is over clamd's "
        f"MaxFileSize ({MAX_FILE}): clamd skips or cuts such members",
    )
    result, _ = _scan(tmp_path, _cab(b"m.txt", b"x" + MARKER), settings)  # under it: read
    assert (result["verdict"], result["signature"]) == ("infected", f"{MARKER_NAME}.UNOFFICIAL")
    assert _scan(tmp_path, _cab(b"a.txt", CLEAN), settings)[0]["verdict"] == "clean"


def test_formats_clamd_does_not_unpack_are_never_clean(tmp_path: Path, clamd: Clamd) -> None:
    """clamd reads an ar (a .deb), a zstd stream or a WARC as plain bytes: no
    hash signature can match what is inside, and EICAR in them was clean."""
    settings = {"clamd": clamd.unix_url}
    for made, name in (
        (_archive(tmp_path, "ar_bsd", {"eicar.com": EICAR}), "ar"),
        (_archive(tmp_path, "ustar", {"eicar.com": EICAR}, "zstd"), "zstd"),
        (_archive(tmp_path, "warc", {"eicar.com": EICAR}), "WARC"),
        (_zip(_archive(tmp_path, "ustar", {"eicar.com": EICAR}, "zstd")), "zstd"),
    ):
        result, _ = _scan(tmp_path, made, settings)
        assert (result["verdict"], result["signature"]) == ("not_fully_scanned", None), name
        assert result["reason"] == (
            f"it holds {name} data, which clamd does not unpack: what is inside was not scanned"
        )


def _lzma_zip(member: bytes) -> bytes:
    """A ZIP whose member is compressed by LZMA (method 14): Python reads
    it, clamd does not."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_LZMA) as z:
        z.writestr("m.txt", member)
    return buf.getvalue()


def test_what_a_pdf_holds_is_surveyed_as_clamd_decodes_it(tmp_path: Path, clamd: Clamd) -> None:
    """clamd undoes a PDF's stream filters (Flate, ASCIIHex, LZW…) and unpacks
    the archives it finds there: a ZIP in a method it does not decode, xz
    streams joined, a RAR, a ZIP member past MaxFileSize embedded in a PDF
    were OK from clamd, and clean."""
    settings = {"clamd": clamd.unix_url, "clamd_max_file_size": MAX_FILE}
    lzma_zip = _lzma_zip(b"x" + MARKER)
    joined = lzma.compress(b"hello\n") + lzma.compress(EICAR)
    for pdf, reason in (
        (pdfs.attached(zlib.compress(lzma_zip)), "a ZIP member is compressed by"),
        (pdfs.attached(pdfs.lzw(joined), b"/LZW"), "a gzip, bzip2 or xz file in it holds"),
        (pdfs.attached(_rar(EICAR).hex().encode() + b">", b"/AHx"), virus.RAR_UNOPENED),
        (
            pdfs.attached(zlib.compress(_zip(b"\0" * (MAX_FILE + 4096) + MARKER))),
            f"a ZIP member of {MAX_FILE + 4096 + len(MARKER)} bytes is over",
        ),
    ):
        assert _clamd_alone(tmp_path, clamd, pdf) == "stream: OK"
        result, _ = _scan(tmp_path, pdf, settings)
        assert result["verdict"] == "not_fully_scanned", reason
        assert result["reason"].startswith(reason)
    # Encrypted: clamd decrypts one that needs no password (its attachments are
    # read through pdfium here) and reads nothing of one that needs a password.
    for pdf, reason in (
        (pdfs.encrypted("", attachment=lzma_zip), "a ZIP member is compressed by"),
        (pdfs.encrypted("secret", attachment=EICAR), "a PDF in it needs a password to open"),
    ):
        assert _clamd_alone(tmp_path, clamd, pdf) == "stream: OK"
        result, _ = _scan(tmp_path, pdf, settings)
        assert result["verdict"] == "not_fully_scanned", reason
        assert result["reason"].startswith(reason)
    # What clamd reads through the same filters it finds; ordinary PDFs stay clean.
    for filters, coded in (
        (b"/LZW", pdfs.lzw(_zip(EICAR))),
        (b"[/AHx /Fl]", zlib.compress(_zip(EICAR)).hex().encode() + b">"),
    ):
        result, _ = _scan(tmp_path, pdfs.attached(coded, filters), settings)
        assert (result["verdict"], result["signature"]) == ("infected", f"{EICAR_NAME}.UNOFFICIAL")
    for pdf in (
        pdfs.attached(zlib.compress(_zip(CLEAN))),
        pdfs.realistic(pages=3),
        pdfs.encrypted("", attachment=CLEAN),
    ):
        result, _ = _scan(tmp_path, pdf, settings)
        assert (result["verdict"], result["reason"]) == ("clean", None)


def _embedded(dictionary: bytes, data: bytes, before_stream: bytes = b"\n") -> bytes:
    """A PDF with one embedded file whose dictionary and data are as given."""
    w = pdfs.Writer()
    obj = w.add(b"<< " + dictionary + b" >>" + before_stream + b"stream\n" + data + b"\nendstream")
    spec = w.add(b"<< /Type /Filespec /F (a.bin) /EF << /F %d 0 R >> >>" % obj)
    return w.build(
        w.add(b"<< /Type /Catalog /Names << /EmbeddedFiles << /Names [(a) %d 0 R] >> >> >>" % spec)
    )


def _raw_mail(part_headers: bytes, body: bytes) -> bytes:
    return (
        b"From: a@example.org\nMIME-Version: 1.0\n"
        b'Content-Type: multipart/mixed; boundary="BB"\n\n--BB\nContent-Type: text/plain\n\nhi\n'
        b"--BB\n" + part_headers + b"\n\n" + body + b"\n--BB--\n"
    )


def test_odd_pdfs_and_mails_clamd_reads_are_surveyed_as_it_reads_them(
    tmp_path: Path, clamd: Clamd
) -> None:
    """Each was an LZMA ZIP clamd unpacked (EICAR in a deflated one in the
    same place is found) and called clean here: a /Length that says less, an
    unknown filter before Flate, "stream" after blanks or a comment, a ZIP
    after other bytes, base64 under a header Python does not decode, a mail
    with its headers padded past 32 kB."""
    lzma_zip = _lzma_zip(b"x" + MARKER)
    b64 = base64.encodebytes
    padded = b"From: a@b\n" + b"X-Pad: " + b"a" * 70 + b"\n" * 1
    padded += (b"X-Pad: " + b"a" * 70 + b"\n") * 560
    builders = {
        "a /Length that says less": lambda z: _embedded(
            b"/Length 10 /Filter /FlateDecode", zlib.compress(z)
        ),
        "an unknown filter first": lambda z: _embedded(
            b"/Filter [/Foo /FlateDecode]", zlib.compress(z)
        ),
        "blanks before stream": lambda z: _embedded(
            b"/Filter /Fl", zlib.compress(z), b" " * 20 + b"\n"
        ),
        "a comment before stream": lambda z: _embedded(b"/Filter /Fl", zlib.compress(z), b"\n%c\n"),
        "bytes before the ZIP": lambda z: pdfs.attached(zlib.compress(b"\0" + z)),
        "bytes before it in a mail": lambda z: mail(b"MZ" + z),
        "a program in a ZIP": lambda z: _zip(b"MZ" + bytes(100) + z),
        "base64 ": lambda z: _raw_mail(b"Content-Transfer-Encoding: base64 ", b64(z)),
        "7bit base64": lambda z: _raw_mail(b"Content-Transfer-Encoding: 7bit base64", b64(z)),
        "no boundary": lambda z: _raw_mail(b"Content-Transfer-Encoding: base64", b64(z)).replace(
            b'; boundary="BB"', b""
        ),
        "headers past 32 kB": lambda z: (
            padded + b"MIME-Version: 1.0\nContent-Type: "
            b"application/zip\nContent-Transfer-Encoding: base64\n\n" + b64(z)
        ),
        "a blank line first": lambda z: b"\n" + mail(z),
        "/Filter in a string first": lambda z: _embedded(
            b"/Desc (/Filter /DCTDecode) /Filter /FlateDecode", zlib.compress(z)
        ),
        "text before the mail": lambda z: b"hello world\n<html>\n" + mail(z),
        "an 8-bit header": lambda z: b"X-A: 1\nX-\xe9: 2\n" + mail(z),
        "short base64 lines": lambda z: _raw_mail(
            b"Content-Transfer-Encoding: bas64",
            b"\n".join(base64.b64encode(z)[i : i + 12] for i in range(0, 4 * len(z), 12)),
        ),
        "a blank line in base64": lambda z: _raw_mail(
            b"Content-Transfer-Encoding: bas64", b64(z).replace(b"\n", b"\n\n", 1)
        ),
        "a ZIP between other bytes": lambda z: b"MZ" + bytes(200) + z + b"\xa5" * 70_000,
    }
    settings = {"clamd": clamd.unix_url}
    for what, build in builders.items():
        found = _clamd_alone(tmp_path, clamd, build(_zip(EICAR)))
        assert found == f"stream: {EICAR_NAME}.UNOFFICIAL FOUND", what  # clamd reads it there
        hidden = build(lzma_zip)
        assert _clamd_alone(tmp_path, clamd, hidden) == "stream: OK", what
        result, _ = _scan(tmp_path, hidden, settings)
        assert result["verdict"] == "not_fully_scanned", what
        assert result["reason"].startswith("a ZIP member is compressed by"), what


def test_pictures_whose_pixels_begin_like_a_stream_stay_clean(tmp_path: Path, clamd: Clamd) -> None:
    """A PDF picture of (31, 139, 34) pixels, Flate-coded, decodes to bytes
    starting 1f 8b (gzip's magic), (66, 90, 104) to "BZh": both were "an
    archive or stream in it could not be unpacked here"."""
    for pixel in (bytes([31, 139, 34]), bytes([66, 90, 104]), bytes([31, 139, 8])):
        w = pdfs.Writer()
        image = w.add(
            w.stream(
                zlib.compress(pixel * 256),
                b"/Type /XObject /Subtype /Image /Width 16 /Height 16 /ColorSpace /DeviceRGB "
                b"/BitsPerComponent 8 /Filter /FlateDecode ",
            )
        )
        pdf = w.build(w.add(b"<< /Type /Catalog /I %d 0 R >>" % image))
        result, _ = _scan(tmp_path, pdf, {"clamd": clamd.unix_url})
        assert (result["verdict"], result["reason"]) == ("clean", None), pixel


def test_what_a_mail_carries_is_surveyed_as_clamd_decodes_it(tmp_path: Path, clamd: Clamd) -> None:
    """clamd decodes a mail's attachments (base64, quoted-printable), an
    mbox's every message, and unpacks the archives it finds: a ZIP in LZMA,
    xz streams joined, a RAR, a ZIP member past MaxFileSize attached to a
    mail were OK from clamd, and clean."""
    settings = {"clamd": clamd.unix_url, "clamd_max_file_size": MAX_FILE}
    lzma_zip = _lzma_zip(b"x" + MARKER)
    joined = lzma.compress(b"hello\n") + lzma.compress(EICAR)
    for data, reason in (
        (mail(lzma_zip), "a ZIP member is compressed by"),
        (mail(joined, cte="quoted-printable"), "a gzip, bzip2 or xz file in it holds"),
        (mail(_rar(EICAR)), virus.RAR_UNOPENED),
        (
            mail(_zip(b"\0" * (MAX_FILE + 4096) + MARKER)),
            f"a ZIP member of {MAX_FILE + 4096 + len(MARKER)} bytes is over",
        ),
        (mbox(mail(CLEAN), mail(lzma_zip)), "a ZIP member is compressed by"),
        (text_mail(b"Hello,\n\n" + uu(lzma_zip)), "a ZIP member is compressed by"),
        (uu(lzma_zip), "a ZIP member is compressed by"),  # clamd decodes it alone
    ):
        assert _clamd_alone(tmp_path, clamd, data) == "stream: OK"
        result, _ = _scan(tmp_path, data, settings)
        assert result["verdict"] == "not_fully_scanned", reason
        assert result["reason"].startswith(reason)
    for data in (mail(CLEAN, _zip(EICAR)), uu(_zip(EICAR))):  # what clamd finds itself
        result, _ = _scan(tmp_path, data, settings)
        assert (result["verdict"], result["signature"]) == ("infected", f"{EICAR_NAME}.UNOFFICIAL")
    for data in (mail(CLEAN, _zip(CLEAN)), mbox(mail(CLEAN), mail(b"%PDF-1.7 text"))):
        result, _ = _scan(tmp_path, data, settings)
        assert (result["verdict"], result["reason"]) == ("clean", None)


def test_a_member_in_a_method_clamd_does_not_decode_is_never_clean(
    tmp_path: Path, clamd: Clamd
) -> None:
    """A ZIP member compressed by LZMA (method 14; Python reads it, clamd
    does not) was clean; one by PPMd was not_fully_scanned as "too many,
    too large or nested too deep"."""
    for method in (14, 98):
        member = bytearray(_zip(CLEAN))  # deflated (method 8) …
        for at in (8, member.find(b"PK\x01\x02") + 10):  # … said to be another
            member[at : at + 2] = method.to_bytes(2, "little")
        result, _ = _scan(tmp_path, bytes(member), {"clamd": clamd.unix_url})
        assert result["verdict"] == "not_fully_scanned", method
        assert result["reason"].startswith(
            "a ZIP member is compressed by a method clamd does not decode"
        )
    lzma_zip = _lzma_zip(b"x" + MARKER)
    result, _ = _scan(tmp_path, lzma_zip, {"clamd": clamd.unix_url})
    assert (result["verdict"], result["signature"]) == ("not_fully_scanned", None)


def test_streams_joined_after_the_first_are_never_clean(tmp_path: Path, clamd: Clamd) -> None:
    """clamd unpacks a gzip, bzip2 or xz file's first stream only: EICAR
    compressed after a compressed "hello" was clean (Python read on)."""
    settings = {"clamd": clamd.unix_url}
    for compress in (gzip.compress, bz2.compress, lzma.compress):
        joined = compress(b"hello\n") + compress(EICAR)
        result, _ = _scan(tmp_path, joined, settings)
        assert (result["verdict"], result["reason"]) == (
            "not_fully_scanned",
            "a gzip, bzip2 or xz file in it holds more streams after its first: "
            "clamd unpacks only the first",
        ), compress
        padded = compress(b"hello\n") + bytes(4096)  # padding, as tapes leave: no stream
        assert _scan(tmp_path, padded, settings)[0]["verdict"] == "clean"
        assert _scan(tmp_path, compress(EICAR), settings)[0]["verdict"] == "infected"


@pytest.mark.parametrize(
    ("reply", "sent", "size", "max_bytes", "said"),
    [
        # Something on clamd's address said OK before it had the whole file.
        ("stream: OK\0", 100_000, 2_000_000, 10**9, "clamd answered after 100000 of its"),
        # clamd's words name paths on its host: redacted, as every reason is.
        ("/var/lib/x: Can't open file /home/u/x ERROR\0", 10, 10, 10, "[path]: Can't open"),
        # clamd's cut (1 MiB) is not the profile's: the reason names max_bytes.
        ("stream: OK\0", 1 << 20, 5 << 20, 4 << 20, "only its first 4194304 bytes were to be"),
    ],
)
def test_what_clamd_did_not_read_or_said_is_never_clean_or_shown_raw(
    reply: str, sent: int, size: int, max_bytes: int, said: str
) -> None:
    verdict, _, reason = virus.verdict(reply, sent, size, max_bytes)
    assert verdict == "not_fully_scanned" and reason is not None and said in reason, reason
    assert "/home/u" not in reason and "/var/lib" not in reason


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(lambda z: z[:-2] + b"\x04\x00PK\x05\x06", id="fake end record in comment"),
        pytest.param(lambda z: z + os.urandom(70_000), id="bytes appended"),
    ],
)
def test_a_zip_python_cannot_read_is_still_never_clean(tmp_path: Path, clamd: Clamd, spoil) -> None:  # type: ignore[no-untyped-def]
    # clamd finds the member by its local header and scans its first
    # MaxFileSize bytes; the directory Python reads is no excuse to say clean.
    hidden = spoil(_zip(b"\0" * (MAX_FILE + 4096) + MARKER))
    with pytest.raises(zipfile.BadZipFile):
        zipfile.ZipFile(io.BytesIO(hidden)).infolist()
    settings = {"clamd": clamd.unix_url, "clamd_max_file_size": MAX_FILE}
    result, _ = _scan(tmp_path, hidden, settings)
    assert (result["verdict"], result["signature"]) == ("not_fully_scanned", None)
    assert f"a ZIP member of {MAX_FILE + 4096 + len(MARKER)} bytes" in result["reason"]


def _encrypted(archive: bytes) -> bytes:
    """``archive`` with every member flagged encrypted (flag bit 0), in its
    local headers and its directory: what clamd sees of a password-protected
    ZIP, whose members it cannot read."""
    out = bytearray(archive)
    for signature, flags_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        at = out.find(signature)
        while at != -1:
            out[at + flags_at] |= 1
            at = out.find(signature, at + 1)
    return bytes(out)


def _directory_understated(member: bytes) -> bytes:
    """A streamed ZIP (sizes in a data descriptor after the data) whose
    central directory says the member is 100 bytes: unzip and clamd go by
    the data, which holds all of ``member``."""

    data = bytearray(_streamed({"member.bin": member}))
    central = data.find(b"PK\x01\x02")
    data[central + 24 : central + 28] = (100).to_bytes(4, "little")  # uncompressed size
    return bytes(data)


def test_zip_members_clamd_does_not_read_are_never_clean(tmp_path: Path, clamd: Clamd) -> None:
    """Each came back clean: an encrypted member (clamd cannot decrypt it), a
    ZIP cut before its directory (clamd unpacks nothing then), a directory
    that understates a member's size (clamd reads past MaxFileSize none of it)."""
    settings = {"clamd": clamd.unix_url, "clamd_max_file_size": MAX_FILE}
    address = virus.parse_address(clamd.unix_url)
    whole = _zip(MARKER + b"\0" * 1000)
    cut = whole[: whole.find(b"PK\x01\x02")]
    understated = _directory_understated(b"\0" * (MAX_FILE + 4096) + MARKER)
    cases = {
        "encrypted": (_encrypted(_zip(EICAR)), "a ZIP member is encrypted"),
        "cut": (cut, "a ZIP member is not listed in a central directory"),
        "understated": (understated, f"a ZIP member of {MAX_FILE + 4096 + len(MARKER)} bytes"),
    }
    for what, (data, reason) in cases.items():
        path = tmp_path / f"{what}.zip"
        path.write_bytes(data)
        said = virus.instream(address, str(path), 10**9, 30)[0].strip("\0")
        assert said == "stream: OK", what  # clamd's own answer: it saw nothing
        result, _ = _scan(tmp_path, data, settings)
        assert (result["verdict"], result["signature"]) == ("not_fully_scanned", None), what
        assert result["reason"].startswith(reason), (what, result["reason"])
    # The same member with its directory is found; a stored ZIP nested in
    # another is read through the outer directory, and is no hidden member.
    assert _scan(tmp_path, whole, settings)[0]["verdict"] == "infected"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("inner.zip", _zip(CLEAN))
    assert _scan(tmp_path, buf.getvalue(), settings)[0]["verdict"] == "clean"


@pytest.mark.parametrize(
    ("reply", "sent", "size", "expected"),
    [
        ("stream: OK\0", 10, 10, ("clean", None, None)),
        ("stream: OK\0", 5, 10, ("not_fully_scanned", None, "larger than max_bytes")),
        ("stream: Foo.Bar FOUND\0", 5, 10, ("infected", "Foo.Bar", None)),
        (
            "stream: Heuristics.Limits.Exceeded.MaxScanTime FOUND\0",
            10,
            10,
            ("not_fully_scanned", None, "clamd stopped at its scan limit (MaxScanTime)"),
        ),
        (
            "INSTREAM size limit exceeded. ERROR\0",
            10,
            10,
            ("not_fully_scanned", None, "clamd could not scan it all: INSTREAM size limit"),
        ),
        (
            "stream: Can't allocate memory ERROR\0",
            10,
            10,
            ("not_fully_scanned", None, "clamd could not scan it all: Can't allocate memory"),
        ),
        # All-match mode: several answers; a real signature wins over a limit.
        (
            "stream: Heuristics.Limits.Exceeded.MaxFileSize FOUND\0stream: X.Y FOUND\0",
            10,
            10,
            ("infected", "X.Y", None),
        ),
        ("stream: Evil\x1b[31m\x07Name FOUND\0", 10, 10, ("infected", "Evil[31mName", None)),
        # Cut at max_bytes and stopped at clamd's limit: both said (it named clamd's alone).
        (
            "stream: Heuristics.Limits.Exceeded.MaxFileSize FOUND\0",
            100,
            250,
            (
                "not_fully_scanned",
                None,
                "clamd stopped at its scan limit (MaxFileSize); larger than max_bytes: "
                "only its first 100 bytes were to be sent",
            ),
        ),
        (
            "stream: Can't allocate memory ERROR\0",
            100,
            250,
            ("not_fully_scanned", None, "clamd could not scan it all: Can't allocate memory; la"),
        ),
        # AlertEncryptedArchive: unread, not a virus.
        (
            "stream: Heuristics.Encrypted.Zip FOUND\0",
            10,
            10,
            ("not_fully_scanned", None, "clamd could not decrypt it (Heuristics.Encrypted.Zip)"),
        ),
    ],
)
def test_clamd_answers_map_to_verdicts(
    reply: str, sent: int, size: int, expected: tuple[str, str | None, str | None]
) -> None:
    verdict, signature, reason = virus.verdict(reply, sent, size, sent)  # cut at what was sent
    assert (verdict, signature) == expected[:2]
    if expected[2] is None:
        assert reason is None
    else:
        assert reason is not None and reason.startswith(expected[2])


def test_a_stream_over_clamds_limit_is_not_said_cut_by_max_bytes() -> None:
    # clamd answered after 1 MiB of a 2 MiB file, well under max_bytes: the
    # reason said "larger than max_bytes: only 1048576 bytes were scanned".
    reply = "INSTREAM size limit exceeded. ERROR\0"
    verdict, _, reason = virus.verdict(reply, 1 << 20, 2 << 20, 100 << 20)
    assert verdict == "not_fully_scanned"
    assert reason == "clamd could not scan it all: " + virus.STREAM_LIMIT


@pytest.mark.parametrize("reply", ["", "UNKNOWN COMMAND\0", "stream: maybe\0"])
def test_an_answer_that_is_not_a_verdict_is_never_clean(reply: str) -> None:
    with pytest.raises(JobError) as err:
        virus.verdict(reply, 10, 10, 10)
    assert err.value.code == "PROVIDER_UNAVAILABLE"


# -- clamd unreachable: PROVIDER_UNAVAILABLE, retryable --------------------------------


def _unavailable(tmp_path: Path, settings: dict[str, Any]) -> JobError:
    with pytest.raises(JobError) as err:
        _scan(tmp_path, CLEAN, settings)
    assert err.value.code == "PROVIDER_UNAVAILABLE"
    assert ERROR_POLICY["PROVIDER_UNAVAILABLE"].retryable
    return err.value


def test_clamd_down_is_provider_unavailable(tmp_path: Path, clamd: Clamd) -> None:
    clamd.stop()  # killed: the unix socket file stays behind, the port is closed
    for url in (clamd.unix_url, clamd.tcp_url):
        err = _unavailable(tmp_path, {"clamd": url})
        assert err.reason == "clamd is not reachable (connection refused)"
    clamd.start()
    result, _ = _scan(tmp_path, CLEAN, {"clamd": clamd.tcp_url})
    assert result["verdict"] == "clean"


def test_a_host_name_that_does_not_resolve_is_provider_unavailable(tmp_path: Path) -> None:
    err = _unavailable(tmp_path, {"clamd": "tcp://no-such-host.invalid:3310"})
    assert err.reason == "clamd is not reachable (host name not resolved)"


def test_a_missing_socket_is_provider_unavailable(tmp_path: Path) -> None:
    err = _unavailable(tmp_path, {"clamd": f"unix://{tmp_path}/nothing-here.sock"})
    assert err.reason == "clamd is not reachable (no socket)"
    assert str(tmp_path) not in err.reason


@contextlib.contextmanager
def _fake_clamd(
    tmp_path: Path,
    answer: bytes | None,
    delay: float = 0.0,
    version: bytes = b"ClamAV 1.4.0/1/today\0",
    read_rate: int = 0,
) -> Iterator[str]:
    """A unix socket that reads whatever it is sent and then answers ``answer``
    ``delay`` seconds later (None: never answers, holding the connection open
    until the block ends); ``version`` to VERSION. With ``read_rate``, it reads
    a stream that many bytes a second, for as long as it is sent."""
    path = Path(f"/tmp/hm-fake-{uuid.uuid4().hex[:8]}.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    server.settimeout(0.2)
    done = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            held.append(conn)
            if answer is not None:
                with contextlib.suppress(OSError):
                    conn.settimeout(1)
                    asked = conn.recv(65536)
                    if asked.startswith(b"zVERSION"):
                        conn.sendall(version)
                        conn.shutdown(socket.SHUT_RDWR)
                        continue
                    while read_rate and not done.is_set() and conn.recv(read_rate // 10):
                        time.sleep(0.1)
                    time.sleep(delay)
                    conn.sendall(answer)
                    conn.shutdown(socket.SHUT_RDWR)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"unix://{path}"
    finally:
        done.set()
        thread.join(5)
        for conn in held:
            conn.close()
        server.close()
        path.unlink()


def test_clamd_not_answering_in_time_is_provider_unavailable(tmp_path: Path) -> None:
    with _fake_clamd(tmp_path, None) as url:
        err = _unavailable(tmp_path, {"clamd": url, "timeout_seconds": 1})
    assert err.reason == "clamd did not answer (timed out)"


def test_a_busy_clamd_has_timeout_seconds_to_answer_each_question(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Connecting is bounded by CONNECT_TIMEOUT; the answers, VERSION's too,
    by the profile's timeout_seconds (a clamd reloading its database is slow)."""
    monkeypatch.setattr(virus, "CONNECT_TIMEOUT", 0.3)
    with _fake_clamd(tmp_path, b"stream: OK\0", delay=0.8) as url:
        result, _ = _scan(tmp_path, CLEAN, {"clamd": url, "timeout_seconds": 5})
    assert result["verdict"] == "clean"


def test_an_answer_trickled_past_the_timeout_is_provider_unavailable(tmp_path: Path) -> None:
    """timeout_seconds bounds the whole answer, not each read of it: a peer
    sending a byte every 0.3 s used to hold the attempt for as long as it liked."""
    path = Path(f"/tmp/hm-trickle-{uuid.uuid4().hex[:8]}.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError):
                conn.settimeout(2)
                if b"VERSION" in conn.recv(64):
                    conn.sendall(b"ClamAV 1.4.0/1/today\0")
                    continue
                for byte in b"stream: OK" * 10:
                    if done.is_set():
                        break
                    conn.sendall(bytes([byte]))
                    time.sleep(0.3)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        started = time.monotonic()
        err = _unavailable(tmp_path, {"clamd": f"unix://{path}", "timeout_seconds": 1})
        assert time.monotonic() - started < 5
        assert err.reason == "clamd did not answer (timed out)"
    finally:
        done.set()
        server.close()
        thread.join(10)
        path.unlink()


def test_a_garbled_answer_is_provider_unavailable(tmp_path: Path) -> None:
    with _fake_clamd(tmp_path, b"HELLO THERE\0") as url:
        err = _unavailable(tmp_path, {"clamd": url})
    assert err.reason == "clamd gave an unexpected answer"


@pytest.mark.parametrize("version", [b"UNKNOWN COMMAND\0", b"5.5.5-10.11.6-MariaDB\0"])
def test_what_does_not_answer_version_as_clamd_is_not_sent_the_file(
    tmp_path: Path, version: bytes
) -> None:
    # It said "stream: OK" to INSTREAM: the file was reported clean, with
    # "UNKNOWN COMMAND" as the engine (or a database's greeting was).
    with _fake_clamd(tmp_path, b"stream: OK\0", version=version) as url:
        err = _unavailable(tmp_path, {"clamd": url})
    assert err.reason == "what answers on clamd's address is not clamd"


def test_a_peer_that_takes_the_file_slowly_is_cut_off_at_timeout_seconds(tmp_path: Path) -> None:
    """Sending is bounded in all, as the answer is: a peer reading 200 kB/s
    held the attempt for as long as its job's timeout, 25 minutes for 300 MB."""
    # 600 kB/s: each 256 KiB chunk is taken within the second, the file is not
    with _fake_clamd(tmp_path, b"stream: OK\0", read_rate=600_000) as url:
        started = time.monotonic()
        with pytest.raises(JobError) as err:
            _scan(tmp_path, os.urandom(4_000_000), {"clamd": url, "timeout_seconds": 1})
        took = time.monotonic() - started
    assert err.value.code == "PROVIDER_UNAVAILABLE"
    assert err.value.reason == "clamd did not take the file (timed out)"
    assert took < 3, took


# -- settings ------------------------------------------------------------------------


def test_only_a_profile_names_the_socket(tmp_path: Path) -> None:
    validate = virus.VIRUS_SCAN.validate
    with pytest.raises(JobError, match="set by the profile"):
        validate({"clamd": "tcp://10.0.0.1:3310"}, {})
    with pytest.raises(JobError, match="set by the profile"):
        validate({"max_bytes": 10**9}, {})
    for bad in ("http://x:1", "unix://relative", "unix:///", "tcp://host", "tcp://:3310", "x"):
        with pytest.raises(JobError, match="clamd must be"):
            validate({}, {"clamd": bad})
    for bad in ("tcp://admin:s3cret@127.0.0.1:3310", "tcp://:s3cret@h:3310", "tcp://u@h:3310"):
        with pytest.raises(JobError, match="takes no user or password"):
            validate({}, {"clamd": bad})
    # A socket path connect() cannot take is the profile's error, refused at
    # once: it used to be PROVIDER_UNAVAILABLE, retried as if clamd were away.
    with pytest.raises(JobError, match="unix socket path is over 107 bytes") as err:
        validate({}, {"clamd": "unix:///run/" + "c" * 100 + ".ctl"})
    assert err.value.code == "INVALID_PARAMS"
    assert validate({}, {"clamd": "unix:///" + "c" * 106})["clamd"] == "unix:///" + "c" * 106
    with pytest.raises(JobError, match="set by the profile"):
        validate({"clamd_max_file_size": 10**9}, {})
    with pytest.raises(JobError, match="set by the profile"):
        validate({"clamd_unpacks_rar": True}, {})  # a job cannot vouch for clamd
    assert validate({}, {"clamd": "tcp://clamav.internal:3310"}) == {
        "clamd": "tcp://clamav.internal:3310",
        "max_bytes": 104_857_600,
        "timeout_seconds": 120,
        "clamd_max_file_size": 26_214_400,
        "clamd_unpacks_rar": False,
    }
    assert virus.VIRUS_SCAN.schema is virus.SCHEMA


def test_available_pings_the_default_socket(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, clamd: Clamd
) -> None:
    monkeypatch.setattr(virus, "DEFAULT_CLAMD", f"unix://{tmp_path}/none.sock")
    assert virus.available() == f"clamd does not answer on unix://{tmp_path}/none.sock"
    monkeypatch.setattr(virus, "DEFAULT_CLAMD", clamd.tcp_url)
    assert virus.available() is None


# -- through a real worker -----------------------------------------------------------


def _profile(driver: Driver, clamd: Clamd, **settings: Any) -> str:
    """A profile naming the session's clamd, under a fresh key (profiles outlive tests)."""
    key = f"test-{uuid.uuid4().hex[:12]}"
    with driver.tx() as tx:
        tx.insert_profile(
            {
                "profile_key": key,
                "profile_version": "v1",
                "job_type": "security.virus_scan",
                "queue_name": "bulk",
                "settings": {"clamd": clamd.unix_url, **settings},
                "credit_cost_base": 1,
                "timeout_seconds": 60,
                "is_active": True,
            }
        )
    return key


@sqlite_only
def test_a_worker_scans_objects_from_the_ledger(
    driver: Driver, live: Engine, storage: Storage, procs: Procs, clamd: Clamd, tmp_path: Path
) -> None:
    profile = _profile(driver, clamd)
    files = {
        "clean": (CLEAN, "clean", None),
        "eicar": (EICAR, "infected", f"{EICAR_NAME}.UNOFFICIAL"),
        "big": (os.urandom(2 * STREAM_MAX), "not_fully_scanned", None),
        # Walked by libarchive inside the confined child.
        "xar": (_archive(tmp_path, "xar", {"a.txt": CLEAN}), "clean", None),
        "7z": (_archive(tmp_path, "7zip", {"x.rar": _rar(CLEAN)}), "not_fully_scanned", None),
    }
    jobs = {}
    for name, (data, _, _) in files.items():
        obj = storage.put(io.BytesIO(data), filename=f"{name}.bin")
        jobs[name] = live.enqueue(
            NewJob("security.virus_scan", profile=profile, object_id=obj["object_id"])
        )
    args = ["--concurrency", "1", "--no-maintenance", "--burst"]
    proc = procs.spawn("worker", "--queues", "bulk", *args, name="worker")
    assert proc.wait(90) == 0, tail(procs._procs[-1][1])
    for name, (_, verdict, signature) in files.items():
        row = wait_job(driver, jobs[name], timeout=5)
        assert row["status"] == "completed", (row["error_code"], row["safe_reason"])
        assert (row["result"]["verdict"], row["result"]["signature"]) == (verdict, signature)
        assert row["result"]["engine"].startswith("ClamAV ")
        with driver.read() as tx:
            (out,) = tx.outputs(jobs[name])
        assert (out["output_type"], out["object_id"]) == ("virus_verdict", None)
        assert out["metadata"] == {"verdict": verdict, "signature": signature}
        assert out["profile_version"] == f"{profile}:v1"


@sqlite_only
def test_a_clamd_outage_is_waited_out_in_retry_wait(
    driver: Driver, live: Engine, storage: Storage, procs: Procs, clamd: Clamd
) -> None:
    profile = _profile(driver, clamd)
    obj = storage.put(io.BytesIO(EICAR), filename="eicar.com")
    clamd.stop()
    job_id = live.enqueue(
        NewJob("security.virus_scan", profile=profile, object_id=obj["object_id"], max_attempts=100)
    )
    procs.worker("--concurrency", "1")
    row = wait_job(driver, job_id, {"retry_wait"}, timeout=30)
    assert row["error_code"] == "PROVIDER_UNAVAILABLE"
    assert row["safe_reason"] == "clamd is not reachable (connection refused)"
    clamd.start()
    row = wait_job(driver, job_id, timeout=30)
    assert row["status"] == "completed", (row["error_code"], row["safe_reason"])
    assert row["result"]["verdict"] == "infected"
    tried = eventually(lambda: attempts(driver, job_id), 5, "attempts recorded")
    assert tried[0]["error_code"] == "PROVIDER_UNAVAILABLE"
    assert tried[-1]["status"] == "completed"

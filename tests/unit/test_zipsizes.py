"""zipsizes: a ZIP's member sizes from its central directory and its local headers."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import struct
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from hypermedia.pipelines import nested, zipsizes


def _zip(members: dict[str, bytes], comment: bytes = b"") -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
        z.comment = comment
    return buf.getvalue()


def _streamed(members: dict[str, bytes]) -> bytes:
    """A ZIP written to a pipe: each local header defers its sizes (flag bit 3)."""

    class Pipe(io.RawIOBase):
        def __init__(self) -> None:
            self.data = bytearray()

        def writable(self) -> bool:
            return True

        def write(self, b: bytes) -> int:  # type: ignore[override]
            self.data += b
            return len(b)

    pipe = Pipe()
    with zipfile.ZipFile(pipe, "w", zipfile.ZIP_DEFLATED) as z:  # type: ignore[arg-type]
        for name, data in members.items():
            with z.open(name, "w") as member:
                member.write(data)
    return bytes(pipe.data)


def _largest(tmp_path: Path, data: bytes) -> int:
    path = tmp_path / "input"
    path.write_bytes(data)
    return zipsizes.largest_member(str(path))


BIG = b"\0" * 700_000


def test_a_readable_zip_declares_its_largest_member(tmp_path: Path) -> None:
    assert _largest(tmp_path, _zip({"a": b"x" * 10, "b": BIG, "c": b"y"})) == len(BIG)
    assert _largest(tmp_path, _zip({})) == 0
    assert _largest(tmp_path, os.urandom(5000)) == 0
    assert _largest(tmp_path, b"") == 0


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(lambda z: _zip({"a": BIG}, comment=b"PK\x05\x06"), id="fake end record"),
        pytest.param(lambda z: z + os.urandom(70_000), id="appended bytes"),
        pytest.param(lambda z: z[:-10], id="cut tail"),
        pytest.param(lambda z: os.urandom(3000) + z[:-22], id="prefix, no end record"),
    ],
)
def test_a_directory_python_cannot_read_still_shows_its_members(tmp_path: Path, spoil) -> None:  # type: ignore[no-untyped-def]
    data = spoil(_zip({"a": BIG}))
    path = tmp_path / "spoilt.zip"
    path.write_bytes(data)
    with pytest.raises(zipfile.BadZipFile):
        zipfile.ZipFile(path).infolist()
    assert zipsizes.largest_member(str(path)) == len(BIG)


def test_deferred_sizes_come_from_the_directory_or_are_unknown(tmp_path: Path) -> None:
    streamed = _streamed({"a": BIG, "b": b"small"})
    assert _largest(tmp_path, streamed) == len(BIG)
    assert _largest(tmp_path, streamed + os.urandom(70_000)) == zipsizes.UNKNOWN


def test_a_header_across_a_chunk_boundary_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = _zip({"a": BIG}, comment=b"PK\x05\x06")  # only the local header is readable
    for cut in range(1, 31):
        monkeypatch.setattr(zipsizes, "_CHUNK", 4096)
        data = os.urandom(4096 - cut) + archive
        assert _largest(tmp_path, data) == len(BIG), cut


def test_zip64_local_headers_give_their_extra_field_size(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with (
        zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z,
        z.open("big", "w", force_zip64=True) as member,
    ):
        member.write(BIG)
    data = buf.getvalue()
    assert data[22:26] == b"\xff\xff\xff\xff"  # the local header points to its extra field
    assert _largest(tmp_path, data[:-22] + b"junk") == len(BIG)


def test_chance_signatures_in_other_data_are_not_members(tmp_path: Path) -> None:
    # "PK\3\4" followed by an unknown method, or no name: not a header.
    noise = b"PK\x03\x04" * 1000 + b"PK\x03\x04\x14\x00\x00\x00\x07\x00" + b"\xff" * 40
    assert _largest(tmp_path, noise) == 0


def _survey(tmp_path: Path, data: bytes) -> zipsizes.Survey:
    path = tmp_path / "input"
    path.write_bytes(data)
    return zipsizes.survey(str(path))


def test_a_survey_says_what_clamd_would_not_read(tmp_path: Path) -> None:
    plain = _zip({"a": b"x" * 100, "b": b"y" * 10})
    assert _survey(tmp_path, plain) == zipsizes.Survey(largest=100)
    # Flag bit 0 in a local header: an encrypted member.
    flagged = bytearray(plain)
    flagged[6] |= 1
    assert _survey(tmp_path, bytes(flagged)).encrypted
    # Cut before its directory: members only local headers show.
    cut = plain[: plain.find(b"PK\x01\x02")]
    assert _survey(tmp_path, cut).hidden
    # A member the directory leaves out (another archive's member spliced in
    # front; Python reads the directory past it, clamd would too).
    extra = _zip({"hidden": b"z" * 50})
    spliced = extra[: extra.find(b"PK\x01\x02")] + plain
    assert zipfile.ZipFile(io.BytesIO(spliced)).namelist() == ["a", "b"]
    assert _survey(tmp_path, spliced).hidden
    # A ZIP stored whole inside another is inside a listed member's data: not hidden.
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("inner.zip", plain)
    assert _survey(tmp_path, buf.getvalue()) == zipsizes.Survey(largest=len(plain))
    # Not a ZIP at all.
    assert _survey(tmp_path, b"%PDF-1.7 " + os.urandom(500)) == zipsizes.Survey()


def test_a_directory_understating_a_streamed_member_is_corrected_by_its_descriptor(
    tmp_path: Path,
) -> None:
    streamed = bytearray(_streamed({"a": BIG}))
    central = streamed.find(b"PK\x01\x02")
    streamed[central + 24 : central + 28] = (100).to_bytes(4, "little")
    assert zipfile.ZipFile(io.BytesIO(bytes(streamed))).infolist()[0].file_size == 100
    assert _largest(tmp_path, bytes(streamed)) == len(BIG)


def test_headers_are_placed_among_members_in_logarithmic_time(tmp_path: Path) -> None:
    """Each local header was looked for in every member: 5,000 members full of
    fake headers held a scan's worker 150 s after clamd had answered."""
    cover = zipsizes._Cover([(10, 20), (0, 5), (30, 100), (40, 50), (200, 210)])
    inside = [0, 4, 10, 19, 30, 45, 60, 99, 200, 209]
    outside = [5, 9, 20, 29, 100, 199, 210, 10**9]
    assert all(cover(o) for o in inside) and not any(cover(o) for o in outside)
    fake = b"PK\x03\x04" + bytes(22) + b"\x01\x00\x00\x00x"  # a plausible header, 1-byte name
    fake = fake[:6] + bytes(2) + fake[8:]  # method 0 (stored)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for i in range(3000):
            z.writestr(f"m{i}", fake * 40)
    path = tmp_path / "fakes.zip"
    path.write_bytes(buf.getvalue())
    started = time.monotonic()
    found = zipsizes.survey(str(path))
    assert time.monotonic() - started < 15  # ~1 s; the linear search took minutes
    assert not found.hidden  # every fake header lies inside a listed member


def test_a_zip_inside_a_compressed_member_adds_what_it_declares(tmp_path: Path) -> None:
    inner = _zip({"big": BIG})
    outer = _zip({"inner.zip": inner, "small": b"x"})
    assert _survey(tmp_path, outer).largest == len(inner)  # the outer alone
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    path = tmp_path / "outer.zip"
    path.write_bytes(outer)
    found = nested.survey_nested(str(path), str(scratch), 10**9)
    assert found.largest == len(BIG) and not found.unsized and list(scratch.iterdir()) == []
    # A nested member of unknown size keeps the known sizes and says it.
    cut = _streamed({"s": b"y" * 10})
    cut = cut[: cut.find(b"PK\x01\x02")]
    path.write_bytes(_zip({"cut.zip": cut}))
    found = nested.survey_nested(str(path), str(scratch), 10**9)
    assert found.unsized and found.largest == len(cut)
    # Too deep to follow: unchecked, said.
    deep = b"core"
    for _ in range(nested.NESTED_DEPTH + 2):
        deep = _zip({"d.zip": deep})
    path.write_bytes(deep)
    assert nested.survey_nested(str(path), str(scratch), 10**9).unchecked


def test_a_nested_zip_that_cannot_be_read_whole_is_unread(tmp_path: Path) -> None:
    """A nested member failing its CRC, one whose size lies, or a broken
    member before it made the survey give up quietly: a file clamd had not
    read all of came out clean."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    inner = _zip({"big": BIG})
    good = _zip({"inner.zip": inner})

    def walked(data: bytes) -> zipsizes.Survey:
        path = tmp_path / "outer.zip"
        path.write_bytes(data)
        return nested.survey_nested(str(path), str(scratch), 10**9)

    assert not walked(good).unread
    crc_at = good.find(b"PK\x01\x02") + 16  # the directory's CRC of the member
    bad_crc = bytearray(good)
    bad_crc[crc_at] ^= 0xFF
    assert walked(bytes(bad_crc)).unread
    # A broken member before it: not clean, and nothing after it can change
    # that, so the survey stops there (it looked on through every member).
    broken = bytearray(_zip({"a.txt": b"text " * 2000, "inner.zip": inner}))
    broken[40:60] = b"\xff" * 20  # inside a.txt's deflated data
    found = walked(bytes(broken))
    assert found.unread and found.settled and found.largest == 10000
    assert list(scratch.iterdir()) == []


def test_many_nested_zips_are_bounded_in_count_and_time(tmp_path: Path) -> None:
    """8,000 tiny ZIPs in a 1.2 MB file held a scan 200 s (the directory read
    again for each)."""
    tiny = _zip({"a": b"x" * 10})
    many = _zip({f"m{i}.zip": tiny for i in range(nested.NESTED_MEMBERS + 500)})
    path = tmp_path / "many.zip"
    path.write_bytes(many)
    started = time.monotonic()
    found = nested.survey_nested(str(path), str(tmp_path), 10**9)
    assert found.unchecked and time.monotonic() - started < 15  # ~0.3 s


def _tar(members: dict[str, bytes], mode: str = "w") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as t:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _stored(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


@pytest.mark.parametrize(
    "wrap",
    [
        pytest.param(gzip.compress, id="zip.gz"),
        pytest.param(bz2.compress, id="zip.bz2"),
        pytest.param(lzma.compress, id="zip.xz"),
        pytest.param(lambda z: _tar({"a.txt": b"x", "p.zip": z}), id="tar"),
        pytest.param(lambda z: _tar({"p.zip": z}, "w:gz"), id="tar.gz"),
        pytest.param(lambda z: gzip.compress(gzip.compress(z)), id="zip.gz.gz"),
        # A deflated ZIP in a ZIP stored whole in a ZIP: only the stored one's
        # headers lie in the file's bytes.
        pytest.param(lambda z: _stored({"i.zip": _zip({"deep.zip": z})}), id="zip-stored-zip"),
        pytest.param(lambda z: _zip({"x.gz": gzip.compress(z)}), id="zip-gz-zip"),
    ],
)
def test_a_zip_inside_any_layer_clamd_unpacks_is_surveyed(tmp_path: Path, wrap) -> None:  # type: ignore[no-untyped-def]
    """clamd unpacks gzip, bzip2, xz and tar too, and reads a ZIP in them with
    the same ZIP reader: 30 kB of .tar.gz hid a member of 26 MB (a signature
    behind MaxFileSize of padding), called clean."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    path = tmp_path / "input"
    path.write_bytes(wrap(_zip({"big": BIG})))
    found = nested.survey_nested(str(path), str(scratch), 10**6)
    assert found.largest == len(BIG) and not found.unchecked and not found.overflowed
    assert list(scratch.iterdir()) == []
    # What holds no ZIP declares nothing more than its own (outer) members.
    path.write_bytes(wrap(b"plain text " * 100))
    plain = nested.survey_nested(str(path), str(scratch), 10**6)
    assert plain.largest <= 1100 and not (plain.unchecked or plain.overflowed)


def test_a_stream_past_max_file_size_or_cut_is_not_surveyed_whole(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    path = tmp_path / "input"
    path.write_bytes(gzip.compress(b"\0" * 2000))
    assert nested.survey_nested(str(path), str(scratch), 2000) == zipsizes.Survey()
    assert nested.survey_nested(str(path), str(scratch), 1999).overflowed  # clamd stops there
    cut = gzip.compress(os.urandom(5000))[:-100]
    path.write_bytes(cut)
    assert nested.survey_nested(str(path), str(scratch), 10**6).unread
    assert list(scratch.iterdir()) == []


def test_a_tar_of_many_members_is_read_as_it_goes(tmp_path: Path) -> None:
    """Each member's header read in turn and dropped: a tar of many empty
    members is no memory of them, and a ZIP after them is still found."""
    members = {f"e{i}": b"" for i in range(20_000)}
    path = tmp_path / "many.tar"
    path.write_bytes(_tar({**members, "z.zip": _zip({"big": BIG})}))
    started = time.monotonic()
    found = nested.survey_nested(str(path), str(tmp_path), 10**6)
    assert found.largest == len(BIG) and not found.unchecked
    assert time.monotonic() - started < 15  # ~1 s


def test_every_member_of_another_archive_counts_against_the_unpacking_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Passing a member of a solid 7-Zip over decompresses it: a few kB of
    LZMA unpacking to gigabytes held the virus scan to its timeout.  Past
    NESTED_BYTES in all, the walk stops: unchecked."""
    import libarchive

    def seven_zip(**members: bytes) -> str:
        path = tmp_path / f"{len(members)}.7z"
        with libarchive.file_writer(str(path), "7zip", options="compression=lzma2") as a:
            for name, data in members.items():
                a.add_file_from_memory(name, len(data), data)
        return str(path)

    monkeypatch.setattr(nested, "NESTED_BYTES", 1024 * 1024)
    one = seven_zip(a=bytes(700_000))
    two = seven_zip(a=bytes(700_000), b=bytes(700_000))
    assert not nested.survey_nested(one, str(tmp_path), 10**9).unchecked
    assert nested.survey_nested(two, str(tmp_path), 10**9).unchecked
    over = nested.survey_nested(one, str(tmp_path), 500_000)  # past clamd's MaxFileSize
    assert (over.overlarge, over.unchecked) == (700_000, False)


def test_a_descriptor_of_an_empty_deflated_member_is_not_read_as_zip64(tmp_path: Path) -> None:
    """A Maven JAR's "META-INF/" (deflated, CRC 0, 2 bytes compressed, size 0,
    sizes in a data descriptor) matched the ZIP64 layout first, and the next
    header's bytes became a size of 5.8 x 10^17: 306 of 1,359 JARs were
    not_fully_scanned."""
    manifest = b"Manifest-Version: 1.0\r\n" * 40
    data = _streamed({"META-INF/": b"", "META-INF/MANIFEST.MF": manifest})
    assert data.count(b"PK\x07\x08") == 2  # both sizes follow their data
    assert _survey(tmp_path, data).largest == len(manifest)


def test_a_chance_local_header_signature_in_a_program_is_no_member(tmp_path: Path) -> None:
    """ "PK\\3\\4" occurs in programs that read ZIPs: in a shared library such a
    match, its flags read as "encrypted", made a clean answer not_fully_scanned."""
    header = struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 1, 8, 0, 0, 0, 9_999_999, 5, 4, 0)
    program = os.urandom(3000) + header + b"\x01\x02\x7f\x00" + os.urandom(3000)
    found = _survey(tmp_path, program)
    assert (found.encrypted, found.largest) == (False, 0)
    # A real member behind a program (an SFX) still counts.
    sfx = os.urandom(3000) + _zip({"big": b"x" * 5000})
    assert _survey(tmp_path, sfx).largest == 5000


def test_members_sent_to_clamd_alone_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each member of a walked archive goes to clamd on its own: a small
    7-Zip of 100,000 tiny members was as many scans.  Past NESTED_SCANS the
    walk stops (unchecked); empty members are not sent."""
    import libarchive

    path = tmp_path / "many.7z"
    with libarchive.file_writer(str(path), "7zip") as a:
        for i in range(5):
            a.add_file_from_memory(f"m{i}.txt", 3, b"abc")
        a.add_file_from_memory("empty.txt", 0, b"")
    sent: list[str] = []

    def scan(member: str) -> tuple[str, str | None, str | None]:
        sent.append(Path(member).read_bytes().decode())
        return "clean", None, None

    assert not nested.survey_nested(str(path), str(tmp_path), 10**9, scan).unchecked
    assert sent == ["abc"] * 5  # the empty one not sent
    monkeypatch.setattr(nested, "NESTED_SCANS", 3)
    sent.clear()
    assert nested.survey_nested(str(path), str(tmp_path), 10**9, scan).unchecked
    assert len(sent) == 3
    # What clamd finds in one is the survey's finding, and the walk ends there.
    found = nested.survey_nested(
        str(path), str(tmp_path), 10**9, lambda p: ("infected", "Sig.A", None)
    )
    assert found.found == "Sig.A"


def test_two_byte_magics_need_the_header_behind_them() -> None:
    """An ordinary file starting with C7 71 (binary cpio's magic) or 1F 9D
    (compress's) was an archive "that could not be unpacked", or data clamd
    does not unpack: not_fully_scanned."""
    from hypermedia.pipelines import archives

    name = b"a.txt\x00"
    fields = struct.pack("<HHHHHHHHHHHI", 0o070707, 0, 0, 0o100644, 0, 0, 1, 0, 0, 0, len(name), 3)
    cpio = fields + name + b"abc"
    assert archives.kind_of(cpio) == "cpio"
    assert archives.kind_of(b"\xc7\x71" + os.urandom(200).replace(b"\x00", b"\x01")) is None
    assert archives.kind_of(b"\x1f\x9d\x90" + os.urandom(20)) == "compress"  # 16 bits, block mode
    assert archives.kind_of(b"\x1f\x9d\x7f" + os.urandom(20)) is None

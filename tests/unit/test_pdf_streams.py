"""pdf_streams: a PDF's streams found and their filters undone, lazily."""

from __future__ import annotations

import base64
import io
import lzma
import mmap
import os
import time
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from hypermedia.pipelines import nested, pdf_streams, zipsizes
from tests.pdfs import Writer, _one_page, attached, encrypted, lzw


def _streams(tmp_path: Path, pdf: bytes) -> list[bytes]:
    """Each stream of ``pdf``, decoded whole."""
    path = tmp_path / "in.pdf"
    path.write_bytes(pdf)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return [b"".join(pdf_streams.decoded(data, s)) for s in pdf_streams.streams(data)]


def _run_length(data: bytes) -> bytes:
    """RunLengthDecode's coding: literal runs of up to 128 bytes, then EOD."""
    out = bytearray()
    for at in range(0, len(data), 128):
        run = data[at : at + 128]
        out += bytes([len(run) - 1]) + run
    return bytes(out + b"\x80")


DATA = os.urandom(3000) + b"text " * 5000 + bytes(70_000)
CODED = {
    b"/FlateDecode": zlib.compress(DATA),
    b"/Fl": zlib.compress(DATA),
    b"/ASCIIHexDecode": b"\n".join(
        DATA.hex().encode()[i : i + 77] for i in range(0, 2 * len(DATA), 77)
    )
    + b">",
    b"/ASCII85Decode": base64.a85encode(DATA, wrapcol=75) + b"~>",
    b"/LZWDecode": lzw(DATA),
    b"/RunLengthDecode": _run_length(DATA),
    b"[/ASCII85Decode /FlateDecode]": base64.a85encode(zlib.compress(DATA)) + b"~>",
    b"[/AHx /LZW]": lzw(DATA).hex().encode() + b">",
}


@pytest.mark.parametrize("filters", list(CODED), ids=[f.decode() for f in CODED])
def test_each_filter_and_chain_is_undone(tmp_path: Path, filters: bytes) -> None:
    assert _streams(tmp_path, attached(CODED[filters], filters)) == [DATA]


def test_odd_endings_of_text_filters_decode_as_readers_do(tmp_path: Path) -> None:
    """An odd hex digit is followed by a 0; ASCII85's ``z`` and a short last
    group; whitespace anywhere."""
    assert _streams(tmp_path, attached(b"41 42\n4>", b"/AHx")) == [b"AB@"]
    assert _streams(tmp_path, attached(b"z 9jqo ^ 9jqo~>", b"/A85")) == [bytes(4) + b"Man Man"]


def test_a_pictures_coding_ends_the_chain_and_an_unknown_name_is_passed_over(
    tmp_path: Path,
) -> None:
    """An image's coding is left as it is: what came before it is the stream.
    A name clamd does not know it passes over, and so is it here."""
    jpeg = b"\xff\xd8\xff\xe0 not really a jpeg"
    assert _streams(tmp_path, attached(zlib.compress(jpeg), b"[/Fl /DCTDecode]")) == [jpeg]
    assert _streams(tmp_path, attached(jpeg, b"/DCTDecode")) == [jpeg]
    assert _streams(tmp_path, attached(zlib.compress(jpeg), b"[/Foo /Fl]")) == [jpeg]


def test_stream_keywords_are_found_past_blanks_and_comments(tmp_path: Path) -> None:
    w = Writer()
    objs = [
        w.add(b"<< /Length 3 >>" + between + b"stream" + after + b"abc\nendstream")
        for between, after in (
            (b" " * 20 + b"\n", b"\n"),
            (b"\n% a comment\n", b"\r\n"),
            (b"\n", b" \n"),
        )
    ]
    refs = b" ".join(b"%d 0 R" % o for o in objs)
    assert (
        _streams(tmp_path, w.build(w.add(b"<< /Type /Catalog /S [%s] >>" % refs))) == [b"abc"] * 3
    )


def test_damaged_data_ends_the_stream_where_it_went_wrong(tmp_path: Path) -> None:
    cut = zlib.compress(DATA)[: len(zlib.compress(DATA)) // 2]
    (got,) = _streams(tmp_path, attached(cut, b"/Fl"))
    assert 0 < len(got) < len(DATA) and DATA.startswith(got)
    assert _streams(tmp_path, attached(b"4142zz>", b"/AHx")) == [b""]
    assert _streams(tmp_path, attached(b"9jqo^" + b"\x7f" * 10 + b"~>", b"/A85")) == [b""]


def test_a_stream_ends_at_its_length_or_else_at_endstream(tmp_path: Path) -> None:
    """``/Length`` as a number or a reference to one; missing or past the
    file's end, the next ``endstream``; one that says less than there is
    before ``endstream`` is read past, as clamd does (an LZMA ZIP behind
    ``/Length 10`` was clean)."""
    w = Writer()
    length = w.add(b"5")
    direct = w.add(b"<< /Length 5 >>\nstream\nHELLOendstream tail\nendstream")
    referred = w.add(b"<< /Length %d 0 R >>\nstream\nWORLD and more\nendstream" % length)
    wrong = w.add(b"<< /Length 99999999 >>\nstream\nUNTIL\nendstream")
    catalog = w.add(b"<< /Type /Catalog /S [%d 0 R %d 0 R %d 0 R] >>" % (direct, referred, wrong))
    assert _streams(tmp_path, w.build(catalog)) == [b"HELLO", b"WORLD and more\n", b"UNTIL\n"]


def test_a_dictionary_padded_past_the_look_back_is_read_from_its_object(
    tmp_path: Path,
) -> None:
    """A stream whose dictionary was padded past 16 kB was passed over (its
    filters unknown); clamd reads it whole."""
    w = Writer()
    padded = w.add(
        w.stream(zlib.compress(b"hidden"), b"/Pad (%s) /Filter /FlateDecode " % (b"x" * 40_000))
    )
    catalog = w.add(b"<< /Type /Catalog /S %d 0 R >>" % padded)
    assert _streams(tmp_path, w.build(catalog)) == [b"hidden"]


def test_what_swells_is_read_a_chunk_at_a_time() -> None:
    """A RunLength bomb (2 bytes for 128) or an LZW run gives its output in
    chunks: reading the first few bytes does not decode it all."""
    bomb = b"\x81\x00" * 5_000_000  # 10 MB coding 640 MB of zeros
    first = next(pdf_streams._run_length(iter([bomb])))
    assert 0 < len(first) <= 2 * pdf_streams._CHUNK
    first = next(pdf_streams._lzw(iter([lzw(bytes(5_000_000))])))
    assert 0 < len(first) <= 2 * pdf_streams._CHUNK
    flate: Iterator[bytes] = pdf_streams._flate(iter([zlib.compress(bytes(200_000_000))]))
    assert len(next(flate)) <= pdf_streams._CHUNK


def test_a_pdf_is_known_by_its_header_in_the_first_kilobyte() -> None:
    assert pdf_streams.is_pdf(b"%PDF-1.7\n")
    assert pdf_streams.is_pdf(b"junk" * 200 + b"%PDF-1.4")
    assert not pdf_streams.is_pdf(b"x" * 1024 + b"%PDF-1.4")
    assert not pdf_streams.is_pdf(b"%!PS-Adobe-3.0")


def _lzma_zip(member: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_LZMA) as z:
        z.writestr("m.bin", member)
    return buf.getvalue()


def _survey(tmp_path: Path, data: bytes, limit: int = 1 << 20) -> zipsizes.Survey:
    path = tmp_path / "input"
    path.write_bytes(data)
    return nested.survey_nested(str(path), str(tmp_path), limit)


def test_layers_in_a_pdfs_streams_are_surveyed(tmp_path: Path) -> None:
    """What clamd decodes from a PDF and unpacks: a ZIP in a method it does
    not decode, joined xz streams, a stream past its MaxFileSize, a PDF in
    a PDF; text and images are passed over."""
    assert _survey(tmp_path, attached(zlib.compress(_lzma_zip(b"x")))).undecoded
    joined = lzma.compress(b"hello") + lzma.compress(b"world")
    assert _survey(tmp_path, attached(lzw(joined), b"/LZW")).joined
    big = lzma.compress(bytes(2 << 20))
    assert _survey(tmp_path, attached(zlib.compress(big))).overflowed
    # Plain data past it too (QA: a marker 30 MiB into a stream, clean from a
    # clamd without AlertExceedsMax); a content stream under it is no finding.
    assert _survey(tmp_path, attached(zlib.compress(bytes(2 << 20) + b"sig"))).overflowed
    assert _survey(tmp_path, _one_page(zlib.compress(b" " * (1 << 20)))) == zipsizes.Survey()
    inner = attached(zlib.compress(_lzma_zip(b"x")))
    assert _survey(tmp_path, attached(zlib.compress(inner))).undecoded
    plain = _survey(tmp_path, attached(zlib.compress(b"BT (hello) Tj ET" * 1000)))
    assert plain == zipsizes.Survey()


def test_a_pdf_of_many_streams_is_looked_into_within_bounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past NESTED_HEADS streams the survey stops: ``unchecked``, not clean."""
    monkeypatch.setattr(nested, "NESTED_HEADS", 50)
    w = Writer()
    kids = [w.add(w.stream(zlib.compress(b"q %d Q" % i))) for i in range(60)]
    pdf = w.build(w.add(b"<< /Type /Catalog /S [%s] >>" % b" ".join(b"%d 0 R" % k for k in kids)))
    assert _survey(tmp_path, pdf).unchecked
    monkeypatch.setattr(nested, "NESTED_HEADS", 200)
    assert not _survey(tmp_path, pdf).unchecked


def test_an_encrypted_pdfs_attachments_are_read_through_pdfium(tmp_path: Path) -> None:
    """Its streams are ciphertext as bytes, which clamd decrypts when no
    password is needed; one that needs a password clamd cannot read."""
    assert _survey(tmp_path, encrypted("", attachment=_lzma_zip(b"x"))).undecoded
    assert _survey(tmp_path, encrypted("", attachment=b"plain text")) == zipsizes.Survey()
    assert _survey(tmp_path, encrypted("secret", attachment=b"x")).locked
    assert not _survey(tmp_path, attached(zlib.compress(b"x"))).locked


def test_streams_without_endstream_are_found_in_linear_time(tmp_path: Path) -> None:
    """Each stream looked for its "endstream" to the file's end: a 20 MB file
    of 10,000 such streams took minutes (now a fraction of a second)."""
    pdf = b"%PDF-1.7\n" + (b"x" * 2000 + b">>stream\n") * 10_000
    started = time.monotonic()
    assert _survey(tmp_path, pdf) == zipsizes.Survey()
    assert time.monotonic() - started < 5

"""pdf.preview on real pdfium and libvips, with PDFs written in code (tests/pdfs.py).

The pipeline is called directly through ``registry.Context`` (the worker's
child does the same); the end-to-end path through a worker is in
tests/integration/test_pdf_jobs.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hypermedia.errors import JobError
from hypermedia.pipelines import pdf, pdf_images, pdf_streams, registry
from hypermedia.pipelines.schema import clean_settings
from hypermedia.storage import sniff
from tests import pdfs
from tests.media import png

IN_CI = os.environ.get("CI", "").lower() == "true"

try:
    import pypdfium2
    import pyvips
except Exception as exc:  # ImportError, or OSError without libpdfium / libvips
    if IN_CI:
        raise
    pytest.skip(f"pypdfium2 or pyvips is not available ({exc})", allow_module_level=True)

PREVIEW = pdf.PREVIEW
MIGRATION = (
    Path(__file__).resolve().parents[2]
    / "hypermedia/db/migrations/versions/0005_credits_hashes_profiles.py"
)


def _profile_settings() -> dict[str, Any]:
    """The pdf-preview:v1 settings the migration installs."""
    spec = importlib.util.spec_from_file_location("migration_0005", MIGRATION)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (row,) = [p for p in module.PROFILES if p[0] == "pdf-preview"]
    assert (row[1], row[2], row[3]) == ("v1", "pdf.preview", "documents")
    return dict(row[4])


SETTINGS = _profile_settings()


@dataclass
class Run:
    ctx: registry.Context
    result: dict[str, Any]
    reports: list[dict[str, Any]]


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    d = tmp_path / "scratch"
    d.mkdir()
    return d


def put(scratch: Path, data: bytes, name: str = "input.pdf") -> Path:
    path = scratch / name
    path.write_bytes(data)
    return path


def run(
    scratch: Path,
    input_file: Path | None,
    params: dict[str, Any] | None = None,
    settings: dict[str, Any] | None = None,
) -> Run:
    validated = PREVIEW.validate(
        dict(params or {}), dict(SETTINGS if settings is None else settings)
    )
    reports: list[dict[str, Any]] = []
    ctx = registry.Context(str(scratch), reports.append, str(input_file) if input_file else None)
    result = PREVIEW.run(validated, ctx)
    assert result is not None
    return Run(ctx, result, reports)


def failure(scratch: Path, input_file: Path, **params: Any) -> JobError:
    """Run expecting a JobError; check its reason is safe and nothing was written."""
    settings = params.pop("settings", None)
    with pytest.raises(JobError) as info:
        run(scratch, input_file, params, settings)
    reason = info.value.reason
    assert str(scratch) not in reason and input_file.name not in reason, reason
    assert "/" not in reason and "pdfium" not in reason.lower(), reason
    assert not [p for p in scratch.iterdir() if p != input_file], "no output on failure"
    return info.value


def decoded(scratch: Path, out: dict[str, Any]) -> Any:
    return pyvips.Image.new_from_file(str(scratch / out["path"]))


def centre(img: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in img(img.width // 2, img.height // 2)[:3])


def close_to(a: tuple[int, ...], b: tuple[int, ...], tol: int = 12) -> bool:
    return all(abs(x - y) <= tol for x, y in zip(a, b, strict=True))


# -- the pipeline and its settings -------------------------------------------------------


def test_registered_on_import_with_its_schema() -> None:
    assert registry.get("pdf.preview") is PREVIEW
    assert PREVIEW.queue == "documents"
    assert PREVIEW.schema is pdf.SCHEMA
    assert PREVIEW.available() is None
    assert (pdf.versions() or "").startswith("pypdfium2 ")
    fixed = {k for k, f in pdf.SCHEMA.items() if not f.overridable}
    assert fixed == {"max_pages", "max_page_pixels", "max_rendered_pages", "max_page_seconds"}


def test_the_migration_profile_is_valid_and_completed_by_defaults() -> None:
    settings = clean_settings(pdf.SCHEMA, SETTINGS)
    assert settings == {
        "first_page": 1,
        "last_page": 1,
        "width": 1280,
        "dpi": 0,
        "format": "webp",
        "quality": 85,
        "max_pages": 5000,
        "max_page_pixels": 50_000_000,
        "max_rendered_pages": 50,
        "max_page_seconds": 30,
    }
    assert PREVIEW.validate({}, SETTINGS) == settings
    assert PREVIEW.validate({"last_page": 3, "format": "png"}, SETTINGS)["last_page"] == 3


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"first_page": 3, "last_page": 2}, "last_page must not be before first_page"),
        ({"first_page": 0}, "first_page must be from 1"),
        ({"last_page": 51}, "at most 50 pages may be rendered by one job"),
        ({"first_page": 5001, "last_page": 5001}, "first_page 5001 is past max_pages (5000)"),
        ({"width": 8193}, "width must be from 16 to 8192"),
        ({"width": 15}, "width must be from 16 to 8192"),
        ({"dpi": 1201}, "dpi must be from 0 to 1200"),
        ({"format": "tiff"}, "format must be one of webp, png, jpeg"),
        ({"quality": 0}, "quality must be from 1 to 100"),
        ({"width": "640"}, "width must be an integer"),
        ({"max_pages": 10**6}, "set by the profile, not by a job: max_pages"),
        ({"max_page_pixels": 10**9}, "set by the profile"),
        ({"max_rendered_pages": 1000}, "set by the profile"),
        ({"password": "x"}, "unknown parameters: password"),
    ],
)
def test_bad_params_are_refused(params: dict[str, Any], message: str) -> None:
    with pytest.raises(JobError) as info:
        PREVIEW.validate(params, SETTINGS)
    assert info.value.code == "INVALID_PARAMS" and message in info.value.reason


def test_a_profile_may_lower_the_limits() -> None:
    settings = {**SETTINGS, "max_rendered_pages": 2}
    assert PREVIEW.validate({"last_page": 2}, settings)["max_rendered_pages"] == 2
    with pytest.raises(JobError, match="at most 2 pages"):
        PREVIEW.validate({"last_page": 3}, settings)


# -- rendering ---------------------------------------------------------------------------


def test_one_page_at_the_profile_width(scratch: Path) -> None:
    src = put(scratch, pdfs.document(1))
    r = run(scratch, src)
    (out,) = r.ctx.outputs
    meta = {"page": 1, "width": 1280, "height": 1656, "format": "webp"}
    size = (scratch / "page-1.webp").stat().st_size
    assert out == {
        "output_type": "page_preview_1",
        "mime_type": "image/webp",
        "metadata": {**meta, "bytes": size},
        "path": "page-1.webp",
    }
    assert r.result == {
        "pages": 1,
        "rendered": [{**meta, "bytes": size}],
        "usage": {"pages": 1},
        "input_facts": {"pages": 1},
    }
    img = decoded(scratch, out)
    assert (img.width, img.height) == (1280, 1656)  # Letter: 612 x 792 pt
    assert img.get("vips-loader") == "webpload"
    assert close_to(centre(img), pdfs.page_color(1))
    assert img(2, 2)[:3] == [255, 255, 255]  # the margin: white, not transparent
    assert not {"exif-data", "xmp-data", "icc-profile-data"} & set(img.get_fields())
    data = (scratch / "page-1.webp").read_bytes()
    assert not {b"EXIF", b"XMP ", b"ICCP"} & {data[i : i + 4] for i in range(12, len(data) - 4)}
    assert r.reports[0]["step"] == "checking the file"
    assert r.reports[-1] == {"percent": 100, "step": "1 page rendered"}


def test_a_page_range_is_chosen_and_clamped_to_the_document(scratch: Path) -> None:
    src = put(scratch, pdfs.document(3))
    r = run(scratch, src, {"first_page": 2, "last_page": 9, "width": 300})
    assert [o["metadata"]["page"] for o in r.ctx.outputs] == [2, 3]
    assert [o["path"] for o in r.ctx.outputs] == ["page-2.webp", "page-3.webp"]
    assert [o["output_type"] for o in r.ctx.outputs] == ["page_preview_2", "page_preview_3"]
    for out in r.ctx.outputs:
        img = decoded(scratch, out)
        assert (img.width, img.height) == (300, 388)
        assert close_to(centre(img), pdfs.page_color(out["metadata"]["page"]))
    assert r.result["pages"] == 3
    assert r.result["usage"] == {"pages": 2}
    assert r.result["input_facts"] == {"pages": 3}
    steps = [rep["step"] for rep in r.reports]
    assert steps[1:3] == ["rendering page 2 (1 of 2)", "rendering page 3 (2 of 2)"]
    assert steps[-1] == "2 pages rendered"
    percents = [rep["percent"] for rep in r.reports]
    assert percents == sorted(percents)


def test_a_first_page_past_the_end_is_refused(scratch: Path) -> None:
    src = put(scratch, pdfs.document(3))
    err = failure(scratch, src, first_page=4, last_page=5)
    assert err.code == "INVALID_PARAMS"
    assert err.reason == "first_page is 4 but the document has 3 pages"


@pytest.mark.parametrize(
    ("fmt", "loader", "mime"),
    [("png", "pngload", "image/png"), ("jpeg", "jpegload", "image/jpeg")],
)
def test_other_formats(scratch: Path, fmt: str, loader: str, mime: str) -> None:
    src = put(scratch, pdfs.document(1))
    r = run(scratch, src, {"format": fmt, "width": 200, "quality": 90})
    (out,) = r.ctx.outputs
    assert out["mime_type"] == mime and out["path"] == f"page-1.{pdf.FORMATS[fmt][0]}"
    img = decoded(scratch, out)
    assert img.get("vips-loader") == loader
    assert (img.width, img.height, img.bands) == (200, 259, 3)
    assert close_to(centre(img), pdfs.page_color(1))
    assert not {"exif-data", "xmp-data", "icc-profile-data"} & set(img.get_fields())


def test_jpeg_pages_are_baseline_with_standard_tables_like_pdftoppm(scratch: Path) -> None:
    src = put(scratch, pdfs.realistic(1))
    r = run(scratch, src, {"format": "jpeg", "width": 640, "quality": 85})
    (out,) = r.ctx.outputs
    data = (scratch / out["path"]).read_bytes()
    assert data[:2] == b"\xff\xd8" and b"\xff\xc0" in data  # SOF0: baseline, not progressive
    assert b"\xff\xc2" not in data and b"Exif" not in data[:64] and b"JFIF" in data[:32]
    img = decoded(scratch, out)
    assert img.get("jpeg-chroma-subsample") == "4:2:0"
    assert (img.width, img.bands, img.interpretation) == (640, 3, "srgb")
    # The pixels as rendered, channels in order: close to the lossless PNG of the page.
    other = scratch / "png"
    other.mkdir()
    (png,) = run(other, src, {"format": "png", "width": 640}).ctx.outputs
    assert (img - decoded(other, png)).abs().avg() < 3
    assert close_to(centre(img), centre(decoded(other, png)))


def test_dpi_renders_the_page_at_its_own_size(scratch: Path) -> None:
    src = put(scratch, pdfs.document([(612, 792), (200, 100)]))
    r = run(scratch, src, {"dpi": 36, "last_page": 2})
    sizes = [(o["metadata"]["width"], o["metadata"]["height"]) for o in r.ctx.outputs]
    assert sizes == [(306, 396), (100, 50)]
    assert [(decoded(scratch, o).width, decoded(scratch, o).height) for o in r.ctx.outputs] == sizes


def test_a_rotated_page_renders_upright(scratch: Path) -> None:
    src = put(scratch, pdfs.document(1, rotate=90))
    r = run(scratch, src, {"width": 792})
    assert (r.result["rendered"][0]["width"], r.result["rendered"][0]["height"]) == (792, 612)


@pytest.mark.parametrize(
    ("crop", "rotate", "size"),
    [
        ((500, 500, 700, 900), 0, (200, 100)),  # nowhere near the MediaBox
        ((200, 0, 400, 100), 0, (200, 100)),  # touching its edge: no area
        ((500, 500, 700, 900), 90, (100, 200)),  # turned, as a viewer turns it
        ((50, 25, 150, 75), 0, (100, 50)),  # inside it: the CropBox, as before
    ],
)
def test_a_crop_box_that_misses_the_media_box_shows_the_whole_page(
    scratch: Path, crop: tuple[float, float, float, float], rotate: int, size: tuple[int, int]
) -> None:
    """pdfium found no area to draw, and the page failed CORRUPT_INPUT for
    good; pdf.js and Ghostscript show the MediaBox."""
    src = put(scratch, pdfs.document([(200, 100)], rotate=rotate, crop=crop))
    (out,) = run(scratch, src, {"dpi": 72, "format": "png"}).ctx.outputs
    assert (out["metadata"]["width"], out["metadata"]["height"]) == size
    img = decoded(scratch, out)
    assert (img.width, img.height) == size and img.min() < 200, "the page is drawn"


@pytest.mark.parametrize("appearance", [True, False])
def test_filled_form_fields_are_drawn(scratch: Path, appearance: bool) -> None:
    """A filled invoice or tax form shows its values, as in any viewer: pdfium
    draws widgets only through a form environment (they came out blank)."""
    src = put(scratch, pdfs.filled_form(appearance=appearance))
    out = run(scratch, src, {"width": 612, "format": "png"}).ctx.outputs[0]
    img = decoded(scratch, out)
    # PDF y grows upwards: the field's box (50, 600)-(300, 640) is rows 152-192.
    field = img.crop(50, 152, 250, 40)
    assert field.min() < 60, "the value's text is drawn"
    if appearance:  # the appearance stream's yellow background too
        assert close_to(tuple(int(v) for v in field(2, 2)[:3]), (255, 255, 0))
    assert img.crop(0, 300, 612, 400).min() > 250, "and nothing else on the page"


def test_quality_changes_the_encoding(scratch: Path) -> None:
    src = put(scratch, pdfs.realistic(1))
    low = run(scratch, src, {"quality": 20}).result["rendered"][0]["bytes"]
    high = run(scratch, src, {"quality": 95}).result["rendered"][0]["bytes"]
    assert low < high


def test_no_input_object(scratch: Path) -> None:
    with pytest.raises(JobError) as info:
        run(scratch, None)
    assert info.value.code == "INVALID_PARAMS"


# -- hostile input ---------------------------------------------------------------------


def test_thousands_of_pages_are_refused_before_any_page_is_read(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = pdfs.many_pages(5001)
    src = put(scratch, data)
    monkeypatch.setattr(pdf, "_render", _must_not_render)
    t = time.monotonic()
    err = failure(scratch, src)
    assert err.code == "LIMIT_EXCEEDED"
    assert err.reason == "the document has 5001 pages, over this profile's limit of 5000"
    assert time.monotonic() - t < 5
    monkeypatch.undo()
    # A profile may allow more; the count still comes back as the input's page count.
    r = run(scratch, src, settings={**SETTINGS, "max_pages": 6000})
    assert r.result["input_facts"] == {"pages": 5001} and r.result["usage"] == {"pages": 1}


@pytest.mark.parametrize(
    ("page", "where"),
    [
        pytest.param(pdfs.image_page(20_000, 20_000), "the document", id="page"),
        pytest.param(pdfs.image_page(20_000, 20_000, via="form"), "the document", id="form"),
        pytest.param(pdfs.image_page(20_000, 20_000, via="annot"), "the document", id="annot"),
        pytest.param(pdfs.image_page(20_000, 20_000, via="pattern"), "the document", id="pattern"),
        pytest.param(pdfs.image_page(40_000, 40_000, via="smask"), "the document", id="soft mask"),
        pytest.param(pdfs.image_page(14_000, 14_000, bits=16), "the document", id="16-bit RGB"),
        pytest.param(
            pdfs.image_page(17_000, 17_000, colorspace=b"/DeviceCMYK"), "the document", id="CMYK"
        ),
        pytest.param(
            pdfs.image_page(17_000, 17_000, icc_components=4), "the document", id="ICC CMYK"
        ),
        pytest.param(
            pdfs.image_page(20_000, 20_000, colorspace=b"/RGB", via="inline"), "page 1", id="inline"
        ),
    ],
)
def test_an_image_the_renderer_would_draw_in_part_is_refused(
    scratch: Path, page: bytes, where: str
) -> None:
    """pdfium inflates at most 1 GiB of one image and draws the rest black,
    silently: a 20,000 x 20,000 RGB image lost its last tenth, and the
    preview completed (through a page, a form, an annotation, a pattern or a
    soft mask alike; 16-bit and 4-component ones counted as 24 bits)."""
    err = failure(scratch, put(scratch, page))
    assert err.code == "LIMIT_EXCEEDED"
    assert err.reason.startswith(f"{where} holds an image of ") and err.reason.endswith(
        "pixels whose data is over the renderer's 1 GiB: a page drawing it would be drawn in part"
    )


def _disguised(how: str) -> bytes:
    """A 20,000 x 20,000 RGB image drawn by an annotation, its dictionary
    written so that a byte reader looking for ">> stream" as pdfium writes it
    missed it, where pdfium reads it all the same (a QA finding: each drew
    the image in part, and the preview completed)."""
    doc = pdfs.image_page(20_000, 20_000, via="annot")
    at = doc.index(b"/Subtype /Image")
    end = doc.index(b">>\nstream", at)
    if how == "blanks":
        return doc[:end] + b">>" + b" " * 20 + b"\nstream" + doc[end + 9 :]
    if how == "comment":
        return doc[:end] + b">>%c\nstream" + doc[end + 9 :]
    if how == "long":  # past the 16 kB looked back over
        return doc[:at] + b"/Pad (" + b"x" * 20_000 + b") " + doc[at:]
    if how == "nested":  # more dictionaries than the 32 passed on the way back
        nest = b"/Deep " + b"<< /D " * 40 + b"1" + b" >>" * 40 + b" "
        return doc[:at] + nest + doc[at:]
    if how == "subtype":  # the name in an object of its own (the xref is repaired)
        head = doc.index(b"\n") + 1
        named = doc[:head] + b"99 0 obj\n/Image\nendobj\n" + doc[head:]
        return named.replace(b"/Subtype /Image", b"/Subtype 99 0 R")
    raise ValueError(how)


@pytest.mark.parametrize("how", ["blanks", "comment", "long", "nested", "subtype"])
def test_an_image_dictionary_read_as_pdfium_reads_it(scratch: Path, how: str) -> None:
    err = failure(scratch, put(scratch, _disguised(how)))
    assert err.code == "LIMIT_EXCEEDED" and "20000x20000" in err.reason


@pytest.mark.parametrize(
    ("size", "filters", "over"),
    [
        (14_000, b"[/FlateDecode /ASCIIHexDecode]", True),  # 588 MB of pixels, 1.18 GB of hex
        (17_000, b"[/FlateDecode /ASCII85Decode]", True),  # 867 MB, 1.08 GB of base 85
        (10_000, b"[/FlateDecode /ASCIIHexDecode]", False),  # 300 MB, 600 MB of hex
        (20_000, b"[/FlateDecode /RunLengthDecode]", False),  # run lengths: not known
        (20_000, b"[/ASCIIHexDecode /FlateDecode]", True),  # hex around the Flate: pixels
    ],
)
def test_what_a_capped_filter_puts_out_is_counted(
    scratch: Path, size: int, filters: bytes, over: bool
) -> None:
    """[/FlateDecode /ASCIIHexDecode]: the Flate puts out two hex digits a
    byte, and the 1 GiB cap counts those (QA: 14,000 x 14,000 RGB drawn in
    part, 20,000 x 20,000 lost half)."""
    page = pdfs.image_page(size, size, filters=filters, via="annot")
    scan = pdf_images.scan(str(put(scratch, page)))
    assert (scan.over == (size, size)) is over


@pytest.mark.parametrize(
    "page",
    [
        # Not inflated past 1 GiB, so drawn whole: a JPEG (Flate-wrapped too), a
        # 1-bit image of 60,000 x 60,000 (450 MB), RGB of 18,000 x 18,000
        # (972 MB), 16-bit grey of 20,000 x 20,000 (800 MB), ICC grey.
        pdfs.image_page(20_000, 20_000, filters=b"/DCTDecode", data=b"\xff\xd8\xff\xd9"),
        pdfs.image_page(20_000, 20_000, filters=b"[/FlateDecode /DCTDecode]"),
        pdfs.image_page(60_000, 60_000, bits=1, colorspace=b"/DeviceGray"),
        pdfs.image_page(18_000, 18_000),
        pdfs.image_page(20_000, 20_000, bits=16, colorspace=b"/DeviceGray"),
        pdfs.image_page(30_000, 30_000, icc_components=1),
    ],
    ids=["jpeg", "flated jpeg", "1-bit", "rgb 972 MB", "16-bit grey", "ICC grey"],
)
def test_an_image_the_renderer_draws_whole_is_rendered(scratch: Path, page: bytes) -> None:
    out = run(scratch, put(scratch, page), {"width": 64}).result
    assert [r["page"] for r in out["rendered"]] == [1]


@pytest.mark.parametrize("twice", [False, True], ids=["flate", "flate twice"])
def test_a_content_stream_the_renderer_would_cut_is_refused(scratch: Path, twice: bool) -> None:
    """pdfium keeps 1 GiB of what one Flate coding puts out and draws the
    page with that: a fill after a GiB of blanks was not drawn, and the
    preview completed, white."""
    err = failure(scratch, put(scratch, pdfs.content_past_cap(twice)))
    assert err.code == "LIMIT_EXCEEDED"
    assert err.reason == (
        "the document holds a stream (a page's content, a form or a font) that inflates "
        "past the renderer's 1 GiB: a page drawing it would be drawn in part"
    )


def test_a_long_stream_under_the_cap_and_a_huge_attachment_are_drawn(scratch: Path) -> None:
    """Inflated to see (over a MB of Flate could be a GiB), drawn when it is
    not; an embedded file past the cap draws nothing, so refuses nothing."""
    noise = random.Random(7).randbytes(600_000).hex().encode()  # 1.2 MB, barely compressible
    content = b"% " + noise + b"\n0 0 612 792 re f\n"
    out = run(scratch, put(scratch, pdfs._one_page(zlib.compress(content))), {"width": 64})
    assert centre(decoded(scratch, out.ctx.outputs[0])) == (0, 0, 0)  # the fill at its end
    attached = put(scratch, pdfs.attached(pdfs.blanks_past_cap()), "attached.pdf")
    assert run(scratch, attached, {"width": 64}).result["rendered"][0]["page"] == 1


def test_streams_too_short_to_hold_a_gib_are_not_inflated(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The look costs nothing for the streams of an everyday document: none
    is long enough that its codings could put out a GiB."""
    monkeypatch.setattr(pdf_streams, "decoded", _must_not_render)
    out = run(scratch, put(scratch, pdfs.realistic(3)), {"width": 64}).result
    assert [r["page"] for r in out["rendered"]] == [1]


def test_the_look_for_a_cut_stream_ends_after_its_seconds(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A document of gigabytes of drawing is not looked through for minutes:
    past STREAM_CHECK_SECONDS its pages are drawn as pdfium draws them."""
    monkeypatch.setattr(pdf, "STREAM_CHECK_SECONDS", 0.0)
    out = run(scratch, put(scratch, pdfs.content_past_cap()), {"width": 64})
    assert centre(decoded(scratch, out.ctx.outputs[0])) == (255, 255, 255)  # the fill lost


def _must_not_render(*args: Any) -> None:
    raise AssertionError("rendered a page that is over a limit")


def test_a_huge_page_is_refused_before_rendering(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pdf, "_render", _must_not_render)
    # 200,000 x 200,000 points: at 72 dpi, 40 billion pixels.
    src = put(scratch, pdfs.document([(200_000, 200_000)]))
    err = failure(scratch, src, dpi=72)
    assert err.code == "LIMIT_EXCEEDED"
    assert err.reason == (
        "page 1 would render at 200000x200000 pixels, over this profile's limit of 50000000 pixels"
    )
    # 1 x 200,000 points at a width of 1280: a 256-million-pixel strip.
    src = put(scratch, pdfs.document([(1, 200_000)]))
    err = failure(scratch, src)
    assert (err.code, "1280x256000000" in err.reason) == ("LIMIT_EXCEEDED", True)
    # Under the pixel cap but longer than WebP can be; PNG can.
    src = put(scratch, pdfs.document([(100, 10_000)]))
    err = failure(scratch, src, width=200)
    assert err.code == "LIMIT_EXCEEDED" and "webp images are at most 16383 pixels" in err.reason
    # A later page over the limit fails the job before the first page is rendered.
    src = put(scratch, pdfs.document([(612, 792), (200_000, 200_000)]))
    assert failure(scratch, src, dpi=72, last_page=2).code == "LIMIT_EXCEEDED"


def test_a_huge_page_at_a_width_renders_at_that_width(scratch: Path) -> None:
    """A width fixes the pixel size whatever the page's size in points."""
    src = put(scratch, pdfs.document([(200_000, 200_000)]))
    r = run(scratch, src, {"width": 640})
    (out,) = r.ctx.outputs
    img = decoded(scratch, out)
    assert (img.width, img.height) == (640, 640)
    assert close_to(centre(img), pdfs.page_color(1))


def test_the_profile_pixel_cap_applies(scratch: Path) -> None:
    src = put(scratch, pdfs.document(1))  # 1280 x 1656 = 2,119,680 pixels
    settings = {**SETTINGS, "max_page_pixels": 2_119_679}
    assert failure(scratch, src, settings=settings).code == "LIMIT_EXCEEDED"
    ok = run(scratch, src, settings={**settings, "max_page_pixels": 2_119_680})
    assert ok.result["usage"] == {"pages": 1}


def test_a_page_that_draws_past_its_budget_is_stopped_there(scratch: Path) -> None:
    """A render bomb (tens of thousands of dashed curves: seconds to draw) is
    stopped at the profile's max_page_seconds, a permanent LIMIT_EXCEEDED,
    not drawn on to the attempt's timeout (retried, to its timeout again)."""
    src = put(scratch, pdfs.render_bomb(40_000))
    settings = {**SETTINGS, "max_page_seconds": 1}
    t0 = time.monotonic()
    err = failure(scratch, src, settings=settings)
    assert time.monotonic() - t0 < 4
    assert err.code == "LIMIT_EXCEEDED"
    assert err.reason == "page 1 takes longer than this profile's limit of 1 s to draw"


def test_a_password_protected_pdf_is_unsupported(scratch: Path) -> None:
    data = pdfs.encrypted(user_password="secret", owner_password="owner")
    # The file is really encrypted: pdfium asks for the password, and with it
    # (user's or owner's) decrypts the page to its colour.
    with pytest.raises(pypdfium2.PdfiumError) as info:
        pypdfium2.PdfDocument(data)
    assert info.value.err_code == pypdfium2.raw.FPDF_ERR_PASSWORD
    for password in ("secret", "owner"):
        doc = pypdfium2.PdfDocument(data, password=password)
        page = doc[0].render(scale=0.25, rev_byteorder=True)
        pixel = pyvips.Image.new_from_memory(
            bytes(page.buffer), page.width, page.height, 3, "uchar"
        )
        assert close_to(centre(pixel), pdfs.page_color(1))
        page.close()
        doc.close()
    src = put(scratch, data)
    err = failure(scratch, src)
    assert (err.code, err.reason) == ("UNSUPPORTED_FORMAT", "encrypted PDFs are not supported")


def test_an_unknown_security_handler_is_unsupported(scratch: Path) -> None:
    data = pdfs.encrypted().replace(b"/Filter /Standard", b"/Filter /Custom9")
    err = failure(scratch, put(scratch, data))
    assert (err.code, err.reason) == (
        "UNSUPPORTED_FORMAT",
        "this PDF's encryption is not supported",
    )


def test_a_broken_content_stream_renders_what_it_can(scratch: Path) -> None:
    """Like every viewer: the damage is only met while drawing, and drawing goes on."""
    data = pdfs.document(1).replace(b" re f Q", b" re f Q\n<<<< garbage ] ) ( 1 2 3 Tz q q")
    r = run(scratch, put(scratch, data), {"width": 200})
    assert close_to(centre(decoded(scratch, r.ctx.outputs[0])), pdfs.page_color(1))


def test_a_pdf_encrypted_with_an_owner_password_only_renders(scratch: Path) -> None:
    """Permissions-only encryption (no user password) opens without asking."""
    src = put(scratch, pdfs.encrypted(user_password="", owner_password="owner"))
    r = run(scratch, src, {"width": 200})
    assert close_to(centre(decoded(scratch, r.ctx.outputs[0])), pdfs.page_color(1))


def test_an_empty_file_is_corrupt(scratch: Path) -> None:
    err = failure(scratch, put(scratch, b""))
    assert (err.code, err.reason) == ("CORRUPT_INPUT", "the input file is empty")


@pytest.mark.parametrize(
    "cut",
    [
        pytest.param(lambda d: d[: len(d) // 2], id="truncated in the middle"),
        pytest.param(lambda d: d[:40], id="header only"),
        pytest.param(lambda d: d[:-120], id="no xref or trailer"),
        pytest.param(lambda d: b"%PDF-1.7\n" + os.urandom(20_000), id="garbage after the header"),
        pytest.param(lambda d: pdfs.document(0), id="no pages"),
    ],
)
def test_damaged_pdfs_are_corrupt(scratch: Path, cut: Any) -> None:
    data = cut(pdfs.document(3))
    err = failure(scratch, put(scratch, data))
    assert err.code == "CORRUPT_INPUT", err.reason
    no_pages = data == pdfs.document(0)
    assert err.reason == (
        "the PDF has no pages" if no_pages else "the PDF is damaged or unreadable"
    )


def test_no_pages_is_told_apart_from_the_documents_the_child_opened_before(
    scratch: Path,
) -> None:
    """pdfium's last error is set only by a failed load: a PDF that loads with no
    pages used to get the error an earlier document left in the same child
    ("encrypted PDFs are not supported" after an encrypted one)."""
    for before in (pdfs.encrypted(), b"%PDF-1.7\n" + os.urandom(2000), pdfs.document(1)):
        failure(scratch, put(scratch, before), first_page=2, last_page=2)
        err = failure(scratch, put(scratch, pdfs.document(0)))
        assert (err.code, err.reason) == ("CORRUPT_INPUT", "the PDF has no pages")


def test_a_png_named_pdf_is_unsupported(scratch: Path) -> None:
    err = failure(scratch, put(scratch, png(64, 64), "input.pdf"))
    assert (err.code, err.reason) == ("UNSUPPORTED_FORMAT", "not a PDF document")


def test_a_pdf_named_png_is_rendered(scratch: Path) -> None:
    """The type comes from the content, never from the name."""
    r = run(scratch, put(scratch, pdfs.document(1), "input.png"), {"width": 100})
    assert r.result["rendered"][0]["width"] == 100


@pytest.mark.parametrize("junk", [1000, 1020, 1024])
def test_the_magic_may_start_where_pdfium_looks(scratch: Path, junk: int) -> None:
    """Readers skip leading junk: pdfium up to a header at byte 1024, which
    was refused from byte 1020 on (the whole of "%PDF-" had to be in the
    first 1024 bytes).  The ledger says application/pdf of them too."""
    data = b"\x00" * junk + pdfs.document(1)
    assert sniff.media_type(data[: sniff.HEAD_BYTES]) == "application/pdf"
    assert run(scratch, put(scratch, data), {"width": 100}).result["pages"] == 1


def test_the_magic_must_be_where_pdfium_looks(scratch: Path) -> None:
    late = b"\x00" * 1025 + pdfs.document(1)
    assert failure(scratch, put(scratch, late)).code == "UNSUPPORTED_FORMAT"
    assert sniff.media_type(late) == "application/octet-stream"
    # A text that names the header only past where readers look stays text.
    assert sniff.media_type(b"x" * 1100 + b" %PDF-1.7") == "text/plain"


# -- the module and the child's sandbox ------------------------------------------------


def test_importing_the_module_loads_neither_pdfium_nor_libvips() -> None:
    code = (
        "import sys, hypermedia.pipelines.pdf as m; "
        "assert m.available() is None; "
        "assert not {'pypdfium2', 'pyvips', 'PIL'} & set(sys.modules), sorted(sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_missing_pdfium_is_a_dependency_failure(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pdf, "_pdfium", None)
    monkeypatch.setitem(sys.modules, "pypdfium2", None)  # import pypdfium2 -> ImportError
    src = put(scratch, pdfs.document(1))
    with pytest.raises(JobError) as info:
        run(scratch, src)
    assert info.value.code == "DEPENDENCY_FAILED"
    monkeypatch.setattr(pdf.importlib.util, "find_spec", lambda name: None)
    assert pdf.available() == "pdfium (pypdfium2) is not installed"


def test_an_old_pypdfium2_is_not_available(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pdf.metadata, "version", lambda name: "4.29.0")
    assert pdf.available() == "pypdfium2 4.29.0 is too old (4.30 or newer is needed)"


_CHILD = """
import json, resource, sys
from hypermedia.errors import JobError
from hypermedia.pipelines import pdf, registry

def vm(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) // 1024

def attempt(name, params):
    ctx = registry.Context(sys.argv[1], lambda p: None, sys.argv[1] + "/" + name)
    try:
        r = pdf.PREVIEW.run(pdf.PREVIEW.validate(params, {}), ctx)
        return [o["width"] * o["height"] for o in r["rendered"]]
    except JobError as exc:
        return exc.code
    except MemoryError:
        return "OOM"

out = {"small": attempt("report.pdf", {"width": 200})}
# The attempt's limit, as the child sets it: {limit} MB of address space.
_, hard = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, ({limit} * 2**20, hard))
out["big"] = attempt("report.pdf", {"dpi": 700, "format": "png"})
out["big_jpeg"] = attempt("report.pdf", {"dpi": 700, "format": "jpeg"})
out["pages"] = attempt("pages.pdf", {})
out["huge"] = attempt("huge.pdf", {"dpi": 300})
# Less room than the big page needs: OOM, and the process carries on.
resource.setrlimit(resource.RLIMIT_AS, ((vm("VmSize") + 64) * 2**20, hard))
out["tight"] = attempt("report.pdf", {"dpi": 700, "format": "png"})
out["after"] = attempt("report.pdf", {"width": 200})
out["peak_mb"] = vm("VmHWM")
print(json.dumps(out))
"""


def test_memory_stays_under_the_attempt_limit_in_an_empty_environment(tmp_path: Path) -> None:
    """As the worker's child runs it: ``python -I``, env={}, RLIMIT_AS set per attempt."""
    (tmp_path / "report.pdf").write_bytes(pdfs.realistic(1))
    (tmp_path / "pages.pdf").write_bytes(pdfs.many_pages(6000))
    (tmp_path / "huge.pdf").write_bytes(pdfs.document([(200_000, 200_000)]))
    limit = 1024
    done = subprocess.run(
        [sys.executable, "-I", "-c", _CHILD.replace("{limit}", str(limit)), str(tmp_path)],
        env={},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["small"] == [200 * 283]
    assert out["big"] == [5785 * 8186]  # A4 at 700 dpi: 47 million pixels, under the cap
    assert out["big_jpeg"] == [5785 * 8186]  # Pillow encodes the buffer in place
    assert (out["pages"], out["huge"]) == ("LIMIT_EXCEEDED", "LIMIT_EXCEEDED")
    assert out["tight"] == "OOM"
    assert out["after"] == [200 * 283]
    assert out["peak_mb"] < limit


def _image_dict(tmp_path: Path, fields: bytes, *objects: bytes) -> pdf_images.Scan:
    """The scan of a PDF holding one image stream with ``fields`` (objects
    1, 2… are ``objects``; the image is the last one)."""
    w = pdfs.Writer()
    for body in objects:
        w.add(body)
    image = w.add(pdfs.Writer.stream(b"x", b"/Type /XObject /Subtype /Image " + fields + b" "))
    content = w.add(pdfs.Writer.stream(b""))
    path = tmp_path / "scan.pdf"
    path.write_bytes(
        pdfs._letter_page(w, content, b"/Resources << /XObject << /Im1 %d 0 R >> >> " % image)
    )
    return pdf_images.scan(str(path))


def test_image_dictionaries_are_read_as_pdfium_reads_them(tmp_path: Path) -> None:
    """Indirect /Filter, /BitsPerComponent and sizes, sizes written 20000.0,
    were not followed (drawn partly black); a DeviceN's alternate space was
    counted as one more ink (a duotone refused)."""
    over = (
        b"/Width 20000 /Height 20000 /ColorSpace /DeviceRGB /BitsPerComponent 8 /Filter 1 0 R",
        b"/Width 1 0 R /Height 20000.0 /ColorSpace /DeviceRGB /BitsPerComponent 8 "
        b"/Filter /FlateDecode",
        b"/Width 14000 /Height 14000 /ColorSpace /DeviceRGB /BitsPerComponent 1 0 R "
        b"/Filter /FlateDecode",
    )
    referenced = (b"[/FlateDecode]", b"20000", b"16")
    for fields, target in zip(over, referenced, strict=True):
        assert _image_dict(tmp_path, fields, target).over is not None, fields
    duotone = (
        b"/Width 20000 /Height 20000 /BitsPerComponent 8 /Filter /FlateDecode "
        b"/ColorSpace [/DeviceN [/Black /Spot] /DeviceCMYK 1 0 R]"
    )
    assert _image_dict(tmp_path, duotone, b"<< >>").over is None  # 800 MB: two inks
    six = duotone.replace(b"[/Black /Spot]", b"[/C /M /Y /K /S1 /S2]").replace(b"20000", b"14000")
    assert _image_dict(tmp_path, six, b"<< >>").over == (14000, 14000)  # 1.18 GB


def test_a_file_made_slow_to_scan_is_bounded(tmp_path: Path) -> None:
    """Thousands of ">>stream" in a row: each looked back over all the others,
    and a 1 MB file held an attempt for half an hour."""
    w = pdfs.Writer()
    bomb = w.add(pdfs.Writer.stream(b"<<" + b">>stream\n" * 7000))
    path = tmp_path / "slow.pdf"
    path.write_bytes(pdfs._letter_page(w, bomb))
    started = time.monotonic()
    assert pdf_images.scan(str(path)).over is None
    assert time.monotonic() - started < 5


def test_a_colour_space_in_an_object_stream_is_read(tmp_path: Path) -> None:
    """PDF 1.5 producers pack small objects in object streams: a colour space
    there was not found and counted as 4 components (an RGB scan of 972 MB
    refused, a 6-ink image of 1.18 GB drawn in part)."""
    import zlib

    def scanned(size: int, space: bytes, flate: bool) -> pdf_images.Scan:
        header = b"8 0 "
        packed = header + space
        data = zlib.compress(packed) if flate else packed
        coding = b"/Filter /FlateDecode " if flate else b""
        fields = b"/Type /ObjStm /N 1 /First %d %s" % (len(header), coding)
        image = (
            b"/Width %d /Height %d /ColorSpace 8 0 R /BitsPerComponent 8 /Filter /FlateDecode"
            % (size, size)
        )
        return _image_dict(tmp_path, image, pdfs.Writer.stream(data, fields))

    for flate in (False, True):
        assert scanned(18_000, b"/DeviceRGB", flate).over is None  # 972 MB: drawn whole
        assert scanned(30_000, b"/DeviceGray", flate).over is None  # 900 MB
        inks = b"[/DeviceN [/C /M /Y /K /S1 /S2] /DeviceCMYK 5 0 R]"
        assert scanned(14_000, inks, flate).over == (14_000, 14_000)  # 1.18 GB

"""pdf.preview end to end: a PDF in the ledger, a real ``hypermedia worker --burst``
on the documents queue whose child runs pdfium with an empty environment and a
memory limit, and the rendered pages back in the ledger as objects.
"""

from __future__ import annotations

import io
import os
from typing import Any

import pytest

from hypermedia.db.driver import Driver

# All of them: registry loads its built-ins once, so importing one module alone
# first would leave the others unregistered for the rest of the run.
from hypermedia.pipelines import debug, image, pdf  # noqa: F401
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import NewJob
from hypermedia.queue.profiles import Profiles
from hypermedia.storage.ledger import Storage
from tests import pdfs
from tests.integration._procs import Procs, attempts, sqlite_only, tail, wait_job
from tests.media import png

IN_CI = os.environ.get("CI", "").lower() == "true"

try:
    import pypdfium2  # noqa: F401
    import pyvips
except Exception as exc:  # ImportError, or OSError without libpdfium / libvips
    if IN_CI:
        raise
    pytest.skip(f"pypdfium2 or pyvips is not available ({exc})", allow_module_level=True)

pytestmark = [pytest.mark.timeout(180), sqlite_only]

CHILD_MEMORY_MB = 768  # the attempt's address-space limit in the worker's child


def _outputs(driver: Driver, job_id: int) -> list[dict[str, Any]]:
    with driver.read() as tx:
        return tx.outputs(job_id)


def _burst(procs: Procs) -> None:
    """Run ``hypermedia worker --burst`` on the documents queue until it exits by itself."""
    args = ["--queues", "documents", "--concurrency", "1", "--no-maintenance", "--burst"]
    proc = procs.spawn(
        "worker", *args, name="worker", HYPERMEDIA_CHILD_MEMORY_MB=str(CHILD_MEMORY_MB)
    )
    code = proc.wait(150)
    log = procs._procs[-1][1]
    assert code == 0, f"the worker exited with {code}:\n{tail(log)}"


def test_a_pdf_gets_page_previews(
    driver: Driver, live: Engine, storage: Storage, procs: Procs
) -> None:
    data = pdfs.document(3)
    src = storage.put(io.BytesIO(data), filename="report.pdf")
    assert src["mime_type"] == "application/pdf"
    job_id = live.enqueue(
        NewJob("pdf.preview", {"last_page": 3, "width": 640}, object_id=src["object_id"])
    )
    row = live.get(job_id)
    assert row["queue_name"] == "documents"
    assert row["params"] == {
        "first_page": 1,
        "last_page": 3,
        "width": 640,
        "dpi": 0,
        "format": "webp",
        "quality": 85,
        "max_pages": 5000,
        "max_page_pixels": 50_000_000,
        "max_rendered_pages": 50,
        "max_page_seconds": 30,
    }
    _burst(procs)

    row = wait_job(driver, job_id, timeout=5)
    assert row["status"] == "completed", (row["error_code"], row["safe_reason"])
    result = row["result"]
    assert (result["pages"], result["usage"], result["input_facts"]) == (
        3,
        {"pages": 3},
        {"pages": 3},
    )
    outs = sorted(_outputs(driver, job_id), key=lambda o: o["metadata"]["page"])
    assert [o["metadata"]["page"] for o in outs] == [1, 2, 3]
    for n, out in enumerate(outs, start=1):
        assert (out["output_type"], out["mime_type"]) == (f"page_preview_{n}", "image/webp")
        assert out["profile_version"] == "pdf-preview:v1"
        meta = out["metadata"]
        assert (meta["width"], meta["height"], meta["format"]) == (640, 828, "webp")
        assert meta == result["rendered"][n - 1]
        obj = storage.get(out["object_id"])
        assert obj["state"] == "ready"
        assert obj["storage_key"] == f"objects/{obj['object_id']}/page_preview_{n}.webp"
        assert obj["size"] == meta["bytes"] == out["output_size_bytes"]
        with storage.open(obj["object_id"]) as f:
            stored = f.read()
        img = pyvips.Image.new_from_buffer(stored, "")
        assert (img.width, img.height) == (640, 828)
        assert img.get("vips-loader") == "webpload_buffer"
        r, g, b = (int(v) for v in img(320, 414)[:3])
        assert all(abs(x - y) <= 12 for x, y in zip((r, g, b), pdfs.page_color(n), strict=True))
    (attempt,) = attempts(driver, job_id)
    assert attempt["peak_memory_mb"] < CHILD_MEMORY_MB
    # The engine keeps the page count on the input object, and charges per
    # page rendered: pdf-preview:v1 costs 1 + 1 per page.
    assert storage.get(src["object_id"])["pages"] == 3
    assert row["actual_credits"] == 1 + 3
    # The input is untouched and the scratch directory was emptied.
    with storage.open(src["object_id"]) as f:
        assert f.read() == data
    assert [p for p in (procs.home / "scratch").rglob("*") if p.is_file()] == []


def test_hostile_pdfs_fail_cleanly_and_the_worker_carries_on(
    driver: Driver, live: Engine, storage: Storage, procs: Procs
) -> None:
    good = pdfs.document(2)

    def put(data: bytes, name: str) -> int:
        return int(storage.put(io.BytesIO(data), filename=name)["object_id"])

    cases = [
        (put(b"", "empty.pdf"), {}, "CORRUPT_INPUT", "the input file is empty"),
        (put(png(32, 32), "scan.pdf"), {}, "UNSUPPORTED_FORMAT", "not a PDF document"),
        (
            put(pdfs.many_pages(6000), "pages.pdf"),
            {},
            "LIMIT_EXCEEDED",
            "the document has 6000 pages, over this profile's limit of 5000",
        ),
        (
            put(pdfs.document([(200_000, 200_000)]), "poster.pdf"),
            {"dpi": 300},
            "LIMIT_EXCEEDED",
            "page 1 would render at 833333x833333 pixels, over this profile's limit of "
            "50000000 pixels",
        ),
        (
            put(pdfs.encrypted(), "locked.pdf"),
            {},
            "UNSUPPORTED_FORMAT",
            "encrypted PDFs are not supported",
        ),
        (
            put(good[: len(good) // 2], "cut.pdf"),
            {},
            "CORRUPT_INPUT",
            "the PDF is damaged or unreadable",
        ),
    ]
    jobs = {
        live.enqueue(NewJob("pdf.preview", params, object_id=object_id)): (code, reason)
        for object_id, params, code, reason in cases
    }
    # Queued last, at the lowest priority: it runs after the hostile ones.  A
    # PDF named .png: the type comes from the content.
    ok = storage.put(io.BytesIO(good), filename="actually-a-pdf.png")
    assert ok["mime_type"] == "application/pdf"
    after = live.enqueue(NewJob("pdf.preview", object_id=ok["object_id"], priority=10))
    _burst(procs)

    categories = {"CORRUPT_INPUT": "invalid_input", "LIMIT_EXCEEDED": "invalid_input"}
    for job_id, (code, reason) in jobs.items():
        row = wait_job(driver, job_id, timeout=5)
        assert (row["status"], row["error_code"]) == ("failed", code), row["safe_reason"]
        assert row["safe_reason"] == reason
        assert row["category"] == categories.get(code, "unsupported_operation")
        assert row["attempt_count"] == 1  # permanent: never retried
        assert _outputs(driver, job_id) == []
        (attempt,) = attempts(driver, job_id)
        assert attempt["peak_memory_mb"] is None or attempt["peak_memory_mb"] < CHILD_MEMORY_MB
    done = wait_job(driver, after, timeout=5)
    assert done["status"] == "completed", (done["error_code"], done["safe_reason"])
    assert done["result"]["pages"] == 2
    assert done["result"]["rendered"][0]["width"] == 1280
    # Only the seven inputs and the one page preview are in the ledger.
    assert len(storage.list()) == 8


def test_a_page_object_that_draws_past_the_budget_is_stopped_by_the_worker(
    driver: Driver, live: Engine, storage: Storage, procs: Procs
) -> None:
    """pdfium asks whether to pause between page objects only: one tiling
    pattern of 0.003-point cells drew on to the attempt's timeout (300 s, then
    retried, to its timeout again). The worker kills the child at the page's
    budget (plus a grace) instead: a permanent LIMIT_EXCEEDED."""
    key = f"pdf-quick-{os.getpid()}"
    Profiles(live).create(key, "pdf.preview", {"max_page_seconds": 1})
    bomb = storage.put(io.BytesIO(pdfs.tiling_bomb()), filename="tiles.pdf")["object_id"]
    job_id = live.enqueue(NewJob("pdf.preview", object_id=bomb, profile=key))
    good = storage.put(io.BytesIO(pdfs.document(1)), filename="ok.pdf")["object_id"]
    after = live.enqueue(NewJob("pdf.preview", object_id=good, priority=10))
    _burst(procs)

    row = wait_job(driver, job_id, timeout=5)
    assert (row["status"], row["error_code"]) == ("failed", "LIMIT_EXCEEDED")
    assert row["safe_reason"] == "page 1 takes longer than this profile's limit of 1 s to draw"
    assert row["attempt_count"] == 1
    (attempt,) = attempts(driver, job_id)
    assert attempt["duration_ms"] < 8000
    assert wait_job(driver, after, timeout=5)["status"] == "completed"


def test_a_stream_that_inflates_past_the_limit_is_an_oom(
    driver: Driver, live: Engine, storage: Storage, procs: Procs
) -> None:
    """pdfium inflates a content stream in memory and aborts the child when
    RLIMIT_AS refuses it more (no MemoryError to catch): the attempt is an
    OOM, retried with twice the memory, not a CRASHED retried as it was."""
    src = storage.put(io.BytesIO(pdfs.inflating(300)), filename="inflating.pdf")
    job_id = live.enqueue(NewJob("pdf.preview", object_id=src["object_id"], max_attempts=1))
    _burst(procs)

    row = wait_job(driver, job_id, timeout=5)
    assert (row["status"], row["error_code"]) == ("failed", "OOM"), row["safe_reason"]
    assert row["safe_reason"] == "the attempt ran out of memory in a native library"
    assert _outputs(driver, job_id) == []

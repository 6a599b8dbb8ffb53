"""image.thumbnail, image.preview and image.compress end to end: a photo in the
ledger, a real ``hypermedia worker --burst`` whose child runs libvips with an
empty environment and its memory limit, and the derived objects back in the
ledger.  Hostile files (the unit tests' ``HOSTILE`` set) go through the same
path: each job fails with its code and a redacted reason, its attempt's peak
memory stays under the limit, and the worker carries on.
"""

from __future__ import annotations

import io
import os
import uuid
from typing import Any

import pytest

from hypermedia.db.driver import Driver

# Both: registry loads its built-ins only while it is empty (see the unit tests).
from hypermedia.pipelines import debug, image  # noqa: F401
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import NewJob
from hypermedia.queue.profiles import Prices, Profiles
from hypermedia.storage.ledger import Storage
from tests.integration._procs import Procs, attempts, sqlite_only, tail, wait_job

IN_CI = os.environ.get("CI", "").lower() == "true"

try:
    import pyvips
except Exception as exc:  # ImportError, or OSError without libvips
    if IN_CI:
        raise
    pytest.skip(f"pyvips/libvips is not available ({exc})", allow_module_level=True)

from tests.unit.test_image_pipeline import HOSTILE  # noqa: E402  (needs pyvips)

pytestmark = [pytest.mark.timeout(180), sqlite_only]

# The attempt's address-space limit for these workers: well below the default
# 2048 MB, so a decoder that tried to allocate a pixel flood would hit it.
MEMORY_MB = 768


def _photo(width: int, height: int, orientation: int = 1) -> bytes:
    """A JPEG gradient with EXIF (orientation) and XMP, as a camera would leave it."""
    xyz = pyvips.Image.xyz(width, height)
    red, green = xyz[0] * (255 / width), xyz[1] * (255 / height)
    img = red.bandjoin([green, green * 0 + 128]).cast("uchar").copy(interpretation="srgb")
    img.set_type(pyvips.GValue.gint_type, "orientation", orientation)
    img.set_type(pyvips.GValue.blob_type, "xmp-data", b"<x:xmpmeta>gps 48.85,2.35</x:xmpmeta>")
    return bytes(img.jpegsave_buffer(Q=85))


def _outputs(driver: Driver, job_id: int) -> list[dict[str, Any]]:
    with driver.read() as tx:
        return tx.outputs(job_id)


def _burst(procs: Procs) -> None:
    """Run ``hypermedia worker --burst`` on the images queue until it exits by itself."""
    args = ["--queues", "images", "--concurrency", "1", "--no-maintenance", "--burst"]
    proc = procs.spawn("worker", *args, name="worker", HYPERMEDIA_CHILD_MEMORY_MB=str(MEMORY_MB))
    code = proc.wait(150)
    log = procs._procs[-1][1]
    assert code == 0, f"the worker exited with {code}:\n{tail(log)}"


def _peak_mb(driver: Driver, job_id: int) -> int:
    (a,) = attempts(driver, job_id)
    assert a["peak_memory_mb"] is not None
    assert 0 < a["peak_memory_mb"] < MEMORY_MB, a
    return int(a["peak_memory_mb"])


def test_a_photo_gets_a_thumbnail_a_preview_and_a_compressed_copy(
    driver: Driver, live: Engine, storage: Storage, procs: Procs
) -> None:
    data = _photo(2000, 1500, orientation=6)  # stored landscape, shown portrait
    src = storage.put(io.BytesIO(data), filename="IMG_0001.JPG")
    # The size as shown, as the outputs' (a gallery lays the original out by it).
    assert (src["mime_type"], src["width"], src["height"]) == ("image/jpeg", 1500, 2000)
    thumb = live.enqueue(NewJob("image.thumbnail", object_id=src["object_id"]))
    preview = live.enqueue(NewJob("image.preview", object_id=src["object_id"]))
    compress = live.enqueue(NewJob("image.compress", object_id=src["object_id"]))
    # AVIF: a format the ledger's header sniffing does not size; and priced by
    # the MB, charged on the input's exact size (a rounded usage.mb undercharged).
    tiny = storage.put(io.BytesIO(_photo(16, 16)), filename="tiny.jpg")
    key = f"avif-{uuid.uuid4().hex[:8]}"
    Profiles(live).create(key, "image.compress", {"format": "avif"}, credits=Prices(0, 1000, 0, 0))
    avif = live.enqueue(NewJob("image.compress", profile=key, object_id=tiny["object_id"]))
    price = -(-tiny["size"] * 1000 // 1_048_576)  # rounded up: 1 for a few hundred bytes
    assert live.get(avif)["estimated_credits"] == price
    assert live.get(thumb)["queue_name"] == "images"
    assert live.get(thumb)["params"] == {
        "width": 200,
        "height": 200,
        "fit": "cover",
        "format": "webp",
        "quality": 85,
        "keep_metadata": False,
        "max_pixels": 100_000_000,
    }
    assert live.get(compress)["params"]["max_width"] == 4096
    _burst(procs)

    for job_id, kind, profile, size in (
        (thumb, "thumb", "image-thumbnail:v1", (200, 200)),
        (preview, "preview", "image-preview:v1", (960, 1280)),
        (compress, "compressed", "image-compress:v1", (1500, 2000)),
    ):
        row = wait_job(driver, job_id, timeout=5)
        assert row["status"] == "completed", (row["error_code"], row["safe_reason"])
        nbytes = row["result"]["bytes"]
        meta = {"width": size[0], "height": size[1], "format": "webp", "bytes": nbytes}
        assert row["result"] == meta
        (out,) = _outputs(driver, job_id)
        assert (out["output_type"], out["mime_type"]) == (kind, "image/webp")
        assert out["metadata"] == meta
        assert out["profile_version"] == profile
        assert live.get(job_id)["profile"] == profile  # the job's own, as people name it
        obj = storage.get(out["object_id"])
        assert obj["state"] == "ready"
        assert obj["storage_key"] == f"objects/{obj['object_id']}/{kind}.webp"
        assert obj["filename"] == f"{kind}.webp"  # its download name
        assert (obj["width"], obj["height"]) == size
        assert obj["size"] == out["output_size_bytes"] == nbytes
        with storage.open(obj["object_id"]) as f:
            stored = f.read()
        decoded = pyvips.Image.new_from_buffer(stored, "")
        assert (decoded.width, decoded.height) == size
        assert decoded.get("vips-loader") == "webpload_buffer"
        assert not {"exif-data", "xmp-data", "orientation"} & set(decoded.get_fields())
        assert b"gps 48.85" not in stored
        _peak_mb(driver, job_id)
    row = wait_job(driver, avif, timeout=5)
    assert row["status"] == "completed", (row["error_code"], row["safe_reason"])
    assert row["actual_credits"] == price
    (out,) = _outputs(driver, avif)
    obj = storage.get(out["object_id"])
    assert (obj["filename"], obj["mime_type"]) == ("compressed.avif", "image/avif")
    assert (obj["width"], obj["height"]) == (16, 16)  # from the pipeline's word
    # The input is untouched and the scratch directory was emptied.
    with storage.open(src["object_id"]) as f:
        assert f.read() == data
    assert [p for p in (procs.home / "scratch").rglob("*") if p.is_file()] == []


def test_an_input_learns_its_shown_size_from_its_first_job(
    driver: Driver, live: Engine, storage: Storage, procs: Procs
) -> None:
    """The ledger sniffs JPEG, PNG, WebP and GIF sizes; a TIFF stayed 0 x 0
    for ever, and a PNG turned by its EXIF kept its stored size, though every
    job on them decoded their header.  So did a JPEG with its frame header
    past the ledger's sniff."""
    tiff = pyvips.Image.black(300, 200, bands=3).tiffsave_buffer()
    src = storage.put(io.BytesIO(tiff), filename="scan.tif")
    assert (src["mime_type"], src["width"], src["height"]) == ("image/tiff", 0, 0)
    # A PNG turned by its EXIF (eXIf chunk): sniffed as stored, 300 x 200.
    turned = pyvips.Image.black(300, 200, bands=3).copy()
    turned.set_type(pyvips.GValue.gint_type, "orientation", 6)
    png = storage.put(io.BytesIO(turned.pngsave_buffer()), filename="turned.png")
    assert (png["width"], png["height"]) == (300, 200)
    # A JPEG whose frame header lies past the 256 kB the ledger reads (a
    # press profile's worth of APP segments first): 0 x 0 until a job says.
    photo = _photo(40, 30)
    junk = (b"\xff\xef" + (65535).to_bytes(2, "big") + bytes(65533)) * 5
    deep = storage.put(io.BytesIO(photo[:2] + junk + photo[2:]), filename="press.jpg")
    assert (deep["mime_type"], deep["width"], deep["height"]) == ("image/jpeg", 0, 0)
    jpeg = storage.put(io.BytesIO(photo), filename="a.jpg")
    # A GIF whose logical screen says 10 x 10 over frames of 120 x 80: the
    # ledger kept 10 x 10 for good, though libvips shows 120 x 80.
    gif = bytearray((pyvips.Image.black(120, 80, bands=3) + 90).cast("uchar").gifsave_buffer())
    gif[6:10] = (10).to_bytes(2, "little") * 2
    screen = storage.put(io.BytesIO(bytes(gif)), filename="screen.gif")
    assert (screen["width"], screen["height"]) == (10, 10)
    inputs = (src, png, deep, screen, jpeg)
    jobs = [live.enqueue(NewJob("image.thumbnail", object_id=o["object_id"])) for o in inputs]
    _burst(procs)
    for job_id in jobs:
        assert wait_job(driver, job_id, timeout=5)["status"] == "completed"
    shown_sizes = ((300, 200), (200, 300), (40, 30), (120, 80))
    for job_id, obj, shown in zip(jobs, inputs, shown_sizes, strict=False):
        facts = {"width": shown[0], "height": shown[1]}
        assert live.get(job_id)["result"]["input_facts"] == facts
        stored = storage.get(obj["object_id"])
        assert (stored["width"], stored["height"]) == shown
    assert "input_facts" not in live.get(jobs[4])["result"]  # sniffed already


def test_hostile_files_fail_cleanly_and_the_worker_carries_on(
    driver: Driver, live: Engine, storage: Storage, procs: Procs
) -> None:
    jobs: dict[int, tuple[str, str]] = {}
    for i, (what, name, make, code) in enumerate(HOSTILE):
        obj = storage.put(io.BytesIO(make()), filename=name)
        job_type = ("image.thumbnail", "image.preview", "image.compress")[i % 3]
        jobs[live.enqueue(NewJob(job_type, object_id=obj["object_id"]))] = (what, code)
    # A PNG under a JPEG's name: the content decides, so it is simply a PNG.
    buf = pyvips.Image.xyz(640, 480)[0].cast("uchar").pngsave_buffer()
    lying = storage.put(io.BytesIO(bytes(buf)), filename="holiday.jpg")
    assert lying["mime_type"] == "image/png"
    # Queued last, at the lowest priority: they run after the hostile ones.
    after = live.enqueue(NewJob("image.thumbnail", object_id=lying["object_id"], priority=10))
    good = storage.put(io.BytesIO(_photo(800, 600)), filename="fine.jpg")
    last = live.enqueue(NewJob("image.compress", object_id=good["object_id"], priority=10))
    _burst(procs)

    for job_id, (what, code) in jobs.items():
        row = wait_job(driver, job_id, timeout=5)
        assert (row["status"], row["error_code"]) == ("failed", code), (what, row["safe_reason"])
        assert row["category"] == (
            "invalid_input" if code != "UNSUPPORTED_FORMAT" else "unsupported_operation"
        ), what
        assert row["attempt_count"] == 1, what  # permanent: never retried
        reason = row["safe_reason"]
        assert "/" not in reason and "vips" not in reason.lower(), (what, reason)
        assert "passwd" not in reason and "scratch" not in reason, (what, reason)
        assert _outputs(driver, job_id) == [], what
        _peak_mb(driver, job_id)
    for job_id, size in ((after, (200, 200)), (last, (800, 600))):
        done = wait_job(driver, job_id, timeout=5)
        assert done["status"] == "completed", (done["error_code"], done["safe_reason"])
        assert (done["result"]["width"], done["result"]["height"]) == size
    # The inputs and the two outputs are in the ledger, nothing else.
    assert len(storage.list()) == len(HOSTILE) + 2 + 2


def _animated_webp(side: int) -> bytes:
    """A valid animated WebP: a side x side canvas and one 1 x 1 lossless frame."""
    still = bytes(pyvips.Image.black(1, 1, bands=3).webpsave_buffer(lossless=True, keep="none"))
    at = still.index(b"VP8L")
    vp8l = still[at:]

    def chunk(kind: bytes, data: bytes) -> bytes:
        return kind + len(data).to_bytes(4, "little") + data + b"\0" * (len(data) & 1)

    canvas = (side - 1).to_bytes(3, "little") * 2
    frame = b"\0" * 12 + (100).to_bytes(3, "little") + b"\0" + vp8l  # at 0,0, 1x1, 100 ms
    body = b"WEBP" + chunk(b"VP8X", b"\x02\0\0\0" + canvas) + chunk(b"ANIM", b"\0" * 6)
    body += chunk(b"ANMF", frame)
    return b"RIFF" + len(body).to_bytes(4, "little") + body


def test_an_image_libvips_decodes_through_a_temporary_file_is_read_in_the_sandbox(
    driver: Driver, live: Engine, storage: Storage, procs: Procs, landlock: int
) -> None:
    """libvips composites an animated WebP's frames on a canvas it cannot
    stream; over 100 MB of pixels (5,200 x 5,200 RGBA here) that canvas is a
    temporary file.  It went to /tmp, which the child's sandbox refuses, and
    the job failed as CORRUPT_INPUT; it is made in the attempt's scratch now."""
    data = _animated_webp(5_200)
    assert pyvips.Image.new_from_buffer(data, "").width == 5_200  # a valid file
    obj = storage.put(io.BytesIO(data), filename="banner.webp")
    thumb = live.enqueue(NewJob("image.thumbnail", object_id=obj["object_id"]))
    preview = live.enqueue(NewJob("image.preview", object_id=obj["object_id"]))
    _burst(procs)

    for job_id, size in ((thumb, (200, 200)), (preview, (1280, 1280))):
        row = wait_job(driver, job_id, timeout=5)
        assert row["status"] == "completed", (row["error_code"], row["safe_reason"])
        assert (row["result"]["width"], row["result"]["height"]) == size
        _peak_mb(driver, job_id)
    assert [p for p in (procs.home / "scratch").rglob("*") if p.is_file()] == []

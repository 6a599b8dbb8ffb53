"""image.thumbnail and image.preview end to end: a photo in the ledger, a real
``hypermedia worker --burst`` whose child runs libvips with an empty
environment and its memory limit, and the derived objects back in the ledger.
"""

from __future__ import annotations

import io
import os
import struct
import zlib
from typing import Any

import pytest

from hypermedia.db.driver import Driver

# Both: registry loads its built-ins only while it is empty (see the unit tests).
from hypermedia.pipelines import debug, image  # noqa: F401
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import NewJob
from hypermedia.storage.ledger import Storage
from tests.integration._procs import Procs, sqlite_only, tail, wait_job

IN_CI = os.environ.get("CI", "").lower() == "true"

try:
    import pyvips
except Exception as exc:  # ImportError, or OSError without libvips.so.42
    if IN_CI:
        raise
    pytest.skip(f"pyvips/libvips is not available ({exc})", allow_module_level=True)

pytestmark = [pytest.mark.timeout(120), sqlite_only]


def _photo(width: int, height: int, orientation: int = 1) -> bytes:
    """A JPEG gradient with EXIF (orientation) and XMP, as a camera would leave it."""
    xyz = pyvips.Image.xyz(width, height)
    red, green = xyz[0] * (255 / width), xyz[1] * (255 / height)
    img = red.bandjoin([green, green * 0 + 128]).cast("uchar").copy(interpretation="srgb")
    img.set_type(pyvips.GValue.gint_type, "orientation", orientation)
    img.set_type(pyvips.GValue.blob_type, "xmp-data", b"<x:xmpmeta>gps 48.85,2.35</x:xmpmeta>")
    return bytes(img.jpegsave_buffer(Q=85))


def _png_bomb(side: int = 12_000) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    z = zlib.compressobj(1)
    idat = b"".join(z.compress(bytes(side + 1)) for _ in range(side)) + z.flush()
    ihdr = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def _outputs(driver: Driver, job_id: int) -> list[dict[str, Any]]:
    with driver.read() as tx:
        return tx.outputs(job_id)


def _burst(procs: Procs) -> None:
    """Run ``hypermedia worker --burst`` on the images queue until it exits by itself."""
    args = ["--queues", "images", "--concurrency", "1", "--no-maintenance", "--burst"]
    proc = procs.spawn("worker", *args, name="worker")
    code = proc.wait(90)
    log = procs._procs[-1][1]
    assert code == 0, f"the worker exited with {code}:\n{tail(log)}"


def test_a_photo_gets_a_thumbnail_and_a_preview(
    driver: Driver, live: Engine, storage: Storage, procs: Procs
) -> None:
    data = _photo(2000, 1500, orientation=6)  # stored landscape, shown portrait
    src = storage.put(io.BytesIO(data), filename="IMG_0001.JPG")
    assert (src["mime_type"], src["width"], src["height"]) == ("image/jpeg", 2000, 1500)
    thumb = live.enqueue(NewJob("image.thumbnail", object_id=src["object_id"]))
    preview = live.enqueue(NewJob("image.preview", object_id=src["object_id"]))
    assert live.get(thumb)["queue_name"] == "images"
    assert live.get(thumb)["params"] == {
        "size": 256,
        "format": "webp",
        "quality": 80,
        "max_pixels": 100_000_000,
    }
    _burst(procs)

    for job_id, kind, profile, size in (
        (thumb, "thumb", "image-thumbnail:v1", (192, 256)),
        (preview, "preview", "image-preview:v1", (960, 1280)),
    ):
        row = wait_job(driver, job_id, timeout=5)
        assert row["status"] == "completed", (row["error_code"], row["safe_reason"])
        assert row["result"] == {
            "width": size[0],
            "height": size[1],
            "format": "webp",
            "bytes": row["result"]["bytes"],
        }
        (out,) = _outputs(driver, job_id)
        assert (out["output_type"], out["mime_type"]) == (kind, "image/webp")
        assert out["metadata"] == {"width": size[0], "height": size[1], "format": "webp"}
        assert out["profile_version"] == profile
        obj = storage.get(out["object_id"])
        assert obj["state"] == "ready"
        assert obj["storage_key"] == f"objects/{obj['object_id']}/{kind}.webp"
        assert obj["size"] == out["output_size_bytes"] == row["result"]["bytes"]
        with storage.open(obj["object_id"]) as f:
            stored = f.read()
        decoded = pyvips.Image.new_from_buffer(stored, "")
        assert (decoded.width, decoded.height) == size
        assert decoded.get("vips-loader") == "webpload_buffer"
        assert not {"exif-data", "xmp-data", "orientation"} & set(decoded.get_fields())
        assert b"gps 48.85" not in stored
    # The input is untouched and the scratch directory was emptied.
    with storage.open(src["object_id"]) as f:
        assert f.read() == data
    assert [p for p in (procs.home / "scratch").rglob("*") if p.is_file()] == []


def test_hostile_photos_fail_cleanly_and_the_worker_carries_on(
    driver: Driver, live: Engine, storage: Storage, procs: Procs
) -> None:
    good = _photo(800, 600)
    truncated = storage.put(io.BytesIO(good[: len(good) // 2]), filename="cut.jpg")
    bomb = storage.put(io.BytesIO(_png_bomb()), filename="bomb.png")
    noise = storage.put(io.BytesIO(b"\x00" + os.urandom(50_000)), filename="noise.jpg")
    ok = storage.put(io.BytesIO(good), filename="fine.jpg")
    expected = [
        ("image.thumbnail", truncated, "CORRUPT_INPUT", "invalid_input"),
        ("image.preview", bomb, "LIMIT_EXCEEDED", "invalid_input"),
        ("image.thumbnail", noise, "UNSUPPORTED_FORMAT", "unsupported_operation"),
    ]
    jobs = {
        live.enqueue(NewJob(job_type, object_id=obj["object_id"])): (code, category)
        for job_type, obj, code, category in expected
    }
    # Queued last, at the lowest priority: it runs after the hostile ones.
    after = live.enqueue(NewJob("image.thumbnail", object_id=ok["object_id"], priority=10))
    _burst(procs)

    for job_id, (code, category) in jobs.items():
        row = wait_job(driver, job_id, timeout=5)
        assert (row["status"], row["error_code"]) == ("failed", code), row["safe_reason"]
        assert row["category"] == category
        assert row["attempt_count"] == 1  # permanent: never retried
        assert "/" not in row["safe_reason"] and "vips" not in row["safe_reason"].lower()
        assert _outputs(driver, job_id) == []
    done = wait_job(driver, after, timeout=5)
    assert done["status"] == "completed", (done["error_code"], done["safe_reason"])
    assert (done["result"]["width"], done["result"]["height"]) == (256, 192)
    # Only the four inputs and the one thumbnail are in the ledger.
    assert len(storage.list()) == 5

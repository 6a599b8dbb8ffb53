"""storage.dedup_check on every database: exact duplicates by checksum, near
duplicates of images by dHash, hashes kept with their algorithm and version.

Most tests run the two halves as the worker does (the child's ``run`` on the
downloaded input, its result through JSON, then ``finish`` with the ledger);
the last one runs a real ``hypermedia worker --burst``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import re
from pathlib import Path
from typing import Any, cast

import pytest
import sqlalchemy as sa

from hypermedia.config import Settings
from hypermedia.db.driver import Driver
from hypermedia.db.schema_storage import object_hashes
from hypermedia.errors import ERROR_POLICY, JobError
from hypermedia.pipelines import dedup, registry
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import AttemptResult, Claimed, NewJob
from hypermedia.storage.ledger import Storage
from hypermedia.worker.transfer import complete, needs_completing
from tests.harness import claimed_input
from tests.integration._procs import Procs, sqlite_only, tail, wait_job

IN_CI = os.environ.get("CI", "").lower() == "true"

try:
    import pyvips
except Exception as exc:  # ImportError, or OSError without libvips.so.42
    if IN_CI:
        raise
    pytest.skip(f"pyvips/libvips is not available ({exc})", allow_module_level=True)

pytestmark = pytest.mark.timeout(120)

PROFILE = {"near": True, "max_distance": 8}


# -- media, made here ----------------------------------------------------------------


def _picture(seed: int, width: int = 1200, height: int = 900) -> Any:
    """Smooth colour blobs: a random 16 x 12 grid blown up with a cubic kernel."""
    rnd = random.Random(seed)
    grid = bytes(rnd.randrange(256) for _ in range(16 * 12 * 3))
    small = pyvips.Image.new_from_memory(grid, 16, 12, 3, "uchar")
    return small.copy(interpretation="srgb").resize(width / 16, vscale=height / 12, kernel="cubic")


def png(seed: int) -> bytes:
    return bytes(_picture(seed).pngsave_buffer())


def jpeg(seed: int, scale: float = 1.0, quality: int = 90) -> bytes:
    img = _picture(seed)
    if scale != 1.0:
        img = img.resize(scale)
    return bytes(img.jpegsave_buffer(Q=quality))


# -- running a check as the worker does ----------------------------------------------


def _claimed(obj: dict[str, Any], params: dict[str, Any]) -> Claimed:
    return cast(Claimed, claimed_input(obj, "storage.dedup_check", params))


def check(
    storage: Storage, obj: dict[str, Any], scratch: Path, **params: Any
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The child's run on the downloaded input, then finish: (result, outputs)."""
    values = dedup.DEDUP_CHECK.validate(params, PROFILE)
    path = scratch / f"input-{obj['object_id']}"
    path.unlink(missing_ok=True)
    storage.download(obj, path)
    ctx = registry.Context(str(scratch), lambda _: None, str(path))
    child = json.loads(json.dumps(dedup.DEDUP_CHECK.run(values, ctx)))  # as the frames carry it
    assert ctx.outputs == []  # the child declares nothing: finish does
    finish = dedup.DEDUP_CHECK.finish
    assert finish is not None
    fctx = registry.FinishContext(storage, _claimed(obj, values), child)
    return finish(fctx), fctx.outputs


def put(storage: Storage, data: bytes, project: str, name: str = "f") -> dict[str, Any]:
    return storage.put(io.BytesIO(data), filename=name, project_id=project)


def hashes(driver: Driver) -> list[dict[str, Any]]:
    with driver.read() as tx:
        q = sa.select(object_hashes).order_by(object_hashes.c.object_id)
        return [dict(r._mapping) for r in tx.conn.execute(q)]


# -- exact duplicates ----------------------------------------------------------------


def test_exact_duplicates_are_found_within_the_project_only(
    storage: Storage, driver: Driver, tmp_path: Path
) -> None:
    data = os.urandom(200_000)
    first = put(storage, data, "p1")
    copies = [put(storage, data, "p1")["object_id"] for _ in range(2)]
    put(storage, data, "p2")  # another project's copy is none of p1's business
    put(storage, os.urandom(200_000), "p1")  # other content
    gone = put(storage, data, "p1")
    with driver.tx() as tx:  # being deleted: not a duplicate any more
        assert tx.update_object(gone["object_id"], ["ready"], {"state": "deleting"})

    result, outputs = check(storage, first, tmp_path)
    assert result["exact"] == copies
    assert result["near"] == []
    assert (result["algorithm"], result["version"], result["hash"]) == (None, None, None)
    assert result["near_skipped"] == "not an image"
    assert result["truncated"] is False
    assert outputs == [
        {
            "output_type": "dedup_result",
            "mime_type": "application/json",
            "metadata": {
                "exact": copies,
                "near": [],
                "algorithm": None,
                "version": None,
                "truncated": False,
            },
            "path": None,
        }
    ]
    # Seen from a copy, the first is a duplicate too.
    again, _ = check(storage, storage.get(copies[1]), tmp_path)
    assert again["exact"] == [first["object_id"], copies[0]]
    assert hashes(driver) == []  # non-images get no perceptual hash


def test_objects_recorded_with_either_checksum_find_each_other(
    storage: Storage, driver: Driver, tmp_path: Path
) -> None:
    """An object stored when SHA-256 was the ledger's checksum is found from
    a new (BLAKE3) copy too: it was found only the other way round."""
    data = os.urandom(50_000)
    old, new = put(storage, data, "p1"), put(storage, data, "p1")
    sha = "sha256:" + hashlib.sha256(data).hexdigest()
    with driver.tx() as tx:
        assert tx.update_object(old["object_id"], ["ready"], {"checksum": sha})
    assert check(storage, new, tmp_path)[0]["exact"] == [old["object_id"]]
    assert check(storage, storage.get(old["object_id"]), tmp_path)[0]["exact"] == [new["object_id"]]


# -- near duplicates -----------------------------------------------------------------


def test_near_duplicates_of_a_changed_image_within_max_distance(
    storage: Storage, driver: Driver, tmp_path: Path
) -> None:
    original = put(storage, png(1), "p1", "original.png")
    smaller = put(storage, jpeg(1, scale=0.25, quality=10), "p1", "small.jpg")
    other = put(storage, png(2), "p1", "other.png")
    elsewhere = put(storage, png(1), "p2", "original.png")  # same picture, other project

    first, _ = check(storage, original, tmp_path)
    assert first["near"] == [] and first["exact"] == []  # nothing else hashed yet
    check(storage, elsewhere, tmp_path)
    second, _ = check(storage, smaller, tmp_path)
    (near,) = second["near"]
    assert near["object_id"] == original["object_id"]
    assert 0 <= near["distance"] <= PROFILE["max_distance"]
    assert second["exact"] == []
    third, _ = check(storage, other, tmp_path)
    assert third["near"] == []
    assert dedup.distance(first["hash"], third["hash"]) > PROFILE["max_distance"]

    # Checked again, the original now sees the resized copy (and never the other project).
    again, outputs = check(storage, original, tmp_path)
    assert again["near"] == [{"object_id": smaller["object_id"], "distance": near["distance"]}]
    assert outputs[0]["metadata"]["near"] == again["near"]
    # A job may ask for a tighter distance (or none at all).
    if near["distance"] > 0:
        strict, _ = check(storage, original, tmp_path, max_distance=near["distance"] - 1)
        assert strict["near"] == []
    off, _ = check(storage, smaller, tmp_path, near=False)
    assert (off["near"], off["hash"], off["algorithm"]) == ([], None, None)
    assert off["near_skipped"] == "near duplicates were not asked for"


def test_a_jpeg_at_another_quality_is_a_near_duplicate(storage: Storage, tmp_path: Path) -> None:
    a = put(storage, jpeg(5, quality=95), "p1", "a.jpg")
    b = put(storage, jpeg(5, quality=30), "p1", "b.jpg")
    check(storage, a, tmp_path)
    result, _ = check(storage, b, tmp_path)
    assert [n["object_id"] for n in result["near"]] == [a["object_id"]]
    assert result["exact"] == []


# The pixels to store so that turning them by EXIF orientation N gives the picture.
_STORED_AS = {
    1: lambda im: im,
    2: lambda im: im.fliphor(),
    3: lambda im: im.rot180(),
    4: lambda im: im.flipver(),
    5: lambda im: im.rot90().fliphor(),
    6: lambda im: im.rot270(),
    7: lambda im: im.rot270().fliphor(),
    8: lambda im: im.rot90(),
}


def test_a_copy_stored_sideways_with_its_exif_orientation_hashes_alike(tmp_path: Path) -> None:
    """A phone's photo is stored sideways with an orientation tag: shrunk to
    9 x 8 before it was turned upright, it hashed up to 10 bits away from the
    same picture stored upright (the same pixels once turned)."""
    b = pyvips.Image.perlin(1200, 900, cell_size=128, seed=1)
    g = pyvips.Image.perlin(1200, 900, cell_size=64, seed=7)
    r = pyvips.Image.perlin(1200, 900, cell_size=200, seed=3)
    picture = ((b.bandjoin([g, r]) + 1) * 127.5).cast("uchar").copy(interpretation="srgb")
    upright = tmp_path / "upright.png"
    picture.pngsave(str(upright))
    want = dedup.dhash(pyvips, str(upright), 10**8)
    for orientation, store in _STORED_AS.items():
        stored = store(picture).copy()
        stored.set_type(pyvips.GValue.gint_type, "orientation", orientation)
        path = tmp_path / f"o{orientation}.png"
        stored.pngsave(str(path))
        assert dedup.dhash(pyvips, str(path), 10**8) == want, orientation


def test_pictures_with_little_structure_are_not_near_duplicates(
    storage: Storage, driver: Driver, tmp_path: Path
) -> None:
    """A white page, a black one and a dark-to-light gradient all hashed to
    zeros, a shaded blank page too, and a page with a small logo two bits
    from them: near duplicates of one another."""
    white = pyvips.Image.black(640, 480).new_from_image([255, 255, 255]).copy(interpretation="srgb")
    black = pyvips.Image.black(640, 480, bands=3).copy(interpretation="srgb")
    ramp = (pyvips.Image.xyz(640, 480)[0] * (255 / 639)).cast("uchar")
    shaded = (pyvips.Image.xyz(1200, 1600)[0] * (30 / 1199) + 225).cast("uchar")
    logo = white.draw_rect([255, 0, 0], 40, 40, 160, 80, fill=True)
    wide = pyvips.Image.black(640, 480).new_from_image([0]).cast("ushort")
    made = {
        "white.png": bytes(white.pngsave_buffer()),
        "black.jpg": bytes(black.jpegsave_buffer(Q=40)),
        "grey16.png": bytes((wide + 30000).cast("ushort").pngsave_buffer()),
        "ramp.png": bytes(ramp.pngsave_buffer()),
        "shaded.png": bytes(shaded.pngsave_buffer()),
        "logo.png": bytes(logo.pngsave_buffer()),
    }
    objs = {name: put(storage, data, "p1", name) for name, data in made.items()}
    results = {name: check(storage, obj, tmp_path)[0] for name, obj in objs.items()}
    for name, r in results.items():
        assert (r["hash"], r["algorithm"], r["near"]) == (None, None, []), name
        assert r["near_skipped"] == dedup.UNIFORM
    assert hashes(driver) == []
    # What an earlier version stored for such a picture: gone once checked again.
    with driver.tx() as tx:
        for name in ("white.png", "logo.png"):
            tx.store_object_hash(
                {
                    "object_id": objs[name]["object_id"],
                    "algorithm": dedup.ALGORITHM,
                    "version": dedup.version(pyvips),
                    "hash": "0" * 15 + "1",
                    "project_id": "p1",
                }
            )
    check(storage, objs["white.png"], tmp_path)
    assert [h["object_id"] for h in hashes(driver)] == [objs["logo.png"]["object_id"]]
    # A picture with structure still hashes, and finds its copy.
    photo = put(storage, png(3), "p1", "photo.png")
    copy = put(storage, jpeg(3, scale=0.5), "p1", "copy.jpg")
    check(storage, photo, tmp_path)
    found, _ = check(storage, copy, tmp_path)
    assert [n["object_id"] for n in found["near"]] == [photo["object_id"]]


def test_an_exact_duplicate_is_not_listed_again_as_near(storage: Storage, tmp_path: Path) -> None:
    data = png(3)
    a, b = put(storage, data, "p1"), put(storage, data, "p1")
    check(storage, a, tmp_path)
    result, _ = check(storage, b, tmp_path)
    assert (result["exact"], result["near"]) == ([a["object_id"]], [])


# -- stored hashes -------------------------------------------------------------------


def test_hashes_are_stored_with_algorithm_and_version_and_checks_repeat(
    storage: Storage, driver: Driver, tmp_path: Path
) -> None:
    obj = put(storage, png(4), "p9")
    first, _ = check(storage, obj, tmp_path)
    libvips = ".".join(str(pyvips.version(i)) for i in range(3))
    assert first["algorithm"] == "dhash64"
    assert first["version"] == f"dhash64/pyvips-{libvips}/2"
    assert re.fullmatch(r"[0-9a-f]{16}", first["hash"])
    (row,) = hashes(driver)
    assert {k: row[k] for k in ("object_id", "algorithm", "version", "hash", "project_id")} == {
        "object_id": obj["object_id"],
        "algorithm": "dhash64",
        "version": first["version"],
        "hash": first["hash"],
        "project_id": "p9",
    }
    # Idempotent: the same answer, still one row.
    second, _ = check(storage, obj, tmp_path)
    assert second == first
    assert len(hashes(driver)) == 1


def test_hashes_of_another_version_are_not_compared(
    storage: Storage, driver: Driver, tmp_path: Path
) -> None:
    a, b = put(storage, png(6), "p1"), put(storage, jpeg(6, quality=50), "p1")
    mine, _ = check(storage, a, tmp_path)
    with driver.tx() as tx:  # b hashed by an older libvips, with the very same bits
        tx.store_object_hash(
            {
                "object_id": b["object_id"],
                "algorithm": "dhash64",
                "version": "dhash64/pyvips-8.0.0/1",
                "hash": mine["hash"],
                "project_id": "p1",
            }
        )
    again, _ = check(storage, a, tmp_path)
    assert again["near"] == []


def test_a_damaged_image_still_gets_its_exact_duplicates(
    storage: Storage, driver: Driver, tmp_path: Path
) -> None:
    data = jpeg(7)
    cut = data[: len(data) // 3]
    a, b = put(storage, cut, "p1"), put(storage, cut, "p1")
    result, _ = check(storage, a, tmp_path)
    assert result["exact"] == [b["object_id"]]
    assert result["hash"] is None and result["near_skipped"]
    assert "/" not in result["near_skipped"]
    assert hashes(driver) == []


def test_an_hevc_heic_is_said_undecodable_here_not_damaged(
    storage: Storage, tmp_path: Path
) -> None:
    """As a thumbnail of it says (UNSUPPORTED_FORMAT), not "damaged or truncated"."""
    from tests.unit.test_image_pipeline import heic_or_skip

    src = tmp_path / "photo.heic"
    heic_or_skip(src)
    obj = put(storage, src.read_bytes(), "p1")
    result, _ = check(storage, obj, tmp_path)
    if result["hash"] is None:  # this libvips has no HEVC decoder
        assert result["near_skipped"] == "HEVC-coded HEIF images cannot be decoded on this server"


# -- failures ------------------------------------------------------------------------


def _finish_with(storage: Storage, obj: dict[str, Any], child: dict[str, Any]) -> JobError:
    finish = dedup.DEDUP_CHECK.finish
    assert finish is not None
    values = dedup.DEDUP_CHECK.validate({}, PROFILE)
    with pytest.raises(JobError) as err:
        finish(registry.FinishContext(storage, _claimed(obj, values), child))
    return err.value


def test_a_forged_child_result_is_refused(storage: Storage) -> None:
    obj = put(storage, b"abc", "p1")
    good = {"checksum": obj["checksum"], "hash": "0123456789abcdef", "algorithm": "dhash64"}
    for child in (
        {},
        {"checksum": "x' OR 1=1"},
        {"checksum": obj["checksum"].removeprefix("blake3:")},  # untagged
        {"checksum": "md5:" + "0" * 64},
        {**good, "version": "dhash64/pyvips-8.18.7/1", "hash": "zz"},
        {**good, "version": "'; DROP TABLE objects"},
        {**good, "version": "dhash64/pyvips-8.18.7/1", "algorithm": "md5"},
        {**good, "hash": None, "checksums": "blake3:" + "0" * 64},
        {**good, "hash": None, "checksums": [obj["checksum"], "blake3:" + "0" * 64]},
    ):
        assert _finish_with(storage, obj, child).code == "INVALID_OUTPUT"
    other = _finish_with(storage, obj, {"checksum": "blake3:" + "0" * 64})
    assert other.code == "CORRUPT_INPUT"


def _down(tmp_path: Path) -> Storage:
    """A ledger whose database does not answer (nothing listens on port 9)."""
    return Storage(Driver("postgresql://nobody@127.0.0.1:9/none"), Settings(home=tmp_path))


def test_the_database_down_in_finish_is_retryable(storage: Storage, tmp_path: Path) -> None:
    obj = put(storage, b"abc", "p1")
    child = {"checksum": obj["checksum"], "hash": None}
    bad = _down(tmp_path)
    try:
        err = _finish_with(bad, obj, child)
    finally:
        bad.db.dispose()
    assert err.code == "STORAGE_UNAVAILABLE"
    assert ERROR_POLICY[err.code].retryable
    assert "nobody" not in err.reason and "127.0.0.1" not in err.reason


@pytest.fixture
def exploding() -> Any:
    """A job type whose finish breaks with a bare exception (a bug, say)."""

    def boom(ctx: registry.FinishContext) -> dict[str, Any]:
        raise RuntimeError("bug")

    p = registry.register(
        registry.Pipeline("test.finish_boom", "bulk", lambda p, s: p, lambda p, c: {}, finish=boom)
    )
    yield p
    registry._REGISTRY.pop(p.job_type, None)


@sqlite_only
def test_a_failing_finish_fails_the_attempt_not_the_slot(
    storage: Storage, tmp_path: Path, exploding: Any
) -> None:
    obj = put(storage, b"abc", "p1")
    down = _down(tmp_path)
    result = {"checksum": obj["checksum"], "hash": None}
    for job_type, code in (
        ("storage.dedup_check", "STORAGE_UNAVAILABLE"),
        (exploding.job_type, "INTERNAL"),
    ):
        job = _claimed(obj, dedup.DEDUP_CHECK.validate({}, PROFILE))
        job.job_type = job_type
        assert needs_completing(job_type, [])
        done = AttemptResult(job.job_id, job.attempt, "completed", result=dict(result))
        res = complete(down, job, done, [], tmp_path)
        assert (res.status, res.code, res.result, res.outputs) == ("failed", code, None, [])
        assert ERROR_POLICY[code].retryable
    down.db.dispose()


# -- through a real worker -----------------------------------------------------------


@sqlite_only
def test_a_worker_checks_objects_end_to_end(
    driver: Driver, live: Engine, storage: Storage, procs: Procs
) -> None:
    original = put(storage, png(11), "proj", "original.png")
    copy = put(storage, png(11), "proj", "copy.png")
    resized = put(storage, jpeg(11, scale=0.5, quality=60), "proj", "resized.jpg")
    put(storage, png(11), "elsewhere", "theirs.png")
    document = put(storage, b"%PDF-1.4 not really\n" * 100, "proj", "doc.pdf")
    # Hashed in order (priority): the original first, the resized copy last.
    jobs = [
        live.enqueue(
            NewJob(
                "storage.dedup_check",
                profile="dedup-check",
                project_id="proj",
                object_id=obj["object_id"],
                priority=i + 1,
            )
        )
        for i, obj in enumerate([original, document, resized])
    ]
    args = ["--queues", "bulk", "--concurrency", "1", "--no-maintenance", "--burst"]
    proc = procs.spawn("worker", *args, name="worker")
    assert proc.wait(90) == 0, tail(procs._procs[-1][1])

    rows = [wait_job(driver, j, timeout=5) for j in jobs]
    for row in rows:
        assert row["status"] == "completed", (row["error_code"], row["safe_reason"])
    first, doc, last = (r["result"] for r in rows)
    assert first["exact"] == [copy["object_id"]]
    assert first["near"] == []  # nothing else hashed yet
    assert first["algorithm"] == "dhash64"
    assert (doc["exact"], doc["near"], doc["algorithm"]) == ([], [], None)
    assert last["exact"] == []
    assert [n["object_id"] for n in last["near"]] == [original["object_id"]]
    assert last["near"][0]["distance"] <= 8
    with driver.read() as tx:
        (out,) = tx.outputs(jobs[2])
    assert (out["output_type"], out["object_id"]) == ("dedup_result", None)
    assert out["metadata"]["near"] == last["near"]
    assert out["profile_version"] == "dedup-check:v1"
    stored = {r["object_id"]: r for r in hashes(driver)}
    assert set(stored) == {original["object_id"], resized["object_id"]}
    assert {r["version"] for r in stored.values()} == {first["version"]}

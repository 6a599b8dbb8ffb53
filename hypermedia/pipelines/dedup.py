"""storage.dedup_check: exact and near duplicates of an object within its project.

Two halves, because the child that reads the file has no database:

* ``run`` (the child) hashes the input: its checksum (BLAKE3, as the ledger
  records new objects: storage/checksum.py) and, for images when ``near`` is
  on, a 64-bit perceptual dHash.
* ``finish`` (the worker, see ``registry.FinishContext``) stores the dHash in
  ``object_hashes`` (idempotent: a retried attempt inserts nothing twice),
  lists the project's other ``ready`` objects with the same
  ``objects.checksum`` (exact duplicates; the child hashes with BLAKE3 and
  SHA-256, so an object recorded with either matches one recorded with the
  other, whichever is checked), and the project's
  images whose dHash of the same algorithm and version is within
  ``max_distance`` bits (near duplicates; an exact duplicate is not listed
  again as a near one).

The project is the input object's.  The result is
``{"exact": [ids], "near": [{"object_id", "distance"}], "algorithm",
"version", "hash", "near_skipped", "truncated"}`` and the same lists are
recorded as a data output ``dedup_result``.

dHash (difference hash), as computed here: the image is decoded by libvips
with the same allow-listed loaders and pixel cap as image.thumbnail, turned
upright by its EXIF orientation (shrunk to fit 256 x 256 on the way), then
shrunk to exactly 9 x 8 pixels (aspect
ratio ignored), flattened on white if it has alpha, turned grey; bit
``8*y + x`` (most significant first) is 1 when pixel (x, y) is brighter than
pixel (x + 1, y).  Resizing and re-encoding move few bits; another picture
differs in about half of them.  A hash is stored with its algorithm
(``dhash64``) and version (``dhash64/pyvips-<libvips version>/2``): hashes
compare only within one version, since another libvips may shrink a little
differently.  Non-images, images that cannot be decoded safely, and
pictures with too little structure from left to right (every bit a tie, or
at most FEW_BITS bits set or unset: a blank or shaded page, a flat colour, a
gradient) get no perceptual hash; their exact duplicates are still found.

Near duplicates are found by reading the project's hashes and counting bits
in Python: one pass over the project per check, fine for tens of thousands of
images; past that, an index (BK-tree, banded hashes) is the next step.
"""

from __future__ import annotations

import importlib.util
import re
from typing import Any

from hypermedia.errors import JobError
from hypermedia.pipelines import image, imaging
from hypermedia.pipelines import schema as S
from hypermedia.pipelines.registry import Context, FinishContext, Pipeline, register
from hypermedia.storage import checksum as cs
from hypermedia.storage.sniff import HEAD_BYTES, media_type

ALGORITHM = "dhash64"
# Bump when the way the hash is computed here changes.  2: shrunk upright
# (1 shrank before turning, and EXIF-rotated copies hashed apart).
FORMAT_VERSION = 2
UPRIGHT_SIDE = 256  # the box of the first, upright shrink
_LEVEL = {"uchar": 1.0, "ushort": 257.0}  # one 8-bit level in the pixel format's range
UNIFORM = (
    "the picture has too little structure from left to right (a blank or shaded page, "
    "a flat colour, a gradient): a perceptual hash cannot tell it apart"
)
# A hash with at most this many bits set (or unset) is a picture brightening
# (or darkening) steadily from left to right, or nearly: any two such hashes
# are within 8 bits, so a shaded blank page, a page with a small logo and a
# black-to-white gradient were near duplicates at the default max_distance.
FEW_BITS = 4
MAX_LISTED = 1000  # per list in a result; "truncated" says when there were more

SCHEMA: S.Schema = {
    "near": S.Field(bool, True, doc="also look for near duplicates of images (perceptual hash)"),
    "max_distance": S.Field(
        int, 8, 0, 64, doc="the most bits two 64-bit dHashes may differ by to count as near"
    ),
    "max_pixels": S.Field(
        int,
        image.DEFAULT_MAX_PIXELS,
        1,
        1_000_000_000,
        overridable=False,
        doc="images over this many pixels are not decoded (no perceptual hash)",
    ),
}

_CHECKSUM = re.compile(rf"({'|'.join(cs.ALGORITHMS)}):[0-9a-f]{{64}}")
_HASH = re.compile(r"[0-9a-f]{16}")
_VERSION = re.compile(r"dhash64/pyvips-\d{1,4}\.\d{1,4}\.\d{1,4}/\d{1,4}")


# -- the child -------------------------------------------------------------------------


def version(vips: Any) -> str:
    libvips = ".".join(str(vips.version(i)) for i in range(3))
    return f"{ALGORITHM}/pyvips-{libvips}/{FORMAT_VERSION}"


def dhash(vips: Any, path: str, max_pixels: int) -> str | None:
    """The 64-bit dHash of the image at ``path`` as 16 hex digits (see the
    module doc), or None for a picture too uniform to hash."""
    header = image._check_input(vips, path, max_pixels)
    try:
        # Upright first, small last: shrunk straight to 9 x 8, the picture was
        # sampled as stored and turned after, so a copy stored sideways with an
        # EXIF orientation (as phones do) hashed up to 10 bits away from the
        # upright one.  The first shrink (on load: a JPEG's is cheap) stays
        # large enough for its sampling not to show in the second.
        upright = vips.Image.thumbnail(path, UPRIGHT_SIDE, height=UPRIGHT_SIDE, fail_on="error")
        small = upright.thumbnail_image(9, height=8, size="force")
        if small.hasalpha():
            white = 65535 if small.format == "ushort" else 255
            small = small.flatten(background=[white] * (small.bands - 1))
        grey = small.colourspace("b-w").extract_band(0).cast("double")
        raw = grey.write_to_memory()
    except vips.Error as exc:  # read as the thumbnails read it: an HEVC HEIC is not "damaged"
        raise imaging.failure(exc, header) from None
    pixels = memoryview(raw).cast("d")
    if grey.width != 9 or grey.height != 8 or len(pixels) != 72:
        raise JobError("CORRUPT_INPUT", "the image could not be reduced for hashing")
    # Every neighbour within a level (of 255) of the next: each bit is a tie
    # or noise, and the hash all zeros, so a white page, a black one and a
    # dark-to-light gradient were near duplicates of one another at distance 0.
    tie = _LEVEL.get(small.format, 1 / 255) * 1.5
    if all(abs(pixels[i] - pixels[i + 1]) <= tie for i in range(72) if i % 9 != 8):
        return None
    bits = 0
    for y in range(8):
        row = pixels[9 * y : 9 * y + 9]
        for x in range(8):
            bits = (bits << 1) | (row[x] > row[x + 1])
    if min(bits.bit_count(), 64 - bits.bit_count()) <= FEW_BITS:
        return None
    return f"{bits:016x}"


def _checksums(path: str) -> tuple[list[str], int, bytes]:
    """The input's checksum in every algorithm the ledger has recorded
    (BLAKE3 now, SHA-256 before): an object stored before BLAKE3 became the
    default is found from a new one, not only the other way round."""
    digests = [(a, cs.new(a)) for a in cs.ALGORITHMS]
    size, head = 0, b""
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                if not size:
                    head = chunk[:HEAD_BYTES]
                for _, digest in digests:
                    digest.update(chunk)
                size += len(chunk)
    except OSError:
        raise JobError("CORRUPT_INPUT", "the input file could not be read") from None
    return [cs.tagged(a, d.hexdigest()) for a, d in digests], size, head


def _run(params: dict[str, Any], ctx: Context) -> dict[str, Any]:
    if ctx.input_path is None:
        raise JobError("INVALID_PARAMS", "storage.dedup_check needs an input object")
    ctx.progress(5, "hashing the content")
    checksums, size, head = _checksums(ctx.input_path)
    out: dict[str, Any] = {
        "checksum": checksums[0],
        "checksums": checksums,
        "size": size,
        "algorithm": None,
        "version": None,
        "hash": None,
        "near_skipped": None,
    }
    if not params.get("near", True):
        out["near_skipped"] = "near duplicates were not asked for"
    elif media_type(head) not in image.ACCEPTED:
        out["near_skipped"] = "not an image"
    else:
        ctx.progress(40, "perceptual hash")
        vips = image._pyvips()  # DEPENDENCY_FAILED (retryable) without libvips
        imaging.temp_in(ctx.scratch)
        try:
            max_pixels = int(params.get("max_pixels", image.DEFAULT_MAX_PIXELS))
            out["hash"] = dhash(vips, ctx.input_path, max_pixels)
            if out["hash"] is None:
                out["near_skipped"] = UNIFORM
            else:
                out["algorithm"], out["version"] = ALGORITHM, version(vips)
        except JobError as exc:  # a damaged or oversized image: exact duplicates only
            out["near_skipped"] = exc.reason
    ctx.progress(90, "hashed")
    return out


# -- the worker ------------------------------------------------------------------------


def _checked(result: dict[str, Any]) -> dict[str, Any]:
    """The child's result, checked: a child that decoded a hostile file is not trusted."""
    bad = JobError("INVALID_OUTPUT", "the duplicate check produced a malformed result")
    if not isinstance(result, dict) or not _CHECKSUM.fullmatch(str(result.get("checksum", ""))):
        raise bad
    digest = result.get("hash")
    if digest is not None and not (
        _HASH.fullmatch(str(digest))
        and result.get("algorithm") == ALGORITHM
        and _VERSION.fullmatch(str(result.get("version", "")))
    ):
        raise bad
    sums = result.get("checksums", [result["checksum"]])
    if not isinstance(sums, list) or not all(_CHECKSUM.fullmatch(str(c)) for c in sums):
        raise bad
    by_algorithm = {cs.algorithm_of(c): c for c in [*sums, result["checksum"]]}
    if len(by_algorithm) != len(set(sums) | {result["checksum"]}):  # two of one kind
        raise bad
    skipped = result.get("near_skipped")
    return {
        "checksum": result["checksum"],
        "checksums": by_algorithm,
        "hash": digest,
        "algorithm": result.get("algorithm") if digest else None,
        "version": result.get("version") if digest else None,
        "near_skipped": str(skipped)[:200] if skipped is not None else None,
    }


def distance(a: str, b: str) -> int:
    return (int(a, 16) ^ int(b, 16)).bit_count()


def _finish(ctx: FinishContext) -> dict[str, Any]:
    import sqlalchemy as sa  # the worker only: the child never loads the database

    job = ctx.job
    if job.object_id is None:
        raise JobError("INVALID_PARAMS", "storage.dedup_check needs an input object")
    mine = _checked(ctx.result)
    max_distance = int(job.params.get("max_distance", 8))
    try:
        # The hash is stored in a short write transaction, and the project's
        # hashes read after its commit in a read-only one: on SQLite a write
        # transaction holds the database's one writer lock, which every claim
        # and result of every worker waits for while it lasts.  Of two near
        # duplicates checked at once, the later commit still sees the other.
        with ctx.storage.db.tx() as tx:
            obj = tx.object(job.object_id)
            if obj is None or obj["state"] != "ready":
                raise JobError("CORRUPT_INPUT", "the input object is no longer available")
            # Checked against the input's own checksum, in its algorithm (the
            # worker verified the bytes it fetched too).
            recorded = obj["checksum"]
            if mine["checksums"].get(cs.algorithm_of(recorded), recorded) != recorded:
                raise JobError("CORRUPT_INPUT", "the input does not match its checksum")
            project = obj["project_id"]
            if mine["near_skipped"] == UNIFORM:
                # What an earlier check stored for it (zeros, or nearly)
                # matched every such picture: gone once it is checked again.
                tx.drop_object_hashes(job.object_id, ALGORITHM)
            elif mine["hash"] is not None:
                tx.store_object_hash(
                    {
                        "object_id": job.object_id,
                        "algorithm": mine["algorithm"],
                        "version": mine["version"],
                        "hash": mine["hash"],
                        "project_id": project,
                    }
                )
        with ctx.storage.db.read() as tx:
            sums = {obj["checksum"], *mine["checksums"].values()}
            exact = tx.same_checksum(project, sums, job.object_id, MAX_LISTED + 1)
            others: list[tuple[int, str]] = []
            if mine["hash"] is not None:
                others = tx.project_hashes(
                    project, mine["algorithm"], mine["version"], job.object_id
                )
    except sa.exc.SQLAlchemyError:
        raise JobError(
            "STORAGE_UNAVAILABLE", "the ledger could not be reached to look for duplicates"
        ) from None
    exact_set = set(exact)
    near: list[dict[str, int]] = []
    if mine["hash"] is not None:
        for object_id, other in others:
            if object_id in exact_set or not _HASH.fullmatch(other):
                continue
            d = distance(mine["hash"], other)
            if d <= max_distance:
                near.append({"object_id": object_id, "distance": d})
        near.sort(key=lambda n: (n["distance"], n["object_id"]))
    truncated = len(exact) > MAX_LISTED or len(near) > MAX_LISTED
    found = {
        "exact": exact[:MAX_LISTED],
        "near": near[:MAX_LISTED],
        "algorithm": mine["algorithm"],
        "version": mine["version"],
    }
    ctx.output("dedup_result", "application/json", {**found, "truncated": truncated})
    return {
        **found,
        "hash": mine["hash"],
        "near_skipped": mine["near_skipped"],
        "truncated": truncated,
    }


def _available() -> str | None:
    # Found, not imported: importing would start libvips in the worker itself.
    if importlib.util.find_spec("pyvips") is None:
        return "pyvips is not installed (needed for the perceptual hash of images)"
    return None


DEDUP_CHECK = register(
    Pipeline(
        "storage.dedup_check",
        "bulk",
        S.validator(SCHEMA),
        _run,
        schema=SCHEMA,
        available=_available,
        doc="exact (checksum) and near (perceptual dHash) duplicates within the project",
        finish=_finish,
        default_profile="dedup-check",
        needs_input=True,
    )
)

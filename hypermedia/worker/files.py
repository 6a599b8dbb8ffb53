"""Moving a job's input into its scratch directory and its output files out.

This runs in the worker, not the child: the child never sees storage
credentials, and a hostile file that takes over its child cannot reach the
store.  What the child names as an output must be a regular file inside its
scratch directory; anything else (a symlink, ``..``, an absolute path) fails
the attempt instead of leaking a file of the worker's host.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from hypermedia.errors import JobError, NotFound
from hypermedia.queue.models import Claimed, Output
from hypermedia.storage.base import BlobMissing, ChecksumMismatch, ChecksumMissing, StorageError
from hypermedia.storage.ledger import Storage

INPUT_NAME = "input"
_ROLE_CHARS = re.compile(r"[^a-z0-9_-]+")


def fetch_input(
    storage: Storage, job: Claimed, scratch: Path, prefix: str = "", *, link: bool = False
) -> str | None:
    """Download the job's input object into scratch as ``{prefix}input.{ext}``;
    return that file name."""
    if job.object_id is None or not job.input_key:
        return None
    ext = job.input_key.rsplit(".", 1)[-1] if "." in job.input_key.rsplit("/", 1)[-1] else "bin"
    name = f"{prefix}{INPUT_NAME}.{ext}"
    try:
        row = job.input_object  # read (ready) with the claim
        if row is None:
            try:
                row = storage.get(job.object_id)
            except NotFound:  # collected since: a retry of a long-finished job
                raise JobError("CORRUPT_INPUT", "the input object no longer exists") from None
            if row["state"] != "ready":
                raise JobError("CORRUPT_INPUT", "the input object is no longer available")
        # With ``link``, a hard link where the pool is local: only for a
        # child that Landlock keeps from writing it (see Slot.inbox), or a
        # write through the link would change the stored original.
        storage.download(row, scratch / name, link=link)
    except ChecksumMissing:  # a legacy row: the bytes may be fine, they cannot be checked
        raise JobError(
            "CORRUPT_INPUT", "the input object has no checksum to verify its bytes against"
        ) from None
    except ChecksumMismatch:
        raise JobError("CORRUPT_INPUT", "the stored input does not match its checksum") from None
    except BlobMissing:
        raise JobError("CORRUPT_INPUT", "the input object's bytes are missing") from None
    except StorageError as exc:
        raise JobError("STORAGE_UNAVAILABLE", f"could not read the input: {exc}") from None
    except OSError as exc:
        raise JobError("STORAGE_UNAVAILABLE", f"scratch space: {exc.strerror}") from None
    return name


def store_outputs(
    storage: Storage, job: Claimed, scratch: Path, declared: list[dict[str, Any]]
) -> list[Output]:
    """Turn what the child declared into Outputs, uploading declared files as pending objects."""
    outputs = []
    pool_id: int | None = job.pool_id
    for o in declared:
        path = o.pop("path", None)
        out = Output(**o)
        if path:
            file = inside(scratch, path)
            if pool_id is None:
                pool_id = storage.pool()["pool_id"]
            try:
                # Not fsynced here, off the slot's way: the flusher syncs every
                # output of a batch at once before the transaction that makes
                # them ready (Storage.make_durable).  The file is the worker's
                # own (out of scratch, removed afterwards): a local pool takes it.
                obj = storage.add_output(
                    pool_id,
                    _role(out.output_type),
                    file,
                    out.mime_type,
                    job.project_id,
                    durable=False,
                    move=True,
                )
            except StorageError as exc:
                raise JobError("STORAGE_UNAVAILABLE", f"could not store an output: {exc}") from None
            out.object_id = obj["object_id"]
            out.output_key = obj["storage_key"]
            out.output_size_bytes = obj["size"]
            out.checksum = obj["checksum"]
            out.width, out.height = obj["width"], obj["height"]
        outputs.append(out)
    return outputs


def inside(scratch: Path, name: str) -> Path:
    """The regular file ``name`` inside ``scratch`` (a directory of the
    worker's own); INVALID_OUTPUT for anything that is not, or leads out."""
    if name and "/" not in name and name not in (".", ".."):
        # A plain file name (what pipelines declare): nothing on the way to
        # resolve, so one lstat tells it all (a symlink is no regular file).
        return _regular(scratch / name)
    root = scratch.resolve()
    lexical = root / os.path.normpath(name)
    outside = JobError(
        "INVALID_OUTPUT", "the pipeline named an output outside its scratch directory"
    )
    if os.path.isabs(name) or not lexical.is_relative_to(root) or lexical == root:
        raise outside
    _regular(lexical)
    # A symlinked directory on the way could still lead out.
    if not lexical.resolve().is_relative_to(root):
        raise outside
    return lexical


def _regular(path: Path) -> Path:
    try:
        st = os.lstat(path)
    except OSError:
        raise JobError(
            "INVALID_OUTPUT", "the pipeline named an output file that does not exist"
        ) from None
    if not stat.S_ISREG(st.st_mode):
        raise JobError("INVALID_OUTPUT", "a pipeline output must be a regular file")
    return path


def _role(output_type: str) -> str:
    role = _ROLE_CHARS.sub("-", output_type.lower()).strip("-_")[:30]
    return role if role and role[0].isalpha() else f"out-{role}"[:30]


MAX_RESULT_BYTES = 256 * 1024


def storable(result: Any, declared: list[dict[str, Any]]) -> tuple[Any, list[dict[str, Any]]]:
    """A result and output metadata the database can store, or INVALID_OUTPUT.

    The child's frames are strict JSON (no NaN, no bytes), but a megabyte of
    text still reaches us, and so does what finish steps add in the worker;
    stored as they are, the settling transaction would fail every time and
    the job would never end.  NUL characters (text read from a hostile file
    can hold them; PostgreSQL stores them in no text or JSON value) become
    U+FFFD.
    """
    try:
        dumped = [json.dumps(result, allow_nan=False)]
        dumped += [json.dumps(o.get("metadata") or {}, allow_nan=False) for o in declared]
    except (TypeError, ValueError):
        raise JobError(
            "INVALID_OUTPUT", "the pipeline returned a result that is not plain JSON"
        ) from None
    if sum(map(len, dumped)) > MAX_RESULT_BYTES:
        raise JobError("INVALID_OUTPUT", "the pipeline returned a result over 256 KiB")
    if any("\\u0000" in d for d in dumped):
        result = _scrub(result)
        declared = [{**o, "metadata": _scrub(o.get("metadata"))} for o in declared]
    return result, declared


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {_scrub(k): _scrub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    return value

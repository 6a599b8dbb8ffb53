"""Plain values passed between the engine, workers and interfaces."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from hypermedia.config import DEFAULT_PROJECT
from hypermedia.errors import InvalidRequest
from hypermedia.parse import storable

QUEUE_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,49}")
# A job's params are settings, not data (inputs are objects): every claim reads
# them, and the worker hands them to the child, so their size is bounded.
MAX_PARAMS_BYTES = 64 * 1024
MAX_TIMEOUT_SECONDS = 7 * 86400


# A worker's queue list that stands for every queue (cli ``--queues '*'``).
EVERY_QUEUE = "*"


def check_queue_name(name: str) -> str:
    """The one rule for queue names, wherever one is given (job, profile, pause)."""
    if not QUEUE_NAME.fullmatch(name):
        raise InvalidRequest(
            "a queue name has 1 to 50 characters: lower-case letters, digits, '.', '_', '-'"
        )
    return name


def check_project_id(project_id: str) -> str:
    """The one rule for project ids, wherever one is given (job, token, budget)."""
    if not project_id or len(project_id) > 64 or not project_id.isprintable():
        raise InvalidRequest("a project id is 1 to 64 printable characters")
    return project_id


UNSTORABLE = "{what} must not hold NUL characters or lone surrogates (\\ud800-\\udfff)"


def check_params(params: dict[str, Any]) -> dict[str, Any]:
    try:
        size = len(json.dumps(params, separators=(",", ":"), allow_nan=False).encode())
    except (TypeError, ValueError):
        raise InvalidRequest("params must be plain JSON") from None
    if size > MAX_PARAMS_BYTES:
        raise InvalidRequest(f"params take at most {MAX_PARAMS_BYTES // 1024} KiB as JSON")
    if not storable(params):
        raise InvalidRequest(UNSTORABLE.format(what="params"))
    return params


def check_idempotency_key(key: str) -> str:
    # ASCII: an HTTP header carries bytes, which arrive as Latin-1 ('é' as 'Ã©').
    if not 1 <= len(key) <= 255 or not (key.isascii() and key.isprintable()):
        raise InvalidRequest("an Idempotency-Key has 1 to 255 printable ASCII characters")
    return key


@dataclass
class NewJob:
    job_type: str
    params: dict[str, Any] = field(default_factory=dict)
    profile: str | None = None  # "key" (newest active) or "key:vN"
    queue: str | None = None
    priority: int = 5
    max_attempts: int = 3
    timeout_seconds: int | None = None
    project_id: str = DEFAULT_PROJECT
    owner_id: str = "system"
    idempotency_key: str | None = None
    object_id: int | None = None
    pool_id: int | None = None
    input_key: str = ""
    input_size_bytes: int = 0
    run_at: datetime | None = None
    hold: bool = False  # stay 'created' until released
    created_by: str | None = None


@dataclass
class Claimed:
    """A job a worker now holds: enough to run it and to report on it."""

    job_id: int
    job_uuid: str
    job_type: str
    queue_name: str
    priority: int
    params: dict[str, Any]
    attempt: int
    max_attempts: int
    timeout_seconds: int
    memory_limit_mb: int | None
    profile_id: int
    project_id: str
    object_id: int | None = None
    pool_id: int | None = None
    input_key: str = ""
    input_size_bytes: int = 0
    # The input object's row (pool_id, storage_key, checksum) as the claim read
    # it, when it was ready then: the worker fetches the input without a read
    # transaction of its own.  None: look it up (and refuse it if not ready).
    input_object: dict[str, Any] | None = None


@dataclass
class Output:
    output_type: str
    mime_type: str
    metadata: dict[str, Any] = field(default_factory=dict)
    profile_version: str = ""  # filled in by the engine from the job's profile
    object_id: int | None = None
    output_key: str = ""
    output_size_bytes: int = 0
    # "blake3:…" (storage/checksum.py) of the stored blob: written on the object when the job
    # completes (the object stays pending, without size or checksum, till then).
    checksum: str = ""
    # The blob's dimensions as sniffed when it was stored (0: not an image), for the object.
    width: int = 0
    height: int = 0


@dataclass
class AttemptResult:
    """What happened to one attempt, as the worker (or the reaper) saw it.

    ``status`` is an attempt status: completed, failed, timeout, crashed,
    cancelled or orphaned.
    """

    job_id: int
    attempt: int
    status: str
    code: str | None = None
    message: str = ""
    result: dict[str, Any] | None = None
    outputs: list[Output] = field(default_factory=list)
    actual_credits: int | None = None
    duration_ms: int | None = None
    peak_memory_mb: int | None = None
    cpu_time_ms: int | None = None
    worker_id: str | None = None  # set by the reaper for jobs of other workers
    # Who the event names, when not the worker: the reaper, for an attempt it
    # abandoned (the dead worker did not end it).
    actor: str | None = None

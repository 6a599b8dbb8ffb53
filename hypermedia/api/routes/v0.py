"""``/v0/processing-jobs``: seed 001's ProcessingJob API over our jobs.

A ProcessingJob is exactly the seed's fields; each maps onto a column of
``processing_jobs`` (the mapping itself is in ``hypermedia.queue.legacy``):

* ``id`` is ``job_uuid``; ``file_id`` is ``object_id`` (our objects have
  integer ids, so ``file_id`` is an integer, not a uuid).
* ``job_type`` uses the seed's names: thumbnail_generation → image.thumbnail,
  document_preview → pdf.preview, compression → image.compress, virus_scan →
  security.virus_scan, deduplication_check → storage.dedup_check,
  video_thumbnail → video.thumbnail (no such pipeline ships: creating one is a
  422).  Jobs of other types (debug.*, image.preview…) are not part of this
  view: they are not listed and answer 404.
* ``status`` is ``states.LEGACY_STATUS``: pending = created, queued,
  retry_wait, claimed, paused; running = processing, cancel_requested (but
  pending for a cancel asked before the attempt started: running ⇒
  started_at, as the seed holds).
* ``priority``: the seed's is "higher = more important", 0 by default; ours is
  1 (highest) … 10 (lowest), 5 by default.  ours = 5 - seed, clamped to 1..10,
  so seed 4 and above are our 1, -5 and below our 10; seed = 5 - ours.
* ``input_data`` is ``params``; ``result_data`` is ``result``;
  ``error_message`` is the last error's safe reason (null for a cancel).
* ``max_retries`` = max_attempts - 1 and ``retry_count`` = attempts made - 1:
  both count the attempts after the first, so retry_count ≤ max_retries.
* ``metadata`` is the audit metadata object: created_at, updated_at,
  deleted_at, created_by, updated_by, deleted_by.

Seed methods: ``cancel`` and the retry that ``can_retry``/``increment_retry``
imply are endpoints (a retry is allowed from failed or cancelled, else 409);
``mark_started``/``mark_completed``/``mark_failed`` are the workers' business.
Scopes: jobs:write creates, cancels and retries; jobs:read lists and reads.
Another project's job is a 404.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator

from hypermedia.api.deps import Whole, may_change, repeated_for, scoped, services, shown
from hypermedia.api.paging import decode_cursor, page
from hypermedia.api.strict_json import StrictJSONRoute
from hypermedia.auth.tokens import Principal
from hypermedia.errors import InvalidRequest, NotFound, StaleTransition
from hypermedia.pipelines import registry
from hypermedia.queue.legacy import our_job_type, processing_job, to_priority
from hypermedia.queue.models import NewJob
from hypermedia.queue.states import LEGACY_STATUS, legacy_status
from hypermedia.services import Services

router = APIRouter(
    prefix="/v0/processing-jobs", tags=["v0 (seed 001)"], route_class=StrictJSONRoute
)

Row = dict[str, Any]
SeedJobType = Literal[
    "thumbnail_generation",
    "video_thumbnail",
    "document_preview",
    "compression",
    "virus_scan",
    "deduplication_check",
]
SeedStatus = Literal["pending", "running", "completed", "failed", "cancelled"]
Uuid = str


_DIGITS = re.compile(r"-?[0-9]{1,20}")


class ProcessingJobCreate(BaseModel):
    # Lax, as seed-001 clients were served ("file_id": "12" and 12.0 are 12),
    # except for booleans: `"file_id": true` made a job on object 1.
    model_config = ConfigDict(extra="forbid")

    file_id: int = Field(..., ge=1, le=2**62, description="the input object's id")
    job_type: SeedJobType
    priority: int = Field(0, ge=-1000, le=1000, description="higher = more important")
    input_data: dict[str, Any] | None = None
    max_retries: int = Field(3, ge=1, le=99)

    @field_validator("file_id", "priority", "max_retries", mode="before")
    @classmethod
    def _no_boolean(cls, value: object) -> object:
        if isinstance(value, bool):
            raise ValueError("a boolean is not a number")
        # Digits only, as the list's ?file_id= takes: int() reads "1_0" as 10
        # and " 1 " as 1 (QA: a job was made on object 10).
        if isinstance(value, str) and not _DIGITS.fullmatch(value):
            raise ValueError("a number is written in ASCII digits")
        return value


def _seed_job(row: Row, principal: Principal) -> Row:
    return processing_job(shown(row, principal, "params"))


@router.post("", status_code=201, summary="Create a processing job")
def create(
    body: ProcessingJobCreate,
    request: Request,
    idempotency_key: str | None = Header(None, max_length=255),
    principal: Principal = scoped("jobs:write"),
) -> Row:
    svc = services(request)
    if our_job_type(body.job_type) not in registry.known():
        # Said in the seed's words: "unknown job type 'video.thumbnail'"
        # named a type this client never sent.
        raise InvalidRequest(
            f"job_type {body.job_type!r} is not served here: no pipeline for it is installed"
        )
    job_id = svc.engine.enqueue(
        NewJob(
            job_type=our_job_type(body.job_type),
            params=body.input_data or {},
            priority=to_priority(body.priority),
            max_attempts=body.max_retries + 1,
            project_id=principal.project_id,
            owner_id=principal.actor,
            created_by=principal.actor,
            idempotency_key=idempotency_key,
            object_id=body.file_id,
        )
    )
    return _seed_job(repeated_for(svc.engine.get(job_id), principal), principal)


@router.get("", summary="List processing jobs, newest first")
def list_jobs(
    request: Request,
    status: SeedStatus | None = Query(None),
    job_type: SeedJobType | None = Query(None),
    file_id: Annotated[Whole | None, Query(ge=1, le=2**62)] = None,
    limit: Annotated[Whole, Query(ge=1, le=500)] = 50,
    cursor: str | None = Query(None, max_length=40),
    principal: Principal = scoped("jobs:read"),
) -> Row:
    rows = services(request).legacy.list(
        principal.project_id,
        status=status,
        job_type=job_type,
        file_id=file_id,
        before_id=decode_cursor(cursor, tag="v0") if cursor else None,
        limit=limit + 1,
    )
    return page(rows, limit, "job_id", lambda row: _seed_job(row, principal), tag="v0")


@router.get("/{job_id}", summary="One processing job")
def show(job_id: Uuid, request: Request, principal: Principal = scoped("jobs:read")) -> Row:
    svc = services(request)
    return _seed_job(svc.legacy.find(job_id, principal.project_id), principal)


@router.post("/{job_id}/cancel", summary="Cancel a job (a running one is stopped within 2 s)")
def cancel(job_id: Uuid, request: Request, principal: Principal = scoped("jobs:write")) -> Row:
    svc = services(request)
    row = _changeable(svc, job_id, principal)
    with _named_by(row["job_uuid"], row["started_at"]):
        svc.engine.cancel(row["job_id"], actor=principal.actor)
    return _changed(svc, job_id, principal)


@router.post("/{job_id}/retry", summary="Run a failed or cancelled job again")
def retry(job_id: Uuid, request: Request, principal: Principal = scoped("jobs:write")) -> Row:
    svc = services(request)
    row = _changeable(svc, job_id, principal)
    with _named_by(row["job_uuid"], row["started_at"]):
        svc.engine.retry(row["job_id"], actor=principal.actor)
    return _changed(svc, job_id, principal)


def _changeable(svc: Services, job_id: str, principal: Principal) -> Row:
    """The job, if ``principal`` may change it (``may_change``, as on /v1: a
    jobs:write token cancelled, retried and read its project's other jobs here)."""
    row = svc.legacy.find(job_id, principal.project_id)
    if not may_change(row, principal):
        raise NotFound(f"processing job {row['job_uuid']} not found")
    return row


def _changed(svc: Services, job_id: str, principal: Principal) -> Row:
    """The job, or to a token without ``jobs:read`` only its id and status."""
    job = _seed_job(svc.legacy.find(job_id, principal.project_id), principal)
    return job if principal.allows("jobs:read") else {"id": job["id"], "status": job["status"]}


@contextmanager
def _named_by(job_id: object, started_at: object) -> Iterator[None]:
    """A refusal names the job and its status as the /v0 client knows them
    (its uuid, a seed status), not the internal id and status it never sees."""
    try:
        yield
    except StaleTransition as exc:
        # As GET shows it (legacy.seed_status): the row's started_at, read
        # just before, with the status the refusal found.
        status = exc.status
        if status in LEGACY_STATUS:
            status = legacy_status(status, started_at)
        raise StaleTransition(exc.job_id, exc.action, status, shown=str(job_id)) from None

"""``/v1/jobs``: create (idempotent), list, show, cancel, retry, events and SSE."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Annotated, Any

import anyio
import anyio.to_thread
from fastapi import APIRouter, Header, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from hypermedia.api.deps import (
    Id,
    Whole,
    check_may_run,
    may_change,
    owned,
    repeated_for,
    scoped,
    services,
    shown,
)
from hypermedia.api.paging import decode_cursor, page
from hypermedia.api.strict_json import StrictJSONRoute, is_head
from hypermedia.auth.tokens import Principal
from hypermedia.db.dialects import is_transient
from hypermedia.errors import InvalidRequest, NotFound
from hypermedia.parse import ascii_int
from hypermedia.queue.models import NewJob
from hypermedia.queue.states import STATUSES, TERMINAL
from hypermedia.redact import brief
from hypermedia.services import Services

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], route_class=StrictJSONRoute)
log = logging.getLogger(__name__)

Row = dict[str, Any]
# What a job row shows of itself; storage keys and soft-delete columns stay inside.
_HIDDEN = {"input_key", "pool_id", "deleted_at", "deleted_by"}
# Nor an output's key: the objects API, which names none, is how it is fetched.
_OUTPUT_HIDDEN = {"output_key", "deleted_at", "deleted_by"}
# Job types and queue names: plain lower-case names (a NUL byte would reach the driver).
NAME = r"^[a-z0-9_.-]+$"
SSE_POLL_SECONDS = 0.25
SSE_KEEPALIVE_SECONDS = 15.0
# How often an open stream checks its token again: a revoked or expired one
# ends it (it streamed on until its job ended, up to the 7-day timeout).
SSE_RECHECK_SECONDS = 5.0
# Threads the streams' polls may hold at once, in one API process: blocked on
# a database that stopped answering, 40 streams held every thread of the
# pool the other routes run in, and /healthz hung with them.
SSE_THREADS = 8
# While the database is away a stream polls less often, up to this.
SSE_AWAY_MAX_SECONDS = 5.0

_AWAY = object()  # a read the database could not answer this time


class _StreamReads:
    """A stream's database reads: in threads of the streams' own limiter, and
    a transient failure (a restart, a dropped connection) said once and then
    ridden out, as `jobs tail` does, instead of cutting the body short with
    two tracebacks."""

    def __init__(self, request: Request, job_id: int) -> None:
        state = request.app.state
        if getattr(state, "stream_threads", None) is None:  # made inside the loop
            state.stream_threads = anyio.CapacityLimiter(SSE_THREADS)
        self.limiter: anyio.CapacityLimiter = state.stream_threads
        self.job_id = job_id
        self.delay = 0.0

    async def __call__(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            got = await anyio.to_thread.run_sync(fn, *args, limiter=self.limiter)
        except Exception as exc:
            if not is_transient(exc):
                raise
            if not self.delay:
                log.warning(
                    "job %s: event stream waits for the database: %s", self.job_id, brief(exc)
                )
            self.delay = min(max(self.delay * 2, SSE_POLL_SECONDS), SSE_AWAY_MAX_SECONDS)
            await asyncio.sleep(self.delay)
            return _AWAY
        self.delay = 0.0
        return got


class JobCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    job_type: str | None = Field(None, min_length=1, max_length=50, examples=["image.thumbnail"])
    profile: str | None = Field(
        # A key has up to 100 characters, a version up to ":v" and 9 digits.
        None,
        min_length=1,
        max_length=111,
        description="`key` (newest active) or `key:vN`",
    )
    object_id: int | None = Field(None, ge=1, le=2**62, description="the input object")
    params: dict[str, Any] = Field(default_factory=dict)
    priority: int = Field(5, ge=1, le=10, description="1 highest … 10 lowest")
    queue: str | None = Field(None, min_length=1, max_length=50)
    max_attempts: int = Field(3, ge=1, le=100)
    timeout_seconds: int | None = Field(None, ge=1, le=7 * 86400)


def public_job(row: Row, principal: Principal) -> Row:
    job = {k: v for k, v in shown(row, principal, "params").items() if k not in _HIDDEN}
    if "outputs" in job:
        job["outputs"] = [
            {k: v for k, v in o.items() if k not in _OUTPUT_HIDDEN} for o in job["outputs"]
        ]
    return job


def _new_job(svc: Services, body: JobCreate, principal: Principal, key: str | None) -> NewJob:
    job_type = body.job_type
    if job_type is None:
        if body.profile is None:
            raise InvalidRequest("give job_type, profile, or both")
        try:
            job_type = str(svc.profiles.show(body.profile)["job_type"])
        except NotFound as exc:
            # Fix: a profile that cannot be used is a bad request (422) whether
            # or not job_type is given, as an unknown object is; not a 404,
            # which says the job (the resource asked for) does not exist.
            raise InvalidRequest(str(exc)) from None
    check_may_run(principal, job_type)
    return NewJob(
        job_type=job_type,
        params=body.params,
        profile=body.profile,
        queue=body.queue,
        priority=body.priority,
        max_attempts=body.max_attempts,
        timeout_seconds=body.timeout_seconds,
        project_id=principal.project_id,
        owner_id=principal.actor,
        created_by=principal.actor,
        idempotency_key=key,
        object_id=body.object_id,
    )


def check_owner(svc: Services, job_id: int, principal: Principal) -> Row:
    """The job's own row; NotFound unless it is the principal's project's (no
    attempts or events read)."""
    job = svc.engine.row(job_id)
    owned(job, principal, "job", job_id)
    return job


def check_changeable(svc: Services, job_id: int, principal: Principal) -> Row:
    """``check_owner`` for a change (cancel, retry): see ``may_change``."""
    job = check_owner(svc, job_id, principal)
    if not may_change(job, principal):
        raise NotFound(f"job {job_id} not found")
    return job


def changed_job(svc: Services, job_id: int, principal: Principal) -> Row:
    """What a change answers: the job, or to a token without ``jobs:read``
    only its id and status (the job itself is not this token's to read)."""
    if principal.allows("jobs:read"):
        return public_job(owned_job(svc, job_id, principal), principal)
    return {"job_id": job_id, "status": svc.engine.row(job_id)["status"]}


def owned_job(svc: Services, job_id: int, principal: Principal) -> Row:
    """The job with its attempts, outputs and events, if it is the principal's project's."""
    return svc.engine.get(job_id, project_id=principal.project_id)


@router.post("", status_code=201, summary="Create a job")
def create_job(
    body: JobCreate,
    request: Request,
    idempotency_key: str | None = Header(
        None,
        max_length=255,
        description="same key + same body returns the first job; a different body is a 422",
    ),
    principal: Principal = scoped("jobs:write"),
) -> Row:
    svc = services(request)
    job_id = svc.engine.enqueue(_new_job(svc, body, principal, idempotency_key))
    return public_job(repeated_for(owned_job(svc, job_id, principal), principal), principal)


@router.get("", summary="List jobs, newest first")
def list_jobs(
    request: Request,
    status: str | None = Query(None, max_length=20, description=", ".join(STATUSES)),
    job_type: str | None = Query(None, max_length=50, pattern=NAME),
    queue: str | None = Query(None, max_length=50, pattern=NAME),
    limit: Annotated[Whole, Query(ge=1, le=500)] = 50,
    cursor: str | None = Query(None, max_length=40),
    principal: Principal = scoped("jobs:read"),
) -> Row:
    rows = services(request).engine.list(
        status=status,
        job_type=job_type,
        queue=queue,
        project_id=principal.project_id,
        before_id=decode_cursor(cursor) if cursor else None,
        limit=limit + 1,
    )
    return page(rows, limit, "job_id", lambda row: public_job(row, principal))


@router.get("/{job_id}", summary="A job with its attempts, outputs, progress and events")
def show_job(job_id: Id, request: Request, principal: Principal = scoped("jobs:read")) -> Row:
    return public_job(owned_job(services(request), job_id, principal), principal)


@router.post("/{job_id}/cancel", summary="Cancel a job (a running one is stopped within 2 s)")
def cancel_job(job_id: Id, request: Request, principal: Principal = scoped("jobs:write")) -> Row:
    svc = services(request)
    check_changeable(svc, job_id, principal)
    svc.engine.cancel(job_id, actor=principal.actor)
    return changed_job(svc, job_id, principal)


@router.post("/{job_id}/retry", summary="Run a failed or cancelled job again, as a new attempt")
def retry_job(job_id: Id, request: Request, principal: Principal = scoped("jobs:write")) -> Row:
    svc = services(request)
    check_may_run(principal, check_changeable(svc, job_id, principal)["job_type"])
    svc.engine.retry(job_id, actor=principal.actor)
    return changed_job(svc, job_id, principal)


@router.get(
    "/{job_id}/events",
    summary="A job's events: JSON, or a Server-Sent Events stream",
    description=(
        "With `Accept: text/event-stream` the answer is a stream: one SSE message per "
        "state change and progress report, in order, each with its event id; it ends "
        "after the job's terminal event. Reconnect with `Last-Event-ID` to resume."
    ),
)
async def job_events(
    job_id: Id,
    request: Request,
    after: Annotated[
        Whole, Query(ge=0, le=2**62, description="only events after this event id")
    ] = 0,
    last_event_id: str | None = Header(None),
    principal: Principal = scoped("jobs:read"),
) -> Any:
    svc = services(request)
    await run_in_threadpool(check_owner, svc, job_id, principal)
    if not wants_stream(request.headers.get("accept", "")):
        _, events = await run_in_threadpool(svc.engine.events_since, job_id, after)
        return {"items": events}
    if is_head(request):  # headers only: no stream opened (each is counted)
        return sse_head()
    return sse_response(svc, request, principal, job_id, after, last_event_id)


SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_head() -> Response:
    """A HEAD of an event stream: the stream's headers, without a length
    (the stream's GET has none: it is sent in chunks)."""
    head = Response(media_type="text/event-stream", headers=SSE_HEADERS)
    del head.headers["content-length"]
    return head


def sse_response(
    svc: Services,
    request: Request,
    principal: Principal,
    job_id: int,
    after: int,
    last_event_id: str | None,
) -> StreamingResponse:
    """The job's events as a stream, resuming after ``Last-Event-ID`` if given."""
    # Anything but a plain id is ignored, as browsers expect: a 422 would
    # stop an EventSource reconnecting.
    resume = ascii_int(last_event_id)
    if resume is not None:
        after = max(after, resume)
    streams = request.app.state.streams
    streams.open(principal.token_id)
    return _CountedStream(
        event_stream(svc, request, principal, job_id, after),
        media_type="text/event-stream",
        headers=dict(SSE_HEADERS),
        release=lambda: streams.close(principal.token_id),
    )


class _CountedStream(StreamingResponse):
    """Counted as open until it is sent, however that ends (the client gone
    before the first byte included, when the body is never iterated)."""

    def __init__(self, *args: Any, release: Callable[[], None], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


def wants_stream(accept: str) -> bool:
    """Whether ``Accept`` asks for text/event-stream, with a quality above 0
    (``text/event-stream;q=0`` is a refusal of it, RFC 9110 §12.4.2)."""
    for item in accept.split(","):
        kind, *params = (p.strip() for p in item.split(";"))
        if kind.lower() != "text/event-stream":
            continue
        q = next((p[2:].strip() for p in params if p.lower().startswith("q=")), "1")
        try:
            return float(q) > 0
        except ValueError:
            return False
    return False


def sse_message(row: Row) -> str:
    # Encoded as the JSON answers are (ISO 8601 times with a "T").
    data = json.dumps(jsonable_encoder(row), sort_keys=True)
    return f"id: {row['event_id']}\nevent: {row['kind']}\ndata: {data}\n\n"


async def event_stream(
    svc: Services, request: Request, principal: Principal, job_id: int, after: int
) -> Any:
    loop = asyncio.get_running_loop()
    quiet_since = checked_at = loop.time()
    read = _StreamReads(request, job_id)
    yield "retry: 1000\n\n"
    while not request.app.state.stopping and not await request.is_disconnected():
        if loop.time() - checked_at > SSE_RECHECK_SECONDS:
            valid = await read(svc.tokens.still_valid, principal)
            if valid is _AWAY:
                continue
            if not valid:
                yield f"event: end\ndata: {json.dumps({'status': 'unauthorized'})}\n\n"
                return
            checked_at = loop.time()
        got = await read(svc.engine.events_since, job_id, after)
        if got is _AWAY:
            if loop.time() - quiet_since > SSE_KEEPALIVE_SECONDS:
                yield ": keep-alive\n\n"
                quiet_since = loop.time()
            continue
        status, rows = got
        for row in rows:
            yield sse_message(row)
            after = row["event_id"]
        if status in TERMINAL:
            yield f"event: end\ndata: {json.dumps({'status': status})}\n\n"
            return
        if rows:
            quiet_since = loop.time()
        elif loop.time() - quiet_since > SSE_KEEPALIVE_SECONDS:
            yield ": keep-alive\n\n"
            quiet_since = loop.time()
        await asyncio.sleep(SSE_POLL_SECONDS)

"""The dashboard at ``/ui``: server-rendered pages over the same use cases as the API.

The plumbing (templates, the login check, error pages, the Origin check) is in
``web``; every page shows only the token's project.
"""

from __future__ import annotations

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import RedirectResponse
from starlette.concurrency import run_in_threadpool
from starlette.routing import Match

from hypermedia.api.deps import COOKIE, Id, authenticate, may_submit, services, shown
from hypermedia.api.routes.jobs import check_owner, owned_job, public_job, sse_response
from hypermedia.api.routes.objects import receive_upload
from hypermedia.auth.tokens import Principal
from hypermedia.errors import HypermediaError, InvalidRequest, NotFound, Unauthorized
from hypermedia.pipelines import registry
from hypermedia.queue.models import NewJob
from hypermedia.queue.states import STATUSES, TERMINAL
from hypermedia.services import Services
from hypermedia.ui.web import (
    STATIC,
    Row,
    UiRoute,
    clear_legacy_cookie,
    error_page,
    login_required,
    need,
    page,
    safe_next,
)

router = APIRouter(prefix="/ui", include_in_schema=False, route_class=UiRoute)
# Outside /ui: what browsers ask of any site (the favicon).
root = APIRouter(include_in_schema=False, route_class=UiRoute)
PAGE_SIZE = 50


# -- static files, login, logout ------------------------------------------------------


@router.get("/static/{name}")
async def static(name: str) -> Response:
    found = STATIC.get(name)
    if found is None:
        raise NotFound("no such file")
    body, media_type = found
    return Response(
        body,
        media_type=media_type,
        headers={"Cache-Control": "public, max-age=300", "X-Content-Type-Options": "nosniff"},
    )


@root.get("/favicon.ico")
@router.get("/favicon.ico")
async def favicon() -> Response:
    """No icon (the pages name an empty one): a 204 rather than a JSON 404."""
    return Response(status_code=204, headers={"Cache-Control": "public, max-age=86400"})


@router.get("/login")
async def login_form(request: Request, next: str = Query("/ui", max_length=500)) -> Response:
    return page(request, "login.html", title="Log in", next=safe_next(next), error=None)


@router.post("/login")
async def login(request: Request) -> Response:
    form = await request.form(max_files=0, max_fields=5)
    token = str(form.get("token") or "").strip()
    target = safe_next(str(form.get("next") or "/ui"))
    svc = services(request)
    try:
        if not token or len(token) > 200:
            raise Unauthorized("no token")
        # A session of its own: the cookie never holds the token.
        secret = await run_in_threadpool(
            svc.tokens.start_session, token, svc.settings.session_hours
        )
    except Unauthorized:
        return page(
            request,
            "login.html",
            401,
            title="Log in",
            next=target,
            error="That token is not valid: unknown, expired or revoked.",
        )
    previous = request.cookies.get(COOKIE)
    if previous:  # logging in again ends the session this browser had
        await run_in_threadpool(svc.tokens.end_session, previous)
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        COOKIE,
        secret,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    clear_legacy_cookie(request, response)
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    secret = request.cookies.get(COOKIE)
    if secret:  # revoked on the server: a copy of the cookie stops working too
        await run_in_threadpool(services(request).tokens.end_session, secret)
    response = RedirectResponse("/ui/login", status_code=303)
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    clear_legacy_cookie(request, response)
    return response


# -- overview ---------------------------------------------------------------------------


@router.get("")
@router.get("/")
async def overview(request: Request) -> Response:
    principal = await login_required(request)
    need(principal, "jobs:read")
    svc = services(request)
    queues = await run_in_threadpool(_queue_summary, svc, principal.project_id)
    failures = await run_in_threadpool(svc.engine.recent_failures, principal.project_id)
    totals = {
        k: sum(int(q.get(k) or 0) for q in queues)
        for k in ("queued", "running", "retry_wait", "completed_1h", "failed_1h")
    }
    return page(
        request,
        "overview.html",
        title="Overview",
        nav="overview",
        queues=queues,
        totals=totals,
        failures=failures,
    )


def _queue_summary(svc: Services, project_id: str) -> list[Row]:
    return list(svc.queues.summary(project_id=project_id))


# -- jobs -------------------------------------------------------------------------------


def _blank(value: str | None) -> str | None:
    value = (value or "").strip()
    return value or None


@router.get("/jobs")
async def jobs_page(
    request: Request,
    status: str | None = Query(None, max_length=20),
    job_type: str | None = Query(None, max_length=50),
    queue: str | None = Query(None, max_length=50),
    before: int | None = Query(None, ge=1, le=2**62),
) -> Response:
    principal = await login_required(request)
    need(principal, "jobs:read")
    status, job_type, queue = _blank(status), _blank(job_type), _blank(queue)
    if status is not None and status not in STATUSES:
        raise InvalidRequest(f"status must be one of {', '.join(STATUSES)}")
    svc = services(request)
    rows = await run_in_threadpool(
        lambda: svc.engine.list(
            project_id=principal.project_id,
            status=status,
            job_type=job_type,
            queue=queue,
            before_id=before,
            limit=PAGE_SIZE + 1,
        )
    )
    more = len(rows) > PAGE_SIZE
    rows = rows[:PAGE_SIZE]
    filters = {"status": status or "", "job_type": job_type or "", "queue": queue or ""}
    return page(
        request,
        "jobs.html",
        title="Jobs",
        nav="jobs",
        jobs=rows,
        filters=filters,
        statuses=STATUSES,
        job_types=registry.known(),
        older={**filters, "before": rows[-1]["job_id"]} if more else None,
        first_page=before is None,
    )


def _job_view(svc: Services, job_id: int, principal: Principal, base_url: str) -> Row:
    job = public_job(owned_job(svc, job_id, principal), principal)
    outputs = []
    for out in job["outputs"]:
        url = None
        if out.get("object_id") is not None:
            try:
                url = svc.storage.signed_url(int(out["object_id"]), base_url=base_url)
            except HypermediaError:
                url = None
        outputs.append({**out, "url": url, "image": str(out["mime_type"]).startswith("image/")})
    source = None
    if job.get("object_id") is not None:
        try:
            obj = svc.storage.get(int(job["object_id"]))
            if obj.get("project_id") == principal.project_id:
                source = obj
        except NotFound:
            source = None
    return {"job": job, "outputs": outputs, "source": source}


@router.get("/jobs/{job_id}")
async def job_page(request: Request, job_id: Id) -> Response:
    principal = await login_required(request)
    need(principal, "jobs:read")
    svc = services(request)
    base_url = str(request.base_url).rstrip("/")
    view = await run_in_threadpool(_job_view, svc, job_id, principal, base_url)
    job = view["job"]
    last_event = max((int(e["event_id"]) for e in job["events"]), default=0)
    writable = principal.allows("jobs:write")
    status = job["status"]
    return page(
        request,
        "job.html",
        title=f"Job {job_id}",
        nav="jobs",
        terminal=status in TERMINAL,
        stream_url=f"/ui/jobs/{job_id}/stream?after={last_event}",
        can_cancel=writable and status not in TERMINAL and status != "cancel_requested",
        can_retry=writable and bool(job.get("can_retry")),
        **view,
    )


@router.get("/jobs/{job_id}/stream")
async def job_stream(
    request: Request,
    job_id: Id,
    after: int = Query(0, ge=0, le=2**62),
    last_event_id: str | None = Header(None, max_length=20),
) -> Response:
    principal = await authenticate(request, cookie=True)
    need(principal, "jobs:read")
    svc = services(request)
    await run_in_threadpool(check_owner, svc, job_id, principal)
    return sse_response(svc, request, principal, job_id, after, last_event_id)


@router.post("/jobs/{job_id}/cancel")
async def cancel(request: Request, job_id: Id) -> Response:
    principal = await login_required(request)
    need(principal, "jobs:write")
    svc = services(request)
    await run_in_threadpool(check_owner, svc, job_id, principal)
    await run_in_threadpool(svc.engine.cancel, job_id, principal.actor)
    return RedirectResponse(f"/ui/jobs/{job_id}", status_code=303)


@router.post("/jobs/{job_id}/retry")
async def retry(request: Request, job_id: Id) -> Response:
    principal = await login_required(request)
    need(principal, "jobs:write")
    svc = services(request)
    await run_in_threadpool(check_owner, svc, job_id, principal)
    await run_in_threadpool(svc.engine.retry, job_id, principal.actor)
    return RedirectResponse(f"/ui/jobs/{job_id}", status_code=303)


# -- upload -----------------------------------------------------------------------------


def upload_profiles(svc: Services, principal: Principal) -> list[Row]:
    """Active profiles whose pipeline can run here and this token may use."""
    rows = [p for p in svc.profiles.list() if p.get("is_active")]
    ready = registry.readiness(rows)
    return [p for p in rows if ready[p["ref"]] is None and may_submit(principal, p["job_type"])]


@router.get("/upload")
async def upload_form(request: Request) -> Response:
    principal = await login_required(request)
    need(principal, "objects:write")
    need(principal, "jobs:write")
    profiles = await run_in_threadpool(upload_profiles, services(request), principal)
    # Preselected: what image-thumbnail means, its newest version (listed last).
    thumbs = [p["ref"] for p in profiles if p["profile_key"] == "image-thumbnail"]
    return page(
        request,
        "upload.html",
        title="Upload",
        nav="upload",
        profiles=profiles,
        chosen=thumbs[-1] if thumbs else None,
    )


@router.post("/upload")
async def upload(request: Request) -> Response:
    principal = await login_required(request)
    need(principal, "objects:write")
    need(principal, "jobs:write")
    svc = services(request)
    # The API's receiver: the file part streamed to a temp file, counted
    # against the upload limit as it arrives (413), never spooled elsewhere.
    async with receive_upload(request, svc.settings, frozenset({"profile"})) as received:
        if not received.filename:
            raise InvalidRequest("choose a file to upload")
        profiles = await run_in_threadpool(upload_profiles, svc, principal)
        ref = received.fields.get("profile", "")
        chosen = next((p for p in profiles if p["ref"] == ref), None)
        if chosen is None:
            raise InvalidRequest("choose one of the listed profiles")
        obj = await run_in_threadpool(
            lambda: svc.storage.put_file(
                received.path, filename=received.filename, project_id=principal.project_id
            )
        )
    job_id = await run_in_threadpool(
        svc.engine.enqueue,
        NewJob(
            job_type=str(chosen["job_type"]),
            profile=str(chosen["ref"]),
            object_id=int(obj["object_id"]),
            project_id=principal.project_id,
            owner_id=principal.actor,
            created_by=principal.actor,
        ),
    )
    return RedirectResponse(f"/ui/jobs/{job_id}", status_code=303)


# -- workers and profiles -----------------------------------------------------------------


@router.get("/workers")
async def workers_page(request: Request) -> Response:
    principal = await login_required(request)
    need(principal, "admin")  # the fleet is instance-wide, as in /v1/workers
    svc = services(request)
    workers = await run_in_threadpool(lambda: list(svc.fleet.list()))
    return page(request, "workers.html", title="Workers", nav="workers", workers=workers)


@router.get("/profiles")
async def profiles_page(request: Request) -> Response:
    principal = await login_required(request)
    svc = services(request)
    rows = await run_in_threadpool(lambda: svc.profiles.list(include_inactive=True))
    ready = await run_in_threadpool(registry.readiness, rows)  # probes: clamd may be slow
    if not principal.allows("admin"):
        # Where clamd listens, and why a tool is missing here, are the
        # operator's business: other tokens see only whether a profile runs.
        rows = [shown(p, principal, "settings") for p in rows]
        ready = {
            t: None if why is None else "not available on this server" for t, why in ready.items()
        }
    return page(
        request, "profiles.html", title="Profiles", nav="profiles", profiles=rows, ready=ready
    )


# Anything else under /ui: a page, not the API's JSON 404; or, for a page
# that exists with other methods (`GET /ui/logout`), the 405 it is elsewhere.
@router.api_route("/{rest:path}", methods=["GET", "POST"])
async def not_found(request: Request, rest: str) -> Response:
    allowed: set[str] = set()
    for route in router.routes:
        if getattr(route, "endpoint", None) is not not_found:
            match, _ = route.matches(request.scope)
            if match is Match.PARTIAL:  # the path, not the method
                allowed |= getattr(route, "methods", None) or set()
    if not allowed:
        return error_page(request, 404, "no such page")
    answer = error_page(request, 405, "this page does not take that method")
    answer.headers["Allow"] = ", ".join(sorted(allowed))
    return answer

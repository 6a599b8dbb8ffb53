"""The dashboard at ``/ui``: server-rendered pages over the same use cases as the API.

The plumbing (templates, the login check, error pages, the Origin check) is in
``web``; every page shows only the token's project.
"""

from __future__ import annotations

import math
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import RedirectResponse
from starlette.concurrency import run_in_threadpool
from starlette.routing import Match

from hypermedia.api.deps import (
    COOKIE,
    FailedAuth,
    RateLimiter,
    Whole,
    authenticate,
    check_may_run,
    link_base,
    may_submit,
    services,
    session_cookies,
    shown,
)
from hypermedia.api.errors import ApiError, error_response
from hypermedia.api.routes.jobs import (
    check_changeable,
    check_owner,
    owned_job,
    public_job,
    sse_head,
    sse_response,
)
from hypermedia.api.routes.objects import receive_upload
from hypermedia.auth.tokens import Principal
from hypermedia.errors import InvalidRequest, NotFound, Unauthorized
from hypermedia.parse import ascii_int
from hypermedia.pipelines import registry
from hypermedia.queue.models import NewJob
from hypermedia.queue.states import QUEUED_SIDE, STATUSES, TERMINAL
from hypermedia.services import Services
from hypermedia.ui.web import (
    STATIC,
    Row,
    UiRoute,
    clear_legacy_cookie,
    home,
    login_required,
    need,
    page,
    safe_next,
)

router = APIRouter(prefix="/ui", include_in_schema=False, route_class=UiRoute)
# Outside /ui: what browsers ask of any site (the favicon).
root = APIRouter(include_in_schema=False, route_class=UiRoute)
PAGE_SIZE = 50
# The methods the catch-all takes (HEAD comes with GET), so that a path that
# is no page is a 404 for each, not the router's 405 for any it does not list.
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def _id(raw: str, what: str) -> int:
    """A database id from a path.  Taken as text: a typed parameter was
    refused (422) before the page's login check, with none of the page; an
    id that cannot exist is as unknown as one that does not."""
    value = ascii_int(raw)
    if value is None or not 1 <= value <= 2**62:
        raise NotFound(f"no such {what}")
    return value


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
async def login_form(request: Request, next: str = "/ui") -> Response:
    # Unchecked here (safe_next bounds it): a refused parameter would send a
    # stranger to log in, back to this very page.
    return page(request, "login.html", title="Log in", next=safe_next(next), error=None)


def _start_session(svc: Services, token: str, limiter: RateLimiter) -> tuple[str, Principal]:
    def admit(principal: Principal) -> None:
        # A login spends from its token's bucket as any request does: a
        # loop of logins was never slowed.
        wait = limiter.take(principal.token_id)
        if wait:
            raise RateLimited(math.ceil(wait))

    secret = svc.tokens.start_session(token, svc.settings.session_hours, admit)
    return secret, svc.tokens.authenticate_session(secret)


class RateLimited(Exception):
    def __init__(self, seconds: int) -> None:
        super().__init__(f"too many requests for this token; try again in {seconds} s")
        self.seconds = seconds


@router.post("/login")
async def login(request: Request) -> Response:
    form = await request.form(max_files=0, max_fields=5)
    token = str(form.get("token") or "").strip()
    target = safe_next(str(form.get("next") or "/ui"))
    svc = services(request)
    failures: FailedAuth = request.app.state.auth_failures
    try:
        if not token or len(token) > 200:
            if token:
                failures.failed(request)
            raise Unauthorized("no token")
        # A session of its own: the cookie never holds the token.
        limiter = request.app.state.rate_limiter
        async with failures.guard(request):
            secret, principal = await run_in_threadpool(_start_session, svc, token, limiter)
    except (RateLimited, ApiError) as exc:
        if isinstance(exc, RateLimited):
            seconds, said = exc.seconds, str(exc)
        else:  # the address's failed logins: whatever token is typed now
            seconds = int(exc.headers["Retry-After"])
            said = f"Too many failed logins from this address: try again in {seconds} s."
        refused = page(request, "login.html", 429, title="Log in", next=target, error=said)
        refused.headers["Retry-After"] = str(seconds)
        return refused
    except Unauthorized:
        return page(
            request,
            "login.html",
            401,
            title="Log in",
            next=target,
            error="That token is not valid: unknown, expired or revoked.",
        )
    # Logging in again ends the session this browser had: each of them, when
    # it carries two (one tossed in for the parent domain: docs/dashboard.md).
    for previous in session_cookies(request):
        await run_in_threadpool(svc.tokens.end_session, previous)
    if target in ("/ui", "/ui/"):  # no page asked for: one this token can open
        target = home(principal)[1]
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
    # Revoked on the server, every one it carries: a copy of the cookie stops
    # working too.
    for secret in session_cookies(request):
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
    return list(svc.queues.summary(project_id, everyones=False))


# -- jobs -------------------------------------------------------------------------------


def _blank(value: str | None) -> str | None:
    value = (value or "").strip()
    return value or None


# The filters are plain text, checked by the engine (as for /v1/jobs): a
# mistaken one ("Images") is said on the page, next to the form to fix it.
@router.get("/jobs")
async def jobs_page(
    request: Request,
    status: str | None = None,
    job_type: str | None = None,
    queue: str | None = None,
    before: str | None = None,
) -> Response:
    principal = await login_required(request)
    need(principal, "jobs:read")
    status, job_type, queue = _blank(status), _blank(job_type), _blank(queue)
    filters = {"status": status or "", "job_type": job_type or "", "queue": queue or ""}
    svc = services(request)
    try:
        before_id = _before(before)
        rows = await run_in_threadpool(
            lambda: svc.engine.list(
                project_id=principal.project_id,
                status=status,
                job_type=job_type,
                queue=queue,
                before_id=before_id,
                limit=PAGE_SIZE + 1,
            )
        )
    except InvalidRequest as exc:
        return _jobs(request, 422, filters, error=str(exc))
    more = len(rows) > PAGE_SIZE
    rows = rows[:PAGE_SIZE]
    return _jobs(
        request,
        200,
        filters,
        jobs=rows,
        older={**filters, "before": rows[-1]["job_id"]} if more else None,
        first_page=before_id is None,
    )


def _before(raw: str | None) -> int | None:
    text = _blank(raw)  # trimmed as the other filters are
    if text is None:
        return None
    value = ascii_int(text)
    if value is None or not 1 <= value <= 2**62:
        raise InvalidRequest("before must be a job id")
    return value


def _jobs(request: Request, code: int, filters: dict[str, str], **context: object) -> Response:
    context = {"jobs": [], "older": None, "first_page": True, "error": None, **context}
    return page(
        request,
        "jobs.html",
        code,
        title="Jobs",
        nav="jobs",
        filters=filters,
        statuses=STATUSES,
        job_types=registry.known(),
        **context,
    )


def _job_view(svc: Services, job_id: int, principal: Principal) -> Row:
    job = public_job(owned_job(svc, job_id, principal), principal)
    source = None
    if job.get("object_id") is not None:
        try:
            obj = svc.storage.get(int(job["object_id"]))
            if obj.get("project_id") == principal.project_id:
                source = obj
        except NotFound:
            source = None
    # One query for the page's outputs (a PDF's previews: one per page).
    stored = [int(o["object_id"]) for o in job["outputs"] if o.get("object_id")]
    ready = svc.storage.ready_ids(stored)
    outputs = [_output(job, out, ready) for out in job["outputs"]]
    return {"job": job, "outputs": outputs, "source": source, "progress": _progress(job)}


def _output(job: Row, out: Row, ready: set[int]) -> Row:
    """A blob links to a route that signs a fresh URL at each click (a signed
    URL in the page went stale while the page stayed open); data alone (a
    verdict, a debug result) is shown, its size being no size of anything."""
    view = {**out, "image": str(out["mime_type"]).startswith("image/"), "href": None, "data": None}
    if out.get("object_id") is None:
        view["data"] = out.get("metadata") or job.get("result")
    elif int(out["object_id"]) in ready:
        view["href"] = f"/ui/jobs/{job['job_id']}/outputs/{out['output_id']}"
    return view


def _progress(job: Row) -> Row | None:
    """The progress of the attempt that runs (or of the last one, where a
    failed or cancelled job stopped).  The job keeps its newest report across
    attempts: one in retry_wait showed the previous attempt's full bar."""
    snap = job.get("progress")
    if not snap or job["status"] == "completed" or job["status"] in QUEUED_SIDE:
        return None
    reports = [e for e in job["events"] if e["kind"] == "progress"]
    if not reports or reports[-1].get("attempt_number") != job["attempt_count"]:
        return None  # this attempt has reported nothing yet
    # The report's own text, as the live page shows it ("100%", not "100.0%").
    return {"percent": snap.get("percent"), "text": reports[-1]["message"]}


@router.get("/jobs/{job_id}")
async def job_page(request: Request, job_id: str) -> Response:
    principal = await login_required(request)
    need(principal, "jobs:read")
    svc = services(request)
    view = await run_in_threadpool(_job_view, svc, _id(job_id, "job"), principal)
    job = view["job"]
    last_event = max((int(e["event_id"]) for e in job["events"]), default=0)
    writable = principal.allows("jobs:write")
    status = job["status"]
    return page(
        request,
        "job.html",
        title=f"Job {job['job_id']}",
        nav="jobs",
        terminal=status in TERMINAL,
        stream_url=f"/ui/jobs/{job['job_id']}/stream?after={last_event}",
        final=" ".join(sorted(TERMINAL)),
        waiting=" ".join(sorted(QUEUED_SIDE)),
        can_cancel=writable and status not in TERMINAL and status != "cancel_requested",
        # Not a debug job for a token that may not submit one: the button
        # was shown, and pressing it gave a 403 page.
        can_retry=writable
        and bool(job.get("can_retry"))
        and may_submit(principal, job["job_type"]),
        **view,
    )


@router.get("/jobs/{job_id}/outputs/{output_id}")
async def output_content(request: Request, job_id: str, output_id: str) -> Response:
    """To a freshly signed URL of the output's blob: the page's link never expires."""
    principal = await login_required(request)
    need(principal, "jobs:read")  # as the page that shows the link
    svc = services(request)
    ids = _id(job_id, "job"), _id(output_id, "output")
    url = await run_in_threadpool(_output_url, svc, *ids, principal, link_base(request))
    return RedirectResponse(url, status_code=303, headers={"Cache-Control": "no-store"})


def _output_url(
    svc: Services, job_id: int, output_id: int, principal: Principal, base_url: str
) -> str:
    job = owned_job(svc, job_id, principal)
    found = [o for o in job["outputs"] if o["output_id"] == output_id and o.get("object_id")]
    if not found:
        raise NotFound("no such output")
    try:
        return svc.storage.signed_url(int(found[0]["object_id"]), base_url=base_url)
    except (NotFound, InvalidRequest):  # collected, or not ready: gone for the page
        raise NotFound("this output is no longer stored") from None


@router.get("/jobs/{job_id}/stream")
async def job_stream(
    request: Request,
    job_id: str,
    after: Annotated[Whole, Query(ge=0, le=2**62)] = 0,
    # Unbounded, as in /v1: anything but a plain id is ignored (a 422 would
    # stop the browser's EventSource reconnecting).
    last_event_id: str | None = Header(None),
) -> Response:
    principal = await authenticate(request, cookie=True)
    need(principal, "jobs:read")
    svc = services(request)
    ident = _id(job_id, "job")
    await run_in_threadpool(check_owner, svc, ident, principal)
    if request.method == "HEAD":  # headers only: no stream opened (each is counted)
        return sse_head()
    return sse_response(svc, request, principal, ident, after, last_event_id)


@router.post("/jobs/{job_id}/cancel")
async def cancel(request: Request, job_id: str) -> Response:
    principal = await login_required(request)
    need(principal, "jobs:write")
    svc = services(request)
    ident = _id(job_id, "job")
    await run_in_threadpool(check_changeable, svc, ident, principal)
    await run_in_threadpool(svc.engine.cancel, ident, principal.actor)
    return RedirectResponse(_after_change(ident, principal), status_code=303)


@router.post("/jobs/{job_id}/retry")
async def retry(request: Request, job_id: str) -> Response:
    principal = await login_required(request)
    need(principal, "jobs:write")
    svc = services(request)
    ident = _id(job_id, "job")
    job = await run_in_threadpool(check_changeable, svc, ident, principal)
    check_may_run(principal, job["job_type"])
    await run_in_threadpool(svc.engine.retry, ident, principal.actor)
    return RedirectResponse(_after_change(ident, principal), status_code=303)


def _after_change(job_id: int, principal: Principal) -> str:
    """The job's page, or for a token that may not read it the first page it
    can open (the upload form says the job, one it made, exists): never a
    page it would meet a 403 on."""
    if principal.allows("jobs:read"):
        return f"/ui/jobs/{job_id}"
    _, href = home(principal)
    return f"{href}?created={job_id}" if href == "/ui/upload" else href


# -- upload -----------------------------------------------------------------------------


def upload_profiles(svc: Services, principal: Principal) -> list[Row]:
    """Active profiles whose pipeline can run here and this token may use."""
    rows = [p for p in svc.profiles.list() if p.get("is_active")]
    ready = registry.readiness(rows)
    return [p for p in rows if ready[p["ref"]] is None and may_submit(principal, p["job_type"])]


@router.get("/upload")
async def upload_form(request: Request, created: str | None = None) -> Response:
    principal = await login_required(request)
    need(principal, "objects:write")
    need(principal, "jobs:write")
    svc = services(request)
    profiles = await run_in_threadpool(upload_profiles, svc, principal)
    # Preselected: what image-thumbnail means, its newest version (listed last).
    thumbs = [p["ref"] for p in profiles if p["profile_key"] == "image-thumbnail"]
    return page(
        request,
        "upload.html",
        title="Upload",
        nav="upload",
        profiles=profiles,
        chosen=thumbs[-1] if thumbs else None,
        created=await run_in_threadpool(_created, svc, created, principal),
    )


def _created(svc: Services, raw: str | None, principal: Principal) -> int | None:
    """The job an upload just made, when this token made it: what the form
    confirms to a token that may not open the job's page.  Any job of the
    project was confirmed, so a token without jobs:read could walk
    ``?created=1,2,3…`` to learn which job ids exist."""
    job_id = ascii_int(raw)
    if job_id is None:
        return None
    try:
        job = check_owner(svc, job_id, principal)
    except NotFound:
        return None
    return job_id if job.get("created_by") == principal.actor else None


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
    if not principal.allows("jobs:read"):  # the job's page would refuse it (403)
        return RedirectResponse(f"/ui/upload?created={job_id}", status_code=303)
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


def page_methods(request: Request) -> set[str]:
    """The methods of the page at this request's path (none: no page), the
    catch-all below left out.  Also ``app.state.allowed_methods`` (api/errors.py):
    a method the catch-all does not take either (TRACE) was answered 405 with
    the catch-all's own methods, for a page and for no page alike."""
    allowed: set[str] = set()
    for route in router.routes:
        if getattr(route, "endpoint", None) is not not_found:
            match, _ = route.matches({**request.scope, "method": "GET"})
            if match in (Match.FULL, Match.PARTIAL):  # the path; the method aside
                allowed |= getattr(route, "methods", None) or set()
    return allowed


# Anything else under /ui: a page, not the API's JSON 404; or, for a page
# that exists with other methods (`GET /ui/logout`), the 405 it is elsewhere.
# Through the API's error_response: the page for a browser, the API's JSON
# for a client that asks for JSON.
@router.api_route("/{rest:path}", methods=METHODS)
async def not_found(request: Request, rest: str) -> Response:
    allowed = page_methods(request)
    if not allowed:
        return error_response(request, 404, "not_found", "no such page")
    return error_response(
        request,
        405,
        "method_not_allowed",
        "this page does not take that method",
        headers={"Allow": ", ".join(sorted(allowed))},
    )

"""The dashboard at ``/ui``: server-rendered pages over the same use cases as the API.

Pages authenticate with the ``hm_token`` cookie set by the login form
(HttpOnly, SameSite=Strict); a missing or invalid cookie redirects to the
login page.  Every POST is refused when its ``Origin`` header names another
host.  Every error renders a small page (never a traceback), and every page
shows only the token's project.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Coroutine
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import jinja2
from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, PlainTextResponse, RedirectResponse, StreamingResponse
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException

from hypermedia.api.deps import COOKIE, Id, authenticate, services
from hypermedia.api.errors import STATUS_OF, ApiError, request_id
from hypermedia.api.routes.jobs import _stream, owned_job, public_job
from hypermedia.auth.tokens import Principal
from hypermedia.errors import Forbidden, HypermediaError, InvalidRequest, NotFound, Unauthorized
from hypermedia.pipelines import registry
from hypermedia.queue.models import NewJob
from hypermedia.queue.states import STATUSES, TERMINAL
from hypermedia.redact import redact
from hypermedia.services import Services

log = logging.getLogger(__name__)

Row = dict[str, Any]
HERE = Path(__file__).parent
PAGE_SIZE = 50
CHUNK = 1024 * 1024
EVENT_KINDS = ("event", "progress", "log", "warning", "error")

# Headers on every page: no framing, no sniffing, scripts and styles only from
# /ui/static; images may also come from a storage backend's presigned URL.
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' https: http: data:; script-src 'self'; "
        "style-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",  # "no-referrer" would send Origin: null
    "Cache-Control": "no-store",
}


def _when(value: Any) -> str:
    if value is None or value == "":
        return "—"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def _size(value: Any) -> str:
    if value is None:
        return "—"
    n = float(value)
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(value)  # pragma: no cover


def _ms(value: Any) -> str:
    if value is None:
        return "—"
    ms = int(value)
    return f"{ms} ms" if ms < 10_000 else f"{ms / 1000:.1f} s"


env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(HERE / "templates"),
    autoescape=True,
    trim_blocks=True,
    lstrip_blocks=True,
)
env.filters.update(when=_when, size=_size, ms=_ms)

# The static files, read once: only these names are served.
_STATIC_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}
STATIC = {
    p.name: (p.read_bytes(), _STATIC_TYPES[p.suffix])
    for p in sorted((HERE / "static").iterdir())
    if p.suffix in _STATIC_TYPES
}


def page(request: Request, template: str, code: int = 200, **context: Any) -> HTMLResponse:
    principal = getattr(request.state, "principal", None)
    html = env.get_template(template).render(principal=principal, **context)
    return HTMLResponse(html, status_code=code, headers=PAGE_HEADERS)


def error_page(request: Request, status: int, message: str) -> HTMLResponse:
    titles = {
        400: "Bad request",
        403: "Not allowed",
        404: "Not found",
        405: "Method not allowed",
        409: "Conflict",
        413: "Too large",
        422: "Not valid",
        429: "Too many requests",
        503: "Unavailable",
    }
    return page(
        request,
        "error.html",
        status,
        title=titles.get(status, "Error"),
        status=status,
        message=redact(message, 500),
        request_id=request_id(request),
    )


# -- login required, errors as pages, the Origin check ------------------------------


class LoginRequired(Exception):
    """No valid cookie: pages redirect to the login form."""


def same_origin(request: Request) -> bool:
    """A request without Origin passes (SameSite=Strict keeps the cookie off
    cross-site POSTs); with one, it must name this very host."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    host = request.headers.get("host", "")
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    return bool(host) and parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()


def _login_redirect(request: Request) -> Response:
    target = "/ui/login"
    if request.method == "GET":
        here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        target += "?next=" + quote(here, safe="")
    response = RedirectResponse(target, status_code=303)
    if COOKIE in request.cookies:
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return response


def _status_of(exc: HypermediaError) -> int:
    for kind, status, _ in STATUS_OF:
        if isinstance(exc, kind):
            return status
    return 400  # pragma: no cover


class UiRoute(APIRoute):
    """A route whose failures answer with a small HTML page (or a redirect to login)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def run(request: Request) -> Response:
            if request.method == "POST" and not same_origin(request):
                return error_page(request, 403, "this form was sent from another site")
            try:
                return await handler(request)
            except (LoginRequired, Unauthorized):
                if "text/event-stream" in request.headers.get("accept", ""):
                    return PlainTextResponse("log in first", status_code=401)
                return _login_redirect(request)
            except ApiError as exc:
                response = error_page(request, exc.status, str(exc))
                response.headers.update(exc.headers)
                return response
            except HypermediaError as exc:
                return error_page(request, _status_of(exc), str(exc))
            except RequestValidationError:
                return error_page(request, 422, "the request is not valid")
            except StarletteHTTPException as exc:
                message = exc.detail if isinstance(exc.detail, str) else "request refused"
                return error_page(request, exc.status_code, message)
            except Exception:
                log.exception("dashboard request %s failed", request_id(request))
                return error_page(request, 500, "internal error; quote the request id")

        return run


router = APIRouter(prefix="/ui", include_in_schema=False, route_class=UiRoute)


async def login_required(request: Request) -> Principal:
    try:
        return await authenticate(request, cookie=True)
    except Unauthorized:
        raise LoginRequired from None


def need(principal: Principal, scope: str) -> None:
    if not principal.allows(scope):
        raise Forbidden(f"this token lacks the {scope} scope")


def safe_next(target: str | None) -> str:
    """Only a path inside the dashboard: never another host."""
    if (
        not target
        or not target.startswith("/ui")
        or target.startswith("//")
        or "\\" in target
        or any(ord(ch) < 32 for ch in target)
    ):
        return "/ui"
    return target


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
        await run_in_threadpool(svc.tokens.authenticate, token)
    except Unauthorized:
        return page(
            request,
            "login.html",
            401,
            title="Log in",
            next=target,
            error="That token is not valid: unknown, expired or revoked.",
        )
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        COOKIE,
        token,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/logout")
async def logout() -> Response:
    response = RedirectResponse("/ui/login", status_code=303)
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return response


# -- overview ---------------------------------------------------------------------------


@router.get("")
@router.get("/")
async def overview(request: Request) -> Response:
    principal = await login_required(request)
    need(principal, "jobs:read")
    svc = services(request)
    queues = await run_in_threadpool(_queue_summary, svc, principal.project_id)
    failures = await run_in_threadpool(
        lambda: svc.engine.list(project_id=principal.project_id, status="failed", limit=10)
    )
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
    job = public_job(owned_job(svc, job_id, principal))
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
    await run_in_threadpool(owned_job, svc, job_id, principal)
    if last_event_id and last_event_id.isdigit():
        after = max(after, int(last_event_id))
    return StreamingResponse(
        _stream(svc, request, job_id, after),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.post("/jobs/{job_id}/cancel")
async def cancel(request: Request, job_id: Id) -> Response:
    principal = await login_required(request)
    need(principal, "jobs:write")
    svc = services(request)
    await run_in_threadpool(owned_job, svc, job_id, principal)
    await run_in_threadpool(svc.engine.cancel, job_id, principal.actor)
    return RedirectResponse(f"/ui/jobs/{job_id}", status_code=303)


@router.post("/jobs/{job_id}/retry")
async def retry(request: Request, job_id: Id) -> Response:
    principal = await login_required(request)
    need(principal, "jobs:write")
    svc = services(request)
    await run_in_threadpool(owned_job, svc, job_id, principal)
    await run_in_threadpool(svc.engine.retry, job_id, principal.actor)
    return RedirectResponse(f"/ui/jobs/{job_id}", status_code=303)


# -- upload -----------------------------------------------------------------------------


def upload_profiles(svc: Services) -> list[Row]:
    """Active profiles whose pipeline can run here."""
    ready = registry.availability()
    return [
        p
        for p in svc.profiles.list()
        if p.get("is_active") and p["job_type"] in ready and ready[p["job_type"]] is None
    ]


@router.get("/upload")
async def upload_form(request: Request) -> Response:
    principal = await login_required(request)
    need(principal, "objects:write")
    need(principal, "jobs:write")
    profiles = await run_in_threadpool(upload_profiles, services(request))
    return page(request, "upload.html", title="Upload", nav="upload", profiles=profiles)


@router.post("/upload")
async def upload(request: Request) -> Response:
    principal = await login_required(request)
    need(principal, "objects:write")
    need(principal, "jobs:write")
    svc = services(request)
    limit = svc.settings.max_upload_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit + 64 * 1024:
        raise ApiError(413, f"uploads are limited to {_size(limit)}")
    async with request.form(max_files=1, max_fields=5) as form:
        upload = form.get("file")
        ref = str(form.get("profile") or "")
        if not isinstance(upload, UploadFile) or not upload.filename:
            raise InvalidRequest("choose a file to upload")
        profiles = await run_in_threadpool(upload_profiles, svc)
        chosen = next((p for p in profiles if p["ref"] == ref), None)
        if chosen is None:
            raise InvalidRequest("choose one of the listed profiles")
        tmp_dir = svc.settings.home / "tmp"
        tmp_dir.mkdir(parents=True, exist_ok=True)
        tmp = tmp_dir / f"ui-upload-{uuid.uuid4().hex}"
        try:
            size = 0
            with open(tmp, "wb") as out:
                while chunk := await upload.read(CHUNK):
                    size += len(chunk)
                    if size > limit:
                        raise ApiError(413, f"uploads are limited to {_size(limit)}")
                    out.write(chunk)
            obj = await run_in_threadpool(
                lambda: svc.storage.put_file(
                    tmp, filename=upload.filename, project_id=principal.project_id
                )
            )
        finally:
            tmp.unlink(missing_ok=True)
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
    await login_required(request)
    svc = services(request)
    rows = await run_in_threadpool(lambda: svc.profiles.list(include_inactive=True))
    ready = registry.availability()
    return page(
        request, "profiles.html", title="Profiles", nav="profiles", profiles=rows, ready=ready
    )


# Anything else under /ui: a page, not the API's JSON 404.
@router.api_route("/{rest:path}", methods=["GET", "POST"])
async def not_found(request: Request, rest: str) -> Response:
    return error_page(request, 404, "no such page")

"""One error shape for every 4xx and 5xx: ``{"code", "message", "request_id"}``.

Messages come from our own exceptions, whose ``str()`` is written to be safe,
and pass through ``redact`` once more; anything unexpected becomes a bare
``internal`` with the request id to find it in the log.  Nothing here echoes
paths, SQL, stack traces or tokens.
"""

from __future__ import annotations

import errno
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from hypermedia.db.dialects import ERRORS as DATABASE_ERRORS
from hypermedia.db.dialects import is_schema_missing, is_transient
from hypermedia.errors import (
    Conflict,
    Forbidden,
    HypermediaError,
    IdempotencyConflict,
    InvalidRequest,
    NotFound,
    StaleTransition,
    Unauthorized,
)
from hypermedia.redact import brief, redact
from hypermedia.storage.base import StorageFull, StorageUnavailable

log = logging.getLogger(__name__)

# Our exceptions -> (HTTP status, code).  Order matters: first match wins.
STATUS_OF: list[tuple[type[Exception], int, str]] = [
    (NotFound, 404, "not_found"),
    (Unauthorized, 401, "unauthorized"),
    (Forbidden, 403, "forbidden"),
    (IdempotencyConflict, 422, "idempotency_conflict"),
    (InvalidRequest, 422, "invalid_request"),
    (StaleTransition, 409, "conflict"),
    (Conflict, 409, "conflict"),
    (StorageFull, 507, "insufficient_storage"),
    (StorageUnavailable, 503, "storage_unavailable"),
    (HypermediaError, 400, "bad_request"),
]

# Seconds a client should wait before sending again what failed for no fault of its own.
RETRY_AFTER = "2"
UNPARSED = "There was an error parsing the body"  # FastAPI's HTTPException(400) detail

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    408: "request_timeout",
    411: "length_required",
    413: "payload_too_large",
    412: "precondition_failed",
    415: "unsupported_media_type",
    416: "range_not_satisfiable",
    422: "invalid_request",
    429: "rate_limited",
}


class ApiError(Exception):
    """An HTTP answer decided by the API layer itself (413, 429, …)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}
        self.code = code or _HTTP_CODES.get(status, "error")


def request_id(request: Request) -> str:
    rid = getattr(request.state, "request_id", None)
    if rid is None:
        rid = request.state.request_id = uuid.uuid4().hex
    return str(rid)


# ``app.state.error_page(request, status, message)``: a page instead of the
# JSON body, or None.  The dashboard installs one (ui/web.py) so that what
# fails before its routes run (a 413 of the body limit, a 405) under /ui is
# still its HTML page.
PageHook = Callable[[Request, int, str], Response | None]
# ``app.state.allowed_methods(request)``: the methods of the page at its path
# (the dashboard's), or None where the routes are to be asked.
MethodsHook = Callable[[Request], "set[str] | None"]


def error_response(
    request: Request,
    status: int,
    code: str,
    message: str,
    *,
    headers: dict[str, str] | None = None,
    details: list[dict[str, Any]] | None = None,
) -> Response:
    body: dict[str, Any] = {
        "code": code,
        "message": redact(message, 500),
        "request_id": request_id(request),
    }
    if details:
        body["details"] = details
    headers = {**(headers or {}), "X-Request-ID": body["request_id"]}
    app = request.scope.get("app")
    hook: PageHook | None = getattr(getattr(app, "state", None), "error_page", None)
    page = hook(request, status, message) if hook is not None else None
    if page is not None:
        page.headers.update(headers)
        return page
    if status == 401:
        headers.setdefault("WWW-Authenticate", "Bearer")
    return JSONResponse(body, status_code=status, headers=headers)


def _validation_details(exc: RequestValidationError) -> list[dict[str, Any]]:
    # Location and reason only: pydantic's "input" could echo what was sent.
    return [
        {
            # A field's name is the sender's too (an extra one can be a token).
            "loc": [redact(str(p), 200) for p in e.get("loc", ())],
            "msg": redact(_message(e), 200),
        }
        for e in exc.errors()[:20]
    ]


def _message(error: dict[str, Any]) -> str:
    """Pydantic's message; for a body that is not JSON, also the parser's
    reason (a position, or a key named twice: api/strict_json.py)."""
    msg = str(error.get("msg", ""))
    why = (error.get("ctx") or {}).get("error") if error.get("type") == "json_invalid" else None
    return f"{msg}: {why}" if why else msg


def _api(request: Request, exc: ApiError) -> Response:
    return error_response(request, exc.status, exc.code, str(exc), headers=exc.headers)


def _ours(request: Request, exc: HypermediaError) -> Response:
    for kind, status, code in STATUS_OF:
        if isinstance(exc, kind):
            again = {"Retry-After": RETRY_AFTER} if status in (503, 507) else None
            return error_response(request, status, code, str(exc), headers=again)
    raise AssertionError("HypermediaError is in STATUS_OF")  # pragma: no cover


async def caller_refused(request: Request) -> Response | None:
    """The answer of the route's token and scope check (``deps.scoped``), if
    it refuses the caller.  FastAPI parses a body before it runs a route's
    dependencies: a request with no token and a broken body was told of its
    JSON (422), not that it may not ask (401/403) — the order the docs give.
    ``request.scope`` must carry its route (``app.BodyLimit`` matches it
    before reading a body; FastAPI's routing has set it by a 422)."""
    return await refused_by(request, guards_of(request.scope.get("route")))


def guards_of(route: object) -> list[Callable[[Request], Awaitable[object]]]:
    """A route's token and scope checks (the ``deps.scoped`` dependencies)."""
    dependant = getattr(route, "dependant", None)
    deps = getattr(dependant, "dependencies", ())
    return [d.call for d in deps if getattr(d.call, "__name__", "").startswith("scope_")]


async def refused_by(
    request: Request, guards: list[Callable[[Request], Awaitable[object]]]
) -> Response | None:
    """The first refusal of ``guards`` (401, 403 or a 429), if one refuses."""
    for guard in guards:
        try:
            await guard(request)
        except ApiError as exc:  # rate limited
            return _api(request, exc)
        except HypermediaError as exc:
            return _ours(request, exc)
    return None


def _allowed(request: Request) -> set[str]:
    """Every method this path takes: Starlette's 405 names the first
    matching route's only (``PUT /v1/jobs`` said ``Allow: POST``).  Under
    /ui the dashboard says (``app.state.allowed_methods``): its catch-all
    ("no such page") takes every path there, so matching names its methods."""
    hook: MethodsHook | None = getattr(request.app.state, "allowed_methods", None)
    if hook is not None and (said := hook(request)) is not None:
        return said
    allowed: set[str] = set()
    for method in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"):
        # Asked of each route as a request: an included router lists no methods.
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] is Match.FULL for route in request.app.routes):
            allowed.add(method)
    return allowed


def install(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        refused = await caller_refused(request)
        if refused is not None:
            return refused
        details = _validation_details(exc)
        return error_response(
            request, 422, "invalid_request", "the request is not valid", details=details
        )

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> Response:
        return _api(request, exc)

    @app.exception_handler(HypermediaError)
    async def _our_error(request: Request, exc: HypermediaError) -> Response:
        return _ours(request, exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 400 and exc.detail == UNPARSED:
            # FastAPI's words for a body it could not decode (not UTF-8,
            # nested past Python's recursion limit, or an integer past
            # Python's 4,300 digits), where bad JSON is a 422.
            message = (
                "the request body could not be read (not UTF-8, nested too deeply, "
                "or a number of 4,300 digits or more)"
            )
            return error_response(request, 422, "invalid_request", message)
        code = _HTTP_CODES.get(exc.status_code, "error")
        message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
        if exc.status_code == 404:
            message = "no such resource"
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            allowed = _allowed(request)
            if not allowed:  # only a catch-all took the path: no page, whatever the method
                return error_response(request, 404, "not_found", "no such resource")
            headers["Allow"] = ", ".join(sorted(allowed))
        return error_response(request, exc.status_code, code, message, headers=headers)

    # Starlette hands a handler of Exception itself the error and then raises
    # it again for the server to log: a traceback (with the SQL statement) on
    # every request while the database is away.  Handlers of the kinds that
    # may pass are called without that; Exception stays for real bugs.
    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        answer = passing_answer(request, exc)
        if answer is not None:
            return answer
        log.exception("request %s failed", request_id(request))
        return error_response(request, 500, "internal", "internal error; quote the request id")

    for kind in (*DATABASE_ERRORS, OSError):
        app.add_exception_handler(kind, _unexpected)


def passing_answer(request: Request, exc: Exception) -> Response | None:
    """The 503 or 507 for ``exc`` if it passes (see ``passing``), logged
    with what the database or disk said; None for a real bug."""
    away = passing(exc)
    if away is None:
        return None
    log.warning("request %s: %s", request_id(request), brief(exc))
    status, code, message = away
    return error_response(request, status, code, message, headers={"Retry-After": RETRY_AFTER})


def passing(exc: Exception) -> tuple[int, str, str] | None:
    """A 503 or 507 for what is no fault of the request and passes: the
    database restarting, unreachable or not migrated yet, the disk full.  The
    client is told to try again; what the database said goes to the log only
    (it names hosts and databases)."""
    if isinstance(exc, OSError):
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return 507, "insufficient_storage", "the server has no room left; try again later"
        return None
    if is_schema_missing(exc):  # deployed before its `db upgrade` ran
        return 503, "database_not_migrated", "the service is being upgraded; try again shortly"
    if is_transient(exc):
        return 503, "database_unavailable", "the database is unavailable; try again shortly"
    return None

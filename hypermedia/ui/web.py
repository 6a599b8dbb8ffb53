"""The dashboard's plumbing: templates, formatting, error pages, the login check.

Pages authenticate with the ``hm_session`` cookie set by the login form
(HttpOnly, SameSite=Strict): a session secret of its own, never the token
(``Tokens.start_session``).  A missing or invalid cookie redirects to the
login page.  Every POST is refused when its ``Origin`` header names another
host.  Every error renders a small page (never a traceback).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

import jinja2
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, PlainTextResponse, RedirectResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from hypermedia.api.deps import COOKIE, LEGACY_COOKIE, authenticate
from hypermedia.api.errors import RETRY_AFTER, STATUS_OF, ApiError, passing, request_id
from hypermedia.auth.tokens import Principal
from hypermedia.errors import Forbidden, HypermediaError, Unauthorized
from hypermedia.queue.profiles import price_text
from hypermedia.redact import brief, redact

log = logging.getLogger(__name__)

Row = dict[str, Any]
HERE = Path(__file__).parent

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
    """Every time the database holds is UTC (naive ones too): said so, as the
    live script says it of the times it adds."""
    if value is None or value == "":
        return "—"
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC)
        return value.strftime("%Y-%m-%d %H:%M:%S UTC")
    return str(value)


def _json(value: Any, indent: int | None = None) -> str:
    """JSON as people read it ("café", not "caf\\u00e9").  A plain string, so
    autoescaping escapes it like any other value (``tojson`` marks its output
    safe, and so must escape the characters itself)."""
    return json.dumps(value, ensure_ascii=False, indent=indent, sort_keys=True, default=str)


def human_size(value: Any) -> str:
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
env.filters.update(when=_when, size=human_size, ms=_ms, json=_json, prices=price_text)

# The static files, read once: only these names are served.
_STATIC_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}
STATIC = {
    p.name: (p.read_bytes(), _STATIC_TYPES[p.suffix])
    for p in sorted((HERE / "static").iterdir())
    if p.suffix in _STATIC_TYPES
}


# The navigation: (key, label, href, scopes the page needs).  A link shows
# only when the principal holds every scope its page needs (routes.py).
NAV = (
    ("overview", "Overview", "/ui", ("jobs:read",)),
    ("jobs", "Jobs", "/ui/jobs", ("jobs:read",)),
    ("upload", "Upload", "/ui/upload", ("objects:write", "jobs:write")),
    ("workers", "Workers", "/ui/workers", ("admin",)),
    ("profiles", "Profiles", "/ui/profiles", ()),
)


def nav_links(principal: Principal | None) -> list[tuple[str, str, str]]:
    if principal is None:
        return []
    return [
        (key, label, href)
        for key, label, href, scopes in NAV
        if all(principal.allows(s) for s in scopes)
    ]


def home(principal: Principal | None) -> tuple[str, str]:
    """(label, href) of the first page the token can open: where a login
    lands and an error page leads back to.  The overview needs jobs:read,
    and a token without it (an uploader's) was sent from one 403 to the next;
    Profiles needs no scope, so there is always one."""
    links = nav_links(principal)
    if not links:  # logged out: /ui sends to the login form
        return "Overview", "/ui"
    _, label, href = links[0]
    return label, href


def page(request: Request, template: str, code: int = 200, **context: Any) -> HTMLResponse:
    principal = getattr(request.state, "principal", None)
    html = env.get_template(template).render(
        principal=principal, nav_links=nav_links(principal), home=home(principal), **context
    )
    response = HTMLResponse(html, status_code=code, headers=PAGE_HEADERS)
    clear_legacy_cookie(request, response)
    return response


def error_page(request: Request, status: int, message: str) -> HTMLResponse:
    titles = {
        400: "Bad request",
        401: "Not logged in",
        403: "Not allowed",
        404: "Not found",
        405: "Method not allowed",
        409: "Conflict",
        413: "Too large",
        422: "Not valid",
        429: "Too many requests",
        500: "Server error",
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


def is_dashboard(request: Request) -> bool:
    path = request.url.path
    return path == "/ui" or path.startswith("/ui/")


def dashboard_methods(request: Request) -> set[str] | None:
    """``app.state.allowed_methods`` (api/errors.py): under /ui, the page's."""
    if not is_dashboard(request):
        return None
    from hypermedia.ui.routes import page_methods  # the routes import this module

    return page_methods(request)


def dashboard_error(request: Request, status: int, message: str) -> Response | None:
    """``app.state.error_page`` (api/errors.py): what fails before a page's
    route runs (a 413 of the body limit, a 405, a HEAD refused) under /ui is
    the error page too, unless the client asked for JSON or an event stream."""
    if not is_dashboard(request):
        return None
    accept = request.headers.get("accept", "")
    if "application/json" in accept or "text/event-stream" in accept:
        return None
    return error_page(request, status, message)


# -- login required, errors as pages, the Origin check ------------------------------


class LoginRequired(Exception):
    """No valid cookie: pages redirect to the login form."""


def origin_refusal(request: Request) -> str | None:
    """Why a POST's Origin is not this dashboard's (None: it is).

    A request without Origin is judged by its Referer (browsers older than
    Origin on every POST still send that), and passes with neither
    (SameSite=Strict keeps the cookie off cross-site POSTs); either must
    name this very host and scheme: a page on http://host (one a network
    attacker can write) is another origin than the dashboard on https://host."""
    origin = request.headers.get("origin") or request.headers.get("referer")
    if origin is None:
        return None
    host = request.headers.get("host", "")
    here = _origin_of(request.url.scheme, host)
    try:
        parts = urlsplit(origin)
        there = _origin_of(parts.scheme, parts.netloc)
    except ValueError:
        there = None
    if here is not None and there == here:
        return None
    tls_hidden = (
        here is not None
        and there is not None
        and (there[0], here[0]) == ("https", "http")
        and there[1] == here[1]
    )
    if tls_hidden:
        # This host seen as http: a proxy that ends TLS and does not say so
        # (X-Forwarded-Proto from an address FORWARDED_ALLOW_IPS trusts) made
        # every form of the dashboard a 403 "another site".
        log.warning(
            "dashboard form refused: it came from %r, this server sees http://%r; "
            "behind a TLS proxy, have it send X-Forwarded-Proto "
            "(from an address in FORWARDED_ALLOW_IPS)",
            origin[:200],
            host[:200],
        )
        return (
            "this form came from https:// but the server sees http://; "
            "behind a proxy that ends TLS, it must send X-Forwarded-Proto"
        )
    return "this form was sent from another site"


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin_of(scheme: str, netloc: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) with the scheme's default port filled in:
    ``Host: media.example.com:443`` (nginx's ``$host:$server_port``) is the
    same origin as ``https://media.example.com``."""
    scheme = scheme.lower()
    if scheme not in _DEFAULT_PORTS or not netloc or "@" in netloc:
        return None
    try:
        parts = urlsplit(f"//{netloc}")
        port = parts.port or _DEFAULT_PORTS[scheme]
    except ValueError:
        return None
    host = (parts.hostname or "").lower()
    return (scheme, host, port) if host else None


# Query parameters never carried into the login's ``next``: a token pasted
# into a dashboard address (``/ui/jobs?token=hm_…``) would otherwise travel on
# into the login form, the address after it and the browser's history.
_SECRET_PARAMS = frozenset({"token", "access_token", "api_key", "apikey", "secret", "password"})
_TOKEN_VALUE = re.compile(r"(?<![A-Za-z0-9])hms?_[A-Za-z0-9_-]{8,}")  # as redact's


def _without_secrets(query: str) -> str:
    kept = [
        (k, v)
        for k, v in parse_qsl(query, keep_blank_values=True)
        if k.lower() not in _SECRET_PARAMS and not _TOKEN_VALUE.search(v)
    ]
    return urlencode(kept)


def _login_redirect(request: Request) -> Response:
    target = "/ui/login"
    if request.method in ("GET", "HEAD"):
        query = _without_secrets(request.url.query)
        here = request.url.path + (f"?{query}" if query else "")
        target += "?next=" + quote(here, safe="")
    response = RedirectResponse(target, status_code=303)
    if COOKIE in request.cookies:
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    clear_legacy_cookie(request, response)
    return response


def clear_legacy_cookie(request: Request, response: Response) -> None:
    """Older versions kept the token itself in ``hm_token``: drop it."""
    if LEGACY_COOKIE in request.cookies:
        response.delete_cookie(LEGACY_COOKIE, path="/", httponly=True, samesite="strict")


def _status_of(exc: HypermediaError) -> int:
    for kind, status, _ in STATUS_OF:
        if isinstance(exc, kind):
            return status
    return 400  # pragma: no cover


class UiRoute(APIRoute):
    """A route whose failures answer with a small HTML page (or a redirect to
    login).  A GET route answers HEAD too: the GET's status and headers, no body
    (an event stream is not started)."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, endpoint, **kwargs)
        if self.methods and "GET" in self.methods:
            self.methods.add("HEAD")

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = self._run_handler(super().get_route_handler())

        async def run(request: Request) -> Response:
            response = await handler(request)
            if request.method != "HEAD":
                return response
            head = Response(status_code=response.status_code)
            head.raw_headers = list(response.raw_headers)
            return head

        return run

    @staticmethod
    def _run_handler(
        handler: Callable[[Request], Coroutine[Any, Any, Response]],
    ) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        async def run(request: Request) -> Response:
            if request.method == "POST" and (refused := origin_refusal(request)):
                return error_page(request, 403, refused)
            try:
                return await handler(request)
            except RequestValidationError:
                # FastAPI checks parameters before the page's code runs, so
                # before its login check: a stranger is sent to log in first,
                # as by any page, and learns nothing of what it would take.
                try:
                    await login_required(request)
                except Exception as exc:
                    return _failure(request, exc)
                return error_page(request, 422, "the request is not valid")
            except Exception as exc:
                return _failure(request, exc)

        return run


def _failure(request: Request, exc: Exception) -> Response:
    """What a page answers for a failure: a login redirect or an error page."""
    if isinstance(exc, LoginRequired | Unauthorized):
        if "text/event-stream" in request.headers.get("accept", ""):
            return PlainTextResponse("log in first", status_code=401)
        return _login_redirect(request)
    if isinstance(exc, ApiError):
        response = error_page(request, exc.status, str(exc))
        response.headers.update(exc.headers)
        return response
    if isinstance(exc, HypermediaError):
        return error_page(request, _status_of(exc), str(exc))
    if isinstance(exc, StarletteHTTPException):
        message = exc.detail if isinstance(exc.detail, str) else "request refused"
        return error_page(request, exc.status_code, message)
    if (away := passing(exc)) is not None:
        # The database restarting or not migrated yet: the API's 503, one
        # log line, not a traceback with the SQL on every page.
        log.warning("dashboard request %s: %s", request_id(request), brief(exc))
        status, _, message = away
        response = error_page(request, status, message)
        response.headers["Retry-After"] = RETRY_AFTER
        return response
    log.exception("dashboard request %s failed", request_id(request), exc_info=exc)
    return error_page(request, 500, "internal error; quote the request id")


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
        or len(target) > 500
        or not (target == "/ui" or target.startswith(("/ui/", "/ui?")))  # not /uievil
        or target.startswith("//")
        or "\\" in target
        or any(ord(ch) < 32 for ch in target)
        or ".." in unquote(urlsplit(target).path).split("/")  # /ui/../v1: out of /ui
    ):
        return "/ui"
    return target

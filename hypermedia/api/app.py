"""The HTTP API: ``create_app(services)`` builds the FastAPI application.

Every route module is thin: parse, check scope and project, call a use case
from ``Services``, shape the answer.  Errors all leave through ``errors``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hypermedia import __version__
from hypermedia.api import errors, openapi, swagger
from hypermedia.api.deps import FailedAuth, RateLimiter, StreamLimit, utf8_url
from hypermedia.api.routes import (
    credits,
    jobs,
    metrics,
    objects,
    ops,
    photos,
    profiles,
    queues,
    v0,
    workers,
)
from hypermedia.redact import brief
from hypermedia.services import Services
from hypermedia.ui import routes as ui
from hypermedia.ui.web import dashboard_error, dashboard_methods

DESCRIPTION = """\
Durable media processing jobs over a storage ledger.

Authenticate with `Authorization: Bearer hm_…` (see `hypermedia tokens create`).
Every resource is scoped to the token's project: another project's job, object
or photo answers 404.  Errors share one shape, `Error`: `{"code", "message",
"request_id"}`, with `details` for a request that fails validation.
"""


class RequestId:
    """Gives every request an id, echoed as ``X-Request-ID`` (and in error
    bodies), and every answer ``X-Content-Type-Options: nosniff``.

    Plain ASGI, not ``@app.middleware("http")``: that wrapper costs about a
    millisecond per request and pipes streamed bodies (SSE) through a queue.
    Only a short, plain incoming id is kept; anything else is replaced.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        # ASCII only: isalnum() took "ü" (and sent it back as two latin-1 characters).
        ok = 0 < len(incoming) <= 64 and incoming.replace("-", "").isascii()
        ok = ok and incoming.replace("-", "").isalnum()
        rid = incoming if ok else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid

        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = [h for h in message.get("headers", []) if h[0] != b"x-request-id"]
                headers.append((b"x-request-id", rid.encode()))
                # Every answer, JSON included: an error echoing a request's
                # text ("unknown job type '<script>'") is never sniffed as HTML.
                if not any(h[0].lower() == b"x-content-type-options" for h in headers):
                    headers.append((b"x-content-type-options", b"nosniff"))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except asyncio.CancelledError:
            if not getattr(scope["app"].state, "stopping", False):
                raise
            # The server stopping cancels what is still open past its grace
            # (an upload, say): answered as a 503 to try again, where uvicorn
            # sent a plain-text 500 and logged a traceback.  Ours to end: the
            # task is this request's alone.
            log.info("request %s: cut short by the server's stop", rid)
            if not started:
                await _refuse_stopping(scope, send_with_id)


async def _refuse_stopping(scope: Scope, send: Send) -> None:
    message = "the server is stopping; try again"
    await refuse(scope, send, 503, "stopping", message, {"Retry-After": errors.RETRY_AFTER})


async def refuse(
    scope: Scope,
    send: Send,
    status: int,
    code: str,
    message: str,
    headers: dict[str, str] | None = None,
) -> None:
    """Answer with the error shape and close the connection (what the client
    sent, or would send, is not read on)."""
    closing = {**(headers or {}), "Connection": "close"}
    response = errors.error_response(Request(scope), status, code, message, headers=closing)
    await response(scope, _no_receive, send)


# Routes that stream their body to disk under their own limit (max_upload_bytes).
UPLOADS = frozenset({("POST", "/v1/objects"), ("POST", "/v1/photos"), ("POST", "/ui/upload")})


class BodyLimit:
    """Refuses, with 413, a request body (JSON, a form) over ``limit`` bytes
    before any route reads it: FastAPI parses a JSON body whole, so a 200 MB
    one would take gigabytes of the API's memory.  The body is read here, up
    to the limit, and handed on; a declared Content-Length over it is refused
    unread, and a body that sends nothing for ``idle`` seconds is dropped
    (408), as an upload's is.  Uploads are left alone (``UPLOADS``).

    The caller's token and scope are checked before the body is read (as an
    upload's are): a client with no token that sent its body a byte a minute
    held a connection for as long as it liked, and was told 408, not 401.

    Every request, uploads too, is refused (400) when its framing is
    ambiguous: two Content-Lengths, or one with Transfer-Encoding.  The HTTP
    parser took the chunked body; a proxy in front that trusts the length
    reads another request's start in it (request smuggling, RFC 9112 §6.3).
    So is one that sends its credentials or its origin twice (``ONCE``).
    """

    def __init__(
        self, app: ASGIApp, limit: int, idle: float = 60.0, guards: Guards | None = None
    ) -> None:
        self.app = app
        self.limit = limit
        self.idle = idle
        self.guards = guards or []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        lengths = [v for k, v in scope["headers"] if k == b"content-length"]
        chunked = any(k == b"transfer-encoding" for k, _ in scope["headers"])
        if len(lengths) > 1 or (lengths and chunked):
            await refuse(scope, send, 400, "bad_request", AMBIGUOUS)
            return
        named = [k for k, _ in scope["headers"] if k in ONCE]
        if len(named) != len(set(named)):
            await refuse(scope, send, 400, "bad_request", TWICE)
            return
        declared = lengths[0] if lengths else b""
        # Without a length or chunks HTTP/1.1 has no body (a GET): nothing to
        # read, and no timer to start for it.
        bodiless = not chunked and declared in (b"", b"0")
        if bodiless or self._exempt(scope):
            await self.app(scope, receive, send)
            return
        if declared.isdigit() and int(declared) > self.limit:
            await refuse(scope, send, 413, "payload_too_large", self._too_large())
            return
        refused = await self._caller_refused(scope)
        if refused is not None:
            refused.headers["Connection"] = "close"  # the body is left unread
            await refused(scope, _no_receive, send)
            return
        chunks, size = [], 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), self.idle)
            except TimeoutError:  # a client that stalls holds a connection for ever
                why = f"the request body stalled: nothing came for {self.idle:g} s"
                await refuse(scope, send, 408, "request_timeout", why)
                return
            if message["type"] != "http.request":  # the client went away
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                await refuse(scope, send, 413, "payload_too_large", self._too_large())
                return
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        handed = False

        async def replay() -> Message:
            nonlocal handed
            if not handed:
                handed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _caller_refused(self, scope: Scope) -> Response | None:
        """The refusal (401, 403, 429; 503 with the database away) of the
        route this request goes to, if its checks refuse the caller.  The
        principal they find is kept in the request's state: the route does
        not authenticate again."""
        path, root = scope["path"], scope.get("root_path", "")
        path = path[len(root) :] if root and path.startswith(root) else path
        for methods, pattern, checks in self.guards:
            if scope["method"] not in methods or not pattern.match(path):
                continue
            scope.setdefault("state", {})  # shared by every Request of the scope
            request = Request(scope)
            try:
                return await errors.refused_by(request, checks)
            except Exception as exc:  # past this middleware, not the app's handlers
                answer = errors.passing_answer(request, exc)
                if answer is None:
                    raise
                return answer
        return None

    @staticmethod
    def _exempt(scope: Scope) -> bool:
        return (scope["method"], scope["path"].rstrip("/") or "/") in UPLOADS

    def _too_large(self) -> str:
        return f"the request body is larger than the {self.limit}-byte limit"


AMBIGUOUS = "the request's length is ambiguous: two Content-Lengths, or one with Transfer-Encoding"
# Headers a request must send at most once: the API took the first of two
# Authorization headers (a proxy that checks or logs the last saw another
# token), the dashboard the first of two Origins.
ONCE = frozenset({b"authorization", b"origin"})
TWICE = "send Authorization and Origin at most once each: two could be read differently"


Guard = Callable[[Request], Awaitable[object]]
# Routes by method and path, with their token and scope checks.
Guards = list[tuple[frozenset[str], re.Pattern[str], list[Guard]]]


def guards(routers: Iterable[APIRouter]) -> Guards:
    """Each route's token and scope checks, for BodyLimit to run before it
    reads a body (FastAPI reads it first, then runs the route's checks)."""
    return [
        (_answered(route.methods), route.path_regex, checks)
        for router in routers
        for route in router.routes
        if isinstance(route, APIRoute) and (checks := errors.guards_of(route))
    ]


def _answered(methods: Iterable[str] | None) -> frozenset[str]:
    """The methods a route answers: a GET route HEAD too (StrictJSONRoute,
    which does not list it)."""
    named = frozenset(methods or ())
    return named | {"HEAD"} if "GET" in named else named


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}


log = logging.getLogger(__name__)
SWEEP_SECONDS = 60.0  # how often a server removes the temp files of dead uploads


async def _sweep_uploads_every(home: Path) -> None:
    """A server restarted within seconds of one killed mid-upload finds its
    temp file too young to judge (leftovers.py) at start: looked at again
    every minute, not only at the next start, which may be weeks away."""
    while True:
        await asyncio.sleep(SWEEP_SECONDS)
        try:
            await run_in_threadpool(objects.sweep_uploads, home)
        except Exception as exc:  # the disk away: said, tried again next time
            log.warning("could not sweep upload leftovers: %s", brief(exc))


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    sweeper = asyncio.create_task(_sweep_uploads_every(app.state.services.settings.home))
    try:
        yield
    finally:
        sweeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sweeper


def create_app(svc: Services) -> FastAPI:
    app = FastAPI(
        title="hypermedia",
        version=__version__,
        description=DESCRIPTION,
        docs_url=None,  # FastAPI's page loads Swagger UI from a CDN: ours is swagger.py
        redoc_url=None,
        lifespan=_lifespan,
        dependencies=[Depends(utf8_url)],
    )
    app.state.services = svc
    app.state.rate_limiter = RateLimiter(
        svc.settings.api_rate_per_second, svc.settings.api_rate_burst
    )
    app.state.auth_failures = FailedAuth(svc.settings.api_auth_failures_per_minute)
    app.state.streams = StreamLimit(svc.settings.api_max_streams)
    # Set as the server begins to stop (api/server.py): open event streams
    # end then, for their clients to reconnect elsewhere, instead of holding
    # the shutdown to its timeout.
    app.state.stopping = False
    errors.install(app)
    openapi.install(app)
    app.state.error_page = dashboard_error  # errors under /ui are its HTML page
    app.state.allowed_methods = dashboard_methods  # and its 405s name the page's methods
    objects.sweep_uploads(svc.settings.home)  # of a server here killed mid-upload
    svc.storage.secret()  # an unusable URL-signing key stops the start, not a download

    # Added first, so it runs inside RequestId: its 413 carries the request id.
    routers = (ops, jobs, objects, photos, profiles, credits, queues, workers, metrics, v0, ui)
    app.add_middleware(
        BodyLimit,
        limit=svc.settings.api_max_body_bytes,
        idle=svc.settings.upload_idle_seconds,
        guards=guards(module.router for module in routers),
    )
    app.add_middleware(RequestId)
    for module in routers:
        app.include_router(module.router)
    app.include_router(ui.root)  # /favicon.ico
    app.include_router(swagger.router)  # /docs
    return app

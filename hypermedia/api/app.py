"""The HTTP API: ``create_app(services)`` builds the FastAPI application.

Every route module is thin: parse, check scope and project, call a use case
from ``Services``, shape the answer.  Errors all leave through ``errors``.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response

from hypermedia import __version__
from hypermedia.api import errors
from hypermedia.api.deps import RateLimiter
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
from hypermedia.services import Services
from hypermedia.ui import routes as ui

DESCRIPTION = """\
Durable media processing jobs over a storage ledger.

Authenticate with `Authorization: Bearer hm_…` (see `hypermedia tokens create`).
Every resource is scoped to the token's project: another project's job, object
or photo answers 404.  Errors share one shape: `{"code", "message", "request_id"}`.
"""


def create_app(svc: Services) -> FastAPI:
    app = FastAPI(
        title="hypermedia",
        version=__version__,
        description=DESCRIPTION,
        docs_url="/docs",
        redoc_url=None,
    )
    app.state.services = svc
    app.state.rate_limiter = RateLimiter(
        svc.settings.api_rate_per_second, svc.settings.api_rate_burst
    )
    errors.install(app)

    @app.middleware("http")
    async def _request_id(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        incoming = request.headers.get("x-request-id", "")
        # Only a short, plain id is echoed back; anything else is replaced.
        ok = 0 < len(incoming) <= 64 and incoming.replace("-", "").isalnum()
        request.state.request_id = incoming if ok else uuid.uuid4().hex
        response = await call_next(request)
        response.headers["X-Request-ID"] = request.state.request_id
        return response

    routers = (ops, jobs, objects, photos, profiles, credits, queues, workers, metrics, v0, ui)
    for module in routers:
        app.include_router(module.router)
    return app

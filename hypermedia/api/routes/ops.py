"""Probes for supervisors and load balancers: ``/healthz`` and ``/readyz``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Literal, TypeVar, cast

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from hypermedia.api.deps import services
from hypermedia.api.strict_json import StrictJSONRoute
from hypermedia.db import ready
from hypermedia.db.driver import Driver

router = APIRouter(tags=["operations"], route_class=StrictJSONRoute)
T = TypeVar("T")


@router.get("/healthz", summary="The process is up")
async def healthz() -> dict[str, str]:
    # On the event loop, not in a thread: with every pool thread blocked on a
    # database that stopped answering, a liveness probe still gets its 200.
    return {"status": "ok"}


class Readiness(BaseModel):
    database: Literal["ok", "unreachable", "refused", "not migrated"]
    storage: Literal["ok", "unreachable", "not checked"]
    serving: Literal["ok", "stopping"]


@router.get(
    "/readyz",
    summary="The database answers at this code's schema, and every storage pool answers",
    responses={
        200: {"model": Readiness},
        # Not the error shape: a probe's answer, saying which part is not ready.
        503: {"model": Readiness, "description": "Not ready"},
    },
)
async def readyz(request: Request) -> JSONResponse:
    svc = services(request)
    probes = _probes(request)
    database = await probes["database"].ask(lambda: _database(svc.engine.db), "unreachable")
    # The pools are listed in the database: without it they cannot be asked.
    storage = "not checked"
    if database == "ok":
        reachable = await probes["storage"].ask(svc.storage.reachable, False)
        storage = "ok" if reachable else "unreachable"
    serving = "stopping" if stopping(request) else "ok"
    body = {"database": database, "storage": storage, "serving": serving}
    ready = storage == "ok" and serving == "ok"
    return JSONResponse(body, status_code=200 if ready else 503)


def stopping(request: Request) -> bool:
    """Whether this server is on its way out: its HTTP side stopping, or the
    worker ``serve`` runs beside it draining after a SIGTERM (seconds to
    minutes, while the API still answers): a load balancer should send
    new requests elsewhere by then."""
    state = request.app.state
    draining: Callable[[], bool] | None = getattr(state, "draining", None)
    return bool(state.stopping) or (draining is not None and draining())


# How long a readiness request waits for its check: a store or database that
# hangs answers "unreachable" after this, while the check goes on (once).
PROBE_WAIT_SECONDS = 5.0


class _Probe:
    """One check at a time, in a thread of its own, shared by every request
    that asks meanwhile.  In the API's shared thread pool, each probe of a
    hung S3 store held a thread for two timeouts after its client gave up:
    45 of them and a request that needs no storage waited 117 s."""

    def __init__(self) -> None:
        self._limiter = anyio.CapacityLimiter(1)
        self._running: asyncio.Future[Any] | None = None

    async def ask(self, check: Callable[[], T], late: T) -> T:
        if self._running is None or self._running.done():
            run = anyio.to_thread.run_sync(check, limiter=self._limiter)
            self._running = asyncio.ensure_future(run)
        try:
            return cast(
                T, await asyncio.wait_for(asyncio.shield(self._running), PROBE_WAIT_SECONDS)
            )
        except TimeoutError:
            return late


def _probes(request: Request) -> dict[str, _Probe]:
    state = request.app.state
    if getattr(state, "readiness", None) is None:
        state.readiness = {"database": _Probe(), "storage": _Probe()}
    return cast(dict[str, _Probe], state.readiness)


def _database(db: Driver) -> str:
    """The database's readiness: ok, unreachable, refused (it answers but
    refuses the URL's user or database: no migration will fix that), or not
    migrated (a deploy whose `db upgrade` has not run yet)."""
    try:
        reason = ready.not_ready(db)
    except Exception:  # the database refuses us for good: still not ready
        return "unreachable"
    if reason is None:
        return "ok"
    return {"away": "unreachable", "refused": "refused"}.get(reason[0], "not migrated")

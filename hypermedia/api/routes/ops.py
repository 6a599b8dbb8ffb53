"""Probes for supervisors and load balancers: ``/healthz`` and ``/readyz``."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from hypermedia.api.deps import services
from hypermedia.db import ready
from hypermedia.db.driver import Driver

router = APIRouter(tags=["operations"])


@router.get("/healthz", summary="The process is up")
async def healthz() -> dict[str, str]:
    # On the event loop, not in a thread: with every pool thread blocked on a
    # database that stopped answering, a liveness probe still gets its 200.
    return {"status": "ok"}


class Readiness(BaseModel):
    database: Literal["ok", "unreachable", "refused", "not migrated"]
    storage: Literal["ok", "unreachable", "not checked"]


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
    database = await run_in_threadpool(_database, svc.engine.db)
    # The pools are listed in the database: without it they cannot be asked.
    storage = "not checked"
    if database == "ok":
        reachable = await run_in_threadpool(svc.storage.reachable)
        storage = "ok" if reachable else "unreachable"
    body = {"database": database, "storage": storage}
    return JSONResponse(body, status_code=200 if storage == "ok" else 503)


# HEAD as well: load balancers probe with it, and HTTP asks it of every GET.
# Routes of their own, out of the OpenAPI document (one operation id per route).
for _path, _probe in (("/healthz", healthz), ("/readyz", readyz)):
    router.add_api_route(_path, _probe, methods=["HEAD"], include_in_schema=False)


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

"""Probes for supervisors and load balancers: ``/healthz`` and ``/readyz``."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from hypermedia.api.deps import services

router = APIRouter(tags=["operations"])


@router.get("/healthz", summary="The process is up")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="The database and every storage pool answer")
async def readyz(request: Request) -> JSONResponse:
    svc = services(request)
    database = await run_in_threadpool(svc.engine.db.healthy)
    storage = database and await run_in_threadpool(svc.storage.reachable)
    body = {
        "database": "ok" if database else "unreachable",
        "storage": "ok" if storage else "unreachable",
    }
    return JSONResponse(body, status_code=200 if database and storage else 503)

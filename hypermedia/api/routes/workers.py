"""``/v1/workers``: the fleet, one worker, and drain (admin; instance-wide)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Path, Query, Request

from hypermedia.api.deps import NO_CONTROLS, scoped, services
from hypermedia.api.strict_json import StrictJSONRoute
from hypermedia.auth.tokens import Principal

router = APIRouter(prefix="/v1/workers", tags=["workers"], route_class=StrictJSONRoute)

Row = dict[str, Any]
WorkerId = Path(..., min_length=1, max_length=100, pattern=NO_CONTROLS)


@router.get("", summary="Workers, newest first, with their latest metrics and health")
def list_workers(
    request: Request,
    include_terminated: bool = Query(False),
    principal: Principal = scoped("admin"),
) -> Row:
    return {"items": services(request).fleet.list(include_terminated=include_terminated)}


@router.get("/{worker_id}", summary="One worker with its latest metrics")
def show_worker(
    request: Request, worker_id: str = WorkerId, principal: Principal = scoped("admin")
) -> Row:
    return services(request).fleet.get(worker_id)


@router.post(
    "/{worker_id}/drain",
    summary="Ask a worker to stop claiming, finish its jobs and exit",
    description="Only an active or idle worker can be drained (409 otherwise); "
    "draining one already draining changes nothing.",
)
def drain_worker(
    request: Request, worker_id: str = WorkerId, principal: Principal = scoped("admin")
) -> Row:
    return services(request).fleet.drain(worker_id)

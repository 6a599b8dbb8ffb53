"""``/v1/queues``: per-queue summary and depth, pause and resume (admin).

Queues are shared by every project, so these are operator routes: the admin
scope sees and switches them instance-wide; ``?project=`` narrows the counts.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request

from hypermedia.api.deps import NO_CONTROLS, scoped, services
from hypermedia.api.strict_json import StrictJSONRoute
from hypermedia.auth.tokens import Principal

router = APIRouter(prefix="/v1/queues", tags=["queues"], route_class=StrictJSONRoute)

Row = dict[str, Any]


@router.get("", summary="Every known queue: switch, counts, and open jobs by status and priority")
def list_queues(
    request: Request,
    # No control characters (QA: a NUL was a 200 on MariaDB, a 422 on PostgreSQL).
    project: str | None = Query(
        None, min_length=1, max_length=64, pattern=NO_CONTROLS, description="count only"
    ),
    principal: Principal = scoped("admin"),
) -> Row:
    queues = services(request).queues
    return {"items": queues.summary(project), "depth": queues.depth(project)}


@router.post("/{name}/pause", summary="Stop workers claiming from a queue (running jobs finish)")
def pause_queue(name: str, request: Request, principal: Principal = scoped("admin")) -> Row:
    return services(request).queues.pause(name)


@router.post("/{name}/resume", summary="Let workers claim from a paused queue again")
def resume_queue(name: str, request: Request, principal: Principal = scoped("admin")) -> Row:
    return services(request).queues.resume(name)

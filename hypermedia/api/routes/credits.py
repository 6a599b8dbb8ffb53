"""``/v1/credits``: the calling token's project, its budget and what it has used."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from hypermedia.api.deps import scoped, services
from hypermedia.api.strict_json import StrictJSONRoute
from hypermedia.auth.tokens import Principal
from hypermedia.queue.profiles import MAX_BUDGET

router = APIRouter(prefix="/v1/credits", tags=["credits"], route_class=StrictJSONRoute)

Row = dict[str, Any]


class Budget(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    budget_credits: int | None = Field(
        ..., ge=0, le=MAX_BUDGET, description="null: no limit", examples=[10_000]
    )


@router.get("", summary="The project's budget, credits used and remaining")
def show_credits(request: Request, principal: Principal = scoped("jobs:read")) -> Row:
    return services(request).credits.show(principal.project_id)[0]


@router.put(
    "/budget",
    summary="Set the project's budget (admin); below what is used, it refuses new work",
)
def set_budget(body: Budget, request: Request, principal: Principal = scoped("admin")) -> Row:
    return services(request).credits.set_budget(principal.project_id, body.budget_credits)

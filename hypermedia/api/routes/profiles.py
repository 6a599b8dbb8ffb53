"""``/v1/profiles``: versioned job settings, shared by every project.

Anyone with ``jobs:read`` may see them (jobs name them), without the
settings a pipeline marks private (where clamd listens): those are for
``admin`` tokens, as are creating a version and deactivating one.  Versions are never changed or
deleted: a new one is created instead.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field

from hypermedia.api.deps import Whole, scoped, services, shown
from hypermedia.api.paging import decode_cursor, page
from hypermedia.api.strict_json import StrictJSONRoute
from hypermedia.auth.tokens import Principal

router = APIRouter(prefix="/v1/profiles", tags=["profiles"], route_class=StrictJSONRoute)

Row = dict[str, Any]
NAME = r"^[a-z0-9._-]+$"
# What GET /{ref} lists of its key's versions; the rest through GET ?key=.
SHOWN_VERSIONS = 100
Ref = PathParam(min_length=1, max_length=120, description="`key` (newest active) or `key:vN`")


class CreditPrices(BaseModel):
    """Credit prices; what is left out carries over from the key's newest version."""

    model_config = ConfigDict(extra="forbid", strict=True)

    base: int | None = Field(None, ge=0, le=1_000_000)
    per_mb: int | None = Field(None, ge=0, le=1_000_000)
    per_page: int | None = Field(None, ge=0, le=1_000_000)
    per_minute: int | None = Field(None, ge=0, le=1_000_000)


class ProfileCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    key: str = Field(..., min_length=1, max_length=100, examples=["image-thumbnail"])
    job_type: str = Field(..., min_length=1, max_length=50, examples=["image.thumbnail"])
    settings: dict[str, Any] | None = Field(
        None,
        description="checked against the job type's schema; left out: the key's newest "
        "version's (a new key: the schema's defaults)",
    )
    queue: str | None = Field(None, min_length=1, max_length=50)
    credits: CreditPrices | None = None
    timeout_seconds: int | None = Field(None, ge=1, le=7 * 86400)
    max_input_bytes: int | None = Field(None, ge=1, le=2**62)


@router.get("", summary="List profile versions (active ones unless told otherwise)")
def list_profiles(
    request: Request,
    job_type: str | None = Query(None, max_length=50, pattern=NAME),
    key: str | None = Query(None, max_length=100, pattern=NAME),
    include_inactive: bool = Query(False),
    limit: Annotated[Whole, Query(ge=1, le=500)] = 100,
    cursor: str | None = Query(None, max_length=40),
    principal: Principal = scoped("jobs:read"),
) -> Row:
    rows = services(request).profiles.list(
        job_type,
        include_inactive=include_inactive,
        key=key,
        after_id=decode_cursor(cursor, "profile_id") if cursor else None,
        limit=limit + 1,
    )
    return page(rows, limit, "profile_id", lambda p: shown(p, principal, "settings"))


@router.get("/{ref}", summary="A profile version, with its key's versions")
def show_profile(
    request: Request, ref: str = Ref, principal: Principal = scoped("jobs:read")
) -> Row:
    profiles = services(request).profiles
    profile = profiles.show(ref)
    # The key's first versions, paged on through the list like any other:
    # a key of 10,000 versions answered 5 MB here.
    rows = profiles.list(
        include_inactive=True, key=profile["profile_key"], limit=SHOWN_VERSIONS + 1
    )
    versions = page(rows, SHOWN_VERSIONS, "profile_id", lambda p: shown(p, principal, "settings"))
    return {
        **shown(profile, principal, "settings"),
        "versions": versions["items"],
        "versions_next_cursor": versions["next_cursor"],
    }


@router.post("", status_code=201, summary="Create the next version of a profile (admin)")
def create_profile(
    body: ProfileCreate, request: Request, principal: Principal = scoped("admin")
) -> Row:
    return services(request).profiles.create(
        body.key,
        body.job_type,
        body.settings,
        queue=body.queue,
        credits=body.credits.model_dump() if body.credits else None,
        timeout_seconds=body.timeout_seconds,
        max_input_bytes=body.max_input_bytes,
    )


@router.post(
    "/{ref}/deactivate",
    summary="Stop new jobs from using a version (admin); jobs that have it keep it",
)
def deactivate_profile(
    request: Request, ref: str = Ref, principal: Principal = scoped("admin")
) -> Row:
    return services(request).profiles.deactivate(ref)

"""``/v1/photos`` (seed 002): upload, list, show, copy, move, update and delete.

A photo is metadata bound to objects; sizes, dimensions, types and URLs come
from the object layer.  Every route checks the photo's project first: another
project's photo answers exactly like a missing one.
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from hypermedia.api.deps import NO_CONTROLS, Whole, link_base, scoped, services
from hypermedia.api.openapi import upload_body
from hypermedia.api.routes.objects import Upload, receive_upload
from hypermedia.api.strict_json import StrictJSONRoute
from hypermedia.auth.tokens import Principal
from hypermedia.errors import BAD_CURSOR, InvalidRequest
from hypermedia.services import Services

router = APIRouter(prefix="/v1/photos", tags=["photos"], route_class=StrictJSONRoute)

Row = dict[str, Any]
# Ids are UUIDs; any unreserved URL text up to the column's width is looked up
# (legacy producers choose their own), nothing with control characters.
PhotoId = PathParam(pattern=r"^[A-Za-z0-9._~-]{1,36}$")


class PhotoCopy(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    album: str | None = Field(None, max_length=200, description="default: the source's album")


class PhotoMove(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    album: str = Field(..., max_length=200)


class PhotoUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    title: str | None = Field(None, max_length=500)
    album: str | None = Field(None, max_length=200)


def owned_photo(svc: Services, photo_id: str, principal: Principal, url: str = "") -> Row:
    """The photo, if it is the caller's project's; with signed URLs given ``url``
    (the base) and a caller who may read objects.  A write-only token gets
    none: a PATCH of ``{}`` handed it links to photos it may not see."""
    urls = bool(url) and principal.allows("objects:read")
    return svc.photos.get(photo_id, base_url=url, urls=urls, project_id=principal.project_id)


# Photos.list's cursor (a timestamp and an id) wrapped to be opaque and URL-safe.
def encode_cursor(cursor: str | None) -> str | None:
    if cursor is None:
        return None
    return base64.urlsafe_b64encode(f"p{cursor}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> str:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        if raw.startswith("p") and raw[1:].isprintable():
            return raw[1:]
    except (binascii.Error, UnicodeDecodeError, ValueError):
        pass
    raise InvalidRequest(BAD_CURSOR)


def _once(name: str, upload: Upload, query: str | None) -> str:
    """A text given as a form field or a query parameter, not both."""
    field = upload.fields.get(name)
    if field is not None and query is not None:
        raise InvalidRequest(f"give {name} as a form field or a query parameter, not both")
    return field if field is not None else query or ""


def _add(svc: Services, upload: Upload, principal: Principal, **text: str) -> str:
    # Given the open file, not its path: with a path the use case would name
    # the photo after our temp file when the client named nothing.
    with open(upload.path, "rb") as src:
        photo = svc.photos.add(
            src, project_id=principal.project_id, owner_id=principal.actor, **text
        )
    return str(photo["id"])


@router.post(
    "",
    status_code=201,
    summary="Upload a photo (raw body, or multipart with `file`, `album`, `title`)",
    description=(
        "The body is sent as for `POST /v1/objects`. `album` and `title` are form fields "
        "of a multipart upload or query parameters (one or the other). Not an image: 422."
    ),
    # The body is read by receive_upload, not by FastAPI.
    openapi_extra=upload_body(
        album={"type": "string", "maxLength": 200}, title={"type": "string", "maxLength": 500}
    ),
)
async def upload_photo(
    request: Request,
    album: str | None = Query(None, max_length=200),
    title: str | None = Query(None, max_length=500),
    filename: str | None = Query(None, max_length=4096, description="for a raw body (cut to 255)"),
    principal: Principal = scoped("objects:write"),
) -> Row:
    svc = services(request)
    fields = frozenset({"album", "title"})
    async with receive_upload(request, svc.settings, fields) as upload:
        text = {
            "album": _once("album", upload, album),
            "title": _once("title", upload, title),
            "filename": upload.filename or filename or "",
        }
        photo_id = await run_in_threadpool(_add, svc, upload, principal, **text)
    return await run_in_threadpool(owned_photo, svc, photo_id, principal, link_base(request))


@router.get("", summary="List the project's photos, newest first (no URLs: get one photo)")
def list_photos(
    request: Request,
    album: str | None = Query(None, max_length=200, pattern=NO_CONTROLS),
    limit: Annotated[Whole, Query(ge=1, le=500)] = 50,
    cursor: str | None = Query(None, max_length=200),
    principal: Principal = scoped("objects:read"),
) -> Row:
    page = services(request).photos.list(
        principal.project_id,
        album=album,
        limit=limit,
        cursor=decode_cursor(cursor) if cursor else None,
    )
    return {"items": page["photos"], "next_cursor": encode_cursor(page["next_cursor"])}


@router.get("/{photo_id}", summary="A photo: facts and signed URLs of its objects, variants")
def show_photo(
    request: Request, photo_id: str = PhotoId, principal: Principal = scoped("objects:read")
) -> Row:
    return owned_photo(services(request), photo_id, principal, link_base(request))


@router.post(
    "/{photo_id}/copy",
    status_code=201,
    summary="Copy a photo (metadata only: the copy shares the objects)",
)
def copy_photo(
    request: Request,
    body: PhotoCopy | None = None,
    photo_id: str = PhotoId,
    principal: Principal = scoped("objects:write"),
) -> Row:
    svc = services(request)
    owned_photo(svc, photo_id, principal)
    copy = svc.photos.copy(photo_id, album=body.album if body else None)
    return owned_photo(svc, copy["id"], principal, link_base(request))


@router.post("/{photo_id}/move", summary="Move a photo to another album")
def move_photo(
    body: PhotoMove,
    request: Request,
    photo_id: str = PhotoId,
    principal: Principal = scoped("objects:write"),
) -> Row:
    svc = services(request)
    owned_photo(svc, photo_id, principal)
    svc.photos.move(photo_id, body.album)
    return owned_photo(svc, photo_id, principal, link_base(request))


@router.patch("/{photo_id}", summary="Change a photo's title or album")
def update_photo(
    body: PhotoUpdate,
    request: Request,
    photo_id: str = PhotoId,
    principal: Principal = scoped("objects:write"),
) -> Row:
    svc = services(request)
    owned_photo(svc, photo_id, principal)
    svc.photos.update(photo_id, title=body.title, album=body.album)
    return owned_photo(svc, photo_id, principal, link_base(request))


@router.delete(
    "/{photo_id}",
    status_code=204,
    summary="Delete a photo (its objects are collected once nothing else uses them)",
)
def delete_photo(
    request: Request, photo_id: str = PhotoId, principal: Principal = scoped("objects:write")
) -> Response:
    svc = services(request)
    owned_photo(svc, photo_id, principal)
    svc.photos.delete(photo_id)
    return Response(status_code=204)

"""The OpenAPI document as the API really answers.

FastAPI documents a 422 of its own shape (``HTTPValidationError``) and no
other error.  ``install`` rewrites the generated document once: every error
answer is the one ``Error`` shape (errors.py), and each operation lists the
statuses it can really give, worked out from the operation itself (a token,
a body, a row id in the path) plus ``EXTRA``, what only the use case knows.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field

REF = "#/components/schemas/"


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="forbid")

    loc: list[str] = Field(..., description="where, outermost first: body, query, path, header")
    msg: str


class Error(BaseModel):
    """Every 4xx and 5xx answer (errors.error_response)."""

    model_config = ConfigDict(extra="forbid")

    code: str = Field(..., description="stable, for programs (docs/api.md, Errors)")
    message: str = Field(..., description="for people")
    request_id: str = Field(..., description="also in the X-Request-ID header")
    # A factory, not None: the key is left out, never null, when there are none.
    details: list[ErrorDetail] = Field(
        default_factory=list, description="request validation (422) only: each field's problem"
    )


RETRY_AFTER = {
    "Retry-After": {
        "description": "seconds to wait before sending it again",
        "schema": {"type": "integer"},
    }
}

# What each status means wherever it is answered; EXTRA may say it better for a route.
MEANING: dict[int, str] = {
    400: "The request's length is ambiguous: two Content-Lengths, or one with "
    "Transfer-Encoding (`bad_request`)",
    401: "No token, or an unknown, expired or revoked one (`unauthorized`)",
    403: "The token lacks the {scope} scope (`forbidden`)",
    404: "No such {what} in the token's project (`not_found`)",
    408: "The body stalled: nothing came for the idle timeout (`request_timeout`)",
    413: "The body is larger than the server's limit (`payload_too_large`)",
    422: "The request is not valid, or its URL's %-escapes are not UTF-8 "
    "(`invalid_request`; request validation lists each field in `details`)",
    429: "Too many requests for this token (`rate_limited`)",
    503: "The database or storage is unavailable, or the database not migrated yet "
    "(`database_unavailable`, `database_not_migrated`, `storage_unavailable`): send it again",
}
# The ``code`` each status's example shows (the one it usually has).
CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    408: "request_timeout",
    409: "conflict",
    411: "length_required",
    412: "precondition_failed",
    413: "payload_too_large",
    416: "range_not_satisfiable",
    422: "invalid_request",
    429: "rate_limited",
    500: "object_corrupt",
    503: "database_unavailable",
    507: "insufficient_storage",
}
HEADERS: dict[int, dict[str, Any]] = {
    401: {"WWW-Authenticate": {"schema": {"type": "string", "const": "Bearer"}}},
    429: RETRY_AFTER,
    503: RETRY_AFTER,
    507: RETRY_AFTER,
}

UPLOAD: dict[int, str] = {
    411: "A multipart upload without Content-Length (`length_required`)",
    413: "Larger than the server's upload limit (`payload_too_large`): nothing is kept, "
    "the connection closes",
    507: "No room left on the server's disk (`insufficient_storage`): nothing is kept",
}
ROWS = {"ref": "profile"}  # path parameters naming a row other than by ``*_id``
CONFLICT = "The job's status does not allow it (`conflict`)"
# (method, path) -> statuses only the use case knows of, with what they mean there.
EXTRA: dict[tuple[str, str], dict[int, str]] = {
    ("POST", "/v1/objects"): UPLOAD,
    ("POST", "/v1/photos"): UPLOAD,
    ("GET", "/v1/objects/{object_id}/content"): {
        403: "A bad, expired or forged link, all alike (`forbidden`)",
        404: "The object is gone since the link was made (`not_found`)",
        412: "`If-Match` names another version (`precondition_failed`)",
        416: "The range starts past the object's end (`range_not_satisfiable`; "
        "`Content-Range: bytes */SIZE`)",
        500: "The stored bytes no longer match their checksum (`object_corrupt`)",
        503: MEANING[503],
    },
    ("POST", "/v1/jobs/{job_id}/cancel"): {409: CONFLICT},
    ("POST", "/v1/jobs/{job_id}/retry"): {409: CONFLICT},
    ("POST", "/v0/processing-jobs/{job_id}/cancel"): {409: CONFLICT},
    ("POST", "/v0/processing-jobs/{job_id}/retry"): {409: CONFLICT},
    ("POST", "/v1/workers/{worker_id}/drain"): {
        409: "Only an active or idle worker can be drained (`conflict`)"
    },
    ("POST", "/v1/profiles"): {409: "The key is being changed by others: try again (`conflict`)"},
}


def answers(method: str, path: str, op: dict[str, Any]) -> dict[int, str]:
    """The error statuses ``op`` can give, each with what it means there."""
    # Any request, whatever the route: app.BodyLimit reads a body sent even
    # to a GET (a length over the limit, a stall, ambiguous framing), and
    # deps.utf8_url refuses %-escapes that are not UTF-8 in any URL.
    codes = {s: MEANING[s] for s in (400, 408, 413, 422)}
    scopes = [s for req in op.get("security", ()) for ss in req.values() for s in ss]
    if scopes:  # deps.scoped: a token looked up in the database, rate-limited, scoped
        scope = " or ".join(f"`{s}`" for s in scopes)
        codes |= {s: MEANING[s] for s in (401, 429, 503)}
        codes[403] = MEANING[403].format(scope=scope)
    # A row named in the path (a queue's name is none: any name can be paused).
    names = [p["name"] for p in op.get("parameters", ()) if p["in"] == "path"]
    rows = [ROWS.get(n, n.removesuffix("_id")) for n in names if n.endswith("_id") or n in ROWS]
    if rows:
        codes[404] = MEANING[404].format(what=rows[0])
    return codes | EXTRA.get((method.upper(), path), {})


def _response(status: int, meaning: str) -> dict[str, Any]:
    example: dict[str, Any] = {"code": CODES[status], "message": "…", "request_id": "9552e1e8…"}
    if status == 422:
        example["details"] = [{"loc": ["body", "priority"], "msg": "Input should be …"}]
    response: dict[str, Any] = {
        "description": meaning,
        "content": {"application/json": {"schema": {"$ref": REF + "Error"}, "example": example}},
    }
    if status in HEADERS:
        response["headers"] = HEADERS[status]
    return response


def rewrite(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` (FastAPI's) with the real error shape and statuses."""
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for fastapis in ("HTTPValidationError", "ValidationError"):
        schemas.pop(fastapis, None)
    error = Error.model_json_schema(ref_template=REF + "{model}")
    schemas.update(error.pop("$defs"), Error=error)
    unmatched = set(EXTRA)
    for path, item in doc["paths"].items():
        for method, op in item.items():
            unmatched.discard((method.upper(), path))
            responses = op["responses"]
            for status, meaning in answers(method, path, op).items():
                responses[str(status)] = _response(status, meaning)
            op["responses"] = dict(sorted(responses.items()))
    if unmatched:  # a route renamed or removed: its entry would silently do nothing
        raise AssertionError(f"EXTRA names no operation: {sorted(unmatched)}")
    return doc


def install(app: FastAPI) -> None:
    generate = app.openapi  # FastAPI's, which caches in app.openapi_schema

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = rewrite(generate())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def upload_body(**text_fields: dict[str, Any]) -> dict[str, Any]:
    """``openapi_extra`` of an upload route, which reads its body itself
    (objects.receive_upload): raw bytes, or a form with a ``file`` part and
    ``text_fields`` (name -> JSON schema)."""
    binary = {"type": "string", "format": "binary"}
    form = {
        "type": "object",
        "properties": {"file": binary, **text_fields},
        "required": ["file"],
        "additionalProperties": False,
    }
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/octet-stream": {"schema": binary},
                "multipart/form-data": {"schema": form},
            },
        }
    }

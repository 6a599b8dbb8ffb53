"""API routes: JSON request bodies read with each key once, HEAD as GET.

Starlette's ``Request.json()`` keeps the last of two equal keys, as Python
does; a proxy, a WAF or a log reader in front may keep the first, so
``{"priority": 1, "priority": 10}`` was one request to them and another to us.
Every API router takes its routes from ``StrictJSONRoute``: such a body is a
422 naming the key, as any other body that is not JSON.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.routing import Match
from starlette.types import Message, Receive, Scope, Send

from hypermedia.parse import DuplicateKey, json_unique


class _Request(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                self._json = json_unique(body)
            except DuplicateKey as exc:
                # FastAPI makes its 422 (type json_invalid) of this one error only.
                doc = body.decode("utf-8", "replace")
                raise json.JSONDecodeError(str(exc), doc, 0) from None
        return self._json


HEAD_KEY = "hypermedia.head"  # in a request's scope: a HEAD, run as its GET


def is_head(request: Request) -> bool:
    """Whether the request is a HEAD (which its GET route runs as a GET)."""
    return request.method == "HEAD" or bool(request.scope.get(HEAD_KEY))


class StrictJSONRoute(APIRoute):
    """Also: a GET route answers HEAD (RFC 9110 §9.3.2), with the GET's status
    and headers, Content-Length included, and no body (``curl -I`` of a job
    was a 405).  A route whose GET streams (a download, a job's events) asks
    ``is_head`` itself, before it opens anything.

    Not by listing HEAD in ``methods``: each listed method is an operation of
    the OpenAPI document, and HEAD would double every GET in it."""

    def _answers_head(self, scope: Scope) -> bool:
        return scope.get("method") == "HEAD" and "GET" in (self.methods or ())

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if self._answers_head(scope):
            return super().matches({**scope, "method": "GET"})
        return super().matches(scope)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._answers_head(scope):
            scope = {**scope, "method": "GET", HEAD_KEY: True}
        await super().handle(scope, receive, send)

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            response = await handler(_Request(request.scope, request.receive))
            return _HeadOf(response) if request.scope.get(HEAD_KEY) else response

        return strict


class _HeadOf(Response):
    """The GET's answer sent as a HEAD's: its status and headers, no body.
    Sent by the answer itself, told the request is a HEAD: a file's answer
    (``/docs``) learns its Content-Length only then, and sends no body."""

    def __init__(self, inner: Response) -> None:
        self.inner = inner
        self.status_code = inner.status_code
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def head_only(message: Message) -> None:
            if message["type"] != "http.response.body":
                await send(message)
            elif not message.get("more_body", False):
                await send({"type": "http.response.body", "body": b"", "more_body": False})

        await self.inner({**scope, "method": "HEAD"}, receive, head_only)

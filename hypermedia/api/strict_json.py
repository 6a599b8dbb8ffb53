"""JSON request bodies read with each key once.

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


class StrictJSONRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(_Request(request.scope, request.receive))

        return strict

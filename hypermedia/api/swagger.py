"""``/docs``: Swagger UI, served by this service itself.

FastAPI's own page loads Swagger UI from a CDN (blank on a host that is
offline) and starts it with an inline script.  Here the files come from the
``swagger-ui-bundle-v2`` package, and the start-up script is a file of its
own, so the page's Content-Security-Policy can allow scripts from this
origin alone: the dashboard's session cookie lives on it too.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, Response
from swagger_ui_bundle import swagger_ui_path

from hypermedia.api.strict_json import StrictJSONRoute
from hypermedia.errors import NotFound

router = APIRouter(include_in_schema=False, route_class=StrictJSONRoute)  # HEAD as GET

DIST = Path(swagger_ui_path)
# Only these are served (the package also has an index page, maps, a petstore demo).
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon-32x32.png": "image/png",
}
ASSET_HEADERS = {"Cache-Control": "public, max-age=86400", "X-Content-Type-Options": "nosniff"}

# Swagger UI fetches the document and "Try it out" calls this origin; its
# icons are data: URLs; its React code sets styles through the DOM (allowed).
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
}

# validatorUrl null: Swagger UI would otherwise send the document to swagger.io.
INIT_JS = """\
"use strict";
const root = document.getElementById("swagger-ui");
window.ui = SwaggerUIBundle({
  url: root.dataset.openapi,
  domNode: root,
  presets: [SwaggerUIBundle.presets.apis],
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  validatorUrl: null,
});
"""

PAGE = """\
<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<link rel="stylesheet" href="{base}/docs/swagger-ui.css">
<link rel="icon" type="image/png" href="{base}/docs/favicon-32x32.png">
</head>
<body>
<div id="swagger-ui" data-openapi="{base}/openapi.json"></div>
<script src="{base}/docs/swagger-ui-bundle.js"></script>
<script src="{base}/docs/init.js"></script>
</body>
</html>
"""


@router.get("/docs")
async def docs(request: Request) -> HTMLResponse:
    base = escape(request.scope.get("root_path", "").rstrip("/"))
    title = escape(f"{request.app.title} API")
    return HTMLResponse(PAGE.format(title=title, base=base), headers=PAGE_HEADERS)


@router.get("/docs/{name}")
async def asset(name: str) -> Response:
    if name == "init.js":
        return Response(INIT_JS, media_type="text/javascript; charset=utf-8", headers=ASSET_HEADERS)
    if name not in ASSETS:
        raise NotFound("no such file")
    return FileResponse(DIST / name, media_type=ASSETS[name], headers=ASSET_HEADERS)

"""/openapi.json tells the truth, and /docs works with nothing from outside.

The document is checked against the API's real answers: the statuses it
declares for a token and a scope are what requests without them get, and
real error bodies validate against the declared ``Error`` schema.  The
document does not depend on the database: SQLite only.
"""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema_rs  # comes with schemathesis (a dev dependency)
import pytest
from fastapi.testclient import TestClient

from hypermedia.queue.models import NewJob
from hypermedia.services import Services
from tests.api.conftest import Project, bearer

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

PUBLIC = {("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/v1/objects/{object_id}/content")}
UPLOADS = ("/v1/objects", "/v1/photos")
# A value for each path parameter: enough to reach the route (not a real row).
PATH_VALUES = {
    "job_id": "1",
    "object_id": "1",
    "photo_id": "p",
    "ref": "x",
    "name": "q",
    "worker_id": "w",
}


def operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(m.upper(), p, op) for p, item in doc["paths"].items() for m, op in item.items()]


def url(path: str) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: PATH_VALUES[m.group(1)], path)


@pytest.fixture
def doc(client: TestClient) -> dict[str, Any]:
    r = client.get("/openapi.json")
    assert r.status_code == 200
    return dict(r.json())


def test_every_error_answer_is_the_one_error_shape(doc: dict[str, Any]) -> None:
    schemas = doc["components"]["schemas"]
    assert "HTTPValidationError" not in json.dumps(doc)
    assert "ValidationError" not in schemas
    error = schemas["Error"]
    assert set(error["properties"]) == {"code", "message", "request_id", "details"}
    assert set(error["required"]) == {"code", "message", "request_id"}
    assert set(schemas["ErrorDetail"]["properties"]) == {"loc", "msg"}
    declared = 0
    for method, path, op in operations(doc):
        for status, response in op["responses"].items():
            if int(status) < 400 or (path, status) == ("/readyz", "503"):
                continue  # a probe's 503 says which part is not ready
            schema = response["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/Error"}, (method, path, status)
            declared += 1
    assert declared > 200


def test_the_bearer_scheme_is_declared_on_every_route_but_the_public_ones(
    doc: dict[str, Any],
) -> None:
    scheme = doc["components"]["securitySchemes"]["bearer"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    for method, path, op in operations(doc):
        statuses = set(op["responses"])
        if (method, path) in PUBLIC:
            assert "security" not in op and "401" not in statuses, (method, path)
            continue
        ((name, scopes),) = op["security"][0].items()
        assert name == "bearer" and len(scopes) == 1, (method, path)
        assert {"401", "403", "429", "503"} <= statuses, (method, path)
        assert f"`{scopes[0]}`" in op["responses"]["403"]["description"]


def test_declared_auth_matches_what_the_routes_answer(
    client: TestClient, doc: dict[str, Any], a: Project
) -> None:
    """No token: a 401 exactly where one is declared.  A token without the
    declared scope: a 403 (admin implies every scope, so any other will do)."""
    for method, path, op in operations(doc):
        r = client.request(method, url(path))
        if (method, path) in PUBLIC:
            assert r.status_code != 401, (method, path)
            continue
        assert r.status_code == 401, (method, path, r.text)
        (scope,) = op["security"][0]["bearer"]
        other = next(t for s, t in a.scoped.items() if s != scope)
        r = client.request(method, url(path), headers=bearer(other))
        assert r.status_code == 403, (method, path, r.text)


def test_404_on_routes_with_a_row_in_the_path_and_409_where_a_state_refuses(
    doc: dict[str, Any],
) -> None:
    paths = doc["paths"]
    for method, path, op in operations(doc):
        names = {p["name"] for p in op.get("parameters", ()) if p["in"] == "path"}
        assert ("404" in op["responses"]) == bool(names - {"name"}), (method, path)
    assert "404" not in paths["/v1/queues/{name}/pause"]["post"]["responses"]
    conflicts = {(m, p) for m, p, op in operations(doc) if "409" in op["responses"]}
    assert conflicts == {
        ("POST", "/v1/jobs/{job_id}/cancel"),
        ("POST", "/v1/jobs/{job_id}/retry"),
        ("POST", "/v0/processing-jobs/{job_id}/cancel"),
        ("POST", "/v0/processing-jobs/{job_id}/retry"),
        ("POST", "/v1/workers/{worker_id}/drain"),
        ("POST", "/v1/profiles"),
    }
    content = paths["/v1/objects/{object_id}/content"]["get"]["responses"]
    assert {"200", "206", "403", "404", "416", "500", "503"} <= set(content)
    assert "application/octet-stream" in content["206"]["content"]
    # Every route, a body or not: app.BodyLimit and deps.utf8_url guard them all.
    for method, path, op in operations(doc):
        assert {"400", "408", "413", "422"} <= set(op["responses"]), (method, path)
    ready = paths["/readyz"]["get"]["responses"]["503"]["content"]["application/json"]
    assert ready["schema"] == {"$ref": "#/components/schemas/Readiness"}


def test_upload_routes_declare_their_raw_and_multipart_bodies(doc: dict[str, Any]) -> None:
    for path in UPLOADS:
        op = doc["paths"][path]["post"]
        content = op["requestBody"]["content"]
        assert content["application/octet-stream"]["schema"]["format"] == "binary"
        form = content["multipart/form-data"]["schema"]
        assert form["properties"]["file"] == {"type": "string", "format": "binary"}
        assert form["required"] == ["file"]
        assert {"408", "411", "413", "422", "507"} <= set(op["responses"]), path
    photo_form = doc["paths"]["/v1/photos"]["post"]["requestBody"]["content"]
    assert set(photo_form["multipart/form-data"]["schema"]["properties"]) == {
        "file",
        "album",
        "title",
    }
    json_bodies = [(m, p) for m, p, op in operations(doc) if "requestBody" in op]
    for method, path in json_bodies:
        assert "413" in doc["paths"][path][method.lower()]["responses"], (method, path)


def test_docs_load_only_local_assets_under_a_strict_policy(client: TestClient) -> None:
    r = client.get("/docs")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    assert "cdn" not in html.lower() and "http" not in html.lower()
    policy = r.headers["content-security-policy"]
    assert "script-src 'self';" in policy and "unsafe" not in policy
    urls = re.findall(r'(?:src|href|data-openapi)="([^"]+)"', html)
    assert len(urls) == 5 and all(u.startswith("/") and not u.startswith("//") for u in urls)
    kinds = set()
    for u in urls:
        got = client.get(u)
        assert got.status_code == 200, u
        kinds.add(got.headers["content-type"].split(";")[0])
    assert kinds == {"text/javascript", "text/css", "image/png", "application/json"}
    assert "SwaggerUIBundle" in client.get("/docs/swagger-ui-bundle.js").text
    # Only the named files: not the package's demo page, nor anything beside it.
    for name in ("index.html", "swagger-initializer.js", "..%2F__init__.py"):
        assert client.get(f"/docs/{name}").status_code == 404, name


def test_real_error_answers_validate_against_the_declared_schema(
    client: TestClient, svc: Services, doc: dict[str, Any], a: Project
) -> None:
    validator = jsonschema_rs.Draft202012Validator(
        {"$ref": "#/components/schemas/Error", "components": doc["components"]}
    )
    queued = svc.engine.enqueue(NewJob("debug.noop", project_id=a.id))
    admin = bearer(a.admin)
    samples = [
        ("GET", "/v1/jobs/{job_id}", "/v1/jobs/999999", admin, None, 404),
        ("POST", "/v1/jobs", "/v1/jobs", admin, {"priority": 99}, 422),
        ("GET", "/v1/jobs", "/v1/jobs", {}, None, 401),
        ("GET", "/v1/queues", "/v1/queues", bearer(a.scoped["jobs:read"]), None, 403),
        ("POST", "/v1/jobs/{job_id}/retry", f"/v1/jobs/{queued}/retry", admin, None, 409),
        ("PUT", "/v1/credits/budget", "/v1/credits/budget", admin, {"x": "y" * 2**21}, 413),
    ]
    for method, path, target, headers, body, status in samples:
        r = client.request(method, target, headers=headers, json=body)
        assert r.status_code == status, (target, r.text[:200])
        assert str(status) in doc["paths"][path][method.lower()]["responses"], (path, status)
        errors = [e.message for e in validator.iter_errors(r.json())]
        assert not errors, (target, r.json(), errors)
    # Request validation's details are the declared ErrorDetail items.
    r = client.post("/v1/jobs", headers=admin, json={"priority": 99})
    assert r.json()["details"][0]["loc"] == ["body", "priority"]


def test_every_route_gives_the_guards_statuses_it_declares(
    client: TestClient, doc: dict[str, Any], a: Project
) -> None:
    """A length over the body limit (413) and a URL whose %-escapes are not
    UTF-8 (422) are answered by every route, a GET's too: the document said
    so only of routes with a body, or with parameters."""
    for method, path, _ in operations(doc):
        target = url(path)
        too_long = client.request(
            method, target, headers={**bearer(a.admin), "Content-Length": str(10**15)}
        )
        assert too_long.status_code == 413, (method, path, too_long.text[:200])
        not_utf8 = client.request(method, target + "?x=%FF", headers=bearer(a.admin))
        assert not_utf8.status_code == 422, (method, path, not_utf8.text[:200])

"""The isolation and scope matrices, over every route the app has.

Routes are read from the application itself, so an endpoint added later is
covered without editing this file: it must declare a scope, refuse every
token without it, and answer another project's resource with a 404.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from hypermedia.auth.tokens import SCOPES
from hypermedia.db.queries import Tx
from hypermedia.queue.models import NewJob
from hypermedia.services import Services
from tests.api.conftest import Project, bearer
from tests.media import png

# Bodies that pass validation, so the answer is about the resource, not the body.
BODIES = {
    ("POST", "/v1/photos/{photo_id}/move"): {"album": "elsewhere"},
    ("PATCH", "/v1/photos/{photo_id}"): {"title": "mine now"},
}
# Reachable without a token: the signed link is the capability.
PUBLIC = {("GET", "/v1/objects/{object_id}/content"), ("HEAD", "/v1/objects/{object_id}/content")}


@dataclass
class Route:
    method: str
    path: str
    scope: str | None


def _flat(routes: list, prefix: str = "") -> list[tuple[str, APIRoute]]:  # type: ignore[type-arg]
    """(full path, route) pairs; FastAPI keeps included routers nested."""
    out: list[tuple[str, APIRoute]] = []
    for r in routes:
        if isinstance(r, APIRoute):
            out.append((prefix + r.path, r))
        elif hasattr(r, "original_router"):
            out += _flat(r.original_router.routes, prefix + r.include_context.prefix)
    return out


def api_routes(client: TestClient) -> list[Route]:
    out = []
    for path, r in _flat(client.app.routes):  # type: ignore[attr-defined]
        if not path.startswith(("/v1/", "/v0/")):
            continue
        names = [d.call.__name__ for d in r.dependant.dependencies if d.call]
        scopes = [n.removeprefix("scope_").replace("_", ":", 1) for n in names]
        scope = next((s for s in scopes if s in SCOPES), None)
        methods = set(r.methods or ())
        if "GET" in methods:  # answered as GET is, without the body (a 405 before)
            methods.add("HEAD")
        out += [Route(m, path, scope) for m in sorted(methods)]
    return out


@dataclass
class Owned:
    """Project A's resources, by the path parameter that names them."""

    values: dict[str, str]

    def fill(self, path: str) -> str:
        def one(m: re.Match[str]) -> str:
            name = m.group(1)
            if path.startswith("/v0/") and name in ("id", "job_id", "job_uuid"):
                return self.values["job_uuid"]
            return self.values.get(name, "1")

        return re.sub(r"\{(\w+)\}", one, path)


@pytest.fixture
def owned_by_a(svc: Services, a: Project) -> Owned:
    obj = svc.storage.put(io.BytesIO(png(8, 8)), filename="a.png", project_id=a.id)
    # Not a debug.* job: retrying one needs the admin scope, on top of jobs:write.
    thumb = NewJob("image.thumbnail", project_id=a.id, object_id=obj["object_id"])
    job_id = svc.engine.enqueue(thumb)
    photo = svc.photos.add(io.BytesIO(png(8, 8)), project_id=a.id, filename="a.png")
    job = svc.engine.get(job_id)
    values = {
        "job_id": str(job_id),
        "job_uuid": job["job_uuid"],
        "object_id": str(obj["object_id"]),
        "name": "images",
        "ref": "image-thumbnail",
        "worker_id": "no-such-worker",
        "photo_id": str(photo["id"]),
    }
    return Owned(values)


def _call(client: TestClient, route: Route, url: str, token: str):  # type: ignore[no-untyped-def]
    headers = {**bearer(token), "Accept": "application/json"}
    body = None if route.method in ("GET", "DELETE") else BODIES.get((route.method, route.path), {})
    return client.request(route.method, url, headers=headers, json=body)


def test_every_route_declares_one_scope(client: TestClient) -> None:
    routes = api_routes(client)
    assert len(routes) >= 30
    missing = [f"{r.method} {r.path}" for r in routes if r.scope is None]
    assert sorted(missing) == sorted(f"{m} {p}" for m, p in PUBLIC)


def test_scope_matrix(client: TestClient, a: Project, owned_by_a: Owned) -> None:
    for route in api_routes(client):
        if route.scope is None:
            continue
        url = owned_by_a.fill(route.path)
        for scope, token in a.scoped.items():
            r = _call(client, route, url, token)
            if route.method == "HEAD":  # the GET's answer, without its body
                got = _call(client, Route("GET", route.path, route.scope), url, token)
                assert (r.status_code, r.content) == (got.status_code, b""), route
                assert r.headers["content-length"] == got.headers["content-length"], route
            elif scope == route.scope:
                assert r.status_code not in (401, 403), f"{route} with {scope}: {r.text}"
            else:
                assert r.status_code == 403, f"{route} with {scope}: {r.status_code}"
                assert r.json()["code"] == "forbidden"


def test_isolation_matrix(
    client: TestClient,
    svc: Services,
    a: Project,
    b: Project,
    owned_by_a: Owned,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    own = {"job_id", "object_id", "photo_id", "id", "job_uuid"}
    before = svc.engine.get(int(owned_by_a.values["job_id"]))
    # What only an owner's answer needs is never read for B: a 404 that read
    # A's job's attempts and events, or A's photo's bindings, first took
    # measurably longer than a missing id's (the time told it existed).
    read: list[str] = []
    for name in ("attempts", "events", "outputs", "bindings_of"):
        real = getattr(Tx, name)
        monkeypatch.setattr(
            Tx, name, lambda *args, _n=name, _f=real, **kw: read.append(_n) or _f(*args, **kw)
        )
    for route in api_routes(client):
        params = set(re.findall(r"\{(\w+)\}", route.path))
        if route.scope is None:
            continue  # the signed link: whoever holds it may download, by design
        if route.scope == "admin" and not params & own:
            continue  # operator endpoints over shared resources (queues, workers, profiles)
        url = owned_by_a.fill(route.path)
        read.clear()
        r = _call(client, route, url, b.admin)
        if route.method == "HEAD":
            assert (
                r.status_code
                == _call(client, Route("GET", route.path, None), url, b.admin).status_code
            )
        elif params & own:
            assert r.status_code == 404, f"{route}: B got {r.status_code} {r.text[:200]}"
            assert r.json()["code"] == "not_found"
            assert read == [], f"{route}: B's 404 read {read} of A's first"
        elif route.method == "GET":
            assert r.status_code == 200, f"{route}: {r.status_code}"
            for key in ("job_uuid", "object_id", "photo_id", "job_id"):
                value = owned_by_a.values.get(key)
                if value and key.endswith("uuid"):
                    assert value not in r.text, f"{route} shows A's {key}"
            for item in r.json().get("items", []):
                assert item.get("project_id") in (None, b.id), f"{route} leaks {item}"
    # SSE too: B cannot follow A's job.
    job_id = owned_by_a.values["job_id"]
    sse = {**bearer(b.admin), "Accept": "text/event-stream"}
    assert client.get(f"/v1/jobs/{job_id}/events", headers=sse).status_code == 404
    after = svc.engine.get(int(job_id))
    assert (after["status"], after["attempt_count"]) == (before["status"], before["attempt_count"])
    assert len(after["events"]) == len(before["events"])

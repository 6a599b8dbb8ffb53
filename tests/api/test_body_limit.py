"""Request bodies other than uploads are capped (HYPERMEDIA_API_MAX_BODY_BYTES):
FastAPI parses a JSON body whole, so without a cap one client could make the
API hold gigabytes.  Uploads stream to disk under their own limit."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from hypermedia.api.app import create_app
from hypermedia.services import Services
from tests.api.conftest import Project, bearer
from tests.api.test_ui_pages import login
from tests.media import jpeg_header

LIMIT = 4096


@pytest.fixture
def capped(svc: Services) -> Iterator[TestClient]:
    svc.settings = svc.settings.with_(api_max_body_bytes=LIMIT)
    with TestClient(create_app(svc), raise_server_exceptions=False) as c:
        yield c


def _job(marker_bytes: int) -> bytes:
    params = {"marker": "x" * marker_bytes}
    return json.dumps({"job_type": "debug.sleep", "params": params}).encode()


JSON = {"Content-Type": "application/json"}


def test_a_json_body_over_the_limit_is_413_and_creates_nothing(
    capped: TestClient, a: Project, svc: Services
) -> None:
    h = {**bearer(a.admin), **JSON, "X-Request-ID": "limit-test-1"}
    body = _job(LIMIT)
    assert len(body) > LIMIT
    r = capped.post("/v1/jobs", content=body, headers=h)
    assert r.status_code == 413
    assert r.json()["code"] == "payload_too_large"
    assert "4096-byte limit" in r.json()["message"]
    assert r.json()["request_id"] == r.headers["X-Request-ID"] == "limit-test-1"
    assert svc.engine.list() == []
    # Under the limit, the same route works.
    ok = capped.post("/v1/jobs", content=_job(100), headers=h)
    assert ok.status_code == 201, ok.text
    assert ok.json()["params"]["marker"] == "x" * 100


def test_a_chunked_body_without_a_length_is_counted(capped: TestClient, a: Project) -> None:
    def chunks(body: bytes) -> Iterator[bytes]:
        for i in range(0, len(body), 1000):
            yield body[i : i + 1000]

    h = {**bearer(a.admin), **JSON}
    r = capped.post("/v1/jobs", content=chunks(_job(LIMIT * 2)), headers=h)
    assert r.status_code == 413 and r.json()["code"] == "payload_too_large"
    ok = capped.post("/v1/jobs", content=chunks(_job(2500)), headers=h)
    assert ok.status_code == 201, ok.text


def test_every_json_route_is_capped_not_only_jobs(capped: TestClient, a: Project) -> None:
    h = {**bearer(a.admin), **JSON}
    big = json.dumps({"title": "t" * LIMIT}).encode()
    for method, path in (
        ("POST", "/v0/processing-jobs"),
        ("PATCH", "/v1/photos/1"),
        ("POST", "/v1/profiles"),
        ("PUT", "/v1/credits"),
    ):
        r = capped.request(method, path, content=big, headers=h)
        assert r.status_code == 413, (method, path, r.status_code)


def test_uploads_keep_their_own_limit(capped: TestClient, a: Project) -> None:
    """A raw upload may be a JSON file larger than the body cap."""
    data = _job(LIMIT * 4)
    r = capped.post("/v1/objects", content=data, headers={**bearer(a.admin), **JSON})
    assert r.status_code == 201, r.text
    assert r.json()["size"] == len(data)
    photo = jpeg_header(64, 48, exif_bytes=LIMIT * 2)
    r = capped.post("/v1/photos/", content=photo, headers=bearer(a.admin))
    assert r.status_code == 201, r.text
    login(capped, a.admin)  # the dashboard's upload form too
    r = capped.post(
        "/ui/upload",
        data={"profile": "image-thumbnail:v1"},
        files={"file": ("big.jpg", photo, "image/jpeg")},
        follow_redirects=False,
    )
    assert r.status_code == 303, r.text


def test_params_over_64_kib_are_refused_under_the_default_body_limit(
    client: TestClient, a: Project, svc: Services
) -> None:
    h = {**bearer(a.admin), **JSON}
    r = client.post("/v1/jobs", content=_job(70_000), headers=h)
    assert r.status_code == 422
    assert r.json()["message"] == "params take at most 64 KiB as JSON"
    assert svc.engine.list() == []

"""/v1/profiles and /v1/credits on every database."""

from __future__ import annotations

import uuid

import pytest
from fastapi.testclient import TestClient

from hypermedia.api.routes import profiles as profiles_route
from tests.api.conftest import Project, bearer


def new_key() -> str:
    # Profiles outlive a test (the table is seeded, not emptied): a key of its own.
    return f"api-{uuid.uuid4().hex[:10]}"


def create(client: TestClient, token: str, **body: object) -> dict[str, object]:
    r = client.post("/v1/profiles", json=body, headers=bearer(token))
    assert r.status_code == 201, r.text
    return dict(r.json())


def test_list_and_filter_profiles(client: TestClient, a: Project) -> None:
    h = bearer(a.scoped["jobs:read"])
    r = client.get("/v1/profiles", params={"key": "debug-noop"}, headers=h)
    assert r.status_code == 200
    assert [p["ref"] for p in r.json()["items"]] == ["debug-noop:v1"]
    only = client.get("/v1/profiles", params={"job_type": "debug.noop"}, headers=h).json()["items"]
    assert only and {p["job_type"] for p in only} == {"debug.noop"}


def test_profiles_are_listed_in_pages(client: TestClient, a: Project) -> None:
    """By key, oldest first, a page at a time; an inactive version is skipped
    unless asked for, and a page ends where the next begins."""
    keys = sorted(new_key() for _ in range(2))
    for key in keys:
        for _ in range(3):
            create(client, a.admin, key=key, job_type="debug.noop")
    client.post(f"/v1/profiles/{keys[0]}:v2/deactivate", headers=bearer(a.admin))
    h = bearer(a.scoped["jobs:read"])

    def walk(**params: object) -> tuple[list[str], int]:
        refs, pages, cursor = [], 0, None
        while True:
            query = {"limit": 2, **params, **({"cursor": cursor} if cursor else {})}
            r = client.get("/v1/profiles", params=query, headers=h)
            assert r.status_code == 200, r.text
            refs += [p["ref"] for p in r.json()["items"]]
            pages, cursor = pages + 1, r.json()["next_cursor"]
            if cursor is None:
                return refs, pages

    every = [f"{k}:v{n}" for k in keys for n in (1, 2, 3)]
    for key in keys:
        mine = [r for r in every if r.startswith(f"{key}:")]
        assert walk(key=key, include_inactive=True) == (mine, 2)
    active = [r for r in every if r != f"{keys[0]}:v2"]
    refs, _ = walk(job_type="debug.noop", limit=4)
    assert [r for r in refs if r.split(":")[0] in keys] == active
    assert len(refs) == len(set(refs))


def test_a_profile_cursor_must_be_one_of_its_pages(client: TestClient, a: Project) -> None:
    h = bearer(a.admin)
    client.post("/v1/jobs", json={"job_type": "debug.noop"}, headers=h)
    client.post("/v1/jobs", json={"job_type": "debug.noop"}, headers=h)
    jobs = client.get("/v1/jobs", params={"limit": 1}, headers=h).json()
    assert jobs["next_cursor"]
    # Base64 of "v" and a profile id that does not exist; a job list's cursor.
    for cursor in ("djk5OTk5OTk5", jobs["next_cursor"], "not-a-cursor"):
        r = client.get("/v1/profiles", params={"cursor": cursor}, headers=h)
        assert r.status_code == 422, cursor
        assert r.json()["message"].startswith("cursor is not valid")
    page = client.get("/v1/profiles", params={"limit": 1}, headers=h).json()
    r = client.get("/v1/jobs", params={"cursor": page["next_cursor"]}, headers=h)
    assert r.status_code == 422


def test_a_shown_profile_pages_its_versions(
    client: TestClient, a: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(profiles_route, "SHOWN_VERSIONS", 2)
    key = new_key()
    for _ in range(3):
        create(client, a.admin, key=key, job_type="debug.noop")
    h = bearer(a.scoped["jobs:read"])
    shown = client.get(f"/v1/profiles/{key}:v1", headers=h).json()
    assert shown["ref"] == f"{key}:v1"
    assert [v["ref"] for v in shown["versions"]] == [f"{key}:v1", f"{key}:v2"]
    rest = client.get(
        "/v1/profiles",
        params={"key": key, "include_inactive": True, "cursor": shown["versions_next_cursor"]},
        headers=h,
    ).json()
    assert ([v["ref"] for v in rest["items"]], rest["next_cursor"]) == ([f"{key}:v3"], None)
    monkeypatch.setattr(profiles_route, "SHOWN_VERSIONS", 3)
    assert client.get(f"/v1/profiles/{key}", headers=h).json()["versions_next_cursor"] is None


def test_create_versions_show_and_deactivate(client: TestClient, a: Project) -> None:
    key = new_key()
    v1 = create(client, a.admin, key=key, job_type="image.thumbnail", settings={"quality": 70})
    assert (v1["ref"], v1["is_active"]) == (f"{key}:v1", True)
    assert v1["settings"]["quality"] == 70  # type: ignore[index]
    v2 = create(
        client,
        a.admin,
        key=key,
        job_type="image.thumbnail",
        settings={"quality": 80},
        credits={"base": 3},
        queue="images",
    )
    assert (v2["ref"], v2["credit_cost_base"], v2["queue_name"]) == (f"{key}:v2", 3, "images")

    h = bearer(a.scoped["jobs:read"])
    shown = client.get(f"/v1/profiles/{key}", headers=h).json()
    assert shown["ref"] == f"{key}:v2"
    assert [v["ref"] for v in shown["versions"]] == [f"{key}:v1", f"{key}:v2"]
    assert client.get(f"/v1/profiles/{key}:v1", headers=h).json()["settings"]["quality"] == 70

    r = client.post(f"/v1/profiles/{key}:v2/deactivate", headers=bearer(a.admin))
    assert r.status_code == 200 and r.json()["is_active"] is False
    assert client.get(f"/v1/profiles/{key}", headers=h).json()["ref"] == f"{key}:v1"
    listed = client.get("/v1/profiles", params={"include_inactive": True, "key": key}, headers=h)
    assert [p["ref"] for p in listed.json()["items"]] == [f"{key}:v1", f"{key}:v2"]
    active = client.get("/v1/profiles", params={"key": key}, headers=h).json()["items"]
    assert [p["ref"] for p in active] == [f"{key}:v1"]


def test_a_profile_of_the_longest_key_can_be_used(client: TestClient, a: Project) -> None:
    """Keys have up to 100 characters; jobs took references of 80 at most."""
    key = new_key() + "k" * 86
    assert len(key) == 100
    create(client, a.admin, key=key, job_type="debug.noop")
    for ref in (key, f"{key}:v1"):
        r = client.post("/v1/jobs", json={"profile": ref}, headers=bearer(a.admin))
        assert r.status_code == 201, r.text
        assert r.json()["job_type"] == "debug.noop"


def test_invalid_profiles_are_422(client: TestClient, a: Project) -> None:
    key, h = new_key(), bearer(a.admin)
    bad = [
        {"key": key, "job_type": "image.thumbnail", "settings": {"quality": 500}},
        {"key": key, "job_type": "image.thumbnail", "settings": {"colour": "red"}},
        {"key": key, "job_type": "no.such_type"},
        {"key": "Bad Key!", "job_type": "debug.noop"},
        {"key": key, "job_type": "debug.noop", "credits": {"base": -1}},
        {"key": key, "job_type": "debug.noop", "credits": {"per_gb": 1}},
        {"key": key, "job_type": "debug.noop", "surprise": True},
    ]
    for body in bad:
        r = client.post("/v1/profiles", json=body, headers=h)
        assert r.status_code == 422, body
        assert r.json()["code"] == "invalid_request"
    listed = client.get("/v1/profiles", params={"include_inactive": True, "key": key}, headers=h)
    assert listed.json() == {"items": [], "next_cursor": None}


def test_missing_profiles_are_404(client: TestClient, a: Project) -> None:
    h = bearer(a.admin)
    assert client.get(f"/v1/profiles/{new_key()}", headers=h).status_code == 404
    assert client.get("/v1/profiles/debug-noop:v99", headers=h).status_code == 404
    assert client.post(f"/v1/profiles/{new_key()}/deactivate", headers=h).status_code == 404
    # A bare key names no version: a retried request retired one more each time.
    r = client.post("/v1/profiles/debug-noop/deactivate", headers=h)
    assert r.status_code == 422 and "debug-noop:v1 is the newest" in r.json()["message"]
    assert client.get("/v1/profiles/debug-noop", headers=h).json()["is_active"] is True
    assert client.get("/v1/profiles/Not A Ref", headers=h).status_code == 422


def test_profile_scopes(client: TestClient, a: Project) -> None:
    body = {"key": new_key(), "job_type": "debug.noop"}
    for scope in ("jobs:read", "jobs:write", "objects:write"):
        r = client.post("/v1/profiles", json=body, headers=bearer(a.scoped[scope]))
        assert r.status_code == 403 and r.json()["code"] == "forbidden", scope
    r = client.post("/v1/profiles/debug-noop/deactivate", headers=bearer(a.scoped["jobs:write"]))
    assert r.status_code == 403
    assert client.get("/v1/profiles", headers=bearer(a.scoped["objects:read"])).status_code == 403
    assert (
        client.get(
            "/v1/profiles/debug-noop:v1", headers=bearer(a.scoped["objects:read"])
        ).status_code
        == 403
    )


def test_credits_show_and_budget(client: TestClient, a: Project, b: Project) -> None:
    h = bearer(a.scoped["jobs:read"])
    assert client.get("/v1/credits", headers=h).json() == {
        "project_id": "proj-a",
        "budget": None,
        "used": 0,
        "remaining": None,
    }
    key = new_key()
    create(client, a.admin, key=key, job_type="debug.noop", credits={"base": 7})
    job = client.post("/v1/jobs", json={"profile": key}, headers=bearer(a.admin))
    assert job.status_code == 201, job.text

    r = client.put("/v1/credits/budget", json={"budget_credits": 100}, headers=bearer(a.admin))
    assert r.status_code == 200
    assert r.json() == {"project_id": "proj-a", "budget": 100, "used": 7, "remaining": 93}
    assert client.get("/v1/credits", headers=h).json()["remaining"] == 93
    # Another project's budget is its own.
    assert client.get("/v1/credits", headers=bearer(b.admin)).json()["budget"] is None

    # Below what is used: allowed, and new work is refused.
    r = client.put("/v1/credits/budget", json={"budget_credits": 5}, headers=bearer(a.admin))
    assert r.json()["remaining"] == -2
    refused = client.post("/v1/jobs", json={"profile": key}, headers=bearer(a.admin))
    assert refused.status_code == 422
    # A retry makes a job hold its estimate again: the same check, the same answer.
    job_id = job.json()["job_id"]
    assert client.post(f"/v1/jobs/{job_id}/cancel", headers=bearer(a.admin)).status_code == 200
    again = client.post(f"/v1/jobs/{job_id}/retry", headers=bearer(a.admin))
    assert again.status_code == 422 and "credit budget exceeded: 0 of 5" in again.text

    r = client.put("/v1/credits/budget", json={"budget_credits": None}, headers=bearer(a.admin))
    assert r.json()["budget"] is None and r.json()["remaining"] is None
    assert client.post(f"/v1/jobs/{job_id}/retry", headers=bearer(a.admin)).status_code == 200


def test_budget_validation_and_scopes(client: TestClient, a: Project) -> None:
    h = bearer(a.admin)
    for body in ({"budget_credits": -1}, {}, {"budget_credits": 1, "project_id": "proj-b"}):
        assert client.put("/v1/credits/budget", json=body, headers=h).status_code == 422, body
    for scope in ("jobs:read", "jobs:write"):
        r = client.put(
            "/v1/credits/budget", json={"budget_credits": 1}, headers=bearer(a.scoped[scope])
        )
        assert r.status_code == 403, scope
    assert client.get("/v1/credits", headers=bearer(a.scoped["objects:read"])).status_code == 403
    assert client.get("/v1/credits", headers=bearer(a.admin)).json()["budget"] is None


def test_a_hostile_job_type_filter_is_422(client: TestClient, a: Project) -> None:
    r = client.get("/v1/profiles", params={"job_type": "x\x00"}, headers=bearer(a.admin))
    assert r.status_code == 422 and r.json()["code"] == "invalid_request"

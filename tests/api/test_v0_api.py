"""/v0/processing-jobs on every database: seed 001's ProcessingJob over our jobs."""

from __future__ import annotations

import io
import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient

from hypermedia.queue.models import AttemptResult, NewJob
from hypermedia.services import Services
from tests.api.conftest import Project, bearer
from tests.media import png

URL = "/v0/processing-jobs"
FIELDS = {
    "id",
    "file_id",
    "job_type",
    "status",
    "priority",
    "input_data",
    "result_data",
    "error_message",
    "started_at",
    "completed_at",
    "retry_count",
    "max_retries",
    "metadata",
}
AUDIT = {"created_at", "updated_at", "deleted_at", "created_by", "updated_by", "deleted_by"}


def _file(svc: Services, project: Project) -> int:
    obj = svc.storage.put(io.BytesIO(png(8, 8)), filename="a.png", project_id=project.id)
    return int(obj["object_id"])


def _create(client: TestClient, token: str, file_id: int, **body: Any) -> dict[str, Any]:
    r = client.post(
        URL,
        json={"file_id": file_id, "job_type": "thumbnail_generation", **body},
        headers=bearer(token),
    )
    assert r.status_code == 201, r.text
    return r.json()


def _ours(svc: Services, job_uuid: str, project: Project) -> dict[str, Any]:
    return svc.legacy.find(job_uuid, project.id)


def test_create_answers_in_the_seed_shape(client: TestClient, svc: Services, a: Project) -> None:
    file_id = _file(svc, a)
    job = _create(client, a.admin, file_id, input_data={"width": 64, "height": 64})
    assert set(job) == FIELDS
    assert set(job["metadata"]) == AUDIT
    assert str(uuid.UUID(job["id"])) == job["id"]
    assert job["file_id"] == file_id
    assert (job["job_type"], job["status"], job["priority"]) == (
        "thumbnail_generation",
        "pending",
        0,
    )
    assert (job["retry_count"], job["max_retries"]) == (0, 3)
    assert job["input_data"]["width"] == 64
    assert job["result_data"] is None and job["error_message"] is None
    assert job["started_at"] is None and job["completed_at"] is None
    assert job["metadata"]["created_by"].startswith("token:")
    assert job["metadata"]["deleted_at"] is None

    row = _ours(svc, job["id"], a)
    assert (row["job_type"], row["object_id"], row["priority"]) == ("image.thumbnail", file_id, 5)
    assert row["max_attempts"] == 4 and row["project_id"] == a.id

    shown = client.get(f"{URL}/{job['id']}", headers=bearer(a.scoped["jobs:read"]))
    assert shown.status_code == 200 and shown.json() == job


@pytest.mark.parametrize(
    ("seed", "ours", "back"),
    [(0, 5, 0), (4, 1, 4), (3, 2, 3), (-2, 7, -2), (-5, 10, -5), (100, 1, 4), (-100, 10, -5)],
)
def test_priority_maps_both_ways(
    client: TestClient, svc: Services, a: Project, seed: int, ours: int, back: int
) -> None:
    job = _create(client, a.admin, _file(svc, a), priority=seed)
    assert _ours(svc, job["id"], a)["priority"] == ours
    assert job["priority"] == back


def test_seed_types_map_to_ours_and_others_are_refused(
    client: TestClient, svc: Services, a: Project
) -> None:
    file_id = _file(svc, a)
    for seed, ours in (
        ("thumbnail_generation", "image.thumbnail"),
        ("compression", "image.compress"),
        ("document_preview", "pdf.preview"),
        ("virus_scan", "security.virus_scan"),
        ("deduplication_check", "storage.dedup_check"),
    ):
        job = _create(client, a.admin, file_id, job_type=seed)
        assert job["job_type"] == seed
        assert _ours(svc, job["id"], a)["job_type"] == ours
    h = bearer(a.admin)
    for body in (
        {"file_id": file_id, "job_type": "video_thumbnail"},  # no such pipeline here
        {"file_id": file_id, "job_type": "image.thumbnail"},  # our name, not the seed's
        {"job_type": "thumbnail_generation"},  # file_id is required
        {"file_id": file_id, "job_type": "thumbnail_generation", "max_retries": 0},
        {"file_id": file_id, "job_type": "thumbnail_generation", "status": "completed"},
    ):
        r = client.post(URL, json=body, headers=h)
        assert r.status_code == 422, (body, r.text)
        assert r.json()["code"] == "invalid_request"
        assert "video.thumbnail" not in r.text  # the seed's name, not ours
    said = client.post(URL, json={"file_id": file_id, "job_type": "video_thumbnail"}, headers=h)
    assert "job_type 'video_thumbnail' is not served here" in said.json()["message"]


def test_status_follows_the_job_through_its_life(
    client: TestClient, svc: Services, a: Project
) -> None:
    h = bearer(a.admin)
    eng = svc.engine
    job = _create(client, a.admin, _file(svc, a), max_retries=1)
    job_id = _ours(svc, job["id"], a)["job_id"]
    (c,) = eng.claim("w1", ["images"], 1)
    assert client.get(f"{URL}/{job['id']}", headers=h).json()["status"] == "pending"  # claimed
    eng.start("w1", [(job_id, c.attempt)])
    running = client.get(f"{URL}/{job['id']}", headers=h).json()
    assert running["status"] == "running" and running["started_at"] is not None

    fail = AttemptResult(job_id, c.attempt, "failed", "CORRUPT_INPUT", "the image is damaged")
    eng.settle("w1", [fail])
    failed = client.get(f"{URL}/{job['id']}", headers=h).json()
    assert failed["status"] == "failed"
    assert failed["error_message"] == "the image is damaged"
    assert (failed["retry_count"], failed["max_retries"]) == (0, 1)

    r = client.post(f"{URL}/{job['id']}/retry", headers=h)
    assert r.status_code == 200, r.text
    assert (r.json()["status"], r.json()["error_message"]) == ("pending", None)
    (c2,) = eng.claim("w1", ["images"], 1)
    eng.start("w1", [(job_id, c2.attempt)])
    eng.settle("w1", [AttemptResult(job_id, c2.attempt, "completed", result={"w": 8})])
    done = client.get(f"{URL}/{job['id']}", headers=h).json()
    assert done["status"] == "completed" and done["completed_at"] is not None
    assert done["result_data"] == {"w": 8}
    assert done["retry_count"] == 1 and done["retry_count"] <= done["max_retries"]
    assert done["metadata"]["updated_at"] >= job["metadata"]["created_at"]


def test_a_cancel_asked_before_the_start_is_still_pending(
    client: TestClient, svc: Services, a: Project
) -> None:
    """Seed 001: running ⇒ started_at.  A cancel asked of a claimed job that
    had not started (cancel_requested) showed running with started_at null."""
    job = _create(client, a.admin, _file(svc, a))
    job_id = _ours(svc, job["id"], a)["job_id"]
    svc.engine.claim("w1", ["images"], 1)
    svc.engine.cancel(job_id, "test")
    assert svc.engine.get(job_id)["status"] == "cancel_requested"
    shown = client.get(f"{URL}/{job['id']}", headers=bearer(a.admin)).json()
    assert (shown["status"], shown["started_at"]) == ("pending", None)
    # Filtered, refused and shown by /v1 the same way (they went by the status
    # alone: found under running, "it is running" in the 409, legacy running).
    h = bearer(a.admin)
    listed = {s: [j["id"] for j in client.get(URL, params={"status": s}, headers=h).json()["items"]]
              for s in ("pending", "running")}  # fmt: skip
    assert listed == {"pending": [job["id"]], "running": []}
    refused = client.post(f"{URL}/{job['id']}/retry", headers=h)
    assert refused.status_code == 409 and "it is pending" in refused.json()["message"]
    v1 = client.get(f"/v1/jobs/{job_id}", headers=h).json()
    assert v1["legacy_status"] == "pending"
    # One that had started: running everywhere.
    other = _create(client, a.admin, _file(svc, a))
    other_id = _ours(svc, other["id"], a)["job_id"]
    (claimed,) = svc.engine.claim("w1", ["images"], 1)
    svc.engine.start("w1", [(other_id, claimed.attempt)])
    svc.engine.cancel(other_id, "test")
    listed = {s: [j["id"] for j in client.get(URL, params={"status": s}, headers=h).json()["items"]]
              for s in ("pending", "running")}  # fmt: skip
    assert listed == {"pending": [job["id"]], "running": [other["id"]]}
    assert client.get(f"/v1/jobs/{other_id}", headers=h).json()["legacy_status"] == "running"


def test_cancel_then_retry(client: TestClient, svc: Services, a: Project) -> None:
    h = bearer(a.admin)
    job = _create(client, a.admin, _file(svc, a))
    r = client.post(f"{URL}/{job['id']}/retry", headers=h)
    assert r.status_code == 409 and r.json()["code"] == "conflict"  # pending: nothing to retry
    # Named as the client knows it: the internal id is never shown on /v0.
    # In seed terms too: a /v0 client knows `pending`, not our `queued`.
    assert r.json()["message"] == f"cannot retry job {job['id']}: it is pending", r.json()
    r = client.post(f"{URL}/{job['id']}/cancel", headers=h)
    assert r.status_code == 200, r.text
    cancelled = r.json()
    assert cancelled["status"] == "cancelled" and cancelled["error_message"] is None
    assert cancelled["metadata"]["updated_by"].startswith("token:")
    r = client.post(f"{URL}/{job['id']}/cancel", headers=h)
    assert (r.status_code, r.json()["message"]) == (
        409,
        f"cannot cancel job {job['id']}: it is cancelled",
    )
    r = client.post(f"{URL}/{job['id']}/retry", headers=h)
    assert r.status_code == 200 and r.json()["status"] == "pending"


def test_a_token_without_jobs_read_changes_only_the_jobs_it_made(
    client: TestClient, svc: Services, a: Project
) -> None:
    """As on /v1: another job of the project answers as a missing one, and
    the answer is the job's id and status only (QA: a jobs:write token
    cancelled, retried and read whole its project's other jobs here)."""
    write = a.scoped["jobs:write"]
    theirs = _create(client, a.admin, _file(svc, a))
    mine = _create(client, write, _file(svc, a))
    for action in ("cancel", "retry"):
        r = client.post(f"{URL}/{theirs['id']}/{action}", headers=bearer(write))
        assert r.status_code == 404, (action, r.text)
        assert r.json()["message"] == f"processing job {theirs['id']} not found"
    shown = client.get(f"{URL}/{theirs['id']}", headers=bearer(a.admin)).json()
    assert shown["status"] == "pending"  # untouched
    r = client.post(f"{URL}/{mine['id']}/cancel", headers=bearer(write))
    assert r.status_code == 200 and r.json() == {"id": mine["id"], "status": "cancelled"}
    r = client.post(f"{URL}/{mine['id']}/retry", headers=bearer(write))
    assert r.status_code == 200 and r.json() == {"id": mine["id"], "status": "pending"}


def test_list_filters_pages_and_hides_other_job_types(
    client: TestClient, svc: Services, a: Project
) -> None:
    h = bearer(a.scoped["jobs:read"])
    f1, f2 = _file(svc, a), _file(svc, a)
    first = [_create(client, a.admin, f1)["id"] for _ in range(3)]
    other = _create(client, a.admin, f2)["id"]
    client.post(f"{URL}/{first[0]}/cancel", headers=bearer(a.admin))
    svc.engine.enqueue(NewJob("debug.noop", project_id=a.id, object_id=f1))  # not a seed type

    seen, cursor = [], None
    while True:
        params: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = client.get(URL, params=params, headers=h).json()
        seen += [j["id"] for j in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == [other, *reversed(first)]
    # Each list's cursor is its own: /v1's and /v0's were the same, taken by either.
    v0 = client.get(URL, params={"limit": 1}, headers=h).json()["next_cursor"]
    v1 = client.get("/v1/jobs", params={"limit": 1}, headers=h).json()["next_cursor"]
    assert client.get(URL, params={"cursor": v1}, headers=h).status_code == 422
    assert client.get("/v1/jobs", params={"cursor": v0}, headers=h).status_code == 422

    def ids(**params: Any) -> list[str]:
        r = client.get(URL, params=params, headers=h)
        assert r.status_code == 200, r.text
        return [j["id"] for j in r.json()["items"]]

    assert ids(file_id=f1) == list(reversed(first))
    assert ids(status="cancelled") == [first[0]]
    assert ids(status="pending", file_id=f1) == [first[2], first[1]]
    assert ids(job_type="virus_scan") == []
    assert ids(job_type="thumbnail_generation", file_id=f2) == [other]
    assert client.get(URL, params={"status": "queued"}, headers=h).status_code == 422
    assert client.get(URL, params={"job_type": "debug.noop"}, headers=h).status_code == 422


def test_another_projects_job_is_404(
    client: TestClient, svc: Services, a: Project, b: Project
) -> None:
    job = _create(client, a.admin, _file(svc, a))
    hb = bearer(b.admin)
    for method, path in (
        ("GET", f"{URL}/{job['id']}"),
        ("POST", f"{URL}/{job['id']}/cancel"),
        ("POST", f"{URL}/{job['id']}/retry"),
        ("GET", f"{URL}/{uuid.uuid4()}"),
    ):
        r = client.request(method, path, headers=hb)
        assert r.status_code == 404, (path, r.text)
        assert r.json()["code"] == "not_found"
    assert client.get(URL, headers=hb).json() == {"items": [], "next_cursor": None}
    assert _ours(svc, job["id"], a)["status"] == "queued"  # B's cancel changed nothing
    # B cannot start work on A's file either.
    r = client.post(URL, json={"file_id": job["file_id"], "job_type": "virus_scan"}, headers=hb)
    assert r.status_code in (404, 422), r.text


def test_scopes(client: TestClient, svc: Services, a: Project) -> None:
    job = _create(client, a.admin, _file(svc, a))
    body = {"file_id": job["file_id"], "job_type": "thumbnail_generation"}
    read, write = bearer(a.scoped["jobs:read"]), bearer(a.scoped["jobs:write"])
    assert client.post(URL, json=body, headers=read).status_code == 403
    assert client.post(f"{URL}/{job['id']}/cancel", headers=read).status_code == 403
    assert client.get(URL, headers=write).status_code == 403
    assert (
        client.get(f"{URL}/{job['id']}", headers=bearer(a.scoped["objects:read"])).status_code
        == 403
    )
    assert client.get(URL).status_code == 401
    assert client.post(URL, json=body, headers=write).status_code == 201


def test_ids_are_case_insensitive_and_odd_ones_are_not_echoed(
    client: TestClient, svc: Services, a: Project
) -> None:
    h = bearer(a.admin)
    job = _create(client, a.admin, _file(svc, a))
    r = client.get(f"{URL}/{job['id'].upper()}", headers=h)
    assert r.status_code == 200 and r.json()["id"] == job["id"], r.text
    odd = "x" * 5000
    r = client.get(f"{URL}/{odd}", headers=h)
    assert r.status_code == 404 and odd not in r.text
    assert r.json()["message"] == "processing job not found: its id is not a uuid"


@pytest.mark.parametrize("field", ["file_id", "priority", "max_retries"])
def test_create_refuses_a_boolean_for_a_number(
    client: TestClient, svc: Services, a: Project, field: str
) -> None:
    """`"file_id": true` made a job on object 1: a boolean is no number."""
    body = {"file_id": _file(svc, a), "job_type": "virus_scan", field: True}
    r = client.post(URL, json=body, headers=bearer(a.admin))
    assert r.status_code == 422, r.text
    assert client.get(URL, headers=bearer(a.admin)).json()["items"] == []


def test_create_still_takes_numbers_as_seed_clients_sent_them(
    client: TestClient, svc: Services, a: Project
) -> None:
    """/v0 serves seed-001 clients as they were: "12" and 12.0 are 12."""
    fid = _file(svc, a)
    body = {"file_id": str(fid), "job_type": "virus_scan", "priority": 2.0, "max_retries": "4"}
    r = client.post(URL, json=body, headers=bearer(a.admin))
    assert r.status_code == 201, r.text
    job = r.json()
    assert (job["file_id"], job["priority"], job["max_retries"]) == (fid, 2, 4)
    # A priority of seed clients may be negative, in text too.
    r = client.post(URL, json={**body, "priority": "-3"}, headers=bearer(a.admin))
    assert r.status_code == 201 and r.json()["priority"] == -3, r.text


@pytest.mark.parametrize("given", ["1_0", " 1 ", "1\n", "\u0661", "+1", "0x1"])
def test_create_takes_digits_only_in_a_text_number(
    client: TestClient, svc: Services, a: Project, given: str
) -> None:
    """QA: int() read "1_0" as 10 and " 1 " as 1: a job was made on object 10."""
    _file(svc, a)
    body = {"file_id": given, "job_type": "virus_scan"}
    r = client.post(URL, json=body, headers=bearer(a.admin))
    assert r.status_code == 422 and r.json()["code"] == "invalid_request", r.text
    assert client.get(URL, headers=bearer(a.admin)).json()["items"] == []

"""/v1/jobs on every database: create, idempotency, list, show, cancel, retry, events."""

from __future__ import annotations

import itertools
import json
import re
import time

import pytest
from fastapi.testclient import TestClient

from hypermedia.services import Services
from tests.api.conftest import Project, bearer
from tests.api.test_ui_pages import login
from tests.media import png

NOOP = {"job_type": "debug.noop"}


def test_create_then_show_a_job(client: TestClient, a: Project) -> None:
    r = client.post("/v1/jobs", json={**NOOP, "priority": 2}, headers=bearer(a.admin))
    assert r.status_code == 201, r.text
    job = r.json()
    assert (job["status"], job["priority"], job["project_id"]) == ("queued", 2, "proj-a")
    assert "input_key" not in job
    shown = client.get(f"/v1/jobs/{job['job_id']}", headers=bearer(a.admin)).json()
    assert shown["job_uuid"] == job["job_uuid"]
    assert [e["to_status"] for e in shown["events"]] == ["queued"]
    assert shown["attempts"] == [] and shown["outputs"] == []


def test_a_job_names_no_storage_key_or_pool(client: TestClient, svc: Services, a: Project) -> None:
    """As the objects API: an output is its object id, type, metadata and
    profile version (output_key and pool_id were shown)."""
    from tests.conformance._helpers import claim_one, done, thumb

    r = client.post("/v1/jobs", json={**NOOP}, headers=bearer(a.admin))
    job_id = r.json()["job_id"]
    got, attempt = claim_one(svc.engine)
    assert got == job_id
    assert svc.engine.settle("w1", [done(job_id, attempt, outputs=[thumb()])]) == {job_id}
    shown = client.get(f"/v1/jobs/{job_id}", headers=bearer(a.admin)).json()
    assert "pool_id" not in shown and "input_key" not in shown
    (out,) = shown["outputs"]
    assert not {"output_key", "deleted_at", "deleted_by"} & set(out)
    assert (out["output_type"], out["metadata"]) == ("thumbnail", {"width": 200})
    assert "objects/1/thumb.webp" not in r.text + str(shown)


def test_idempotency_key_returns_the_first_job_or_422(client: TestClient, a: Project) -> None:
    h = {**bearer(a.admin), "Idempotency-Key": "order-17"}
    first = client.post("/v1/jobs", json=NOOP, headers=h)
    again = client.post("/v1/jobs", json=NOOP, headers=h)
    assert first.status_code == again.status_code == 201
    assert again.json()["job_id"] == first.json()["job_id"]
    other = client.post("/v1/jobs", json={**NOOP, "priority": 9}, headers=h)
    assert other.status_code == 422
    assert other.json()["code"] == "idempotency_conflict"
    assert set(other.json()) == {"code", "message", "request_id"}


def test_profile_alone_names_the_job_type(client: TestClient, a: Project) -> None:
    r = client.post("/v1/jobs", json={"profile": "debug-noop"}, headers=bearer(a.admin))
    assert r.status_code in (201, 404, 422), r.text
    if r.status_code == 201:
        assert r.json()["job_type"] == "debug.noop"


def test_a_profile_that_cannot_be_used_is_422_with_or_without_job_type(
    client: TestClient, a: Project
) -> None:
    """Named alone it was a 404 (as if the job were missing), with job_type a 422."""
    h = bearer(a.admin)
    for profile in ("no-such-profile", "debug-noop:v99"):
        for body in ({"profile": profile}, {**NOOP, "profile": profile}):
            r = client.post("/v1/jobs", json=body, headers=h)
            assert r.status_code == 422, (body, r.text)
            assert r.json()["code"] == "invalid_request"
    r = client.post("/v1/jobs", json={**NOOP, "profile": "debug-noop:"}, headers=h)
    assert r.status_code == 422 and "not a profile reference" in r.json()["message"]


def test_same_idempotency_key_with_another_profile_is_422(client: TestClient, a: Project) -> None:
    h = {**bearer(a.admin), "Idempotency-Key": "order-18"}
    first = client.post("/v1/jobs", json={"profile": "debug-noop"}, headers=h)
    assert first.status_code == 201, first.text
    other = client.post("/v1/jobs", json={"profile": "debug-noop:v1"}, headers=h)
    assert other.status_code == 201 and other.json()["job_id"] == first.json()["job_id"]
    key = f"noop-{first.json()['job_id']}-{a.id}"
    made = client.post("/v1/profiles", json={"key": key, "job_type": "debug.noop"}, headers=h)
    assert made.status_code == 201, made.text
    other = client.post("/v1/jobs", json={"profile": key}, headers=h)
    assert other.status_code == 422 and other.json()["code"] == "idempotency_conflict"


def test_unknown_fields_and_bad_values_are_422(client: TestClient, a: Project) -> None:
    h = bearer(a.admin)
    assert client.post("/v1/jobs", json={**NOOP, "colour": "red"}, headers=h).status_code == 422
    assert client.post("/v1/jobs", json={**NOOP, "priority": 0}, headers=h).status_code == 422
    r = client.post("/v1/jobs", json={"job_type": "no.such"}, headers=h)
    assert r.status_code == 422 and r.json()["code"] == "invalid_request"
    r = client.post("/v1/jobs", json={"params": {}}, headers=h)
    assert r.status_code == 422
    # JSON types as written: true is not priority 1, "5" is not 5.
    for odd in ({"priority": True}, {"priority": "5"}, {"max_attempts": 2.0}):
        r = client.post("/v1/jobs", json={**NOOP, **odd}, headers=h)
        assert r.status_code == 422, odd


@pytest.mark.parametrize(
    ("body", "key", "said"),
    [
        ({**NOOP, "queue": "bulk\n"}, None, "queue name"),
        ({**NOOP, "queue": "bu\x00lk"}, None, "queue name"),
        ({**NOOP, "queue": "Bulk"}, None, "queue name"),
        (NOOP, "key\x00", "Idempotency-Key"),
        (NOOP, "key\x1b[2J", "Idempotency-Key"),
        (NOOP, "caf\u00e9".encode().decode("latin-1"), "Idempotency-Key"),  # stored garbled
        ({"profile": "debug-noop\x00"}, None, "profile reference"),
    ],
)
def test_nul_and_control_characters_are_422_not_500(
    client: TestClient, a: Project, body: dict, key: str | None, said: str
) -> None:
    """PostgreSQL stores no NUL in text: checked before it is asked to."""
    h: dict[str, str | bytes] = {**bearer(a.admin)}
    if key:
        h["Idempotency-Key"] = key.encode("latin-1")  # the bytes a client sends
    r = client.post("/v1/jobs", json=body, headers=h)
    assert r.status_code == 422, r.text
    assert said in r.json()["message"]
    assert client.get("/v1/jobs", headers=bearer(a.admin)).json()["items"] == []


def test_list_filters_and_pages_with_a_cursor(client: TestClient, a: Project) -> None:
    h = bearer(a.admin)
    ids = [client.post("/v1/jobs", json=NOOP, headers=h).json()["job_id"] for _ in range(5)]
    seen, cursor = [], None
    while True:
        params: dict[str, str | int] = {"limit": 2, "status": "queued"}
        if cursor:
            params["cursor"] = cursor
        page = client.get("/v1/jobs", params=params, headers=h).json()
        seen += [j["job_id"] for j in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == sorted(ids, reverse=True)
    assert client.get("/v1/jobs", params={"status": "done"}, headers=h).status_code == 422
    assert client.get("/v1/jobs", params={"cursor": "!!"}, headers=h).status_code == 422
    empty = client.get("/v1/jobs", params={"status": "failed"}, headers=h).json()
    assert empty == {"items": [], "next_cursor": None}


def test_cancel_then_retry(client: TestClient, a: Project) -> None:
    h = bearer(a.admin)
    job_id = client.post("/v1/jobs", json=NOOP, headers=h).json()["job_id"]
    r = client.post(f"/v1/jobs/{job_id}/cancel", headers=h)
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    r = client.post(f"/v1/jobs/{job_id}/retry", headers=h)
    assert r.status_code == 200 and r.json()["status"] == "queued"
    # Retrying a queued job is a conflict, not a 500.
    r = client.post(f"/v1/jobs/{job_id}/retry", headers=h)
    assert r.status_code == 409 and r.json()["code"] == "conflict"


def test_debug_job_types_need_the_admin_scope(
    client: TestClient, a: Project, svc: Services
) -> None:
    """They inject faults and probe the sandbox (a tenant once port-scanned
    the host's loopback through debug.sleep's probe)."""
    _, reader_writer = svc.tokens.create(a.id, ["jobs:read", "jobs:write"])
    writer = bearer(reader_writer)
    probe = {"network": True, "probe": {"connect": [5432]}}
    bodies = ({"job_type": "debug.sleep", "params": probe}, {"profile": "debug-noop"}, NOOP)
    for body in bodies:
        r = client.post("/v1/jobs", json=body, headers=writer)
        assert r.status_code == 403, body
        assert "needs a token with the admin scope" in r.json()["message"]
    assert client.get("/v1/jobs", headers=bearer(a.admin)).json()["items"] == []
    made = client.post("/v1/jobs", json=NOOP, headers=bearer(a.admin))
    assert made.status_code == 201
    # Nor run again by a retry (API or dashboard): an admin's cancelled
    # debug job was re-run, its parameters and all, by any jobs:write token.
    job_id = made.json()["job_id"]
    assert client.post(f"/v1/jobs/{job_id}/cancel", headers=bearer(a.admin)).status_code == 200
    r = client.post(f"/v1/jobs/{job_id}/retry", headers=writer)
    assert r.status_code == 403 and "needs a token with the admin scope" in r.json()["message"]
    login(client, reader_writer)  # the dashboard goes by its session cookie
    r = client.post(f"/ui/jobs/{job_id}/retry", follow_redirects=False)
    assert r.status_code == 403, r.text
    client.cookies.clear()
    assert client.get(f"/v1/jobs/{job_id}", headers=bearer(a.admin)).json()["status"] == "cancelled"
    r = client.post(f"/v1/jobs/{job_id}/retry", headers=bearer(a.admin))
    assert r.status_code == 200 and r.json()["status"] == "queued"


def test_a_token_that_may_not_read_jobs_changes_only_those_it_made(
    client: TestClient, a: Project, svc: Services
) -> None:
    """A jobs:write token without jobs:read learned which jobs of its project
    exist and their state from cancel and retry (409 "it is failed"), and
    read a whole job (params, attempts, events) from a retry's answer."""
    _, uploader = svc.tokens.create(a.id, ["objects:write", "jobs:write"])
    others = client.post("/v1/jobs", json=NOOP, headers=bearer(a.admin)).json()["job_id"]
    assert client.post(f"/v1/jobs/{others}/cancel", headers=bearer(a.admin)).status_code == 200
    missing = others + 1000
    for action in ("cancel", "retry"):
        r = client.post(f"/v1/jobs/{others}/{action}", headers=bearer(uploader))
        gone = client.post(f"/v1/jobs/{missing}/{action}", headers=bearer(uploader))
        assert (r.status_code, gone.status_code) == (404, 404), action
        said = r.json()["message"].replace(str(others), "N")
        assert said == gone.json()["message"].replace(str(missing), "N")
    # Its own job: changed, answered with its id and status only.
    obj = client.post("/v1/objects", content=png(8, 8), headers=bearer(uploader)).json()
    made = client.post(
        "/v1/jobs",
        json={"profile": "image-thumbnail", "object_id": obj["object_id"]},
        headers=bearer(uploader),
    )
    mine = made.json()["job_id"]
    r = client.post(f"/v1/jobs/{mine}/cancel", headers=bearer(uploader))
    assert (r.status_code, r.json()) == (200, {"job_id": mine, "status": "cancelled"})
    r = client.post(f"/v1/jobs/{mine}/retry", headers=bearer(uploader))
    assert (r.status_code, r.json()) == (200, {"job_id": mine, "status": "queued"})
    # The dashboard alike: another's job is a 404 page, its own leads to the upload form.
    login(client, uploader)
    assert client.post(f"/ui/jobs/{others}/retry", follow_redirects=False).status_code == 404
    r = client.post(f"/ui/jobs/{mine}/cancel", follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (303, f"/ui/upload?created={mine}")
    assert f"<b>#{mine}</b> was created" in client.get(r.headers["location"]).text
    client.cookies.clear()
    # With jobs:read, the whole job, as before.
    r = client.post(f"/v1/jobs/{mine}/retry", headers=bearer(a.admin))
    assert r.status_code == 200 and "attempts" in r.json() and "events" in r.json()


def test_a_write_only_token_repeating_anothers_key_is_answered_as_a_conflict(
    client: TestClient, a: Project, svc: Services
) -> None:
    """QA: the same Idempotency-Key from a jobs:write token without jobs:read
    answered another token's job whole (status, result, who made it), in
    /v1 and /v0 alike.  Its own repeats still answer its job."""
    _, uploader = svc.tokens.create(a.id, ["objects:write", "jobs:write"])
    obj = client.post("/v1/objects", content=png(8, 8), headers=bearer(uploader)).json()
    body = {"profile": "image-thumbnail", "object_id": obj["object_id"]}
    v0 = {"file_id": obj["object_id"], "job_type": "thumbnail_generation"}
    for path, sent in (("/v1/jobs", body), ("/v0/processing-jobs", v0)):
        theirs = client.post(path, json=sent, headers={**bearer(a.admin), "Idempotency-Key": path})
        assert theirs.status_code == 201, theirs.text
        r = client.post(path, json=sent, headers={**bearer(uploader), "Idempotency-Key": path})
        assert r.status_code == 422, (path, r.text)
        assert r.json()["code"] == "idempotency_conflict" and "result" not in r.text
        again = client.post(path, json=sent, headers={**bearer(a.admin), "Idempotency-Key": path})
        assert again.status_code == 201 and again.json() == theirs.json()  # a reader: the job
        key = {**bearer(uploader), "Idempotency-Key": f"mine-{path}"}
        mine, repeat = (client.post(path, json=sent, headers=key) for _ in range(2))
        assert mine.status_code == repeat.status_code == 201 and mine.json() == repeat.json()


def test_a_job_type_that_reads_an_input_is_refused_without_one(
    client: TestClient, a: Project
) -> None:
    h = bearer(a.scoped["jobs:write"])
    for body in ({"profile": "image-thumbnail"}, {"job_type": "pdf.preview"}):
        r = client.post("/v1/jobs", json=body, headers=h)
        assert r.status_code == 422, body
        assert r.json()["message"].endswith("needs an input object (object_id)")


def test_events_as_json_and_after(client: TestClient, a: Project) -> None:
    h = bearer(a.admin)
    job_id = client.post("/v1/jobs", json=NOOP, headers=h).json()["job_id"]
    client.post(f"/v1/jobs/{job_id}/cancel", headers=h)
    items = client.get(f"/v1/jobs/{job_id}/events", headers=h).json()["items"]
    assert [e["to_status"] for e in items] == ["queued", "cancelled"]
    later = client.get(
        f"/v1/jobs/{job_id}/events", params={"after": items[0]["event_id"]}, headers=h
    ).json()["items"]
    assert [e["to_status"] for e in later] == ["cancelled"]


def test_sse_streams_each_change_in_order_and_resumes(
    client: TestClient, a: Project, svc: Services
) -> None:
    h = {**bearer(a.admin), "Accept": "text/event-stream"}
    job_id = client.post("/v1/jobs", json=NOOP, headers=bearer(a.admin)).json()["job_id"]
    svc.engine.cancel(job_id)
    with client.stream("GET", f"/v1/jobs/{job_id}/events", headers=h) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        body = "".join(r.iter_text())
    messages = [m for m in body.split("\n\n") if m.startswith("id:")]
    ids = [int(m.split("\n")[0][4:]) for m in messages]
    assert ids == sorted(ids) and len(ids) == 2
    assert '"to_status": "cancelled"' in messages[-1]
    # Times as in the JSON answers: ISO 8601 with a "T".
    sent = json.loads(messages[-1].split("data: ", 1)[1])
    listed = client.get(f"/v1/jobs/{job_id}/events", headers=bearer(a.admin)).json()["items"]
    assert sent["created_at"] == listed[-1]["created_at"] and "T" in sent["created_at"]
    assert body.rstrip().endswith('data: {"status": "cancelled"}')
    # Resume after the first event: only the second comes again.
    resumed = {**h, "Last-Event-ID": str(ids[0])}
    with client.stream("GET", f"/v1/jobs/{job_id}/events", headers=resumed) as r:
        again = [m for m in "".join(r.iter_text()).split("\n\n") if m.startswith("id:")]
    assert [int(m.split("\n")[0][4:]) for m in again] == ids[1:]
    # An id no database can hold, or not ASCII digits: ignored, the whole stream
    # comes (it once cut the stream, or answered 500).
    # Longer than any id: ignored too (a 422 stopped EventSource reconnecting).
    odds = (b"99999999999999999999", b"1" * 21, b"1" * 300, b"\xb2", b"abc")
    for odd in odds:  # \xb2: '²' in Latin-1
        with client.stream(
            "GET", f"/v1/jobs/{job_id}/events", headers={**h, "Last-Event-ID": odd}
        ) as r:
            assert r.status_code == 200, odd
            whole = [m for m in "".join(r.iter_text()).split("\n\n") if m.startswith("id:")]
        assert [int(m.split("\n")[0][4:]) for m in whole] == ids, odd


@pytest.mark.timeout(60)
def test_an_open_stream_ends_when_its_token_is_revoked(
    client: TestClient, a: Project, svc: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It streamed on until its job ended (up to the 7-day timeout): a
    revoked token must stop authenticating at once, streams included."""
    from hypermedia.api.routes import jobs as routes
    from hypermedia.queue.models import NewJob

    monkeypatch.setattr(routes, "SSE_RECHECK_SECONDS", 0.2)
    row, token = svc.tokens.create(a.id, ["jobs:read"])
    job_id = svc.engine.enqueue(NewJob("debug.noop", project_id=a.id, queue="nobody-serves"))
    h = {**bearer(token), "Accept": "text/event-stream"}
    with client.stream("GET", f"/v1/jobs/{job_id}/events", headers=h) as r:
        lines = r.iter_lines()
        assert any(line.startswith("id:") for line in itertools.islice(lines, 4))
        svc.tokens.revoke(row["token_id"])
        rest = "\n".join(lines)  # ends: it would hang while the job is queued
    assert 'event: end\ndata: {"status": "unauthorized"}' in rest
    assert svc.engine.get(job_id)["status"] == "queued"


@pytest.mark.timeout(60)
def test_a_token_holds_a_bounded_number_of_streams(svc: Services, a: Project) -> None:
    """Each stream polls the database four times a second: 300 of one token
    slowed every other caller forty-fold."""
    from hypermedia.api.app import create_app
    from hypermedia.queue.models import NewJob

    svc.settings = svc.settings.with_(api_max_streams=2)
    job_id = svc.engine.enqueue(NewJob("debug.noop", project_id=a.id, queue="nobody-serves"))
    h = {**bearer(a.admin), "Accept": "text/event-stream"}
    other = {**bearer(a.scoped["jobs:read"]), "Accept": "text/event-stream"}
    url = f"/v1/jobs/{job_id}/events"
    with TestClient(create_app(svc)) as c:
        with c.stream("GET", url, headers=h) as one, c.stream("GET", url, headers=h) as two:
            assert (one.status_code, two.status_code) == (200, 200)
            third = c.get(url, headers=h)
            assert third.status_code == 429 and third.json()["code"] == "rate_limited"
            assert "2 event streams open" in third.json()["message"]
            assert third.headers["Retry-After"]
            with c.stream("GET", url, headers=other) as theirs:  # another token's count
                assert theirs.status_code == 200
        # Closed streams are no longer counted: two may be open again.
        deadline = time.monotonic() + 10
        while True:
            with c.stream("GET", url, headers=h) as one, c.stream("GET", url, headers=h) as two:
                codes = (one.status_code, two.status_code)
            if codes == (200, 200) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert codes == (200, 200)


def test_errors_have_one_shape_and_a_request_id(client: TestClient, a: Project) -> None:
    r = client.get("/v1/jobs/999999", headers=bearer(a.admin))
    assert r.status_code == 404
    body = r.json()
    assert set(body) == {"code", "message", "request_id"}
    assert r.headers["X-Request-ID"] == body["request_id"]
    # Never sniffed as HTML, though a message may echo the request's text.
    r = client.post("/v1/jobs", json={"job_type": "<script>x</script>"}, headers=bearer(a.admin))
    assert r.status_code == 422 and r.headers["X-Content-Type-Options"] == "nosniff"
    assert client.get("/healthz").headers["X-Content-Type-Options"] == "nosniff"
    r = client.get("/v1/nothing-here", headers=bearer(a.admin))
    assert r.status_code == 404 and set(r.json()) == {"code", "message", "request_id"}
    r = client.get("/v1/jobs")
    assert r.status_code == 401 and r.json()["code"] == "unauthorized"
    assert r.headers["WWW-Authenticate"] == "Bearer"
    # A caller's request id is echoed when it is ASCII letters, digits and
    # dashes; anything else is replaced ("ü" came back as "Ã¼").
    kept = client.get("/healthz", headers={"X-Request-ID": "abc-123"})
    assert kept.headers["X-Request-ID"] == "abc-123"
    for odd in ("ü".encode(), "ªº²".encode(), b"A\xb5B", b"a b", b"x" * 65):
        r = client.get("/healthz", headers={"X-Request-ID": odd})  # type: ignore[dict-item]
        assert re.fullmatch(r"[0-9a-f]{32}", r.headers["X-Request-ID"]), (odd, r.headers)


def test_where_clamd_listens_is_shown_to_admin_tokens_only(
    client: TestClient, svc: Services, a: Project
) -> None:
    """A virus scan's params carry its profile's settings, the clamd socket
    among them (a private setting): /v1 and /v0 show it to admin tokens only,
    and every other setting to anyone who may read the job or the profile."""
    upload = client.post(
        "/v1/objects", files={"file": ("a.txt", b"hello")}, headers=bearer(a.admin)
    )
    assert upload.status_code == 201, upload.text
    body = {"profile": "virus-scan", "object_id": upload.json()["object_id"]}
    made = client.post("/v1/jobs", json=body, headers=bearer(a.scoped["jobs:write"]))
    assert made.status_code == 201, made.text
    job_id = made.json()["job_id"]
    uuid = made.json()["job_uuid"]
    socket = "unix:///run/clamav/clamd.ctl"

    def seen(token: str) -> list[dict[str, object]]:
        h = bearer(token)
        listed = client.get("/v1/jobs", params={"job_type": "security.virus_scan"}, headers=h)
        profiles = client.get("/v1/profiles", params={"key": "virus-scan"}, headers=h)
        profiles = profiles.json()["items"]
        one = client.get("/v1/profiles/virus-scan", headers=h).json()
        return [
            client.get(f"/v1/jobs/{job_id}", headers=h).json()["params"],
            next(j for j in listed.json()["items"] if j["job_id"] == job_id)["params"],
            client.get(f"/v0/processing-jobs/{uuid}", headers=h).json()["input_data"],
            next(p for p in profiles if p["profile_key"] == "virus-scan")["settings"],
            one["settings"],
            *(v["settings"] for v in one["versions"]),
        ]

    assert made.json()["params"].get("clamd") is None
    for settings in seen(a.scoped["jobs:read"]):
        assert "clamd" not in settings and settings["max_bytes"] > 0, settings
    for settings in seen(a.admin):
        assert settings["clamd"] == socket, settings


def test_a_body_that_cannot_be_decoded_is_422_like_bad_json(client: TestClient, a: Project) -> None:
    """Bytes that are not UTF-8, or JSON nested past the parser's depth, were
    a 400 "There was an error parsing the body"; broken JSON is a 422."""
    h = {**bearer(a.admin), "Content-Type": "application/json"}
    deep = '{"job_type": "debug.noop", "params": {"a": ' + "[" * 5000 + "]" * 5000 + "}}"
    for body in (b'{"job_type": "debug.noop", "queue": "\xff\xfe"}', deep.encode(), b"{"):
        r = client.post("/v1/jobs", content=body, headers=h)
        assert r.status_code == 422, r.text
        assert r.json()["code"] == "invalid_request"
    assert client.get("/v1/jobs", headers=h).json()["items"] == []


@pytest.mark.parametrize("depth", [350, 600, 980])
def test_params_nested_deep_enough_to_pass_the_parser_are_never_a_500(
    client: TestClient, a: Project, depth: int
) -> None:
    """JSON nested 330 to 980 deep passed the parser, then ran a check of its
    strings out of stack: a 500 and a traceback of 4,000 lines per request."""
    h = {**bearer(a.admin), "Content-Type": "application/json"}
    nested = '{"a": ' * depth + "1" + "}" * depth
    for path, body in (
        ("/v1/jobs", '{"job_type": "debug.noop", "params": ' + nested + "}"),
        (
            "/v1/jobs",
            '{"job_type": "debug.noop", "params": {"a": ' + "[" * depth + "]" * depth + "}}",
        ),
        (
            "/v1/profiles",
            '{"key": "deep", "job_type": "image.thumbnail", "settings": ' + nested + "}",
        ),
    ):
        r = client.post(path, content=body.encode(), headers=h)
        assert r.status_code == 422, (path, r.status_code, r.text[:300])


def test_an_integer_too_long_to_read_is_said_as_such(client: TestClient, a: Project) -> None:
    """QA: 5,000 digits were "not UTF-8, or nested too deeply": neither."""
    h = {**bearer(a.admin), "Content-Type": "application/json"}
    body = '{"job_type": "debug.noop", "params": {"n": ' + "9" * 5000 + "}}"
    r = client.post("/v1/jobs", content=body.encode(), headers=h)
    assert r.status_code == 422 and "a number of 4,300 digits or more" in r.json()["message"]


def test_a_key_named_twice_is_422_naming_it(client: TestClient, a: Project) -> None:
    """``{"priority": 1, "priority": 10}`` was a job of priority 10 here and of
    priority 1 to a reader that keeps the first: one body, two requests."""
    h = {**bearer(a.admin), "Content-Type": "application/json"}
    for body in (
        b'{"job_type": "debug.noop", "priority": 1, "priority": 10}',
        b'{"job_type": "debug.noop", "params": {"ms": 1, "ms": 2}}',
    ):
        r = client.post("/v1/jobs", content=body, headers=h)
        assert r.status_code == 422, r.text
        assert r.json()["code"] == "invalid_request"
        assert "appears twice" in str(r.json()["details"]), r.text
    r = client.post("/v0/processing-jobs", content=b'{"a": 1, "a": 1}', headers=h)
    assert r.status_code == 422 and "appears twice" in r.text, r.text
    assert client.get("/v1/jobs", headers=h).json()["items"] == []
    # Equal keys in different objects are no twice-named key.
    body = b'{"job_type": "debug.sleep", "params": {"ms": 1}, "queue": "ms"}'
    assert client.post("/v1/jobs", content=body, headers=h).status_code == 201


def test_a_field_name_that_is_a_token_is_not_echoed(client: TestClient, a: Project) -> None:
    """Extra fields are a 422 naming them: a token sent as a field's name came back whole."""
    r = client.post("/v1/jobs", json={**NOOP, a.admin: 1}, headers=bearer(a.admin))
    assert r.status_code == 422
    assert a.admin not in r.text and "[token]" in str(r.json()["details"])

"""The dashboard's pages over every database: login and logout, redirects,
project scoping, escaping, cancel/retry forms and the Origin check."""

from __future__ import annotations

import html
import re
import uuid
from urllib.parse import unquote

import pytest
from fastapi.testclient import TestClient

from hypermedia.api.app import create_app
from hypermedia.api.deps import COOKIE
from hypermedia.queue.models import AttemptResult, NewJob
from hypermedia.services import Services
from tests.api.conftest import Project, bearer
from tests.media import png

HOSTILE = '<img src=x onerror="alert(1)">'


def login(client: TestClient, token: str, next: str = "/ui") -> None:
    client.cookies.clear()
    r = client.post("/ui/login", data={"token": token, "next": next}, follow_redirects=False)
    assert r.status_code == 303, r.text
    cookie = client.cookies.get(COOKIE)
    assert cookie and cookie.startswith("hms_") and cookie != token  # a session, not the token


def sleep_job(svc: Services, project: str, ms: int = 60_000) -> int:
    return svc.engine.enqueue(NewJob("debug.sleep", {"ms": ms}, project_id=project))


def test_pages_redirect_to_login_without_a_cookie(client: TestClient) -> None:
    for path in ("/ui", "/ui/jobs?status=queued", "/ui/jobs/1", "/ui/upload", "/ui/profiles"):
        r = client.get(path, follow_redirects=False)
        assert r.status_code == 303, path
        assert r.headers["location"].startswith("/ui/login?next=%2Fui"), r.headers["location"]
    r = client.post("/ui/jobs/1/cancel", follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (303, "/ui/login")
    # The live stream answers 401 rather than a page.
    r = client.get("/ui/jobs/1/stream", headers={"Accept": "text/event-stream"})
    assert r.status_code == 401
    page = client.get("/ui/login")
    assert page.status_code == 200 and 'name="token"' in page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]


def test_login_sets_a_strict_httponly_cookie_and_logout_clears_it(
    client: TestClient, a: Project
) -> None:
    r = client.post(
        "/ui/login", data={"token": a.admin, "next": "/ui/jobs"}, follow_redirects=False
    )
    assert (r.status_code, r.headers["location"]) == (303, "/ui/jobs")
    cookie = r.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=")
    flags = {f.strip().lower() for f in cookie.split(";")}
    assert {"httponly", "samesite=strict", "path=/"} <= flags
    assert "secure" not in flags  # plain http here; https sets Secure
    overview = client.get("/ui")
    assert overview.status_code == 200
    assert 'id="project">proj-a<' in overview.text
    r = client.post("/ui/logout", follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (303, "/ui/login")
    assert client.cookies.get(COOKIE) is None
    assert client.get("/ui", follow_redirects=False).status_code == 303


def test_bad_tokens_are_refused_and_next_never_leaves_the_dashboard(
    client: TestClient, a: Project
) -> None:
    r = client.post("/ui/login", data={"token": "hm_nope_nope"}, follow_redirects=False)
    assert r.status_code == 401 and 'id="login-error"' in r.text
    assert COOKIE not in r.headers.get("set-cookie", "")
    for target in ("//evil.example/x", "https://evil.example/", "/v1/jobs", "/ui\\@evil"):
        r = client.post(
            "/ui/login", data={"token": a.admin, "next": target}, follow_redirects=False
        )
        assert r.headers["location"] == "/ui", target
    # A stale cookie redirects to login and is cleared.
    client.cookies.clear()
    client.cookies.set(COOKIE, "hm_revoked_token")
    r = client.get("/ui/jobs", follow_redirects=False)
    assert r.status_code == 303 and f'{COOKIE}=""' in r.headers["set-cookie"]


def test_every_page_renders(client: TestClient, svc: Services, a: Project) -> None:
    job_id = sleep_job(svc, a.id)
    login(client, a.admin)
    for path in ("/ui", "/ui/", "/ui/jobs", "/ui/upload", "/ui/workers", "/ui/profiles"):
        r = client.get(path)
        assert r.status_code == 200, (path, r.text)
        assert r.headers["content-type"].startswith("text/html")
        assert r.headers["x-frame-options"] == "DENY"
    overview = client.get("/ui").text
    assert 'id="total-queued">1<' in overview and "bulk" in overview
    assert "no worker</span>" in overview  # its job waits: nothing claims from bulk
    jobs = client.get("/ui/jobs").text
    assert f'href="/ui/jobs/{job_id}"' in jobs
    profiles = client.get("/ui/profiles").text
    assert "image-thumbnail:v1" in profiles and "debug-sleep:v1" in profiles
    upload = client.get("/ui/upload").text
    assert 'value="image-thumbnail:v1"' in upload
    css = client.get("/ui/static/style.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    js = client.get("/ui/static/job.js")
    assert js.status_code == 200 and "EventSource" in js.text
    assert client.get("/ui/static/..%2Froutes.py").status_code == 404
    missing = client.get("/ui/no/such/page")
    assert missing.status_code == 404 and "no such page" in missing.text


def test_job_list_filters_and_pages(client: TestClient, svc: Services, a: Project) -> None:
    ids = [sleep_job(svc, a.id) for _ in range(3)]
    svc.engine.cancel(ids[0])
    login(client, a.admin)
    cancelled = client.get("/ui/jobs", params={"status": "cancelled"}).text
    assert f'/ui/jobs/{ids[0]}"' in cancelled and f'/ui/jobs/{ids[1]}"' not in cancelled
    none = client.get("/ui/jobs", params={"job_type": "image.thumbnail", "status": ""}).text
    assert "No jobs match." in none
    older = client.get("/ui/jobs", params={"before": ids[2]}).text
    assert f'/ui/jobs/{ids[1]}"' in older and f'/ui/jobs/{ids[2]}"' not in older
    # Trimmed as the other filters are (" 7 " was a 422).
    padded = client.get("/ui/jobs", params={"before": f" {ids[2]} "})
    assert padded.status_code == 200 and padded.text == older
    bad = client.get("/ui/jobs", params={"status": "bogus"})
    assert bad.status_code == 422 and "status must be one of" in bad.text
    assert "Traceback" not in bad.text


def test_another_projects_job_is_a_404_page(
    client: TestClient, svc: Services, a: Project, b: Project
) -> None:
    job_id = sleep_job(svc, a.id)
    login(client, b.admin)
    r = client.get(f"/ui/jobs/{job_id}")
    assert r.status_code == 404 and "Not found" in r.text
    assert client.get(f"/ui/jobs/{job_id}/stream").status_code == 404
    assert client.post(f"/ui/jobs/{job_id}/cancel").status_code == 404
    assert f'/ui/jobs/{job_id}"' not in client.get("/ui/jobs").text
    assert 'id="total-queued">0<' in client.get("/ui").text
    # Nor a queue only a's jobs name: its name is a's text.
    svc.engine.enqueue(NewJob("debug.noop", {}, queue="a-secret-plan", project_id=a.id))
    assert "a-secret-plan" not in client.get("/ui").text
    assert svc.engine.get(job_id)["status"] == "queued"
    # A bearer header is the API's: the pages go by the cookie alone (a's
    # token over b's session showed a's job, and ran a's forms).
    r = client.get(f"/ui/jobs/{job_id}", headers=bearer(a.admin))
    assert r.status_code == 404
    assert client.post(f"/ui/jobs/{job_id}/cancel", headers=bearer(a.admin)).status_code == 404
    client.cookies.clear()
    r = client.get("/ui/jobs", headers=bearer(a.admin), follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/ui/login")


def test_the_progress_bar_stays_while_it_means_something(
    client: TestClient, svc: Services, a: Project
) -> None:
    done, stopped = sleep_job(svc, a.id), sleep_job(svc, a.id)
    eng = svc.engine
    queue = eng.get(done)["queue_name"]
    claimed = [(c.job_id, c.attempt) for c in eng.claim("w-ui", [queue], 2)]
    assert eng.start("w-ui", claimed) == {done, stopped}
    eng.report_progress("w-ui", {k: {"percent": 90, "step": "hashed"} for k in claimed})
    login(client, a.admin)
    assert 'id="progress" max="100" value="90.0"' in client.get(f"/ui/jobs/{done}").text
    ends = {done: ("completed", None), stopped: ("failed", "CORRUPT_INPUT")}
    finished = [
        AttemptResult(job_id=j, attempt=n, status=ends[j][0], code=ends[j][1], worker_id="w-ui")
        for j, n in claimed
    ]
    assert eng.settle("w-ui", finished) == {done, stopped}
    assert 'id="progress"' not in client.get(f"/ui/jobs/{done}").text
    page = client.get(f"/ui/jobs/{stopped}").text
    # The report's own text, as the live page shows it.
    assert 'value="90.0"' in page and '<span id="progress-text">90% hashed<' in page


def test_a_waiting_jobs_bar_is_empty_not_busy(
    client: TestClient, svc: Services, a: Project
) -> None:
    # Without a value a <progress> is the browser's moving "busy" bar: shown
    # for a job that may wait in a paused queue for days.
    waiting = sleep_job(svc, a.id)
    login(client, a.admin)
    assert 'id="progress" max="100" value="0"' in client.get(f"/ui/jobs/{waiting}").text


def test_cancel_and_retry_forms(client: TestClient, svc: Services, a: Project) -> None:
    job_id = sleep_job(svc, a.id)
    login(client, a.admin)
    page = client.get(f"/ui/jobs/{job_id}").text
    assert f'action="/ui/jobs/{job_id}/cancel"' in page and 'id="retry"' not in page
    assert 'data-terminal="0"' in page
    r = client.post(f"/ui/jobs/{job_id}/cancel", follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (303, f"/ui/jobs/{job_id}")
    assert svc.engine.get(job_id)["status"] == "cancelled"
    page = client.get(f"/ui/jobs/{job_id}").text
    assert 'id="status" class="status s-cancelled">cancelled<' in page
    assert 'id="retry"' in page and 'id="cancel"' not in page and 'data-terminal="1"' in page
    again = client.post(f"/ui/jobs/{job_id}/cancel")
    assert again.status_code == 409 and "cannot cancel" in again.text
    # A token that may cancel but not submit debug jobs sees no Retry button
    # (it saw one, and pressing it gave a 403 page).
    _, both = svc.tokens.create(a.id, ["jobs:read", "jobs:write"])
    login(client, both)
    writer = client.get(f"/ui/jobs/{job_id}").text
    assert 'id="status" class="status s-cancelled">cancelled<' in writer
    assert 'id="retry"' not in writer
    login(client, a.admin)
    r = client.post(f"/ui/jobs/{job_id}/retry", follow_redirects=False)
    assert r.status_code == 303
    assert svc.engine.get(job_id)["status"] == "queued"


def test_posts_from_another_origin_are_refused(
    client: TestClient, svc: Services, a: Project
) -> None:
    job_id = sleep_job(svc, a.id)
    login(client, a.admin)
    others = (
        "http://evil.example",
        "null",
        "http://testserver.evil.example",
        "http://testserver:81",
    )
    for origin in others:
        r = client.post(f"/ui/jobs/{job_id}/cancel", headers={"Origin": origin})
        assert r.status_code == 403 and "another site" in r.text, origin
    # No Origin (an older browser): its Referer is judged the same way.
    r = client.post(f"/ui/jobs/{job_id}/cancel", headers={"Referer": "http://evil.example/x"})
    assert r.status_code == 403 and "another site" in r.text
    r = client.post("/ui/login", data={"token": a.admin}, headers={"Origin": "http://evil.example"})
    assert r.status_code == 403
    assert svc.engine.get(job_id)["status"] == "queued"
    r = client.post(
        f"/ui/jobs/{job_id}/cancel",
        headers={"Referer": "http://testserver/ui/jobs"},
        follow_redirects=False,
    )
    assert r.status_code == 303
    assert svc.engine.get(job_id)["status"] == "cancelled"


def test_behind_a_tls_proxy_the_origin_must_say_https(
    client: TestClient, svc: Services, a: Project
) -> None:
    """The scheme is the proxy's X-Forwarded-Proto (the cookie's Secure comes
    from the same): a page on http://host posting to https://host is refused."""
    job_id = sleep_job(svc, a.id)
    login(client, a.admin)
    base = "https://testserver/ui/jobs"
    r = client.post(f"{base}/{job_id}/cancel", headers={"Origin": "http://testserver"})
    assert r.status_code == 403 and "another site" in r.text
    assert svc.engine.get(job_id)["status"] == "queued"
    ok = {"Origin": "HTTPS://testserver"}
    r = client.post(f"{base}/{job_id}/cancel", headers=ok, follow_redirects=False)
    assert r.status_code == 303
    assert svc.engine.get(job_id)["status"] == "cancelled"


def test_a_proxy_that_hides_tls_is_named_and_default_ports_are_the_same_origin(
    client: TestClient, svc: Services, a: Project, caplog: pytest.LogCaptureFixture
) -> None:
    """Without X-Forwarded-Proto every form was a 403 "sent from another
    site", nothing logged; nginx's `Host $host:$server_port` (":443") too."""
    login(client, a.admin)
    job_id = sleep_job(svc, a.id)
    hidden = {"Origin": "https://testserver"}  # the browser's; the server sees http
    with caplog.at_level("WARNING"):
        r = client.post(f"/ui/jobs/{job_id}/cancel", headers=hidden)
    assert r.status_code == 403 and "X-Forwarded-Proto" in r.text, r.text
    assert any("X-Forwarded-Proto" in m for m in caplog.messages)
    assert svc.engine.get(job_id)["status"] == "queued"
    for host, origin in (
        ("testserver:443", "https://testserver"),
        ("testserver:80", "http://testserver"),
    ):
        job_id = sleep_job(svc, a.id)
        url = f"{origin}/ui/jobs/{job_id}/cancel"
        r = client.post(url, headers={"Origin": origin, "Host": host}, follow_redirects=False)
        assert r.status_code == 303, (host, r.text)
    r = client.post(
        f"/ui/jobs/{job_id}/cancel",
        headers={"Origin": "http://testserver:8080", "Host": "testserver"},
    )
    assert r.status_code == 403 and "another site" in r.text


def test_actions_need_their_scope(client: TestClient, svc: Services, a: Project) -> None:
    job_id = sleep_job(svc, a.id)
    login(client, a.scoped["jobs:read"])
    page = client.get(f"/ui/jobs/{job_id}").text
    assert 'id="cancel"' not in page
    r = client.post(f"/ui/jobs/{job_id}/cancel")
    assert r.status_code == 403 and "jobs:write" in r.text
    assert client.get("/ui/upload").status_code == 403
    assert client.get("/ui/workers").status_code == 403
    assert svc.engine.get(job_id)["status"] == "queued"
    login(client, a.scoped["objects:write"])
    assert client.get("/ui/jobs").status_code == 403


def test_upload_stores_the_file_and_creates_the_job(
    client: TestClient, svc: Services, a: Project
) -> None:
    login(client, a.admin)
    name = f"{HOSTILE}.png"
    r = client.post(
        "/ui/upload",
        data={"profile": "image-thumbnail:v1"},
        files={"file": (name, png(8, 6), "image/png")},
        follow_redirects=False,
    )
    assert r.status_code == 303, r.text
    job_id = int(r.headers["location"].rsplit("/", 1)[1])
    job = svc.engine.get(job_id)
    assert (job["job_type"], job["project_id"], job["status"]) == (
        "image.thumbnail",
        "proj-a",
        "queued",
    )
    assert job["created_by"].startswith("token:")
    obj = svc.storage.get(job["object_id"])
    assert obj["project_id"] == "proj-a" and obj["size"] == len(png(8, 6))
    assert list((svc.settings.home / "tmp").iterdir()) == []
    page = client.get(f"/ui/jobs/{job_id}").text
    assert HOSTILE not in page
    assert html.escape(obj["filename"], quote=False) in page

    bad = client.post(
        "/ui/upload",
        data={"profile": "virus-scan:v1"},
        files={"file": ("a.png", png(), "image/png")},
    )
    assert bad.status_code == 422 and "choose one of the listed profiles" in bad.text
    empty = client.post("/ui/upload", data={"profile": "image-thumbnail:v1"})
    assert empty.status_code == 422


def test_hostile_parameters_are_escaped(client: TestClient, a: Project) -> None:
    login(client, a.admin)
    # A filter no job could match is refused (422), its value not echoed.
    r = client.get("/ui/jobs", params={"job_type": HOSTILE, "queue": '"><script>x()</script>'})
    assert r.status_code == 422
    assert HOSTILE not in r.text and "<script>x()" not in r.text
    assert "a queue name has 1 to 50 characters" in r.text
    # A well-formed one is kept in the form, escaped.
    r = client.get("/ui/jobs", params={"job_type": "a.b", "queue": "q-1"})
    assert r.status_code == 200 and 'value="a.b"' in r.text and 'value="q-1"' in r.text
    r = client.get("/ui/login", params={"next": '/ui"><script>x()</script>'})
    assert "<script>x()" not in r.text
    r = client.get("/ui/jobs/not-a-number")
    assert r.status_code == 404 and "Traceback" not in r.text
    assert client.get("/ui/jobs/999999999").status_code == 404


def test_the_stream_replays_a_finished_jobs_events(
    client: TestClient, svc: Services, a: Project
) -> None:
    job_id = sleep_job(svc, a.id)
    svc.engine.cancel(job_id)
    login(client, a.admin)
    with client.stream("GET", f"/ui/jobs/{job_id}/stream") as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        body = "".join(r.iter_text())
    assert "event: event" in body and '"to_status": "cancelled"' in body
    assert body.rstrip().endswith('data: {"status": "cancelled"}')


def test_an_upload_over_the_limit_is_refused_and_leaves_nothing(svc: Services, a: Project) -> None:
    small = Services.from_engine(svc.engine)
    small.settings = svc.settings.with_(max_upload_bytes=1000)
    with TestClient(create_app(small), raise_server_exceptions=False) as c:
        login(c, a.admin)
        r = c.post(
            "/ui/upload",
            data={"profile": "image-thumbnail:v1"},
            files={"file": ("big.png", png(8, 6) + b"\0" * 5000, "image/png")},
        )
        assert r.status_code == 413 and "text/html" in r.headers["content-type"]
    assert svc.storage.list(project_id=a.id) == []
    tmp = svc.settings.home / "tmp"
    assert not tmp.exists() or list(tmp.iterdir()) == []


HTML = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}


def test_errors_before_a_route_runs_are_pages_under_ui(client: TestClient, a: Project) -> None:
    """A body over the limit (413), a wrong method (405): the dashboard's page
    for a browser under /ui, the API's JSON elsewhere or when JSON is asked for."""
    login(client, a.admin)
    big = b"x" * (1024 * 1024 + 1)
    for path in ("/ui/login", "/ui/jobs/1/cancel", "/ui/logout"):
        r = client.post(path, content=big, headers=HTML)
        assert r.status_code == 413, path
        assert r.headers["content-type"].startswith("text/html")
        assert "Too large" in r.text and "1048576-byte limit" in r.text
        assert r.headers["x-request-id"] in r.text
    assert client.get("/ui").status_code == 200  # still logged in: logout never ran
    r = client.post("/v1/jobs", content=big, headers={**bearer(a.admin), **HTML})
    assert r.status_code == 413 and r.json()["code"] == "payload_too_large"
    for method, path in (("PUT", "/ui/jobs"), ("DELETE", "/ui"), ("PATCH", "/ui/login")):
        r = client.request(method, path, headers=HTML)
        assert r.status_code == 405, (method, path)
        assert r.headers["content-type"].startswith("text/html")
        assert "Method not allowed" in r.text and "GET" in r.headers["allow"]
        assert 'id="project">proj-a<' not in r.text  # no principal: a bare page
    # Pages that exist with another method, which the catch-all 404 page took.
    for method, path, allow in (
        ("GET", "/ui/logout", "POST"),
        ("POST", "/ui/jobs", "GET, HEAD"),
        ("GET", "/ui/jobs/1/cancel", "POST"),
    ):
        r = client.request(method, path, headers=HTML)
        assert (r.status_code, r.headers.get("allow")) == (405, allow), (method, path)
        assert "Method not allowed" in r.text
    assert client.get("/ui/no-such-page", headers=HTML).status_code == 404
    assert client.get("/ui").status_code == 200  # GET /ui/logout logged nobody out
    r = client.put("/ui/jobs", headers={"Accept": "application/json"})
    assert r.status_code == 405 and r.json()["code"] == "method_not_allowed"
    r = client.put("/v1/jobs", headers={**bearer(a.admin), **HTML})
    assert r.status_code == 405 and r.json()["code"] == "method_not_allowed"


def test_head_answers_like_get_without_a_body(
    client: TestClient, svc: Services, a: Project
) -> None:
    r = client.head("/ui/login")
    get = client.get("/ui/login")
    assert r.status_code == 200 and r.content == b""
    assert r.headers["content-type"].startswith("text/html")
    assert r.headers["content-length"] == get.headers["content-length"]
    assert r.headers["x-frame-options"] == "DENY"
    r = client.head("/ui/jobs", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/ui/login?next=")
    job_id = sleep_job(svc, a.id)
    login(client, a.admin)
    assert client.head("/ui").status_code == 200
    assert client.head(f"/ui/jobs/{job_id}").status_code == 200
    r = client.head("/ui/static/style.css")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/css")
    assert client.head("/ui/no/such/page").status_code == 404
    # The stream of a running job answers its headers at once: nothing is streamed.
    r = client.head(f"/ui/jobs/{job_id}/stream")
    assert r.status_code == 200 and r.content == b""
    assert r.headers["content-type"].startswith("text/event-stream")
    # Nor is a stream opened, and counted against the token's, by any of them.
    for _ in range(svc.settings.api_max_streams + 1):
        assert client.head(f"/ui/jobs/{job_id}/stream").status_code == 200
    svc.engine.cancel(job_id)
    with client.stream("GET", f"/ui/jobs/{job_id}/stream") as r:
        assert r.status_code == 200


def test_favicon_is_no_json_404(client: TestClient, a: Project) -> None:
    for path in ("/favicon.ico", "/ui/favicon.ico"):
        r = client.get(path, headers=HTML)
        assert r.status_code == 204 and r.content == b"", path
        assert client.head(path).status_code == 204
    login(client, a.admin)
    assert '<link rel="icon" href="data:,">' in client.get("/ui").text  # none is asked for


def _nav(text: str) -> set[str]:
    nav = text.split("<nav>", 1)[1].split("</nav>", 1)[0]
    return set(re.findall(r'href="([^"]+)"', nav))


def test_the_nav_shows_only_pages_the_scopes_open(
    client: TestClient, svc: Services, a: Project
) -> None:
    _, uploader = svc.tokens.create(a.id, ["objects:write", "jobs:write"])
    _, reader_writer = svc.tokens.create(a.id, ["jobs:read", "objects:write", "jobs:write"])
    everything = {"/ui", "/ui/jobs", "/ui/upload", "/ui/workers", "/ui/profiles"}
    cases = [
        (a.admin, "/ui", everything),
        (a.scoped["jobs:read"], "/ui", {"/ui", "/ui/jobs", "/ui/profiles"}),
        (a.scoped["objects:write"], "/ui/profiles", {"/ui/profiles"}),
        (uploader, "/ui/upload", {"/ui/upload", "/ui/profiles"}),
        (reader_writer, "/ui", everything - {"/ui/workers"}),
    ]
    for token, where, links in cases:
        login(client, token)
        r = client.get(where)
        assert r.status_code == 200, (where, r.text)
        assert _nav(r.text) == links, (where, links)
        for href in links:  # every link shown opens
            assert client.get(href).status_code == 200, href
        for href in everything - links:  # and every one hidden would have refused
            assert client.get(href).status_code == 403, href
    # A refused page shows the nav of what the token can open.
    login(client, a.scoped["objects:write"])
    r = client.get("/ui/workers")
    assert r.status_code == 403 and _nav(r.text) == {"/ui/profiles"}


def test_the_clamd_socket_is_shown_to_admins_only(
    client: TestClient, svc: Services, a: Project
) -> None:
    """The profiles page and a virus scan's job page (its params carry the
    profile's settings) name the server's clamd socket to admin tokens only."""
    source = svc.settings.home / "a.txt"
    source.write_bytes(b"hello")
    obj = svc.storage.put_file(source, filename="a.txt", project_id=a.id)
    job_id = svc.engine.enqueue(
        NewJob(
            "security.virus_scan",
            profile="virus-scan",
            object_id=int(obj["object_id"]),
            project_id=a.id,
        )
    )
    login(client, a.scoped["jobs:read"])
    for path in ("/ui/profiles", f"/ui/jobs/{job_id}"):
        page = html.unescape(client.get(path).text)  # JSON's quotes are escaped
        assert "max_bytes" in page, path
        # The socket setting, not clamd_max_file_size (a limit, no address).
        assert '"clamd":' not in page and "/run/clamav" not in page, path
    assert "virus-scan:v1" in client.get("/ui/profiles").text
    login(client, a.admin)
    for path in ("/ui/profiles", f"/ui/jobs/{job_id}"):
        assert "unix:///run/clamav/clamd.ctl" in client.get(path).text, path


def test_a_profile_runs_here_by_the_clamd_it_names(
    client: TestClient, svc: Services, a: Project
) -> None:
    """Not by the default socket: a virus-scan profile naming a clamd that
    does not answer is said not to run here, and is not offered for upload."""
    key = f"scan-{uuid.uuid4().hex[:8]}"
    svc.profiles.create(key, "security.virus_scan", {"clamd": "tcp://127.0.0.1:9"})
    login(client, a.admin)
    row = _profile_row(client.get("/ui/profiles").text, f"{key}:v1")
    assert "no: clamd does not answer on tcp://127.0.0.1:9" in row
    assert f'value="{key}:v1"' not in client.get("/ui/upload").text


def test_the_upload_form_preselects_one_profile(
    client: TestClient, svc: Services, a: Project
) -> None:
    """image-thumbnail as a job naming it gets it: its newest active version
    (every version was marked selected, and browsers took the last)."""
    v2 = svc.profiles.create("image-thumbnail", "image.thumbnail", {"width": 300})
    try:
        login(client, a.admin)
        form = client.get("/ui/upload").text
        selected = re.findall(r'<option value="([^"]+)" selected', form)
        assert selected == [v2["ref"]], selected
        assert 'value="image-thumbnail:v1"' in form
    finally:
        svc.profiles.deactivate(v2["ref"])


def _profile_row(page: str, ref: str) -> str:
    (row,) = [r for r in page.split("<tr") if f"<td>{ref}</td>" in r]
    return row


def test_a_token_without_jobs_read_never_meets_a_dead_end(
    client: TestClient, svc: Services, a: Project
) -> None:
    """An uploader's token (objects:write, jobs:write) landed on the overview's
    403, whose way back led to the same 403, and each upload ended on the
    job page's 403."""
    _, uploader = svc.tokens.create(a.id, ["objects:write", "jobs:write"])
    client.cookies.clear()
    r = client.post("/ui/login", data={"token": uploader}, follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (303, "/ui/upload")
    assert client.get("/ui/upload").status_code == 200
    refused = client.get("/ui")
    assert refused.status_code == 403 and "lacks the jobs:read scope" in refused.text
    assert '<a href="/ui/upload" id="back">Back to the upload page</a>' in refused.text
    assert '<a class="brand" href="/ui/upload">' in refused.text
    r = client.post(
        "/ui/upload",
        data={"profile": "image-thumbnail:v1"},
        files={"file": ("a.png", png(8, 6), "image/png")},
        follow_redirects=False,
    )
    assert r.status_code == 303 and r.headers["location"].startswith("/ui/upload?created=")
    job_id = int(r.headers["location"].rsplit("=", 1)[1])
    assert svc.engine.get(job_id)["project_id"] == a.id
    done = client.get(r.headers["location"])
    assert done.status_code == 200
    assert f'id="created">Uploaded: job\n<b>#{job_id}</b> was created.' in done.text
    assert 'id="file"' in done.text  # and the form, for the next file
    # Only jobs this token made are confirmed (any of the project's were: a
    # token without jobs:read learned which ids exist); junk is ignored.
    other = svc.engine.enqueue(NewJob("debug.noop", project_id="proj-other"))
    mine_not = svc.engine.enqueue(NewJob("debug.noop", project_id=a.id, created_by="someone"))
    for junk in (str(other), str(mine_not), "abc", "99999999999999999999"):
        assert 'id="created"' not in client.get(f"/ui/upload?created={junk}").text, junk
    # Only the objects:write scope: Profiles is all it can open, and where it lands.
    r = client.post(
        "/ui/login",
        data={"token": a.scoped["objects:write"], "next": "/ui/"},
        follow_redirects=False,
    )
    assert r.headers["location"] == "/ui/profiles"
    # A page asked for is where the login goes, whatever the token may see there.
    r = client.post(
        "/ui/login", data={"token": uploader, "next": "/ui/jobs"}, follow_redirects=False
    )
    assert r.headers["location"] == "/ui/jobs"
    # A reader lands on the overview, and an upload by a reader goes to the job.
    r = client.post("/ui/login", data={"token": a.admin}, follow_redirects=False)
    assert r.headers["location"] == "/ui"
    r = client.post(
        "/ui/upload",
        data={"profile": "image-thumbnail:v1"},
        files={"file": ("a.png", png(8, 6), "image/png")},
        follow_redirects=False,
    )
    assert re.fullmatch(r"/ui/jobs/\d+", r.headers["location"])


def test_a_mistaken_filter_is_said_on_the_jobs_page(
    client: TestClient, svc: Services, a: Project
) -> None:
    """It was a bare 422 page, without the form to correct it in."""
    sleep_job(svc, a.id)
    login(client, a.admin)
    cases = [
        ({"queue": "Images"}, "a queue name has 1 to 50 characters"),
        ({"job_type": "DEBUG.noop"}, "a job type has 1 to 50 characters"),
        ({"status": "bogus"}, "status must be one of"),
        ({"queue": "q" * 80}, "a queue name has 1 to 50 characters"),
        ({"before": "abc"}, "before must be a job id"),
        ({"before": "0"}, "before must be a job id"),
    ]
    for params, message in cases:
        r = client.get("/ui/jobs", params=params)
        assert r.status_code == 422, params
        assert '<form method="get" action="/ui/jobs" class="filters">' in r.text, params
        assert '<a href="/ui/jobs" aria-current="page">Jobs</a>' in r.text
        assert f'<p class="error" id="filter-error">{message}' in r.text, params
        assert 'id="jobs"' not in r.text  # no table of jobs it did not look for
    # What was typed stays in the form, to be corrected there.
    r = client.get("/ui/jobs", params={"queue": "Images", "job_type": "a.b"})
    assert 'id="filter-queue" value="Images"' in r.text
    assert 'id="filter-type" value="a.b"' in r.text


def test_a_malformed_job_id_is_an_unknown_job(client: TestClient, a: Project) -> None:
    """/ui/jobs/abc answered a bare 422, before and instead of the login."""
    bad = ("abc", "0", "-1", "99999999999999999999", "1.5")
    for raw in bad:
        r = client.get(f"/ui/jobs/{raw}", follow_redirects=False)
        assert r.status_code == 303, raw
        assert r.headers["location"] == f"/ui/login?next=%2Fui%2Fjobs%2F{raw}"
    # Any other refused parameter asks for the login first too.
    r = client.get("/ui/jobs/1/stream?after=x", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/ui/login?next=")
    login(client, a.admin)
    unknown = client.get("/ui/jobs/999999999")
    assert unknown.status_code == 404
    for raw in bad:
        r = client.get(f"/ui/jobs/{raw}")
        assert r.status_code == 404, raw
        assert "<h1>Not found</h1>" in r.text and "<nav>" in r.text
        assert client.get(f"/ui/jobs/{raw}/stream").status_code == 404
        assert client.post(f"/ui/jobs/{raw}/cancel").status_code == 404
        assert client.post(f"/ui/jobs/{raw}/retry").status_code == 404
    # Logged in, a refused parameter is the error page, with the nav.
    r = client.get("/ui/jobs/1/stream?after=x")
    assert r.status_code == 422 and "<nav>" in r.text


def test_an_unknown_path_is_a_404_whatever_the_method(client: TestClient, a: Project) -> None:
    """PATCH, PUT, DELETE and OPTIONS of a path that is no page answered 405."""
    login(client, a.admin)
    for method in ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"):
        r = client.request(method, "/ui/no/such/page", headers=HTML)
        assert r.status_code == 404, method
        assert r.headers["content-type"].startswith("text/html"), method
        assert "allow" not in r.headers
    r = client.request("PATCH", "/ui/no/such/page", headers={"Accept": "application/json"})
    assert r.status_code == 404 and r.json()["code"] == "not_found"
    # A page that exists answers what it allows.
    r = client.options("/ui/jobs", headers=HTML)
    assert (r.status_code, r.headers["allow"]) == (405, "GET, HEAD")
    r = client.patch("/ui/jobs/1/cancel", headers=HTML)
    assert (r.status_code, r.headers["allow"]) == (405, "POST")
    # A method nothing takes (QA: TRACE was a 405 naming every method the
    # catch-all takes, for a page and for no page alike).
    for method in ("TRACE", "CONNECT", "FOO"):
        r = client.request(method, "/ui/jobs/1", headers=HTML)
        assert (r.status_code, r.headers["allow"]) == (405, "GET, HEAD"), method
        r = client.request(method, "/ui/no/such/page", headers=HTML)
        assert r.status_code == 404 and "allow" not in r.headers, method
    r = client.request("TRACE", "/v1/jobs", headers={"Accept": "application/json"})
    assert (r.status_code, r.headers["allow"]) == (405, "GET, HEAD, POST")


def test_a_token_in_a_dashboard_address_is_not_carried_into_the_login(
    client: TestClient, a: Project
) -> None:
    """QA: /ui/jobs?token=hm_… sent the token on into the login form's next,
    the address after the login and the browser's history."""
    secret = a.admin  # a real token, shaped as tokens are
    r = client.get(
        f"/ui/jobs?status=failed&token={secret}&q={secret}&Access_Token=x&type=a.b",
        follow_redirects=False,
    )
    assert r.status_code == 303
    location = unquote(r.headers["location"])
    assert location == "/ui/login?next=/ui/jobs?status=failed&type=a.b", location
    assert "hm_" not in r.headers["location"] and "oken" not in location
    form = client.get(r.headers["location"])
    assert secret not in form.text and "status=failed" in form.text


def test_a_session_cookie_sent_twice_is_refused(client: TestClient, a: Project) -> None:
    """QA: with two hm_session cookies the last was read, so one tossed in by
    a sibling subdomain for the parent domain (an attacker's own session)
    could stand in for the user's."""
    login(client, a.admin)
    mine = client.cookies.get(COOKIE)
    client.cookies.clear()
    for both in (f"{COOKIE}=hms_theirs; {COOKIE}={mine}", f"{COOKIE}={mine}; {COOKIE}=hms_theirs"):
        r = client.get("/ui", headers={**HTML, "Cookie": both}, follow_redirects=False)
        assert r.status_code == 400, r.text
        assert f"two {COOKIE} cookies" in r.text and "clear this site" in r.text
    r = client.get("/ui", headers={**HTML, "Cookie": f"{COOKIE}={mine}; other=1"})
    assert r.status_code == 200  # one, beside other cookies: as ever
    r = client.get("/ui", headers={**HTML, "Cookie": f"{COOKIE}={mine}; {COOKIE}"})
    assert r.status_code == 200  # a value with no name is no second one
    # Logging out (or in again) ends every session it carries (QA: only the
    # last one read was ended, the other stayed valid).
    login(client, a.admin)
    theirs = client.cookies.get(COOKIE)
    login(client, a.admin)
    mine = client.cookies.get(COOKIE)
    client.cookies.clear()
    both = f"{COOKIE}={mine}; {COOKIE}={theirs}"
    r = client.post("/ui/logout", headers={"Cookie": both}, follow_redirects=False)
    assert r.status_code == 303
    for secret in (mine, theirs):
        r = client.get(
            "/ui", headers={**HTML, "Cookie": f"{COOKIE}={secret}"}, follow_redirects=False
        )
        assert r.status_code == 303, "ended"

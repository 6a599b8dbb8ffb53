"""The dashboard in a real headless Chromium, against a real server and worker.

uvicorn serves ``create_app`` from a thread over a fresh SQLite database; a
real ``hypermedia worker`` process works the same database and home.  In the
browser: log in with a token, upload a PNG with the image-thumbnail profile,
watch the job page follow the job live to ``completed`` and show the
thumbnail, then cancel a running 30-second ``debug.sleep`` job from its page.

Chromium is the system's (``/usr/bin/chromium``): nothing is downloaded.
Locally a missing browser skips; with CI=true it fails.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from hypermedia.api.app import create_app
from hypermedia.config import Settings
from hypermedia.db.driver import Driver
from hypermedia.db.migrate import upgrade
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import AttemptResult, NewJob
from hypermedia.services import Services
from tests.harness import wait_for
from tests.integration._procs import Procs
from tests.media import png
from tests.ports import free_port

IN_CI = os.environ.get("CI", "").lower() == "true"
CHROMIUM = os.environ.get("HYPERMEDIA_TEST_CHROMIUM", "/usr/bin/chromium")

pytestmark = pytest.mark.timeout(240)

# Run before any page script: remember every status the page's own script
# writes into #status (a live update, not a server render) across reloads.
WATCH_STATUS = """
document.addEventListener("DOMContentLoaded", () => {
  const el = document.getElementById("status");
  if (!el) return;
  new MutationObserver(() => {
    const seen = JSON.parse(sessionStorage.getItem("hm-live") || "[]");
    seen.push(el.textContent);
    sessionStorage.setItem("hm-live", JSON.stringify(seen));
  }).observe(el, {childList: true, characterData: true, subtree: true});
});
"""


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"CI=true and {reason}")
    pytest.skip(reason)


@pytest.fixture
def chromium() -> Iterator[Any]:
    """A headless system Chromium driven by Playwright."""
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        _unavailable(f"no Chromium at {CHROMIUM}")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        _unavailable(f"playwright is not installed ({exc})")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"], headless=True)
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class Stack:
    base: str
    svc: Services
    procs: Procs
    token: str


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    """The API on a free port (uvicorn in a thread) and a Procs for workers, on SQLite."""
    url = f"sqlite:///{tmp_path / 'hypermedia.db'}"
    upgrade(url)
    driver = Driver(url)
    svc = Services.from_engine(Engine(driver, Settings(home=tmp_path, database_url=url)))
    _, token = svc.tokens.create("default", ["admin"], name="e2e")
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(svc),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            ws="none",
            timeout_graceful_shutdown=2,
        )
    )
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    procs = Procs(driver, tmp_path)
    try:
        wait_for(lambda: server.started, 30, what="uvicorn starts")
        yield Stack(f"http://127.0.0.1:{port}", svc, procs, token)
    finally:
        procs.close()
        server.should_exit = True
        thread.join(15)
        driver.dispose()


def _page(chromium: Any, *, watch: bool = False) -> tuple[Any, Any, list[str]]:
    """A fresh context's page, the script errors it raises collected (and,
    with ``watch``, the live statuses it shows: ``_live_statuses``)."""
    context = chromium.new_context()
    if watch:
        context.add_init_script(WATCH_STATUS)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    return context, page, errors


def _live_statuses(page: Any) -> list[str]:
    return list(page.evaluate("JSON.parse(sessionStorage.getItem('hm-live') || '[]')"))


def test_login_upload_watch_and_cancel(chromium: Any, stack: Stack) -> None:
    from playwright.sync_api import expect

    base, svc = stack.base, stack.svc
    context, page, errors = _page(chromium, watch=True)
    try:
        # Login: every page sends us to the form first.
        page.goto(f"{base}/ui/jobs")
        assert "/ui/login" in page.url
        page.fill("#token", "hm_not_a_real_token")
        page.click("#login")
        expect(page.locator("#login-error")).to_be_visible()
        page.fill("#token", stack.token)
        page.click("#login")
        page.wait_for_url(f"{base}/ui/jobs")
        expect(page.locator("#project")).to_have_text("default")
        cookie = next(c for c in context.cookies() if c["name"] == "hm_session")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert cookie["value"].startswith("hms_") and cookie["value"] != stack.token
        assert page.evaluate("document.cookie") == ""  # out of scripts' reach

        # Upload with no worker running yet: the job page shows it waiting.
        page.click("nav >> text=Upload")
        page.set_input_files(
            "#file", files=[{"name": "red.png", "mimeType": "image/png", "buffer": png(64, 48)}]
        )
        # The profile the README's quick start names comes selected.
        expect(page.locator("#profile")).to_have_value("image-thumbnail:v1")
        # A form is sent once (a second click made a second upload and job):
        # two submits in a row, the second is stopped and the button disabled.
        sent = page.evaluate(
            """() => new Promise((done) => {
                 let sent = 0;
                 document.addEventListener("submit", (e) => {  // after once.js's
                   if (!e.defaultPrevented) sent++;
                   e.preventDefault();
                 });
                 const form = document.getElementById("submit").form;
                 for (let i = 0; i < 2; i++)
                   form.dispatchEvent(new Event("submit", {bubbles: true, cancelable: true}));
                 setTimeout(() => done([sent, document.getElementById("submit").disabled]), 50);
               })"""
        )
        assert sent == [1, True], sent
        page.reload()  # a fresh form (as after Back), then the real upload
        page.set_input_files(
            "#file", files=[{"name": "red.png", "mimeType": "image/png", "buffer": png(64, 48)}]
        )
        page.click("#submit")
        page.wait_for_url(re.compile(r"/ui/jobs/\d+$"))
        job_id = int(page.url.rsplit("/", 1)[1])
        expect(page.locator("#status")).to_have_text("queued")
        assert svc.engine.get(job_id)["job_type"] == "image.thumbnail"
        assert [j["job_id"] for j in svc.engine.list(project_id="default")] == [job_id]

        # A worker starts; the open page follows the job by itself to the end.
        loads: list[str] = []
        page.on("load", lambda p: loads.append(p.url))
        stack.procs.worker(queues="images,bulk", timeout=60)
        expect(page.locator("#status")).to_have_text("completed", timeout=60_000)
        thumb = page.locator("#outputs img.preview").first
        expect(thumb).to_be_visible(timeout=15_000)
        page.wait_for_function(
            "() => { const i = document.querySelector('#outputs img.preview');"
            " return i && i.complete && i.naturalWidth > 0; }",
            timeout=15_000,
        )
        assert "completed" in _live_statuses(page), _live_statuses(page)
        assert loads, "the page did not reload itself when the job ended"
        expect(page.locator("#attempts tbody tr")).to_have_count(1)
        expect(page.locator("#attempts tbody tr").first).to_contain_text("completed")

        # The fleet and the overview agree.
        page.click("nav >> text=Workers")
        expect(page.locator("#workers tbody")).to_contain_text("healthy")
        page.click("nav >> text=Overview")
        expect(page.locator("#completed-1h")).to_have_text("1")

        # A 30-second job: open its page, wait until it runs, cancel it there.
        sleep_id = svc.engine.enqueue(
            NewJob("debug.sleep", {"ms": 30_000}, project_id="default", owner_id="e2e")
        )
        page.goto(f"{base}/ui/jobs/{sleep_id}")
        expect(page.locator("#status")).to_have_text("processing", timeout=30_000)
        clicked = time.monotonic()
        page.click("#cancel")
        expect(page.locator("#status")).to_have_text("cancelled", timeout=10_000)
        took = time.monotonic() - clicked
        assert took < 8, took
        job = svc.engine.get(sleep_id)
        assert job["status"] == "cancelled", job["status"]
        expect(page.locator("#retry")).to_be_visible()
        assert not errors, errors
    finally:
        context.close()


def test_a_refused_stream_says_live_updates_stopped(chromium: Any, stack: Stack) -> None:
    """The browser's own "error" event (no data) once threw in job.js, and a
    stream the server refused (a revoked token: 401) left a stale page silently."""
    from playwright.sync_api import expect

    base, svc = stack.base, stack.svc
    job_id = svc.engine.enqueue(
        NewJob("debug.noop", project_id="default", owner_id="e2e", queue="nobody-serves")
    )
    context, page, errors = _page(chromium)
    try:
        page.route("**/stream*", lambda route: route.fulfill(status=401, body="no"))
        page.goto(f"{base}/ui/jobs/{job_id}")  # the login form, then back here
        page.fill("#token", stack.token)
        page.click("#login")
        page.wait_for_url(f"{base}/ui/jobs/{job_id}")
        expect(page.locator("#live-stopped")).to_have_text("Live updates stopped: reload the page.")
        expect(page.locator("#status")).to_have_text("queued")
        assert not errors, errors
    finally:
        context.close()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _http(
    base: str,
    method: str,
    path: str,
    *,
    cookie: str = "",
    data: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes, list[str]]:
    """One request over real HTTP (no redirects followed, no proxy): status,
    headers, body and the cookies set."""
    request = urllib.request.Request(base + path, data=data, method=method)
    request.add_header("Accept", "text/html")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    if cookie:
        request.add_header("Cookie", cookie)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect)
    try:
        with opener.open(request, timeout=10) as r:
            return r.status, dict(r.headers), r.read(), r.headers.get_all("Set-Cookie") or []
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read(), e.headers.get_all("Set-Cookie") or []


def test_sessions_and_error_pages_over_real_http(stack: Stack) -> None:
    """Through uvicorn: the cookie is a session, logout kills a copy of it, a
    session secret is no bearer token; HEAD and a 405 under /ui are pages (a
    413 is refused unread, with a reset mid-upload: tests/api covers it)."""
    base = stack.base
    form = urllib.parse.urlencode({"token": stack.token, "next": "/ui/jobs"}).encode()
    status, headers, _, cookies = _http(base, "POST", "/ui/login", data=form)
    assert (status, headers["location"]) == (303, "/ui/jobs")
    [set_cookie] = cookies
    assert stack.token not in set_cookie
    secret = set_cookie.split(";", 1)[0].split("=", 1)[1]
    assert secret.startswith("hms_")
    cookie = f"hm_session={secret}"
    assert _http(base, "GET", "/ui/jobs", cookie=cookie)[0] == 200
    # A session secret is refused as a bearer token.
    bearer = {"Authorization": f"Bearer {secret}"}
    assert _http(base, "GET", "/v1/jobs", headers=bearer)[0] == 401
    # HEAD: the GET's headers, no body.
    status, headers, body, _ = _http(base, "HEAD", "/ui/jobs", cookie=cookie)
    assert status == 200 and body == b"" and int(headers["content-length"]) > 0
    # A 405 under /ui is the dashboard's page.
    status, headers, body, _ = _http(base, "PUT", "/ui/jobs", cookie=cookie, data=b"")
    assert status == 405 and headers["content-type"].startswith("text/html")
    assert b"Method not allowed" in body
    assert _http(base, "GET", "/favicon.ico")[0] == 204
    # Logout revokes the session on the server: the copied cookie is dead.
    status, headers, _, _ = _http(base, "POST", "/ui/logout", cookie=cookie, data=b"")
    assert (status, headers["location"]) == (303, "/ui/login")
    status, headers, _, _ = _http(base, "GET", "/ui/jobs", cookie=cookie)
    assert status == 303 and headers["location"].startswith("/ui/login")


def _log_in(page: Any, base: str, token: str, path: str) -> None:
    page.goto(f"{base}{path}")  # the login form, then back to path
    page.fill("#token", token)
    page.click("#login")
    page.wait_for_url(f"{base}{path}")


def test_an_ended_session_goes_to_login_without_a_badge(
    chromium: Any, stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream's end for a revoked token ({"status": "unauthorized"}) was
    written into the status badge (class s-unauthorized) before the reload."""
    from hypermedia.api.routes import jobs as jobs_api

    monkeypatch.setattr(jobs_api, "SSE_RECHECK_SECONDS", 0.3)  # the server's check, sooner
    base, svc = stack.base, stack.svc
    job_id = svc.engine.enqueue(
        NewJob("debug.noop", project_id="default", owner_id="e2e", queue="nobody-serves")
    )
    row, token = svc.tokens.create("default", ["jobs:read"])
    context, page, errors = _page(chromium, watch=True)
    try:
        with page.expect_response(lambda r: "/stream" in r.url) as opened:
            _log_in(page, base, token, f"/ui/jobs/{job_id}")
        assert opened.value.status == 200  # the stream is open: its token checked
        assert page.locator("#status").text_content() == "queued"
        svc.tokens.revoke(int(row["token_id"]))
        page.wait_for_url(re.compile(r"/ui/login\?next="), timeout=15_000)
        assert "unauthorized" not in _live_statuses(page), _live_statuses(page)
        assert not errors, errors
    finally:
        context.close()


def test_a_long_file_name_keeps_the_page_in_the_window(
    chromium: Any, stack: Stack, tmp_path: Path
) -> None:
    """A 1000-character file name without a space made the job page 2445 px
    wide in a 1280 px window."""
    base, svc = stack.base, stack.svc
    source = tmp_path / "long.png"
    source.write_bytes(png(8, 6))
    obj = svc.storage.put_file(source, filename="n" * 1000 + ".png", project_id="default")
    job_id = svc.engine.enqueue(
        NewJob(
            "debug.sleep",
            {"ms": 1, "marker": "m" * 1000},
            project_id="default",
            object_id=int(obj["object_id"]),
            queue="nobody-serves",
        )
    )
    context = chromium.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    try:
        _log_in(page, base, stack.token, f"/ui/jobs/{job_id}")
        assert "n" * 200 in (page.locator("#input").text_content() or "")
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 1280, width
    finally:
        context.close()


@pytest.mark.parametrize("width", [375, 1280])
def test_table_cells_keep_short_words_whole_and_the_page_in_the_window(
    chromium: Any, stack: Stack, width: int
) -> None:
    """Cells could break anywhere: the table squeezed every column to a
    letter ("image.thumbnai|l", "faile|d") and, on a phone, the headers
    still pushed the page past the window (478-738 px in 375)."""
    base, svc = stack.base, stack.svc
    for _ in range(3):
        svc.engine.enqueue(NewJob("debug.sleep", {"ms": 1}, queue="nobody-serves"))
    # Failed for good: the overview's recent failures show their codes.
    svc.engine.enqueue(NewJob("debug.sleep", {"ms": 1}, queue="fails", max_attempts=1))
    (claimed,) = svc.engine.claim("w-css", ["fails"], 1)
    failed = AttemptResult(claimed.job_id, claimed.attempt, "failed", code="UNSUPPORTED_FORMAT")
    svc.engine.flush("w-css", [], [failed])
    context = chromium.new_context(viewport={"width": width, "height": 740})
    page = context.new_page()
    lines_of = (  # the lines each element's text takes: one box each
        "s => [...document.querySelectorAll(s)].map(e => {"
        " const r = document.createRange(); r.selectNodeContents(e);"
        " return new Set([...r.getClientRects()].map(b => Math.round(b.top))).size; })"
    )
    try:
        _log_in(page, base, stack.token, "/ui/jobs")
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        for cell in ("td:nth-child(2)", "td:nth-child(4) .status"):  # job type, status
            lines = page.evaluate(lines_of, "tbody tr " + cell)
            assert lines and set(lines) == {1}, (cell, lines)
        # A code in a cell too ("CORR|UPT_|INPU|T" in four lines on a phone).
        page.goto(base + "/ui")
        lines = page.evaluate(lines_of, "td code")
        assert lines and set(lines) == {1}, lines
    finally:
        context.close()

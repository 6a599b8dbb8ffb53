"""The dashboard's job page over every database: what it shows of outputs
(data ones, and links to blobs that stay valid), params, progress and times.

The services here run on a FakeClock, so signed URLs expire and retries
come due without sleeping.
"""

from __future__ import annotations

import html
import io
import re
import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient

from hypermedia.config import Settings
from hypermedia.db.driver import Driver
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import AttemptResult, NewJob, Output
from hypermedia.services import Services
from tests.api.conftest import Project
from tests.api.test_ui_pages import _profile_row, login
from tests.conftest import FakeClock
from tests.media import png

W = "w-ui"
DASH = "\u2013"  # an en dash, as people type it


@pytest.fixture
def svc(driver: Driver, settings: Settings, clock: FakeClock) -> Services:
    """The API's services on the test's FakeClock (overrides tests/api/conftest.py's)."""
    return Services.from_engine(
        Engine(driver, settings.with_(api_rate_per_second=0.0), clock=clock)
    )


def run(svc: Services, job_id: int) -> int:
    """Claim and start ``job_id`` as worker W; its attempt number."""
    queue = svc.engine.get(job_id)["queue_name"]
    [(got, attempt)] = [(c.job_id, c.attempt) for c in svc.engine.claim(W, [queue], 1)]
    assert got == job_id and svc.engine.start(W, [(got, attempt)]) == {job_id}
    return attempt


def finish(svc: Services, job_id: int, status: str = "completed", **kw: Any) -> None:
    attempt = svc.engine.get(job_id)["attempt_count"]
    result = AttemptResult(job_id=job_id, attempt=attempt, status=status, worker_id=W, **kw)
    assert svc.engine.settle(W, [result]) == {job_id}


def test_a_data_only_output_shows_its_data(client: TestClient, svc: Services, a: Project) -> None:
    """A verdict (dedup_result) is data in its metadata, with no blob behind
    it: the page showed "dedup_result · application/json · 0 B" and nothing."""
    verdict = {"duplicates": [{"object_id": 7, "distance": 0}], "truncated": False}
    dedup = svc.engine.enqueue(NewJob("debug.sleep", {"ms": 1}, project_id=a.id))
    run(svc, dedup)
    finish(
        svc,
        dedup,
        result={"checked": 3},
        outputs=[Output("dedup_result", "application/json", metadata=verdict)],
    )
    # debug.sleep {"output": true}: a result and an output without metadata.
    debug = svc.engine.enqueue(NewJob("debug.sleep", {"ms": 1}, project_id=a.id))
    run(svc, debug)
    finish(
        svc,
        debug,
        result={"slept_ms": 1, "pid": 4242},
        outputs=[Output("debug_result", "application/json")],
    )
    login(client, a.admin)
    page = client.get(f"/ui/jobs/{dedup}").text
    outputs = html.unescape(page.split('id="outputs"', 1)[1].split("<h2>", 1)[0])
    assert "dedup_result · application/json" in outputs
    assert "0 B" not in outputs and "href=" not in outputs
    assert '"distance": 0' in outputs and '"truncated": false' in outputs
    page = client.get(f"/ui/jobs/{debug}").text
    outputs = html.unescape(page.split('id="outputs"', 1)[1].split("<h2>", 1)[0])
    assert "debug_result · application/json" in outputs and "0 B" not in outputs
    assert '"pid": 4242' in outputs  # no metadata of its own: the job's result


def _output_job(svc: Services, project: str, data: bytes) -> int:
    """A completed job with one stored text output."""
    src = svc.storage.put(io.BytesIO(b"input"), project_id=project)
    out = svc.storage.put(io.BytesIO(data), project_id=project, role="copy")
    job_id = svc.engine.enqueue(
        NewJob("debug.copy", object_id=int(src["object_id"]), project_id=project)
    )
    run(svc, job_id)
    finish(svc, job_id, outputs=[Output("copy", "text/plain", object_id=int(out["object_id"]))])
    return job_id


def test_download_links_stay_valid_after_signed_urls_expire(
    client: TestClient, svc: Services, clock: FakeClock, a: Project, b: Project
) -> None:
    """The page held the signed URL itself: left open longer than
    HYPERMEDIA_SIGNED_URL_SECONDS, its link answered the API's JSON 403."""
    job_id = _output_job(svc, a.id, b"the output")
    login(client, a.scoped["jobs:read"])
    page = client.get(f"/ui/jobs/{job_id}").text
    [href] = re.findall(r'<a href="([^"]+)">download</a>', page)
    output_id = svc.engine.get(job_id)["outputs"][0]["output_id"]
    assert href == f"/ui/jobs/{job_id}/outputs/{output_id}"
    clock.advance(svc.settings.signed_url_seconds + 60)  # the page stayed open
    r = client.get(href, follow_redirects=False)
    assert r.status_code == 303 and r.headers["cache-control"] == "no-store"
    assert "/v1/objects/" in r.headers["location"]
    got = client.get(r.headers["location"])
    assert (got.status_code, got.content) == (200, b"the output")
    # Each click signs anew; what was signed earlier expires as before.
    clock.advance(svc.settings.signed_url_seconds + 60)
    assert client.get(r.headers["location"]).status_code == 403
    assert client.get(href).content == b"the output"
    # Another project, another job's output, junk ids: the same 404 page.
    other = _output_job(svc, a.id, b"other")
    for path in (
        f"/ui/jobs/{other}/outputs/{output_id}",
        f"/ui/jobs/{job_id}/outputs/abc",
        f"/ui/jobs/{job_id}/outputs/0",
    ):
        r = client.get(path, follow_redirects=False)
        assert r.status_code == 404 and "Not found" in r.text, path
    login(client, b.admin)
    assert client.get(href, follow_redirects=False).status_code == 404
    # Logged out: to the login form, then back to the download.
    client.cookies.clear()
    r = client.get(href, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/ui/login?next=%2Fui%2Fjobs")


def test_an_image_preview_loads_through_the_dashboard(
    client: TestClient, svc: Services, a: Project
) -> None:
    src = svc.storage.put(io.BytesIO(png(8, 6)), project_id=a.id)
    thumb = svc.storage.put(io.BytesIO(png(4, 3)), project_id=a.id, role="thumb")
    job_id = svc.engine.enqueue(
        NewJob("image.thumbnail", object_id=int(src["object_id"]), project_id=a.id)
    )
    run(svc, job_id)
    finish(svc, job_id, outputs=[Output("thumbnail", "image/png", object_id=thumb["object_id"])])
    login(client, a.admin)
    page = client.get(f"/ui/jobs/{job_id}").text
    [src_attr] = re.findall(r'<img class="preview" src="([^"]+)"', page)
    assert src_attr.startswith(f"/ui/jobs/{job_id}/outputs/")
    assert client.get(src_attr).content == png(4, 3)
    # A download link as well, as for any stored output (the docs said so;
    # an image had its preview alone).
    assert re.findall(r'<a href="([^"]+)">download</a>', page) == [src_attr]


def test_params_read_as_written_and_stay_escaped(
    client: TestClient, svc: Services, a: Project
) -> None:
    """``tojson`` showed "Tom \\u0026 Jerry \\u2013 caf\\u00e9"; JSON as
    written must still never end the <pre> it is shown in."""
    marker = f"Tom & Jerry {DASH} café </pre><script>alert(1)</script>"
    job_id = svc.engine.enqueue(NewJob("debug.sleep", {"marker": marker}, project_id=a.id))
    login(client, a.admin)
    page = client.get(f"/ui/jobs/{job_id}").text
    params = page.split('<pre class="json" id="params">', 1)[1].split("</pre>", 1)[0]
    shown = f"Tom &amp; Jerry {DASH} café &lt;/pre&gt;&lt;script&gt;alert(1)&lt;/script&gt;"
    assert shown in params
    assert "\\u" not in params and "<script>alert" not in page
    assert "\n  &#34;marker&#34;: " in params  # indented, one key a line
    # Profile settings: the same filter, on one line.
    key = f"scan-{uuid.uuid4().hex[:8]}"
    svc.profiles.create(key, "security.virus_scan", {"clamd": f"unix:///run/café {DASH} ü.ctl"})
    row = _profile_row(client.get("/ui/profiles").text, f"{key}:v1")
    assert f"&#34;clamd&#34;: &#34;unix:///run/café {DASH} ü.ctl&#34;" in row
    assert "\\u" not in row


def _bar(page: str) -> str:
    return page.split('<p class="progress">', 1)[1].split("</p>", 1)[0]


def test_progress_is_the_running_attempts_only(
    client: TestClient, svc: Services, clock: FakeClock, a: Project
) -> None:
    """A job in retry_wait showed its failed attempt's "100.0% step 4/4"."""
    job_id = svc.engine.enqueue(NewJob("debug.sleep", {"ms": 1}, project_id=a.id))
    first = run(svc, job_id)
    svc.engine.report_progress(W, {(job_id, first): {"percent": 100, "step": "step 4/4"}})
    login(client, a.admin)
    bar = _bar(client.get(f"/ui/jobs/{job_id}").text)
    assert 'value="100.0"' in bar and ">100% step 4/4<" in bar  # as the live page writes it
    finish(svc, job_id, "crashed", code="CRASHED")
    assert svc.engine.get(job_id)["status"] == "retry_wait"
    page = client.get(f"/ui/jobs/{job_id}").text
    assert 'data-waiting="created paused queued retry_wait"' in page  # for job.js
    bar = _bar(page)  # empty and still: not the browser's moving busy bar
    assert 'value="0"' in bar and '<span id="progress-text"></span>' in bar
    clock.advance(3600)
    assert svc.engine.promote() == 1
    second = run(svc, job_id)
    assert second == first + 1
    bar = _bar(client.get(f"/ui/jobs/{job_id}").text)  # nothing reported by this attempt yet
    assert "value=" not in bar and '<span id="progress-text"></span>' in bar  # busy: it runs
    svc.engine.report_progress(W, {(job_id, second): {"percent": 25, "step": "step 1/4"}})
    bar = _bar(client.get(f"/ui/jobs/{job_id}").text)
    assert 'value="25.0"' in bar and ">25% step 1/4<" in bar


def test_times_say_they_are_utc(client: TestClient, svc: Services, a: Project) -> None:
    job_id = svc.engine.enqueue(NewJob("debug.sleep", {"ms": 1}, project_id=a.id))
    login(client, a.admin)
    page = client.get(f"/ui/jobs/{job_id}").text
    created = svc.engine.get(job_id)["created_at"]
    assert f"<dd>{created:%Y-%m-%d %H:%M:%S} UTC by " in page
    assert re.search(r"<td>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC</td>", page)  # the events
    jobs = client.get("/ui/jobs").text
    assert f"<td>{created:%Y-%m-%d %H:%M:%S} UTC</td>" in jobs
    js = client.get("/ui/static/job.js").text
    assert '" UTC"' in js  # what the live page adds to the events it appends


def test_credits_shown_are_the_ones_charged(client: TestClient, svc: Services, a: Project) -> None:
    """A failed or cancelled job, which costs nothing, showed its estimate as
    its credits; the profiles page showed every price as `base + N/MB`, a
    per-page or per-minute price never."""
    key = f"paid-{uuid.uuid4().hex[:6]}"
    svc.profiles.create(key, "debug.sleep", {}, credits={"base": 2, "per_page": 3})
    login(client, a.admin)
    failing = svc.engine.enqueue(NewJob("debug.sleep", profile=key, project_id=a.id))
    run(svc, failing)
    finish(svc, failing, "failed", code="CORRUPT_INPUT", message="bad")
    page = client.get(f"/ui/jobs/{failing}").text
    assert re.search(r'id="credits">0 \(not charged\)<', page), page
    queued = svc.engine.enqueue(NewJob("debug.sleep", profile=key, project_id=a.id))
    assert re.search(r'id="credits">\d+ \(estimated\)<', client.get(f"/ui/jobs/{queued}").text)
    profiles = client.get("/ui/profiles").text
    assert "<td>2 + 3/page</td>" in _profile_row(profiles, f"{key}:v1")
    assert "<td>1 + 1/page</td>" in _profile_row(profiles, "pdf-preview:v1")


def test_an_events_code_is_shown_once(client: TestClient, svc: Services, a: Project) -> None:
    """The engine's message begins "INTERNAL: …": the page said "INTERNAL
    INTERNAL: …", and so did the live page's rows."""
    job_id = svc.engine.enqueue(NewJob("debug.sleep", {"ms": 1}, project_id=a.id))
    run(svc, job_id)
    finish(svc, job_id, "failed", code="INTERNAL", message="asked to fail")
    login(client, a.admin)
    page = client.get(f"/ui/jobs/{job_id}").text
    assert "INTERNAL: asked to fail; retry in" in page
    assert "<code>INTERNAL</code> INTERNAL:" not in page
    # A message that does not name its code keeps it in front.
    job_id = svc.engine.enqueue(NewJob("debug.sleep", {"ms": 1}, project_id=a.id))
    run(svc, job_id)
    svc.engine.cancel(job_id)
    finish(svc, job_id, "crashed", code="CRASHED")
    events = [e for e in svc.engine.events_since(job_id)[1] if e.get("code")]
    assert events and not events[-1]["message"].startswith("CRASHED:")
    assert "<code>CRASHED</code> " in client.get(f"/ui/jobs/{job_id}").text
    js = client.get("/ui/static/job.js").text
    assert 'message.indexOf(row.code + ":") !== 0' in js

"""Dashboard sessions over every database, through the app's HTTP routes.

Logging in makes a session of its own: the cookie holds a random secret,
stored only as a SHA-256 next to its token's id, never the token.  Logging out
revokes it on the server, so a copied cookie stops working; revoking or
expiring the token ends its sessions; a session expires by itself; and a
session secret is no API token.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta

import sqlalchemy as sa
from fastapi.testclient import TestClient

from hypermedia.api.app import create_app
from hypermedia.api.deps import COOKIE, LEGACY_COOKIE
from hypermedia.config import Settings
from hypermedia.db.driver import Driver
from hypermedia.db.schema_auth import dashboard_sessions
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import NewJob
from hypermedia.services import Services
from tests.api.conftest import Project, bearer
from tests.conftest import FakeClock


def login(client: TestClient, token: str) -> str:
    """A fresh login (no earlier cookie); returns the session cookie's value."""
    client.cookies.clear()
    r = client.post("/ui/login", data={"token": token}, follow_redirects=False)
    assert r.status_code == 303, r.text
    secret = client.cookies.get(COOKIE)
    assert secret
    return secret


def page_with(client: TestClient, secret: str, path: str = "/ui") -> int:
    """The status of ``path`` for a browser holding only this cookie."""
    client.cookies.clear()
    client.cookies.set(COOKIE, secret, domain="testserver.local")  # as the server set it
    return client.get(path, follow_redirects=False).status_code


def session_rows(svc: Services) -> list[dict]:
    with svc.engine.db.read() as tx:
        return [dict(r._mapping) for r in tx.conn.execute(sa.select(dashboard_sessions))]


def token_id(svc: Services, token: str) -> int:
    return svc.tokens.authenticate(token).token_id


def test_the_cookie_is_a_session_stored_hashed_never_the_token(
    client: TestClient, svc: Services, a: Project
) -> None:
    r = client.post("/ui/login", data={"token": a.admin}, follow_redirects=False)
    assert r.status_code == 303
    assert a.admin not in r.headers["set-cookie"]
    secret = client.cookies.get(COOKIE)
    assert secret and secret.startswith("hms_") and secret != a.admin
    assert a.admin.split("_", 2)[2] not in secret
    [row] = session_rows(svc)
    assert row["secret_hash"] == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in str(row) and a.admin not in str(row)
    assert row["token_id"] == token_id(svc, a.admin)
    assert row["expires_at"] - row["created_at"] == timedelta(hours=12)
    assert row["revoked_at"] is None
    overview = client.get("/ui")
    assert overview.status_code == 200 and 'id="project">proj-a<' in overview.text
    # The session carries its token's project and scopes, nothing more.
    reader = login(client, a.scoped["jobs:read"])
    assert page_with(client, reader, "/ui/jobs") == 200
    assert page_with(client, reader, "/ui/upload") == 403


def test_logout_revokes_the_session_so_a_copied_cookie_stops_working(
    client: TestClient, svc: Services, a: Project
) -> None:
    job_id = svc.engine.enqueue(NewJob("debug.sleep", {"ms": 60_000}, project_id=a.id))
    secret = login(client, a.admin)
    assert page_with(client, secret) == 200
    r = client.post("/ui/logout", follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (303, "/ui/login")
    assert client.cookies.get(COOKIE) is None
    [row] = session_rows(svc)
    assert row["revoked_at"] is not None
    # Someone who copied the cookie before: pages, actions and the stream refuse it.
    assert page_with(client, secret) == 303
    r = client.post(f"/ui/jobs/{job_id}/cancel", follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (303, "/ui/login")
    assert svc.engine.get(job_id)["status"] == "queued"
    r = client.get(f"/ui/jobs/{job_id}/stream", headers={"Accept": "text/event-stream"})
    assert r.status_code == 401
    # The token itself is untouched: the API and a new login still work.
    client.cookies.clear()
    assert client.get("/v1/jobs", headers=bearer(a.admin)).status_code == 200
    again = login(client, a.admin)
    assert again != secret and page_with(client, again) == 200
    # Logging in again over a live session ends the old one.
    client.post("/ui/login", data={"token": a.admin}, follow_redirects=False)
    newest = client.cookies.get(COOKIE)
    assert newest and newest != again
    assert page_with(client, again) == 303
    assert page_with(client, newest) == 200


def test_revoking_the_token_ends_its_sessions(
    client: TestClient, svc: Services, a: Project
) -> None:
    first, second = login(client, a.admin), login(client, a.admin)
    other = login(client, a.scoped["jobs:read"])
    for secret in (first, second, other):
        assert page_with(client, secret) == 200
    principal = svc.tokens.authenticate_session(first)
    assert svc.tokens.still_valid(principal)  # what an open stream checks
    svc.tokens.revoke(token_id(svc, a.admin))
    assert page_with(client, first) == 303 and page_with(client, second) == 303
    assert not svc.tokens.still_valid(principal)
    assert page_with(client, other) == 200  # another token's session
    r = client.post("/ui/login", data={"token": a.admin}, follow_redirects=False)
    assert r.status_code == 401  # and no new session for the revoked token


def test_sessions_expire_and_so_do_their_tokens(
    driver: Driver, settings: Settings, clock: FakeClock
) -> None:
    svc = Services.from_engine(
        Engine(driver, settings.with_(api_rate_per_second=0.0, session_hours=2.0), clock=clock)
    )
    _, token = svc.tokens.create("p", ["admin"])
    _, short = svc.tokens.create("p", ["admin"], expires_in=timedelta(hours=1))
    with TestClient(create_app(svc), raise_server_exceptions=False) as c:
        long_lived, short_lived = login(c, token), login(c, short)
        assert {r["expires_at"] for r in session_rows(svc)} == {clock.now + timedelta(hours=2)}
        clock.advance(3600 - 1)
        assert page_with(c, long_lived) == 200 and page_with(c, short_lived) == 200
        clock.advance(2)  # the short token expired: its session with it
        assert page_with(c, long_lived) == 200 and page_with(c, short_lived) == 303
        clock.advance(3600)  # two hours since login: the session itself expired
        assert page_with(c, long_lived) == 303
        principal = svc.tokens.authenticate(token)
        assert c.get("/v1/jobs", headers=bearer(token)).status_code == 200  # the token lives on
        # The next login deletes expired sessions: rows do not pile up.
        fresh = login(c, token)
        rows = session_rows(svc)
        assert [r["secret_hash"] for r in rows] == [hashlib.sha256(fresh.encode()).hexdigest()]
        assert rows[0]["token_id"] == principal.token_id


def test_a_session_secret_is_no_api_token(client: TestClient, svc: Services, a: Project) -> None:
    secret = login(client, a.admin)
    client.cookies.clear()
    for path in ("/v1/jobs", "/v1/objects", "/v1/profiles", "/v1/queues"):
        r = client.get(path, headers=bearer(secret))
        assert r.status_code == 401, path
        assert r.json()["code"] == "unauthorized" and secret not in r.text
    r = client.post(
        "/v1/jobs", headers=bearer(secret), json={"profile": "debug-noop", "params": {}}
    )
    assert r.status_code == 401
    # Not as a bearer header on the dashboard either: the header is a token's
    # place.  A page sends the browser to log in (docs/dashboard.md), the
    # live stream answers 401.
    r = client.get("/ui", headers=bearer(secret), follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/login?next=%2Fui"
    stream = {**bearer(secret), "Accept": "text/event-stream"}
    assert client.get("/ui/jobs/1/stream", headers=stream).status_code == 401
    # The cookie is only read by the dashboard: the API ignores it.
    client.cookies.set(COOKIE, secret)
    assert client.get("/v1/jobs").status_code == 401
    assert client.get("/ui").status_code == 200
    # The token itself in the cookie (how older versions kept it) is refused, and
    # the old cookie, where a browser still has it, is deleted.
    assert page_with(client, a.admin) == 303
    client.cookies.clear()
    client.cookies.set(LEGACY_COOKIE, a.admin)
    r = client.get("/ui", follow_redirects=False)
    assert r.status_code == 303 and f'{LEGACY_COOKIE}=""' in r.headers["set-cookie"]
    # Beside a good session too: every page deletes it, not only the login's.
    client.cookies.set(COOKIE, secret)
    client.cookies.set(LEGACY_COOKIE, a.admin)
    r = client.get("/ui", follow_redirects=False)
    assert r.status_code == 200 and f'{LEGACY_COOKIE}=""' in r.headers["set-cookie"]


def test_logins_spend_from_the_tokens_rate_and_keep_its_newest_sessions(
    driver: Driver, settings: Settings
) -> None:
    """600 logins in a loop made 600 sessions of 12 hours, at full speed."""
    from hypermedia.auth.tokens import MAX_SESSIONS

    slow = settings.with_(api_rate_per_second=0.001, api_rate_burst=3)
    svc = Services.from_engine(Engine(driver, slow))
    _, token = svc.tokens.create("p", ["admin"])
    with TestClient(create_app(svc), raise_server_exceptions=False) as c:
        for _ in range(3):
            login(c, token)
        c.cookies.clear()
        r = c.post("/ui/login", data={"token": token}, follow_redirects=False)
        assert r.status_code == 429 and int(r.headers["Retry-After"]) > 0
        assert "too many requests for this token" in r.text
        assert len(session_rows(svc)) == 3  # the refused login made none
    fast = Services.from_engine(Engine(driver, settings.with_(api_rate_per_second=0.0)))
    with TestClient(create_app(fast), raise_server_exceptions=False) as c:
        secrets = [login(c, token) for _ in range(MAX_SESSIONS + 5)]
        rows = session_rows(fast)
        assert len(rows) == MAX_SESSIONS  # the newest, the oldest deleted
        assert page_with(c, secrets[-1]) == 200 and page_with(c, secrets[0]) == 303


def test_a_login_target_leaving_the_dashboard_is_not_followed() -> None:
    from hypermedia.ui.web import safe_next

    for target in ("/ui/../v1/jobs", "/ui/%2e%2e/v1/jobs", "/ui/jobs/../../v1", "//evil/ui"):
        assert safe_next(target) == "/ui", target
    for target in ("/uievil", "/ui.evil.com", "/ui@evil.com"):  # not under /ui/
        assert safe_next(target) == "/ui", target
    assert safe_next("/ui?x=1") == "/ui?x=1" and safe_next("/ui") == "/ui"
    assert safe_next("/ui/jobs/7?x=..") == "/ui/jobs/7?x=.."

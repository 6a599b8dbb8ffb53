"""Tokens: stored hashed, recognisable, scoped, revocable, expiring, rate limited."""

from __future__ import annotations

import hashlib
import os
import stat
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from hypermedia.api.app import create_app
from hypermedia.errors import InvalidRequest, NotFound, Unauthorized
from hypermedia.services import Services
from tests.api.conftest import bearer


def test_a_token_is_stored_as_a_hash_with_a_public_prefix(svc: Services) -> None:
    row, token = svc.tokens.create("p1", "jobs:read, jobs:write", name="ci")
    assert token.startswith(row["prefix"] + "_") and row["prefix"].startswith("hm_")
    assert "token_hash" not in row and token not in str(row)
    with svc.engine.db.read() as tx:
        stored = tx.token(row["token_id"])
    assert stored is not None
    assert stored["token_hash"] == hashlib.sha256(token.encode()).hexdigest()
    assert sorted(stored["scopes"]) == ["jobs:read", "jobs:write"]
    principal = svc.tokens.authenticate(token)
    assert (principal.project_id, principal.scopes) == ("p1", {"jobs:read", "jobs:write"})
    assert [p["project_id"] for p in svc.tokens.projects()] == ["p1"]


def test_bad_scopes_are_refused(svc: Services) -> None:
    for scopes in ("", "jobs:delete", "admin,root"):
        with pytest.raises(InvalidRequest):
            svc.tokens.create("p1", scopes)


def test_revoked_expired_and_forged_tokens_fail_alike(svc: Services) -> None:
    _, token = svc.tokens.create("p1", ["admin"])
    row, short = svc.tokens.create("p1", ["admin"], expires_in=timedelta(seconds=-1))
    forged = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    for bad in (short, forged, "hm_nope", "", "hm_" + "a" * 10 + "_x", token + "x"):
        with pytest.raises(Unauthorized) as err:
            svc.tokens.authenticate(bad)
        assert str(err.value) == "invalid or expired token"
    svc.tokens.authenticate(token)
    revoked = svc.tokens.revoke(svc.tokens.list("p1")[0]["token_id"])
    assert revoked["revoked_at"] is not None
    with pytest.raises(Unauthorized):
        svc.tokens.authenticate(token)
    with pytest.raises(NotFound):
        svc.tokens.revoke(row["token_id"], project_id="other")


def test_first_admin_token_is_written_once_with_mode_0600(svc: Services, tmp_path: Path) -> None:
    token = svc.tokens.first_admin(tmp_path)
    assert token is not None
    path = tmp_path / "admin-token"
    assert path.read_text().strip() == token
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert svc.tokens.authenticate(token).allows("jobs:write")
    assert svc.tokens.first_admin(tmp_path) is None  # tokens exist: nothing new


def test_api_refuses_missing_revoked_and_wrong_scheme(client: TestClient, svc: Services) -> None:
    row, token = svc.tokens.create("p1", ["jobs:read"])
    assert client.get("/v1/jobs", headers=bearer(token)).status_code == 200
    assert client.get("/v1/jobs", headers={"Authorization": f"Basic {token}"}).status_code == 401
    svc.tokens.revoke(row["token_id"])
    r = client.get("/v1/jobs", headers=bearer(token))
    assert r.status_code == 401 and token not in r.text


def test_credentials_or_an_origin_sent_twice_are_refused(client: TestClient, svc: Services) -> None:
    """The first of two Authorization headers was taken: a proxy that checks
    or logs the last one saw another token than the API used (QA)."""
    _, mine = svc.tokens.create("p1", ["jobs:read"])
    _, theirs = svc.tokens.create("p2", ["jobs:read"])
    for second in (f"Bearer {theirs}", "Bearer garbage", f"Bearer {mine}"):
        r = client.get(
            "/v1/jobs", headers=[("Authorization", f"Bearer {mine}"), ("Authorization", second)]
        )
        assert r.status_code == 400, r.text
        assert r.json()["code"] == "bad_request" and "at most once" in r.json()["message"]
    origins = [("Origin", "http://testserver"), ("Origin", "http://evil.example")]
    r = client.post("/ui/login", headers=origins, data={"token": mine}, follow_redirects=False)
    assert r.status_code == 400
    assert client.get("/v1/jobs", headers=bearer(mine)).status_code == 200  # once: as ever


def test_who_may_ask_is_judged_before_what_is_asked(client: TestClient, svc: Services) -> None:
    """A broken body of a caller with no token, or a token without the
    scope, was told of its JSON (422) before it was told it may not ask."""
    _, reader = svc.tokens.create("p1", ["jobs:read"])
    _, writer = svc.tokens.create("p1", ["jobs:write"])
    json_type = {"Content-Type": "application/json"}
    for body in (b"{bad", b"\xff\xfe", b'{"job_type": 5}'):
        r = client.post("/v1/jobs", content=body, headers=json_type)
        assert (r.status_code, r.json()["code"]) == (401, "unauthorized"), body
        r = client.post("/v1/jobs", content=body, headers={**json_type, **bearer(reader)})
        assert (r.status_code, r.json()["code"]) == (403, "forbidden"), body
        r = client.post("/v1/jobs", content=body, headers={**json_type, **bearer(writer)})
        assert r.status_code == 422, body  # allowed to ask: told what is wrong


def test_rate_limit_answers_429_with_retry_after(svc: Services) -> None:
    limited = Services.from_engine(svc.engine)
    limited.settings = svc.settings.with_(api_rate_per_second=0.5, api_rate_burst=3)
    _, token = svc.tokens.create("p1", ["jobs:read"])
    _, other = svc.tokens.create("p1", ["jobs:read"])
    with TestClient(create_app(limited)) as c:
        codes = [c.get("/v1/jobs", headers=bearer(token)).status_code for _ in range(5)]
        assert codes == [200, 200, 200, 429, 429]
        r = c.get("/v1/jobs", headers=bearer(token))
        assert r.json()["code"] == "rate_limited" and int(r.headers["Retry-After"]) >= 1
        # The bucket is per token: another token of the same project is not slowed.
        assert c.get("/v1/jobs", headers=bearer(other)).status_code == 200


def test_failed_authentications_from_an_address_are_throttled(
    svc: Services, caplog: pytest.LogCaptureFixture
) -> None:
    """200 wrong tokens in 3 s were 200 database reads, unlimited and unlogged."""
    guarded = Services.from_engine(svc.engine)
    guarded.settings = svc.settings.with_(api_auth_failures_per_minute=5)
    _, good = svc.tokens.create("p1", ["jobs:read"])
    app = create_app(guarded)
    with TestClient(app, client=("203.0.113.7", 5000)) as c, caplog.at_level("WARNING"):
        codes = [c.get("/v1/jobs", headers=bearer(f"hm_x_wrong{i}")).status_code for i in range(8)]
        assert codes == [401] * 5 + [429] * 3
        r = c.get("/v1/jobs", headers=bearer(good))  # not even checked now
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
        assert "failed authentications" in r.json()["message"]
        assert c.get("/v1/jobs").status_code == 401  # no credential: no guess, no 429
        r = c.post("/ui/login", data={"token": good}, follow_redirects=False)
        assert r.status_code == 429 and "Too many failed logins from this address" in r.text
        assert f"try again in {r.headers['Retry-After']} s." in r.text
    said = [m for m in caplog.messages if "too many failed authentications" in m]
    assert len(said) == 1 and "203.0.113.7" in said[0]
    # Another address is not slowed; dashboard logins count too.
    with TestClient(app, client=("198.51.100.9", 5000)) as c:
        assert c.get("/v1/jobs", headers=bearer(good)).status_code == 200
        codes = [
            c.post("/ui/login", data={"token": f"hm_x_{i}"}, follow_redirects=False).status_code
            for i in range(6)
        ]
        assert codes == [401] * 5 + [429]


def test_forgotten_buckets_are_only_full_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """One address per request of a wide IPv6 range grew the dict for ever."""
    from hypermedia.api import deps

    now = [100.0]
    monkeypatch.setattr(deps.time, "monotonic", lambda: now[0])
    limiter = deps.RateLimiter(1.0, 2)
    limiter.KEYS = 3
    limiter.take("hot")
    limiter.take("hot")
    now[0] += 1.0  # "hot" has one of two back: not full
    for key in range(3):
        limiter.take(key)
    assert set(limiter._buckets) == {"hot", 0, 1, 2}
    now[0] += 1.5  # 0, 1 and 2 full again; "hot" too
    limiter.take("new")
    assert set(limiter._buckets) == {"new"}
    now[0] += 0.5
    limiter.take("a")
    limiter.take("b")
    limiter.take("c")  # "new" has 1.5 of 2 back: kept
    assert "new" in limiter._buckets


def test_failed_authentications_sent_at_once_are_throttled_too(svc: Services) -> None:
    """All 300 guesses sent at once were looked up (401): each was counted
    only once its look-up had ended, after the others had passed the check.
    Valid requests sent at once are not refused: they wait their turn."""
    import asyncio

    import httpx

    guarded = Services.from_engine(svc.engine)
    guarded.settings = svc.settings.with_(api_auth_failures_per_minute=5)
    _, good = svc.tokens.create("p1", ["jobs:read"])
    app = create_app(guarded)

    async def burst(address: str, tokens: list[str]) -> list[int]:
        transport = httpx.ASGITransport(app=app, client=(address, 5000))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            sent = [c.get("/v1/jobs", headers=bearer(t)) for t in tokens]
            return [r.status_code for r in await asyncio.gather(*sent)]

    guesses = asyncio.run(burst("203.0.113.8", [f"hm_x_wrong{i}" for i in range(60)]))
    assert guesses.count(401) <= 6 and guesses.count(429) >= 54, sorted(guesses)
    valid = asyncio.run(burst("203.0.113.9", [good] * 40))
    assert valid == [200] * 40

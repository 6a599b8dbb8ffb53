"""What endpoints depend on: the services, the caller's principal, its scopes.

``scoped("jobs:read")`` authenticates the bearer token, applies the per-token
rate limit, and checks the scope; endpoints then filter every query by
``principal.project_id``.  The dashboard's pages take its session cookie
instead (``authenticate(request, cookie=True)``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Hashable
from typing import Annotated, Any
from urllib.parse import unquote_to_bytes

from fastapi import Depends, Path, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPBearer
from pydantic import BeforeValidator
from starlette.concurrency import run_in_threadpool

from hypermedia.api.errors import ApiError
from hypermedia.auth.tokens import Principal
from hypermedia.errors import Forbidden, IdempotencyConflict, NotFound, Unauthorized
from hypermedia.pipelines import registry
from hypermedia.services import Services

log = logging.getLogger(__name__)

# The dashboard's cookie: a session secret (Tokens.start_session), never a token.
COOKIE = "hm_session"
# Where older versions kept the token itself: cleared wherever it is seen.
LEGACY_COOKIE = "hm_token"


# Text in a query or a path with no control character (C0, DEL and C1):
# PostgreSQL refused a NUL where SQLite answered with it, raw, in a 404.
NO_CONTROLS = r"^[^\x00-\x1f\x7f-\x9f]*$"


def utf8_url(request: Request) -> None:
    """Refuses (422) a path or query whose %-escapes are not UTF-8: the
    server decodes them with U+FFFD in place of each bad byte, so
    ``?album=%FF`` listed the photos of an album named "\ufffd"."""
    for part, raw in (
        ("path", request.scope.get("raw_path")),
        ("query", request.scope.get("query_string")),
    ):
        if raw and not _utf8(raw.replace(b"+", b" ")):
            error = {
                "type": "utf8",
                "loc": (part,),
                "msg": f"the {part} is not UTF-8 once %-decoded",
            }
            raise RequestValidationError([{**error, "input": None}])


def _utf8(raw: bytes) -> bool:
    if raw.isascii() and b"%" not in raw:  # most requests: nothing to decode
        return True
    try:
        unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _digits(value: Any) -> Any:
    """Digits only: an int() reads "1_0" as 10 and " +1" or "1.0" as 1."""
    if isinstance(value, str) and not (value.isascii() and value.isdigit()):
        raise ValueError("must be a whole number, digits only")
    return value


# A database id in a path: bounded, so a huge number is a 422, not a driver overflow.
Id = Annotated[int, BeforeValidator(_digits), Path(ge=1, le=2**62)]
# A whole number in a query string, as strict as an id: "?limit=1_0" was 10.
Whole = Annotated[int, BeforeValidator(_digits)]


def services(request: Request) -> Services:
    return request.app.state.services


class RateLimiter:
    """A token bucket per key (an API token's id, a client's address), in
    this process (``rate`` 0: no limit)."""

    KEYS = 10_000  # past this many, full buckets are forgotten

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = max(1, burst)
        self._buckets: dict[Hashable, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, key: Hashable) -> float:
        """0 if allowed, else the seconds until a request would be."""
        return self._level(key, take=True)

    def wait(self, key: Hashable) -> float:
        """``take`` without taking."""
        return self._level(key, take=False)

    def level(self, key: Hashable) -> float:
        """How many ``take`` calls would be allowed now (no limit: infinity)."""
        if self.rate <= 0:
            return math.inf
        now = time.monotonic()
        with self._lock:
            level, at = self._buckets.get(key, (float(self.burst), now))
            return min(float(self.burst), level + (now - at) * self.rate)

    def _level(self, key: Hashable, *, take: bool) -> float:
        if self.rate <= 0:
            return 0.0
        now = time.monotonic()
        with self._lock:
            level, at = self._buckets.get(key, (float(self.burst), now))
            level = min(float(self.burst), level + (now - at) * self.rate)
            if level >= 1:
                if take:
                    self._buckets[key] = (level - 1, now)
                    if len(self._buckets) > self.KEYS:
                        self._forget_full(now)
                return 0.0
            self._buckets[key] = (level, now)
            return (1 - level) / self.rate

    def _forget_full(self, now: float) -> None:
        # One address per request of a wide IPv6 range grew the dict for ever.
        self._buckets = {
            k: (level, at)
            for k, (level, at) in self._buckets.items()
            if level + (now - at) * self.rate < self.burst
        }


class FailedAuth:
    """Failed authentications per client address, in this process.

    Past ``per_minute`` of them in a burst, that address's credentials are
    not even checked until its bucket refills (a 429): a loop of guesses cost
    a database read each, without limit, and nobody saw it.  The first
    refusal of an episode is logged."""

    def __init__(self, per_minute: int) -> None:
        self.bucket = RateLimiter(per_minute / 60, per_minute)
        self._told: set[str] = set()
        self._checking: dict[str, int] = {}  # look-ups in flight, per address
        # Made in the loop that serves (a test may run several, one after another).
        self._settled: tuple[asyncio.AbstractEventLoop, asyncio.Condition] | None = None

    @contextlib.asynccontextmanager
    async def guard(self, request: Request) -> AsyncIterator[None]:
        """Around one look-up of credentials: refused (429) once the
        address's failures are spent; its Unauthorized counted as one.

        Look-ups in flight hold a failure each until they end: counted only
        at their end, hundreds of guesses sent at once all passed the check
        before the first was counted.  A request beyond what is left waits
        for those in flight rather than being refused: valid ones give
        theirs back."""
        address = client_address(request)
        loop = asyncio.get_running_loop()
        if self._settled is None or self._settled[0] is not loop:
            self._settled = (loop, asyncio.Condition())
        settled = self._settled[1]
        async with settled:
            while self.bucket.level(address) - self._checking.get(address, 0) < 1:
                if wait := self.bucket.wait(address):
                    self._refuse(address, wait)
                await settled.wait()
            self._checking[address] = self._checking.get(address, 0) + 1
            self._told.discard(address)
        failed = False
        try:
            yield
        except Unauthorized:
            failed = True
            raise
        finally:
            async with settled:
                if (left := self._checking.pop(address) - 1) > 0:
                    self._checking[address] = left
                if failed:
                    self.bucket.take(address)
                settled.notify_all()

    def _refuse(self, address: str, wait: float) -> None:
        if address not in self._told:
            if len(self._told) >= RateLimiter.KEYS:  # addresses that never came back
                self._told.clear()
            self._told.add(address)
            log.warning("%s: too many failed authentications; refused for a while", address)
        seconds = math.ceil(wait)
        raise ApiError(
            429,
            f"too many failed authentications from this address; try again in {seconds} s",
            headers={"Retry-After": str(seconds)},
        )

    def failed(self, request: Request) -> None:
        """A failure found without a look-up (a login form's token too long)."""
        self.bucket.take(client_address(request))


def link_base(request: Request) -> str:
    """The prefix of the links this service signs: HYPERMEDIA_PUBLIC_URL, or
    else the address the request came to (its Host header, the client's word)."""
    return services(request).settings.public_url or str(request.base_url).rstrip("/")


def client_address(request: Request) -> str:
    # Behind a proxy, uvicorn has put the forwarded address here already
    # (from the addresses FORWARDED_ALLOW_IPS trusts).
    return request.client.host if request.client else ""


class StreamLimit:
    """Open event streams per API token, in this process (a dashboard
    session counts against its token, as for the rate limit)."""

    def __init__(self, per_token: int) -> None:
        self.per_token = per_token
        self._open: dict[int, int] = {}
        self._lock = threading.Lock()

    def open(self, key: int) -> None:
        """Count one more stream of ``key``, or raise a 429."""
        with self._lock:
            if self._open.get(key, 0) >= self.per_token:
                raise ApiError(
                    429,
                    f"this token has {self.per_token} event streams open, the most it may",
                    headers={"Retry-After": "5"},
                )
            self._open[key] = self._open.get(key, 0) + 1

    def close(self, key: int) -> None:
        with self._lock:
            left = self._open.get(key, 0) - 1
            if left > 0:
                self._open[key] = left
            else:
                self._open.pop(key, None)


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return None


def session_cookies(request: Request) -> list[str]:
    """Every ``hm_session`` value the request carries, in every Cookie
    header (a part with no ``=`` is a value with no name, not this one)."""
    values = []
    for header in request.headers.getlist("cookie"):
        for part in header.split(";"):
            name, eq, value = part.partition("=")
            if eq and name.strip() == COOKIE:
                values.append(value.strip().strip('"'))
    return values


def _session_cookie(request: Request) -> str | None:
    """The dashboard's session cookie.  Refused when sent twice: a sibling
    subdomain can set one for the parent domain beside ours (cookie
    tossing), and the server read the last, so an attacker's own session
    could stand in for the user's (a login into the attacker's account)."""
    if len(session_cookies(request)) > 1:
        raise ApiError(
            400,
            f"the request carries two {COOKIE} cookies (one may be set for a parent "
            "domain by another site): clear this site's cookies, then log in again",
        )
    return request.cookies.get(COOKIE)


async def authenticate(request: Request, *, cookie: bool = False) -> Principal:
    cached = getattr(request.state, "principal", None)
    if cached is not None:
        return cached
    svc = services(request)
    # One way in per side: the API takes a bearer token only, the dashboard
    # its session cookie only (a bearer header there ran its pages and forms
    # as the header's project, over the cookie's).
    token = None if cookie else _bearer(request)
    secret = _session_cookie(request) if cookie else None
    if not token and not secret:
        raise Unauthorized("a bearer token is required" if not cookie else "log in first")
    failures: FailedAuth = request.app.state.auth_failures
    async with failures.guard(request):
        if token:  # an API token; a session secret is refused here
            principal = await run_in_threadpool(svc.tokens.authenticate, token)
        else:  # only the dashboard's routes ask for the cookie
            principal = await run_in_threadpool(svc.tokens.authenticate_session, secret or "")
    # A session shares its token's bucket: logging in again gives no fresh one.
    wait = request.app.state.rate_limiter.take(principal.token_id)
    if wait:
        raise ApiError(
            429, "too many requests for this token", headers={"Retry-After": str(math.ceil(wait))}
        )
    request.state.principal = principal
    return principal


# For the OpenAPI document only: it names the bearer scheme and the route's
# scope on each operation (Swagger UI's Authorize button, "Try it out" sending
# the token).  auto_error=False: it never answers a request; ``authenticate``
# does every check.
BEARER = HTTPBearer(
    scheme_name="bearer",
    bearerFormat="hm_…",
    description="An API token (`hypermedia tokens create`); the dashboard's session "
    "secret is refused.",
    auto_error=False,
)


def scoped(scope: str) -> Any:
    """A dependency: the caller's principal, which must hold ``scope``."""

    # ``_documented`` is unused: FastAPI fills it from BEARER, and
    # errors.caller_refused calls this with the request alone.
    async def dependency(request: Request, _documented: Any = Depends(BEARER)) -> Principal:
        principal = await authenticate(request)
        if not principal.allows(scope):
            raise Forbidden(f"this token lacks the {scope} scope")
        return principal

    dependency.__name__ = f"scope_{scope.replace(':', '_')}"
    return Security(dependency, scopes=[scope])


def may_submit(principal: Principal, job_type: str) -> bool:
    """``debug.*`` job types inject faults and probe the children's sandbox
    (sockets, paths, stray processes): tools of the instance's operator, so
    a token needs the admin scope to submit one."""
    return principal.allows("admin") or not job_type.startswith("debug.")


def check_may_run(principal: Principal, job_type: str) -> None:
    """Forbidden unless ``principal`` may submit ``job_type``: a new job, or a
    retry, which runs an operator's debug job again as much as a new one."""
    if not may_submit(principal, job_type):
        raise Forbidden(f"{job_type} is an operator's tool: it needs a token with the admin scope")


def shown(row: dict[str, Any], principal: Principal, field: str) -> dict[str, Any]:
    """``row`` with its ``field`` (a job's params, a profile's settings) as
    ``principal`` may see it: where the server's daemons listen (a private
    setting, see pipelines/schema.py) is for admin tokens only."""
    if principal.allows("admin"):
        return row
    return {**row, field: registry.public_settings(str(row["job_type"]), row.get(field))}


def owned(row: dict[str, object], principal: Principal, what: str, ident: object) -> None:
    """Another project's row answers exactly like a missing one."""
    if row.get("project_id") != principal.project_id:
        raise NotFound(f"{what} {ident} not found")


def repeated_for(job: dict[str, object], principal: Principal) -> dict[str, object]:
    """``job``, found by a create's Idempotency-Key, as the answer to the
    repeat: to a token without ``jobs:read``, only a job it made (QA: the
    same key from a write-only token answered another token's job whole);
    another's key is "used for a different request", as a different body's."""
    if not may_change(job, principal):
        raise IdempotencyConflict("this Idempotency-Key was already used for a different request")
    return job


def may_change(job: dict[str, object], principal: Principal) -> bool:
    """Whether ``principal`` may cancel or retry its project's ``job``: a token
    without ``jobs:read`` only the jobs it made (the answer, a 409 "it is
    failed" or the job after a retry, told it which jobs exist and what they
    hold); any other is answered as a missing one."""
    return principal.allows("jobs:read") or job.get("created_by") == principal.actor

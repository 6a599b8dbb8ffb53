"""Projects and per-project API tokens: create, list, revoke, authenticate.

A token reads ``hm_<10 public chars>_<32 secret chars>``.  The public part is
stored as ``prefix`` (how a token is found, listed and recognised in a leak
scanner); the database keeps only the SHA-256 of the whole token, compared in
constant time.

A dashboard login starts a **session** (``start_session``): a random secret
``hms_<43 chars>`` of its own, stored as a SHA-256 with its token's id and an
expiry.  The cookie holds that secret, never the token.  A session borrows its
token's project and scopes at every request, so revoking or expiring the
token ends it; logging out revokes the session alone.  ``authenticate`` (the
bearer path) never reads sessions: a session secret is no API token.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from hypermedia.config import DEFAULT_PROJECT
from hypermedia.db.driver import Driver
from hypermedia.errors import InvalidRequest, NotFound, Unauthorized
from hypermedia.queue.models import check_project_id

Row = dict[str, Any]

SCOPES = ("objects:read", "objects:write", "jobs:read", "jobs:write", "admin")
_ALPHABET = "abcdefghijklmnopqrstuvwxyz234567"
# last_used_at is written at most this often per token: not one write per request.
_TOUCH_EVERY = timedelta(seconds=60)
SESSION_PREFIX = "hms_"
MAX_SESSIONS = 20  # a token's live dashboard sessions (browsers, devices) kept at most


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


@dataclass(frozen=True)
class Principal:
    """Who is calling: a token of one project with some scopes."""

    token_id: int
    project_id: str
    scopes: frozenset[str]
    # Set when the caller is a dashboard session of token ``token_id``.
    session_id: int | None = None

    def allows(self, scope: str) -> bool:
        return "admin" in self.scopes or scope in self.scopes

    @property
    def actor(self) -> str:
        return f"token:{self.token_id}"


def parse_scopes(value: str | Iterable[str]) -> list[str]:
    items = value.split(",") if isinstance(value, str) else list(value)
    scopes = sorted({s.strip() for s in items if s.strip()})
    unknown = [s for s in scopes if s not in SCOPES]
    if unknown or not scopes:
        raise InvalidRequest(f"scopes must be a non-empty subset of {', '.join(SCOPES)}")
    return scopes


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _public(row: Row) -> Row:
    """A token row as shown to people: never the hash."""
    out = {k: v for k, v in row.items() if k != "token_hash"}
    out["scopes"] = list(row["scopes"])
    return out


class Tokens:
    def __init__(self, db: Driver, *, clock: Callable[[], datetime] = utcnow) -> None:
        self.db = db
        self.clock = clock

    def ensure_project(self, project_id: str, owner_id: str = "admin", name: str = "") -> Row:
        check_project_id(project_id)

        def ensure(tx: Any) -> Row:
            row = tx.project(project_id)
            if row is None:
                tx.insert_project(
                    {
                        "project_id": project_id,
                        "name": name or project_id,
                        "owner_id": owner_id,
                        "created_at": self.clock(),
                    }
                )
                row = tx.project(project_id)
            return dict(row or {})

        return self.db.tx_retrying(ensure)  # InnoDB may deadlock racing first inserts

    def projects(self) -> list[Row]:
        with self.db.read() as tx:
            return tx.projects()

    def create(
        self,
        project_id: str,
        scopes: str | Iterable[str],
        *,
        name: str = "",
        expires_in: timedelta | None = None,
        owner_id: str = "admin",
        created_by: str | None = None,
    ) -> tuple[Row, str]:
        """A new token for ``project_id`` (created if new); returns (row, token)."""
        made = self._create(project_id, scopes, name, expires_in, owner_id, created_by)
        assert made is not None
        return made

    def _create(
        self,
        project_id: str,
        scopes: str | Iterable[str],
        name: str,
        expires_in: timedelta | None,
        owner_id: str,
        created_by: str | None,
        *,
        first: bool = False,
    ) -> tuple[Row, str] | None:
        """``create``; ``first``: only if no token exists yet (else None),
        decided under the project row's lock."""
        wanted = parse_scopes(scopes)
        if len(name) > 100 or not name.isprintable():
            # Cut to 100 without a word, and printed raw by `tokens ls`: a
            # name's escape codes reached the operator's terminal.
            raise InvalidRequest("a token name has at most 100 printable characters")
        self.ensure_project(project_id, owner_id)
        public = "".join(secrets.choice(_ALPHABET) for _ in range(10))
        token = f"hm_{public}_{secrets.token_urlsafe(24)}"
        now = self.clock()
        with self.db.tx() as tx:
            if first:
                tx.lock_project(project_id)
                if tx.count_tokens():
                    return None
            token_id = tx.insert_token(
                {
                    "project_id": project_id,
                    "name": name,
                    "prefix": f"hm_{public}",
                    "token_hash": _digest(token),
                    "scopes": wanted,
                    "created_by": created_by,
                    "created_at": now,
                    "expires_at": now + expires_in if expires_in else None,
                }
            )
            row = tx.token(token_id)
        return _public(dict(row or {})), token

    def list(self, project_id: str | None = None) -> list[Row]:
        with self.db.read() as tx:
            return [_public(r) for r in tx.tokens(project_id)]

    def revoke(self, token_id: int, project_id: str | None = None) -> Row:
        with self.db.tx() as tx:
            row = tx.token(token_id)
            if row is None or (project_id is not None and row["project_id"] != project_id):
                raise NotFound(f"token {token_id} not found")
            tx.revoke_token(token_id, self.clock())
            return _public(dict(tx.token(token_id) or {}))

    def still_valid(self, principal: Principal) -> bool:
        """Whether a principal that authenticated earlier still would (its
        token, and its session if it is one): what a long answer (an event
        stream) checks now and then."""
        now = self.clock()
        with self.db.read() as tx:
            if principal.session_id is not None:
                return _session_live(tx.session(principal.session_id), now)
            row = tx.token(principal.token_id)
        return row is not None and _live(row["revoked_at"], row["expires_at"], now)

    def authenticate(self, token: str) -> Principal:
        """The principal behind ``token``; Unauthorized for anything else."""
        parts = token.split("_", 2)
        if len(parts) != 3 or parts[0] != "hm" or len(parts[1]) != 10:
            raise Unauthorized("invalid or expired token")
        now = self.clock()
        with self.db.read() as tx:
            row = tx.token_by_prefix(f"hm_{parts[1]}")
        if (
            row is None
            or not hmac.compare_digest(row["token_hash"], _digest(token))
            or not _live(row["revoked_at"], row["expires_at"], now)
        ):
            raise Unauthorized("invalid or expired token")
        if row["last_used_at"] is None or now - row["last_used_at"] > _TOUCH_EVERY:
            with self.db.tx() as tx:
                tx.touch_token(row["token_id"], now)
        return Principal(row["token_id"], row["project_id"], frozenset(row["scopes"]))

    # -- dashboard sessions ---------------------------------------------------------

    def start_session(
        self, token: str, hours: float, admit: Callable[[Principal], None] | None = None
    ) -> str:
        """A new dashboard session of ``token`` (checked as ``authenticate``
        does, then by ``admit``, which raises to refuse: the token's rate
        limit), valid ``hours`` at most; returns its secret, shown once.  A
        token keeps its MAX_SESSIONS newest sessions: a script logging in
        in a loop made one 12-hour row per request."""
        principal = self.authenticate(token)
        if admit is not None:
            admit(principal)
        secret = SESSION_PREFIX + secrets.token_urlsafe(32)
        now = self.clock()
        with self.db.tx() as tx:
            tx.delete_expired_sessions(now)  # the table's only upkeep: a cheap delete
            tx.insert_session(
                {
                    "token_id": principal.token_id,
                    "secret_hash": _digest(secret),
                    "created_at": now,
                    "expires_at": now + timedelta(hours=hours),
                }
            )
            tx.trim_sessions(principal.token_id, MAX_SESSIONS)
        return secret

    def authenticate_session(self, secret: str) -> Principal:
        """The principal behind a session secret (the dashboard's cookie):
        its token's project and scopes; Unauthorized for anything else."""
        if not secret.startswith(SESSION_PREFIX) or len(secret) > 100:
            raise Unauthorized("invalid or expired session")
        digest = _digest(secret)
        with self.db.read() as tx:
            row = tx.session_by_hash(digest)
        if (
            row is None
            or not hmac.compare_digest(row["secret_hash"], digest)
            or not _session_live(row, self.clock())
        ):
            raise Unauthorized("invalid or expired session")
        return Principal(
            row["token_id"],
            row["project_id"],
            frozenset(row["scopes"]),
            session_id=row["session_id"],
        )

    def end_session(self, secret: str) -> None:
        """Log out: the session's secret stops working at once, everywhere."""
        if secret.startswith(SESSION_PREFIX) and len(secret) <= 100:
            with self.db.tx() as tx:
                tx.revoke_session(_digest(secret), self.clock())

    def first_admin(self, home: Path) -> str | None:
        """On a database without tokens: make an admin token of the default
        project, write it to ``home/admin-token`` (mode 0600) and return it."""
        with self.db.read() as tx:
            if tx.count_tokens():
                return None
        # Again under a lock: replicas started at once on a new database each
        # made one, printed once, in another machine's home.
        name = "first admin token"
        made = self._create(DEFAULT_PROJECT, ["admin"], name, None, "admin", None, first=True)
        if made is None:
            return None
        token = made[1]
        path = home / "admin-token"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        os.chmod(path, 0o600)  # an older file may have had wider permissions
        return token


def _live(revoked_at: datetime | None, expires_at: datetime | None, now: datetime) -> bool:
    return revoked_at is None and (expires_at is None or expires_at > now)


def _session_live(row: Row | None, now: datetime) -> bool:
    """A session holds while neither it nor its token is revoked or expired."""
    return (
        row is not None
        and _live(row["revoked_at"], row["expires_at"], now)
        and _live(row["token_revoked_at"], row["token_expires_at"], now)
    )

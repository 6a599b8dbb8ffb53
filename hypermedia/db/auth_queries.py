"""Queries over projects, API tokens and dashboard sessions (mixed into ``Tx``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa

from hypermedia.db.schema_auth import api_tokens as T
from hypermedia.db.schema_auth import dashboard_sessions as DS
from hypermedia.db.schema_auth import projects as PR

Row = dict[str, Any]

# A session with what it borrows from its token: project, scopes and whether
# the token itself still holds (revoked, expired).
_SESSION = sa.select(
    DS,
    T.c.project_id,
    T.c.scopes,
    T.c.revoked_at.label("token_revoked_at"),
    T.c.expires_at.label("token_expires_at"),
).join(T, T.c.token_id == DS.c.token_id)


class AuthQueries:
    conn: sa.Connection

    def project(self, project_id: str) -> Row | None:
        row = self.conn.execute(sa.select(PR).where(PR.c.project_id == project_id)).first()
        return dict(row._mapping) if row else None

    def projects(self) -> list[Row]:
        return [dict(r._mapping) for r in self.conn.execute(sa.select(PR).order_by(PR.c.name))]

    def insert_project(self, values: Row) -> None:
        """Insert the project unless a concurrent transaction just did: the
        first tokens of a new project, made at once, raced to create it."""
        try:
            with self.conn.begin_nested():
                self.conn.execute(PR.insert().values(**values))
        except sa.exc.IntegrityError:
            if self.project(values["project_id"]) is None:
                raise  # another constraint: not the race

    def lock_project(self, project_id: str) -> None:
        """Hold the project row's lock until the transaction ends (SQLite:
        nothing to take; its writers take turns anyway)."""
        q = sa.select(PR.c.project_id).where(PR.c.project_id == project_id).with_for_update()
        self.conn.execute(q).first()

    def insert_token(self, values: Row) -> int:
        key = self.conn.execute(T.insert().values(**values)).inserted_primary_key
        assert key is not None
        return int(key[0])

    def token(self, token_id: int) -> Row | None:
        row = self.conn.execute(sa.select(T).where(T.c.token_id == token_id)).first()
        return dict(row._mapping) if row else None

    def token_by_prefix(self, prefix: str) -> Row | None:
        row = self.conn.execute(sa.select(T).where(T.c.prefix == prefix)).first()
        return dict(row._mapping) if row else None

    def tokens(self, project_id: str | None = None) -> list[Row]:
        q = sa.select(T).order_by(T.c.token_id)
        if project_id is not None:
            q = q.where(T.c.project_id == project_id)
        return [dict(r._mapping) for r in self.conn.execute(q)]

    def count_tokens(self) -> int:
        return int(self.conn.execute(sa.select(sa.func.count()).select_from(T)).scalar_one())

    def revoke_token(self, token_id: int, now: datetime) -> bool:
        q = T.update().where(T.c.token_id == token_id, T.c.revoked_at.is_(None))
        return self.conn.execute(q.values(revoked_at=now)).rowcount == 1

    def touch_token(self, token_id: int, now: datetime) -> None:
        self.conn.execute(T.update().where(T.c.token_id == token_id).values(last_used_at=now))

    def insert_session(self, values: Row) -> int:
        key = self.conn.execute(DS.insert().values(**values)).inserted_primary_key
        assert key is not None
        return int(key[0])

    def session_by_hash(self, secret_hash: str) -> Row | None:
        row = self.conn.execute(_SESSION.where(DS.c.secret_hash == secret_hash)).first()
        return dict(row._mapping) if row else None

    def session(self, session_id: int) -> Row | None:
        row = self.conn.execute(_SESSION.where(DS.c.session_id == session_id)).first()
        return dict(row._mapping) if row else None

    def revoke_session(self, secret_hash: str, now: datetime) -> bool:
        q = DS.update().where(DS.c.secret_hash == secret_hash, DS.c.revoked_at.is_(None))
        return self.conn.execute(q.values(revoked_at=now)).rowcount == 1

    def trim_sessions(self, token_id: int, keep: int) -> int:
        """Delete the token's sessions but its ``keep`` newest; how many went.
        Two statements: MariaDB has no LIMIT in an IN subquery."""
        cut = (
            sa.select(DS.c.session_id)
            .where(DS.c.token_id == token_id)
            .order_by(DS.c.session_id.desc())
            .limit(1)
            .offset(keep - 1)
        )
        oldest_kept = self.conn.execute(cut).scalar()
        if oldest_kept is None:
            return 0
        gone = DS.delete().where(DS.c.token_id == token_id, DS.c.session_id < oldest_kept)
        return int(self.conn.execute(gone).rowcount)

    def delete_expired_sessions(self, now: datetime) -> int:
        return int(self.conn.execute(DS.delete().where(DS.c.expires_at <= now)).rowcount)

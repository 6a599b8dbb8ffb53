"""Queries of the photo domain (seed 002): photos, their object bindings,
variant_jobs and compatibility bridge hits.  Mixed into ``Tx``.

Binding an object follows GC's locking protocol (``hypermedia.storage.gc``):
the object row is locked and must be ``ready``, so a binding either commits
before GC locks the row (and GC's re-check sees it) or finds it ``deleting``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from hypermedia.db.schema import job_outputs as O
from hypermedia.db.schema import processing_jobs as J
from hypermedia.db.schema_storage import bridge_hits as BH
from hypermedia.db.schema_storage import objects as OB
from hypermedia.db.schema_storage import photo_objects as PO
from hypermedia.db.schema_storage import photos as PH
from hypermedia.db.schema_storage import variant_jobs as VJ
from hypermedia.errors import Conflict

Row = dict[str, Any]

MAX_ATTEMPTS = 2**31 - 1  # variant_jobs.attempts is a 4-byte INTEGER on every database

# The roles a photo's variants are bound to (photos/service.py: VARIANTS maps
# each to the job type that makes it).  Here because the engine asks too
# (``jobs_of_deleted_photos``), and it cannot import the photo service.
VARIANT_ROLES = ("thumb", "preview")


def variant_key(photo_id: str, role: str) -> str:
    """The idempotency key of a photo's variant job; ``add`` and the bridge share it."""
    return f"photo:{photo_id}:{role}"


def photo_of_variant_key(key: str | None) -> str | None:
    """The photo whose variant job has idempotency key ``key``, if it is one."""
    kind, _, rest = (key or "").partition(":")
    photo_id, _, role = rest.rpartition(":")
    return photo_id if kind == "photo" and photo_id and role in VARIANT_ROLES else None


def _rows(result: sa.CursorResult[Any]) -> list[Row]:
    return [dict(r._mapping) for r in result]


def _padded(text: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    """SQLite: a timestamp's text with six fractional digits ('… 18:06:11' →
    '… 18:06:11.000000', '… 18:06:11.5' → '… 18:06:11.500000')."""
    return sa.case(
        (sa.func.length(text) == 19, text + ".000000"),
        else_=sa.func.substr(text + "000000", 1, 26),
    )


class PhotoQueries:
    conn: sa.Connection
    dialect: str

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """Statements that may fail without spoiling the transaction around them.

        On PostgreSQL a failed statement aborts the whole transaction; rolling
        back to a savepoint keeps what was written before it.
        """
        with self.conn.begin_nested():
            yield

    # -- photos --------------------------------------------------------------

    def insert_photo(self, values: Row) -> None:
        self.conn.execute(sa.insert(PH).values(values))

    def photo(self, photo_id: str, *, lock: bool = False) -> Row | None:
        q = sa.select(PH).where(PH.c.photo_id == photo_id)
        if lock and self.dialect != "sqlite":  # SQLite: the write lock is held already
            q = q.with_for_update()
        row = self.conn.execute(q).first()
        return dict(row._mapping) if row else None

    def photos_by_ids(self, photo_ids: Sequence[str]) -> dict[str, Row]:
        if not photo_ids:
            return {}
        q = sa.select(PH).where(PH.c.photo_id.in_(sorted(set(photo_ids))))
        return {r.photo_id: dict(r._mapping) for r in self.conn.execute(q)}

    def photos(
        self,
        project_ids: Sequence[str],
        *,
        album: str | None = None,
        before: tuple[datetime, str] | None = None,
        limit: int = 50,
    ) -> list[Row]:
        """Newest first; ``before`` is the (created_at, photo_id) of the last row seen.

        ``project_ids``: the project's own id and, for the default project, ``""``
        (the rows legacy producers write carry no project)."""
        q = sa.select(PH).where(PH.c.project_id.in_(list(project_ids)))
        if album is not None:
            q = q.where(PH.c.album == album)
        created = self._created_at()
        if before is not None:
            at, pid = before
            at_value: Any = at
            if self.dialect == "sqlite":  # as SQLAlchemy stores it: six digits always
                at_value = at.replace(tzinfo=None).isoformat(" ", "microseconds")
            q = q.where(
                sa.or_(created < at_value, sa.and_(created == at_value, PH.c.photo_id < pid))
            )
        q = q.order_by(created.desc(), PH.c.photo_id.desc()).limit(limit)
        return _rows(self.conn.execute(q))

    def _created_at(self) -> sa.ColumnElement[Any]:
        """``photos.created_at`` as pages order and compare it.

        SQLite keeps timestamps as text: ours always have six fractional digits,
        but a legacy producer's row takes the column's default,
        ``CURRENT_TIMESTAMP``, which has none ('2026-12-03 18:06:11').  Compared
        as text that row sorts before '2026-12-03 18:06:11.000000', so a page
        ending on it would start the next page with it again, forever.  Both
        sides are padded to six digits first.
        """
        if self.dialect == "sqlite":
            return _padded(sa.type_coerce(PH.c.created_at, sa.String))
        return PH.c.created_at

    def update_photo(self, photo_id: str, values: Row) -> bool:
        q = sa.update(PH).where(PH.c.photo_id == photo_id).values(values)
        return self.conn.execute(q).rowcount == 1

    def delete_photo(self, photo_id: str) -> bool:
        """The photo, its bindings and its variant row (the foreign keys would
        cascade; explicit deletes say what goes and do not depend on them)."""
        self.conn.execute(sa.delete(PO).where(PO.c.photo_id == photo_id))
        self.conn.execute(sa.delete(VJ).where(VJ.c.photo_id == photo_id))
        return self.conn.execute(sa.delete(PH).where(PH.c.photo_id == photo_id)).rowcount == 1

    # -- bindings ------------------------------------------------------------

    def bind(self, photo_id: str, object_id: int, role: str) -> None:
        """Bind ``object_id`` to the photo as ``role``, replacing that role's binding.

        Locks the object row and refuses one that is not ``ready`` (see the
        module docstring): an object GC has marked is never bound again.
        """
        q = sa.select(OB.c.state).where(OB.c.object_id == object_id)
        if self.dialect != "sqlite":
            q = q.with_for_update()
        state = self.conn.execute(q).scalar()
        if state is None:
            raise Conflict(f"object {object_id} no longer exists")
        if state != "ready":
            raise Conflict(f"object {object_id} is {state}, not ready")
        self.conn.execute(sa.delete(PO).where(PO.c.photo_id == photo_id, PO.c.role == role))
        self.conn.execute(sa.insert(PO).values(photo_id=photo_id, object_id=object_id, role=role))

    def unbind(self, photo_id: str, role: str) -> bool:
        q = sa.delete(PO).where(PO.c.photo_id == photo_id, PO.c.role == role)
        return self.conn.execute(q).rowcount == 1

    def bindings_of(self, photo_ids: Sequence[str]) -> list[Row]:
        """Bindings of these photos with the facts of their objects."""
        if not photo_ids:
            return []
        q = (
            sa.select(
                PO.c.photo_id,
                PO.c.role,
                PO.c.object_id,
                OB.c.size,
                OB.c.mime_type,
                OB.c.width,
                OB.c.height,
                OB.c.filename,
                OB.c.state,
            )
            .join(OB, OB.c.object_id == PO.c.object_id)
            .where(PO.c.photo_id.in_(list(photo_ids)))
            .order_by(PO.c.photo_id, PO.c.role)
        )
        return _rows(self.conn.execute(q))

    def photos_bound_to(self, object_id: int, role: str) -> list[str]:
        """Photos that share this object in this role (copies of one another)."""
        q = (
            sa.select(PO.c.photo_id)
            .where(PO.c.object_id == object_id, PO.c.role == role)
            .order_by(PO.c.photo_id)
        )
        return [r[0] for r in self.conn.execute(q)]

    def copies_lacking(self, original: int, role: str, photo_id: str) -> list[str]:
        """Photos other than ``photo_id`` sharing its original that wait for no
        variants of their own and have no ``role`` yet: the copies a new
        variant is shared with.  One query: 2,000 legacy photos of one
        original, each read in turn at every binding, bound 6 photos a minute."""
        own = sa.select(VJ.c.photo_id).where(VJ.c.photo_id == PO.c.photo_id)
        other = PO.alias("other")
        has = sa.select(other.c.photo_id).where(
            other.c.photo_id == PO.c.photo_id, other.c.role == role
        )
        q = (
            sa.select(PO.c.photo_id)
            .where(
                PO.c.object_id == original,
                PO.c.role == "original",
                PO.c.photo_id != photo_id,
                ~own.exists(),
                ~has.exists(),
            )
            .order_by(PO.c.photo_id)
        )
        return [r[0] for r in self.conn.execute(q)]

    # -- variant_jobs --------------------------------------------------------

    def insert_variant_job(self, photo_id: str, now: datetime, *, native: bool = False) -> None:
        """A photo's variants to make (``native``: our own photo's, not a legacy producer's)."""
        self.conn.execute(
            sa.insert(VJ).values(
                photo_id=photo_id,
                attempts=0,
                next_attempt_at=now,
                last_error="",
                created_at=now,
                native=native,
            )
        )

    def variant_job(self, photo_id: str) -> Row | None:
        row = self.conn.execute(sa.select(VJ).where(VJ.c.photo_id == photo_id)).first()
        return dict(row._mapping) if row else None

    # The two listings below name rows by photo id only: a legacy producer's
    # row may hold a value no driver reads as its type (PostgreSQL's
    # '-infinity', a SQLite timestamp written as a number or "yesterday"),
    # and one such row in a batch stopped every adoption, or every binding.

    def due_variant_jobs(
        self, now: datetime, limit: int, *, exclude: Sequence[str] = ()
    ) -> list[str]:
        """Lock rows no engine job was made for yet, skipping rows others hold."""
        q = sa.select(VJ.c.photo_id).where(VJ.c.adopted_at.is_(None), VJ.c.next_attempt_at <= now)
        if exclude:
            q = q.where(VJ.c.photo_id.not_in(list(exclude)))
        q = q.order_by(VJ.c.next_attempt_at, VJ.c.photo_id).limit(limit)
        if self.dialect != "sqlite":
            q = q.with_for_update(skip_locked=True)
        return [r[0] for r in self.conn.execute(q)]

    def adopted_variant_jobs(self, after: str, limit: int) -> list[str]:
        """Rows whose engine jobs exist, by photo id (``after``: the last one seen)."""
        q = (
            sa.select(VJ.c.photo_id)
            .where(VJ.c.adopted_at.is_not(None), VJ.c.photo_id > after)
            .order_by(VJ.c.photo_id)
            .limit(limit)
        )
        return [r[0] for r in self.conn.execute(q)]

    def variant_jobs_of(self, photo_ids: Sequence[str]) -> list[Row]:
        if not photo_ids:
            return []
        q = sa.select(VJ).where(VJ.c.photo_id.in_(list(photo_ids))).order_by(VJ.c.photo_id)
        return _rows(self.conn.execute(q))

    def mark_variant_adopted(self, photo_id: str, now: datetime) -> bool:
        q = (
            sa.update(VJ)
            .where(VJ.c.photo_id == photo_id, VJ.c.adopted_at.is_(None))
            .values(adopted_at=now, last_error="")
        )
        return self.conn.execute(q).rowcount == 1

    def unadopt_variant_job(self, photo_id: str, why: str) -> None:
        """Give a row back to the bridge: it says adopted, but no engine job exists."""
        q = sa.update(VJ).where(VJ.c.photo_id == photo_id).values(adopted_at=None, last_error=why)
        self.conn.execute(q)

    def variant_failed(self, photo_id: str, error: str, next_attempt_at: datetime) -> None:
        """One more failed try: attempts + 1, the (already redacted) error, a later retry."""
        q = (
            sa.update(VJ)
            .where(VJ.c.photo_id == photo_id)
            .values(
                # A legacy row may already hold the column's largest value:
                # one more overflowed, and the row was never pushed back.
                attempts=sa.case(
                    (VJ.c.attempts >= MAX_ATTEMPTS, VJ.c.attempts), else_=VJ.c.attempts + 1
                ),
                last_error=error,
                next_attempt_at=next_attempt_at,
            )
        )
        self.conn.execute(q)

    def note_variant_error(self, photo_id: str, attempts: int, error: str) -> None:
        """What the engine said about a failed variant job (attempts as the job counts them)."""
        q = (
            sa.update(VJ)
            .where(VJ.c.photo_id == photo_id)
            .values(attempts=attempts, last_error=error)
        )
        self.conn.execute(q)

    def delete_variant_job(self, photo_id: str) -> bool:
        return self.conn.execute(sa.delete(VJ).where(VJ.c.photo_id == photo_id)).rowcount == 1

    # -- job outputs seen from the photo side ---------------------------------

    def output_object(self, job_id: int) -> int | None:
        """The newest output object of a job (a re-extract may have added one)."""
        q = (
            sa.select(O.c.object_id)
            .where(O.c.job_id == job_id, O.c.object_id.is_not(None), O.c.deleted_at.is_(None))
            .order_by(O.c.output_id.desc())
            .limit(1)
        )
        value = self.conn.execute(q).scalar()
        return None if value is None else int(value)

    def output_objects(self, job_ids: Sequence[int]) -> dict[int, int]:
        """``output_object`` for many jobs at once: job id -> object id."""
        if not job_ids:
            return {}
        q = (
            sa.select(O.c.job_id, O.c.object_id)
            .where(
                O.c.job_id.in_(sorted(set(job_ids))),
                O.c.object_id.is_not(None),
                O.c.deleted_at.is_(None),
            )
            .order_by(O.c.output_id)
        )
        return {int(r.job_id): int(r.object_id) for r in self.conn.execute(q)}  # newest wins

    def retire_outputs(self, job_ids: Sequence[int], now: datetime) -> int:
        """Outputs of a deleted photo's variant jobs stop pinning their objects;
        a copy still bound to one keeps it through its binding."""
        if not job_ids:
            return 0
        q = (
            sa.update(O)
            .where(O.c.job_id.in_(list(job_ids)), O.c.deleted_at.is_(None))
            .values(deleted_at=now)
        )
        return int(self.conn.execute(q).rowcount)

    def release_variant_keys(self, job_ids: Sequence[int]) -> None:
        """Variant jobs superseded by a new original give their keys up to the
        jobs that replace them (a key names one job: the photo's current one)."""
        if job_ids:
            q = sa.update(J).where(J.c.job_id.in_(list(job_ids))).values(idempotency_key=None)
            self.conn.execute(q)

    def jobs_of_deleted_photos(self, job_ids: Sequence[int]) -> list[int]:
        """Those of ``job_ids`` that are variant jobs of a photo that no longer exists."""
        if not job_ids:
            return []
        q = sa.select(J.c.job_id, J.c.idempotency_key).where(J.c.job_id.in_(list(job_ids)))
        photo_of = {
            job_id: photo
            for job_id, key in self.conn.execute(q)
            if (photo := photo_of_variant_key(key)) is not None
        }
        if not photo_of:
            return []
        q = sa.select(PH.c.photo_id).where(PH.c.photo_id.in_(sorted(set(photo_of.values()))))
        alive = {r[0] for r in self.conn.execute(q)}
        return sorted(j for j, p in photo_of.items() if p not in alive)

    # -- compatibility bridge hits (seed 004) ---------------------------------

    def insert_bridge_hit(self, values: Row) -> int:
        res = self.conn.execute(sa.insert(BH).values(values))
        return int(res.inserted_primary_key[0])  # type: ignore[index]

    def bridge_hits(
        self, *, legacy_surface: str | None = None, job_id: int | None = None, limit: int = 100
    ) -> list[Row]:
        q = sa.select(BH)
        if legacy_surface is not None:
            q = q.where(BH.c.legacy_surface == legacy_surface)
        if job_id is not None:
            q = q.where(BH.c.job_id == job_id)
        q = q.order_by(BH.c.bridge_id.desc()).limit(limit)
        return _rows(self.conn.execute(q))

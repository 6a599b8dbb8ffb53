"""Queries about pools and the objects ledger (seed 002), mixed into ``Tx``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from hypermedia.db import fast
from hypermedia.db.bulk import update_many
from hypermedia.db.schema import job_outputs as O
from hypermedia.db.schema import processing_jobs as J
from hypermedia.db.schema_storage import object_hashes as OH
from hypermedia.db.schema_storage import objects as OB
from hypermedia.db.schema_storage import photo_objects as PO
from hypermedia.db.schema_storage import pools as PL
from hypermedia.errors import Conflict
from hypermedia.queue.states import STATUSES, TERMINAL

Row = dict[str, Any]
# Jobs that may still read their input object: every status but the terminal ones.
LIVE_JOB_STATUSES = tuple(s for s in STATUSES if s not in TERMINAL)


class StorageQueries:
    conn: sa.Connection
    dialect: str

    # -- pools ---------------------------------------------------------------

    def pool(
        self, *, name: str | None = None, pool_id: int | None = None, lock: bool = False
    ) -> Row | None:
        q = sa.select(PL)
        q = q.where(PL.c.name == name) if name is not None else q.where(PL.c.pool_id == pool_id)
        if lock and self.dialect != "sqlite":  # SQLite: the write lock is held already
            q = q.with_for_update()
        row = self.conn.execute(q).first()
        return dict(row._mapping) if row else None

    def pool_users(self, pool_id: int) -> tuple[dict[str, int], int]:
        """What refers to a pool: its objects by state (any state: a ``deleting``
        row still needs the pool to delete its blob), and unfinished jobs.

        Not the rows a worker reserved for outputs (storage/reserve.py): no
        blob, nothing refers to them, nobody sees them, and a running worker
        keeps its unused ones until it stops.  ``delete_reservations`` drops
        them with the pool."""
        q = (
            sa.select(OB.c.state, sa.func.count())
            .where(OB.c.pool_id == pool_id, ~_reserved())
            .group_by(OB.c.state)
        )
        objects = {str(state): int(n) for state, n in self.conn.execute(q)}
        jobs = sa.select(sa.func.count()).where(
            J.c.pool_id == pool_id, J.c.status.in_(LIVE_JOB_STATUSES)
        )
        return objects, int(self.conn.execute(jobs).scalar_one())

    def delete_reservations(self, pool_id: int) -> int:
        """The pool's reserved output rows (see ``pool_users``).  A worker that
        takes one of them later has its completion refused as swept, and retried
        (``Engine._lost_outputs``); reserving more in the pool fails on the
        foreign key (``STORAGE_UNAVAILABLE``, retried too)."""
        q = sa.delete(OB).where(OB.c.pool_id == pool_id, _reserved())
        return int(self.conn.execute(q).rowcount)

    def delete_pool(self, pool_id: int) -> None:
        self.conn.execute(sa.delete(PL).where(PL.c.pool_id == pool_id))

    def set_pool_url(self, pool_id: int, url: str) -> None:
        self.conn.execute(sa.update(PL).where(PL.c.pool_id == pool_id).values(backend_url=url))

    def pools(self) -> list[Row]:
        return [dict(r._mapping) for r in self.conn.execute(sa.select(PL).order_by(PL.c.pool_id))]

    def insert_pool(self, values: Row) -> int:
        try:
            res = self.conn.execute(sa.insert(PL).values(values))
        except sa.exc.IntegrityError as exc:
            raise Conflict("a pool with this name exists") from exc
        return int(res.inserted_primary_key[0])  # type: ignore[index]

    # -- objects -------------------------------------------------------------

    def insert_object(self, values: Row) -> int:
        if self.dialect == "sqlite":  # prepared: see db/fast.py
            return int(fast.insert_many(self.conn, OB, [values]) or 0)
        res = self.conn.execute(sa.insert(OB).values(values))
        return int(res.inserted_primary_key[0])  # type: ignore[index]

    def insert_objects(self, rows: Sequence[Row]) -> dict[str, int]:
        """Insert many objects (executemany); return object_id by storage_key."""
        if not rows:
            return {}
        self.conn.execute(sa.insert(OB), list(rows))
        keys = [r["storage_key"] for r in rows]
        found: dict[str, int] = {}
        for i in range(0, len(keys), 500):
            q = sa.select(OB.c.storage_key, OB.c.object_id).where(
                OB.c.storage_key.in_(keys[i : i + 500])
            )
            found.update({k: v for k, v in self.conn.execute(q)})
        return found

    def update_objects_many(self, from_state: str, rows: Sequence[Row]) -> int:
        """Executemany of guarded updates; each row has ``_id`` and the same columns."""
        return update_many(self.conn, OB.c.object_id, OB.c.state == from_state, rows)

    def object(self, object_id: int, *, lock: bool = False) -> Row | None:
        if self.dialect == "sqlite":  # the write lock is held already; see db/fast.py
            prepared = fast.prepare(
                self.conn,
                ("object",),
                lambda: sa.select(OB).where(OB.c.object_id == sa.bindparam("id")),
            )
            found = fast.rows(self.conn, prepared, {"id": object_id})
            return found[0] if found else None
        q = sa.select(OB).where(OB.c.object_id == object_id)
        if lock and self.dialect != "sqlite":  # SQLite: the write lock is held already
            q = q.with_for_update()
        row = self.conn.execute(q).first()
        return dict(row._mapping) if row else None

    def shown_object(self, object_id: int) -> Row | None:
        """The object as users see it (``objects show``, ``GET /v1/objects/{id}``):
        ``ready`` only.  A ``pending`` row is an upload or an output still on
        its way (or a reservation), a ``deleting`` one is GC's to remove (a
        refused or failed upload, an object nothing uses): no object to show."""
        q = sa.select(OB).where(OB.c.object_id == object_id, OB.c.state == "ready")
        row = self.conn.execute(q).first()
        return dict(row._mapping) if row else None

    def object_states(self, ids: Sequence[int], *, lock: bool = False) -> dict[int, str]:
        """The state of each of ``ids`` that has a row; with ``lock``, the rows
        locked (a completing job's outputs: GC's mark skips locked rows)."""
        if self.dialect == "sqlite":  # the write lock is held already; see db/fast.py
            prepared = fast.prepare(
                self.conn,
                ("object_states", len(ids)),
                lambda: sa.select(OB.c.object_id, OB.c.state).where(
                    sa.or_(*(OB.c.object_id == p for p in fast.id_params(ids)))
                ),
            )
            found = fast.rows(self.conn, prepared, fast.id_values(ids))
            return {r["object_id"]: r["state"] for r in found}
        q = sa.select(OB.c.object_id, OB.c.state).where(OB.c.object_id.in_(list(ids)))
        if lock:
            q = q.with_for_update()
        return {i: str(st) for i, st in self.conn.execute(q)}

    def taken_keys(self, keys: Sequence[str]) -> set[str]:
        """Those of ``keys`` a row has, in any pool and state (the key is unique)."""
        if not keys:
            return set()
        q = sa.select(OB.c.storage_key).where(OB.c.storage_key.in_(list(keys)))
        return {str(k) for (k,) in self.conn.execute(q)}

    def record_orphan(self, pool_id: int, key: str, project_id: str, now: datetime) -> bool:
        """A ``deleting`` row for a blob no row leads to (an output whose reserved
        row GC swept while it was stored), so that GC deletes it; False when a
        row has that key already (it governs the blob)."""
        taken = sa.select(OB.c.object_id).where(OB.c.storage_key == key)
        if self.conn.execute(taken).first() is not None:
            return False
        row = {
            "pool_id": pool_id,
            "storage_key": key,
            "project_id": project_id,
            "state": "deleting",
            "created_at": now,
            "updated_at": now,
        }
        # A row given the key meanwhile (two `gc orphans` at once) governs it.
        if self.dialect == "postgresql":  # an error there would end the transaction
            q = postgresql.insert(OB).values(row).on_conflict_do_nothing()
            return self.conn.execute(q.returning(OB.c.object_id)).first() is not None
        try:  # MariaDB refuses the statement alone; SQLite's writers take turns anyway
            self.conn.execute(sa.insert(OB).values(row))
        except sa.exc.IntegrityError:
            return False
        return True

    def ready_inputs(self, ids: Sequence[int]) -> dict[int, Row]:
        """pool_id, storage_key and checksum of those of ``ids`` that are ready."""
        cols = (OB.c.object_id, OB.c.pool_id, OB.c.storage_key, OB.c.checksum)
        if self.dialect == "sqlite":  # prepared: see db/fast.py
            prepared = fast.prepare(
                self.conn,
                ("ready_inputs", len(ids)),
                lambda: sa.select(*cols).where(
                    sa.or_(*(OB.c.object_id == p for p in fast.id_params(ids))),
                    fast.unindexed(OB.c.state) == "ready",
                ),
            )
            found = fast.rows(self.conn, prepared, fast.id_values(ids))
        else:
            q = sa.select(*cols).where(OB.c.object_id.in_(list(ids)), OB.c.state == "ready")
            found = [dict(r._mapping) for r in self.conn.execute(q)]
        return {r["object_id"]: r for r in found}

    def objects_where(self, ids: Sequence[int], *, lock: bool = False) -> list[Row]:
        if not ids:
            return []
        q = sa.select(OB).where(OB.c.object_id.in_(list(ids)))
        if lock and self.dialect != "sqlite":
            q = q.with_for_update()
        return [dict(r._mapping) for r in self.conn.execute(q)]

    def objects(
        self,
        *,
        state: str | None = None,
        before_id: int | None = None,
        limit: int = 50,
        project_id: str | None = None,
        reserved: bool = False,
    ) -> list[Row]:
        """Objects, newest first.  Without ``reserved``, as users see them
        (``objects ls``, ``GET /v1/objects``): ``ready`` ones, as
        ``shown_object``, unless ``state`` asks for uploads on their way or
        rows GC is to delete (what an operator looks for), but never the
        rows workers reserved for outputs (storage/reserve.py); with
        ``reserved``, every row of the ledger."""
        q = sa.select(OB)
        if not reserved:
            q = q.where(~_reserved()) if state is not None else q.where(OB.c.state == "ready")
        if project_id is not None:
            q = q.where(OB.c.project_id == project_id)
        if state is not None:
            q = q.where(OB.c.state == state)
        if before_id is not None:
            q = q.where(OB.c.object_id < before_id)
        q = q.order_by(OB.c.object_id.desc()).limit(limit)
        return [dict(r._mapping) for r in self.conn.execute(q)]

    def ready_objects_after(
        self, after_id: int, limit: int, pool_id: int | None = None
    ) -> list[Row]:
        """Ready objects with ids above ``after_id``, oldest first (a scrub's page)."""
        q = sa.select(OB).where(OB.c.state == "ready", OB.c.object_id > after_id)
        if pool_id is not None:
            q = q.where(OB.c.pool_id == pool_id)
        q = q.order_by(OB.c.object_id).limit(limit)
        return [dict(r._mapping) for r in self.conn.execute(q)]

    def update_object(self, object_id: int, from_states: Sequence[str], values: Row) -> bool:
        """Guarded state change; False when the object was not in one of ``from_states``."""
        if self.dialect == "sqlite":  # prepared: see db/fast.py
            states, cols = tuple(from_states), tuple(values)
            prepared = fast.prepare(
                self.conn,
                ("update_object", states, cols),
                lambda: (
                    sa.update(OB)
                    .where(
                        OB.c.object_id == sa.bindparam("id"),
                        sa.or_(*(OB.c.state == st for st in states)),
                    )
                    .values({c: sa.bindparam(f"v_{c}") for c in cols})
                ),
            )
            params = {"id": object_id, **{f"v_{c}": v for c, v in values.items()}}
            return fast.execute(self.conn, prepared, params)[0] == 1
        q = (
            sa.update(OB)
            .where(OB.c.object_id == object_id, OB.c.state.in_(list(from_states)))
            .values(values)
        )
        return self.conn.execute(q).rowcount == 1

    def promote_objects(self, rows: Sequence[Row], now: datetime) -> int:
        """pending → ready for a completing job's outputs.  Rows with a checksum
        also write what the upload left for now: the object's size and checksum,
        and (its row being a reserved one, storage/reserve.py) its key, media
        type and dimensions."""
        if not rows:
            return 0
        done = 0
        plain = [r["object_id"] for r in rows if not r.get("checksum")]
        if plain:
            q = sa.update(OB).where(OB.c.object_id.in_(plain), OB.c.state == "pending")
            done += int(self.conn.execute(q.values(state="ready", updated_at=now)).rowcount)
        valued = [
            {
                "_id": r["object_id"],
                "_size": r["size"],
                "_checksum": r["checksum"],
                "_key": r["storage_key"],
                "_filename": r.get("filename", ""),
                "_mime": r["mime_type"],
                "_width": r.get("width"),
                "_height": r.get("height"),
                "_now": now,
            }
            for r in rows
            if r.get("checksum")
        ]
        if valued:

            def build() -> Any:
                return (
                    sa.update(OB)
                    .where(OB.c.object_id == sa.bindparam("_id"), OB.c.state == "pending")
                    .values(
                        state="ready",
                        size=sa.bindparam("_size"),
                        checksum=sa.bindparam("_checksum"),
                        storage_key=sa.bindparam("_key"),
                        filename=sa.bindparam("_filename"),
                        mime_type=sa.bindparam("_mime"),
                        width=sa.bindparam("_width"),
                        height=sa.bindparam("_height"),
                        updated_at=sa.bindparam("_now"),
                    )
                )

            if self.dialect == "sqlite":  # prepared: see db/fast.py
                prepared = fast.prepare(self.conn, ("promote_objects",), build)
                done += fast.execute_many(self.conn, prepared, valued)
            else:
                done += int(self.conn.execute(build(), valued).rowcount)
        return done

    # -- garbage collection --------------------------------------------------

    def _unreferenced(self) -> sa.ColumnElement[bool]:
        photo = sa.select(PO.c.object_id).where(PO.c.object_id == OB.c.object_id)
        output = sa.select(O.c.object_id).where(
            O.c.object_id == OB.c.object_id, O.c.deleted_at.is_(None)
        )
        job = sa.select(J.c.object_id).where(
            J.c.object_id == OB.c.object_id, J.c.status.in_(LIVE_JOB_STATUSES)
        )
        return ~sa.exists(photo) & ~sa.exists(output) & ~sa.exists(job)

    def collectable(
        self, state: str, before: datetime, limit: int, *, unreferenced: bool
    ) -> list[int]:
        """Lock and return objects in ``state`` untouched since ``before``.

        Rows another transaction holds (a copy binding the object, say) are
        skipped, not waited for.  The reference test here ran on this
        statement's snapshot; callers check again with ``referenced`` once the
        rows are locked, which sees every binding committed before the lock.
        """
        q = sa.select(OB.c.object_id).where(OB.c.state == state, OB.c.updated_at < before)
        if unreferenced:
            q = q.where(self._unreferenced())
        q = q.order_by(OB.c.object_id).limit(limit)
        if self.dialect != "sqlite":
            q = q.with_for_update(skip_locked=True)
        return [r[0] for r in self.conn.execute(q)]

    def referenced(self, ids: Sequence[int]) -> set[int]:
        if not ids:
            return set()
        q = sa.select(OB.c.object_id).where(OB.c.object_id.in_(list(ids)), ~self._unreferenced())
        return {r[0] for r in self.conn.execute(q)}

    def mark_deleting(self, ids: Sequence[int], from_state: str, now: datetime) -> int:
        if not ids:
            return 0
        q = (
            sa.update(OB)
            .where(OB.c.object_id.in_(list(ids)), OB.c.state == from_state)
            .values(state="deleting", updated_at=now)
        )
        return int(self.conn.execute(q).rowcount)

    def deleting_objects(
        self, limit: int, after: int = 0, exclude_pools: Sequence[int] = ()
    ) -> list[Row]:
        """The next ``deleting`` rows after object id ``after`` (a sweep reads
        each row once a run), leaving out the pools ``exclude_pools``."""
        q = (
            sa.select(OB.c.object_id, OB.c.pool_id, OB.c.storage_key)
            .where(OB.c.state == "deleting", OB.c.object_id > after)
            .order_by(OB.c.object_id)
            .limit(limit)
        )
        if exclude_pools:
            q = q.where(OB.c.pool_id.not_in(sorted(exclude_pools)))
        return [dict(r._mapping) for r in self.conn.execute(q)]

    def deleting_count(self, pool_id: int, after: int) -> int:
        """How many ``deleting`` rows of ``pool_id`` lie after object id ``after``."""
        q = sa.select(sa.func.count()).where(
            OB.c.state == "deleting", OB.c.pool_id == pool_id, OB.c.object_id > after
        )
        return int(self.conn.execute(q).scalar() or 0)

    def delete_unused_reservations(self, ids: Sequence[int]) -> int:
        """Reserved output rows no output took (storage/reserve.py): no blob, no reference."""
        if not ids:
            return 0
        q = sa.delete(OB).where(OB.c.object_id.in_(list(ids)), _reserved())
        return int(self.conn.execute(q).rowcount)

    def delete_object_row(self, object_id: int) -> bool:
        """GC's last step for an object, its duplicate-check hashes with it:
        they outlived it, and every later check of its project read them."""
        q = sa.delete(OB).where(OB.c.object_id == object_id, OB.c.state == "deleting")
        try:
            deleted = self.conn.execute(q).rowcount == 1
        except sa.exc.IntegrityError as exc:  # a row behind the service's back refers to it
            raise Conflict(f"a row refers to object {object_id}") from exc
        if not deleted:
            return False
        self.conn.execute(sa.delete(OH).where(OH.c.object_id == object_id))
        return True


def _reserved() -> sa.ColumnElement[bool]:
    """A row reserved for an output (storage/reserve.py): still ``pending``,
    with its placeholder key.  An upload's own row gets its real key in the
    transaction that inserts it, so only reservations keep one."""
    return sa.and_(OB.c.state == "pending", OB.c.storage_key.startswith("pending/"))

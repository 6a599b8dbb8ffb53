"""Named queries over one open transaction.

``Tx`` is what the rest of the code sees of the database: plain dicts in and
out, every status change guarded by the statuses it may start from.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from hypermedia.db import dialects, fast, pg_batch, revisions
from hypermedia.db.auth_queries import AuthQueries
from hypermedia.db.bulk import update_many
from hypermedia.db.credit_queries import CreditQueries
from hypermedia.db.dedup_queries import DedupQueries
from hypermedia.db.photo_queries import PhotoQueries
from hypermedia.db.queue_queries import QueueQueries
from hypermedia.db.retention_queries import RetentionQueries
from hypermedia.db.schema import JOB_VIEW
from hypermedia.db.schema import job_attempts as A
from hypermedia.db.schema import job_events as E
from hypermedia.db.schema import job_outputs as O
from hypermedia.db.schema import processing_jobs as J
from hypermedia.db.schema import processing_profiles as P
from hypermedia.db.schema_storage import objects as OB
from hypermedia.db.storage_queries import StorageQueries
from hypermedia.db.workers import WorkerQueries
from hypermedia.errors import Conflict
from hypermedia.queue.states import RUNNING_SIDE

Row = dict[str, Any]


def _uniform(rows: Sequence[Row]) -> list[Row]:
    """Rows with the same keys in the same order (absent keys become NULL)."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return [{k: r.get(k) for k in keys} for r in rows]


def _held_by(worker_id: str) -> sa.ColumnElement[bool]:
    """claimed_by is this worker, written so the planner cannot use idx_claimed.

    Finished jobs keep claimed_by, so one worker's entries in that index grow
    without end; with the job ids known, the primary key is always the way in,
    but PostgreSQL estimates from stale statistics and may pick idx_claimed.
    IS NOT DISTINCT FROM is the same test for a non-NULL id and not indexable.
    """
    return J.c.claimed_by.is_not_distinct_from(worker_id)


# What settling a result needs to know of its job.
_FENCED = (
    J.c.job_id,
    J.c.status,
    J.c.attempt_count,
    J.c.max_attempts,
    J.c.claimed_by,
    J.c.memory_limit_mb,
    J.c.started_at,
    J.c.queue_name,
    J.c.visibility_timeout,
    J.c.profile_id,
    J.c.error_code,  # the previous attempt's (errors.CodePolicy.retry_once)
)


def _rows(result: sa.CursorResult[Any]) -> list[Row]:
    return [dict(r._mapping) for r in result]


class Tx(
    WorkerQueries,
    QueueQueries,
    StorageQueries,
    PhotoQueries,
    DedupQueries,
    AuthQueries,
    RetentionQueries,
    CreditQueries,
):
    def __init__(self, conn: sa.Connection, dialect: str, *, autocommit: bool = False) -> None:
        self.conn = conn
        self.dialect = dialect
        # Every statement commits on its own: locks end with the statement.
        self.autocommit = autocommit
        # Queues whose workers this process wakes once the transaction has
        # committed (where the database cannot: see db/wakeups.py).
        self.woken: set[str] = set()

    def ping(self) -> None:
        self.conn.execute(sa.text("SELECT 1"))

    def schema_revision(self) -> str | None:
        """Alembic's stamp, read without Alembic; None if never migrated."""
        if not sa.inspect(self.conn).has_table("alembic_version"):
            return None
        q = sa.text("SELECT version_num FROM alembic_version")
        return self.conn.execute(q).scalar()

    def has_job_tables(self) -> bool:
        """Whether hypermedia's tables are here (whatever revision is recorded)."""
        return sa.inspect(self.conn).has_table("processing_jobs")

    def schema_behind(self) -> str | None:
        """revisions.behind of this database (its tables looked at only
        when no revision is recorded)."""
        current = self.schema_revision()
        return revisions.behind(current, current is None and self.has_job_tables())

    def server_now(self) -> datetime:
        return dialects.server_now(self.conn, self.dialect)

    # -- profiles ------------------------------------------------------------

    def profile(
        self, key: str, version: str | None = None, *, active_only: bool = True
    ) -> Row | None:
        """Version ``version`` of ``key``, or its newest (active, unless not ``active_only``)."""
        q = sa.select(P).where(P.c.profile_key == key)
        if version is None:
            if active_only:
                q = q.where(P.c.is_active.is_(True))
            q = q.order_by(P.c.profile_id.desc()).limit(1)
        else:
            q = q.where(P.c.profile_version == version)
        row = self.conn.execute(q).first()
        return dict(row._mapping) if row else None

    def profile_by_id(self, profile_id: int) -> Row | None:
        row = self.conn.execute(sa.select(P).where(P.c.profile_id == profile_id)).first()
        return dict(row._mapping) if row else None

    def profiles_for_type(self, job_type: str) -> list[Row]:
        q = (
            sa.select(P)
            .where(P.c.job_type == job_type, P.c.is_active.is_(True))
            .order_by(P.c.profile_id.desc())
        )
        return _rows(self.conn.execute(q))

    def insert_profile(self, values: Row) -> int:
        try:
            res = self.conn.execute(sa.insert(P).values(values))
        except sa.exc.IntegrityError as exc:
            # uk_key_version: a concurrent create took this version first.
            raise Conflict("this profile version exists") from exc
        return int(res.inserted_primary_key[0])  # type: ignore[index]

    def has_profile_key(self, key: str) -> bool:
        """Whether ``key`` has any version, active or not."""
        q = sa.select(P.c.profile_id).where(P.c.profile_key == key).limit(1)
        return self.conn.execute(q).first() is not None

    def lock_profile_key(self, key: str) -> None:
        """Take the row lock of ``key``'s first version (if any) until the transaction
        ends: concurrent creators of its next version then queue here, each reading
        the versions afresh, instead of racing for one number."""
        q = (
            sa.select(P.c.profile_id)
            .where(P.c.profile_key == key)
            .order_by(P.c.profile_id)
            .limit(1)
            .with_for_update()  # SQLite: nothing; its writers take turns anyway
        )
        self.conn.execute(q).first()

    def profiles(
        self,
        job_type: str | None = None,
        *,
        include_inactive: bool = False,
        key: str | None = None,
        after: Row | None = None,
        limit: int | None = None,
    ) -> list[Row]:
        """Versions by key, then oldest first; from just past the version
        ``after`` (a page's last row: its key and id) when given."""
        q = sa.select(P)
        if job_type is not None:
            q = q.where(P.c.job_type == job_type)
        if key is not None:
            q = q.where(P.c.profile_key == key)
        if not include_inactive:
            q = q.where(P.c.is_active.is_(True))
        if after is not None:
            k, pid = after["profile_key"], after["profile_id"]
            q = q.where(
                sa.or_(P.c.profile_key > k, sa.and_(P.c.profile_key == k, P.c.profile_id > pid))
            )
        q = q.order_by(P.c.profile_key, P.c.profile_id)
        return _rows(self.conn.execute(q if limit is None else q.limit(limit)))

    def set_profile_active(self, profile_id: int, active: bool) -> bool:
        q = sa.update(P).where(P.c.profile_id == profile_id).values(is_active=active)
        return self.conn.execute(q).rowcount == 1

    def credit_inputs(self, job_ids: Sequence[int]) -> dict[int, Row]:
        """What settling needs to price jobs: input size, input object and its facts."""
        if not job_ids:
            return {}
        found = self._rows_by_ids(
            "credit_inputs",
            lambda ids: (
                sa.select(
                    J.c.job_id, J.c.object_id, J.c.input_size_bytes, OB.c.pages, OB.c.duration_ms
                )
                .select_from(J.outerjoin(OB, OB.c.object_id == J.c.object_id))
                .where(J.c.job_id.in_(ids))
            ),
            job_ids,
        )
        return {r["job_id"]: r for r in found}

    def set_object_facts(self, object_id: int, values: Row) -> bool:
        """Pages, duration or dimensions a job found out about its (ready) input."""
        q = sa.update(OB).where(OB.c.object_id == object_id, OB.c.state == "ready").values(values)
        return self.conn.execute(q).rowcount == 1

    # -- jobs ----------------------------------------------------------------

    def insert_jobs(self, rows: Sequence[Row]) -> dict[str, int]:
        """Insert jobs; return job_id by job_uuid (the order of RETURNING is not promised)."""
        if not rows:
            return {}
        try:
            if self.dialect == "postgresql":
                got = pg_batch.bulk_insert(self.conn, J, rows, ("job_id", "job_uuid"))
                return {r["job_uuid"]: r["job_id"] for r in got}
            res = self.conn.execute(sa.insert(J).returning(J.c.job_id, J.c.job_uuid), list(rows))
        except sa.exc.IntegrityError as exc:
            # Fix: a concurrent enqueue can commit the same (project, idempotency
            # key) between our lookup and this insert; say so in our own terms so
            # the engine (which never imports SQLAlchemy) can resolve the race.
            raise Conflict("a unique key refused the new job") from exc
        return {r.job_uuid: r.job_id for r in res}

    def job(self, job_id: int, *, lock: bool = False) -> Row | None:
        q = sa.select(*JOB_VIEW).where(J.c.job_id == job_id, J.c.deleted_at.is_(None))
        if lock:
            q = q.with_for_update()
        row = self.conn.execute(q).first()
        return dict(row._mapping) if row else None

    def job_by_idempotency_key(self, project_id: str, key: str, lock: bool = False) -> Row | None:
        q = sa.select(*JOB_VIEW).where(J.c.project_id == project_id, J.c.idempotency_key == key)
        if lock and self.dialect != "sqlite":  # SQLite: the write lock is held already
            q = q.with_for_update()
        row = self.conn.execute(q).first()
        return dict(row._mapping) if row else None

    def jobs_by_idempotency_keys(
        self, pairs: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], Row]:
        """``job_by_idempotency_key`` for many (project, key) pairs at once."""
        if not pairs:
            return {}
        pair = sa.tuple_(J.c.project_id, J.c.idempotency_key)
        q = sa.select(*JOB_VIEW).where(pair.in_(sorted(set(pairs))))
        return {(r.project_id, r.idempotency_key): dict(r._mapping) for r in self.conn.execute(q)}

    def jobs(
        self,
        *,
        status: str | None = None,
        job_type: str | None = None,
        queue: str | None = None,
        project_id: str | None = None,
        before_id: int | None = None,
        limit: int = 50,
    ) -> list[Row]:
        q = sa.select(*JOB_VIEW).where(J.c.deleted_at.is_(None))
        for col, value in (
            (J.c.status, status),
            (J.c.job_type, job_type),
            (J.c.queue_name, queue),
            (J.c.project_id, project_id),
        ):
            if value is not None:
                q = q.where(col == value)
        if before_id is not None:
            q = q.where(J.c.job_id < before_id)
        return _rows(self.conn.execute(q.order_by(J.c.job_id.desc()).limit(limit)))

    def recent_failures(self, project_id: str, limit: int) -> list[Row]:
        """The project's failed jobs, the latest to fail first (a retried old
        job that failed again is recent; its id is not)."""
        q = (
            sa.select(*JOB_VIEW)
            .where(J.c.status == "failed", J.c.project_id == project_id, J.c.deleted_at.is_(None))
            .order_by(J.c.completed_at.desc(), J.c.job_id.desc())
            .limit(limit)
        )
        return _rows(self.conn.execute(q))

    def jobs_where(self, job_ids: Iterable[int], *, lock: bool = False) -> list[Row]:
        ids = list(job_ids)
        if not ids:
            return []
        q = sa.select(*JOB_VIEW).where(J.c.job_id.in_(ids))
        if lock:
            q = q.with_for_update()
        return _rows(self.conn.execute(q))

    def update_job(
        self,
        job_id: int,
        from_statuses: Iterable[str],
        values: Row,
        *,
        attempt: int | None = None,
        worker_id: str | None = None,
    ) -> bool:
        """Guarded status change; False when the row was not in an allowed state."""
        q = sa.update(J).where(J.c.job_id == job_id, J.c.status.in_(sorted(from_statuses)))
        if attempt is not None:
            q = q.where(J.c.attempt_count == attempt)
        if worker_id is not None:
            q = q.where(J.c.claimed_by == worker_id)
        return self.conn.execute(q.values(values)).rowcount == 1

    def update_jobs_many(self, from_statuses: Iterable[str], rows: Sequence[Row]) -> None:
        """Executemany of guarded updates; each row carries ``_id`` and the same columns."""
        statuses = tuple(sorted(from_statuses))
        guard = lambda: sa.or_(*(J.c.status == s for s in statuses))  # noqa: E731
        update_many(self.conn, J.c.job_id, guard, rows, shape=statuses)

    def update_jobs_by_ids(
        self, ids: Sequence[int], from_statuses: Iterable[str], values: Row
    ) -> int:
        if not ids:
            return 0
        statuses = sorted(from_statuses)
        if self.dialect == "sqlite":  # prepared: see db/fast.py
            cols = tuple(values)
            prepared = fast.prepare(
                self.conn,
                ("jobs_by_ids", len(ids), tuple(statuses), cols),
                lambda: (
                    sa.update(J)
                    .where(
                        J.c.job_id.in_(fast.id_params(ids)),
                        sa.or_(*(fast.unindexed(J.c.status) == s for s in statuses)),
                    )
                    .values({c: sa.bindparam(f"v_{c}") for c in cols})
                ),
            )
            params = {**fast.id_values(ids), **{f"v_{c}": v for c, v in values.items()}}
            return fast.execute(self.conn, prepared, params)[0]
        q = sa.update(J).where(J.c.job_id.in_(list(ids)), J.c.status.in_(statuses))
        return int(self.conn.execute(q.values(values)).rowcount)

    def fenced(
        self,
        worker_id: str | None,
        items: Sequence[tuple[int, int]],
        statuses: Iterable[str],
        *,
        skip_locked: bool = False,
    ) -> list[Row]:
        """Lock and return the jobs still held by this (worker, attempt); others are stale.

        With ``skip_locked``, rows locked by another transaction are left out
        instead of waited for.
        """
        if not items:
            return []
        ids = [i for i, _ in items]
        want, ok = set(items), frozenset(statuses)
        if self.dialect == "sqlite":
            # The write lock is held already; prepared, see db/fast.py.
            found = self._fenced_sqlite(worker_id, ids)
            return [
                r for r in found if (r["job_id"], r["attempt_count"]) in want and r["status"] in ok
            ]
        q = sa.select(*_FENCED).where(J.c.job_id.in_(ids))
        if worker_id is not None:
            # Not "=": see _held_by.
            q = q.where(_held_by(worker_id))
        # In autocommit a lock would end with this statement, and the caller
        # guards its writes instead.
        if not self.autocommit:
            q = q.with_for_update(skip_locked=skip_locked)
        # Fix: match (job, attempt) pairs, not a dict keyed by job: with two
        # reports for one job in a batch (an old attempt's late result next to
        # the current one's), the dict kept only the last and could drop the
        # current attempt's report as stale.
        # The statuses are checked here, not in SQL: the planner would be
        # tempted by the status indexes, full of dead entries for statuses
        # every job passes through, when the primary key is the way in.
        return [
            r
            for r in _rows(self.conn.execute(q))
            if (r["job_id"], r["attempt_count"]) in want and r["status"] in ok
        ]

    def _fenced_sqlite(self, worker_id: str | None, ids: Sequence[int]) -> list[Row]:
        def build(in_ids: Any) -> Any:
            q = sa.select(*_FENCED).where(J.c.job_id.in_(in_ids))
            if worker_id is None:
                return q
            return q.where(fast.unindexed(J.c.claimed_by) == sa.bindparam("worker"))

        shape = "fenced" if worker_id is None else "fenced_by_worker"
        return self._rows_by_ids(shape, build, ids, worker=worker_id)

    def claim(
        self,
        worker_id: str,
        queues: Sequence[str],
        n: int,
        now: datetime,
        lease_until: datetime,
        only: Collection[int] | None = None,
    ) -> list[Row]:
        return dialects.claim(self.conn, self.dialect, worker_id, queues, n, now, lease_until, only)

    def apply_transitions(
        self,
        worker_id: str | None,
        items: Sequence[Any],
        claim: tuple[Sequence[str], int, datetime, datetime] | None = None,
    ) -> tuple[set[int], list[Row]]:
        """PostgreSQL: write decided transitions, each guarded by the status it
        was decided from, and claim (queues, n, now, lease_until) for
        ``worker_id`` if given, all in one statement.  Returns the job ids
        changed and the rows claimed."""
        args = None
        if claim is not None:
            assert worker_id is not None, "a claim is always some worker's"
            args = dialects.ClaimArgs(worker_id, *claim)
        return pg_batch.apply(self.conn, worker_id, items, args)

    def notify(self, queues: set[str]) -> None:
        if not dialects.notify(self.conn, self.dialect, queues):
            self.woken.update(queues)

    def due_retries(self, now: datetime, limit: int) -> list[Row]:
        q = (
            sa.select(J.c.job_id, J.c.queue_name, J.c.attempt_count)
            .where(J.c.status == "retry_wait", J.c.available_at <= now)
            .order_by(J.c.available_at)
            .limit(limit)
        )
        # Locked, skipping what another transaction holds: one held row (a
        # frozen process mid-transaction) stalled every promotion behind it,
        # and the leader's other services and lease with them.  SQLite: the
        # write lock is held already.
        if self.dialect != "sqlite" and not self.autocommit:
            q = q.with_for_update(skip_locked=True)
        return _rows(self.conn.execute(q))

    def expired_leases(self, now: datetime, limit: int) -> list[Row]:
        q = (
            sa.select(J.c.job_id, J.c.attempt_count, J.c.claimed_by)
            .where(
                J.c.status.in_(["claimed", "processing", "cancel_requested"]),
                J.c.visibility_timeout < now,
            )
            .limit(limit)
        )
        return _rows(self.conn.execute(q))

    def held_by(self, worker_ids: Sequence[str]) -> list[Row]:
        if not worker_ids:
            return []
        q = sa.select(J.c.job_id, J.c.attempt_count, J.c.claimed_by).where(
            J.c.status.in_(["claimed", "processing", "cancel_requested"]),
            J.c.claimed_by.in_(list(worker_ids)),
        )
        return _rows(self.conn.execute(q))

    def claimed_in_queue(self, queue_name: str) -> list[Row]:
        """The jobs claimed from ``queue_name`` and not started, by any
        worker, locked (idx_status_queue leads with both)."""
        q = sa.select(*_FENCED).where(J.c.status == "claimed", J.c.queue_name == queue_name)
        if not self.autocommit:
            q = q.with_for_update()
        return _rows(self.conn.execute(q))

    def claimed_unstarted(self, worker_id: str) -> list[tuple[int, int]]:
        """(job, attempt) of the jobs this worker claimed and has not started.

        By claimed_by (idx_claimed) and status: the ids are what is sought.
        """
        q = sa.select(J.c.job_id, J.c.attempt_count).where(
            J.c.claimed_by == worker_id, J.c.status == "claimed"
        )
        return [(r.job_id, r.attempt_count) for r in self.conn.execute(q)]

    def statuses_of(self, worker_id: str, items: Sequence[tuple[int, int]]) -> dict[int, str]:
        """Current status of the jobs a worker runs, or absent if no longer its attempt."""
        if not items:
            return {}
        want = set(items)  # (job, attempt) pairs; see ``fenced`` for why not a dict
        # Fix: only jobs still under a lease count as held.  A job the reaper
        # moved on (retry_wait, failed, cancelled) keeps claimed_by and
        # attempt_count, and used to be reported here, so its old worker never
        # learnt that it had lost the attempt and kept running it.
        # Statuses checked here, not in SQL: see ``fenced``.
        q = sa.select(J.c.job_id, J.c.status, J.c.attempt_count, J.c.claimed_by).where(
            J.c.job_id.in_(sorted({i for i, _ in want}))
        )
        return {
            r.job_id: r.status
            for r in self.conn.execute(q)
            if r.claimed_by == worker_id
            and (r.job_id, r.attempt_count) in want
            and r.status in RUNNING_SIDE
        }

    def renew_leases(
        self, worker_id: str, ids: Sequence[int], until: datetime, now: datetime
    ) -> int:
        if not ids:
            return 0
        q = (
            sa.update(J)
            .where(
                J.c.job_id.in_(list(ids)),
                _held_by(worker_id),
                J.c.status.in_(["claimed", "processing", "cancel_requested"]),
            )
            .values(visibility_timeout=until)
        )
        return int(self.conn.execute(q).rowcount)

    # -- attempts, events, outputs ------------------------------------------

    def insert_attempts(self, rows: Sequence[Row]) -> None:
        if rows:
            self.conn.execute(sa.insert(A), list(rows))

    def finish_attempts(self, rows: Sequence[Row]) -> None:
        """Executemany: each row has job_id, attempt_number and the columns to set."""
        if not rows:
            return
        if self.dialect == "postgresql":
            pg_batch.bulk_update(
                self.conn, A, ("job_id", "attempt_number"), _uniform(rows), "t.status = 'started'"
            )
            return
        cols = [k for k in rows[0] if k not in ("job_id", "attempt_number")]

        def build() -> Any:
            return (
                sa.update(A)
                .where(
                    A.c.job_id == sa.bindparam("k_job"),
                    A.c.attempt_number == sa.bindparam("k_n"),
                    A.c.status == "started",
                )
                .values({c: sa.bindparam(f"v_{c}") for c in cols})
            )

        params = [
            {"k_job": r["job_id"], "k_n": r["attempt_number"], **{f"v_{c}": r[c] for c in cols}}
            for r in rows
        ]
        if self.dialect == "sqlite":  # prepared: see db/fast.py
            prepared = fast.prepare(self.conn, ("finish_attempts", tuple(cols)), build)
            fast.execute_many(self.conn, prepared, params)
            return
        self.conn.execute(build(), params)

    def delete_attempt(self, job_id: int, attempt_number: int) -> None:
        self.conn.execute(
            sa.delete(A).where(A.c.job_id == job_id, A.c.attempt_number == attempt_number)
        )

    def attempts(self, job_id: int) -> list[Row]:
        q = sa.select(A).where(A.c.job_id == job_id).order_by(A.c.attempt_number)
        return _rows(self.conn.execute(q))

    def insert_events(self, rows: Sequence[Row]) -> None:
        if not rows:
            return
        if self.dialect == "postgresql" and len(rows) > 1:
            pg_batch.bulk_insert(self.conn, E, _uniform(rows))
        elif self.dialect == "sqlite":
            fast.insert_many(self.conn, E, _uniform(rows))
        else:
            self.conn.execute(sa.insert(E), list(rows))

    def trim_history(self, job_ids: Iterable[int], keep: int) -> int:
        """Keep each job's newest ``keep`` progress and log entries (seed 004's
        cap); its state changes (kind "event") are all kept."""
        deleted = 0
        for job_id in sorted(set(job_ids)):
            diagnostic = (E.c.job_id == job_id, E.c.kind != "event")
            oldest_kept = self.conn.execute(
                sa.select(E.c.event_id)
                .where(*diagnostic)
                .order_by(E.c.event_id.desc())
                .offset(keep - 1)
                .limit(1)
            ).scalar()
            if oldest_kept is not None:
                q = sa.delete(E).where(*diagnostic, E.c.event_id < oldest_kept)
                deleted += int(self.conn.execute(q).rowcount)
        return deleted

    def events(self, job_id: int, after_id: int = 0) -> list[Row]:
        q = sa.select(E).where(E.c.job_id == job_id, E.c.event_id > after_id).order_by(E.c.event_id)
        return _rows(self.conn.execute(q))

    def insert_outputs(self, rows: Sequence[Row]) -> int:
        """Insert outputs not already recorded for (job, type, profile version)."""
        if not rows:
            return 0
        ids = sorted({r["job_id"] for r in rows})
        existing = self._recorded_outputs(ids)
        # Fix: also drop repeats inside this batch (a result listing the same
        # output twice); before, they reached uk_job_type_profile and the whole
        # settling transaction failed, so the completion could never be recorded.
        fresh = []
        for r in rows:
            key = (r["job_id"], r["output_type"], r["profile_version"])
            if key not in existing:
                existing.add(key)
                fresh.append(r)
        if fresh and self.dialect == "sqlite":
            fast.insert_many(self.conn, O, _uniform(fresh))
        elif fresh:
            self.conn.execute(sa.insert(O), fresh)
        return len(fresh)

    def _recorded_outputs(self, job_ids: Sequence[int]) -> set[tuple[Any, ...]]:
        found = self._rows_by_ids(
            "recorded_outputs",
            lambda ids: sa.select(O.c.job_id, O.c.output_type, O.c.profile_version).where(
                O.c.job_id.in_(ids)
            ),
            job_ids,
        )
        return {(r["job_id"], r["output_type"], r["profile_version"]) for r in found}

    def _rows_by_ids(
        self, shape: str, build: Callable[[Any], Any], ids: Sequence[Any], **values: Any
    ) -> list[Row]:
        """Rows of ``build(ids)`` (a statement with ``IN ids``); on SQLite prepared
        once per IN-list length (db/fast.py), ``values`` binding its other parameters."""
        if self.dialect == "sqlite":
            prepared = fast.prepare(
                self.conn, (shape, len(ids)), lambda: build(fast.id_params(ids))
            )
            return fast.rows(self.conn, prepared, {**fast.id_values(ids), **values})
        return _rows(self.conn.execute(build(list(ids))))

    def outputs(self, job_id: int) -> list[Row]:
        q = sa.select(O).where(O.c.job_id == job_id, O.c.deleted_at.is_(None))
        return _rows(self.conn.execute(q.order_by(O.c.output_id)))

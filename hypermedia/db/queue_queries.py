"""Queries about queues as a whole: depth, summaries, pause switches, /metrics figures.

Every figure is one GROUP BY over the jobs (or attempts, or workers) table:
nothing here reads rows one by one.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from hypermedia.db.schema import JOB_VIEW
from hypermedia.db.schema import attempt_fold as AF
from hypermedia.db.schema import job_attempts as A
from hypermedia.db.schema import processing_jobs as J
from hypermedia.db.schema import processing_profiles as P
from hypermedia.db.schema import pruned_attempt_durations as PD
from hypermedia.db.schema import queue_states as Q
from hypermedia.db.schema import workers as W
from hypermedia.queue.states import RUNNING_SIDE, STATUSES, TERMINAL

Row = dict[str, Any]
OPEN = sorted(frozenset(STATUSES) - TERMINAL)


_FOLD = "durations"  # attempt_fold's one row


def _count_if(cond: sa.ColumnElement[bool]) -> sa.ColumnElement[Any]:
    return sa.func.coalesce(sa.func.sum(sa.case((cond, 1), else_=0)), 0)


def _live_jobs(project_id: str | None) -> list[sa.ColumnElement[bool]]:
    where: list[sa.ColumnElement[bool]] = [J.c.deleted_at.is_(None)]
    if project_id is not None:
        where.append(J.c.project_id == project_id)
    return where


class QueueQueries:
    conn: sa.Connection
    dialect: str

    def queue_depth(self, project_id: str | None = None) -> list[Row]:
        """Open (non-terminal) jobs counted by queue, status and priority."""
        count = sa.func.count().label("count")
        q = (
            sa.select(J.c.queue_name, J.c.status, J.c.priority, count)
            .where(*_live_jobs(project_id), J.c.status.in_(OPEN))
            .group_by(J.c.queue_name, J.c.status, J.c.priority)
            .order_by(J.c.queue_name, J.c.status, J.c.priority)
        )
        return [dict(r._mapping) for r in self.conn.execute(q)]

    def queue_counts(self, since: datetime, project_id: str | None = None) -> list[Row]:
        """Per queue: queued, running, retry_wait, and completed/failed since ``since``."""
        finished_since = J.c.completed_at >= since
        q = (
            sa.select(
                J.c.queue_name,
                _count_if(J.c.status == "queued").label("queued"),
                _count_if(J.c.status.in_(sorted(RUNNING_SIDE))).label("running"),
                _count_if(J.c.status == "retry_wait").label("retry_wait"),
                _count_if(sa.and_(J.c.status == "completed", finished_since)).label("completed_1h"),
                _count_if(sa.and_(J.c.status == "failed", finished_since)).label("failed_1h"),
            )
            .where(*_live_jobs(project_id))
            .group_by(J.c.queue_name)
        )
        return [dict(r._mapping) for r in self.conn.execute(q)]

    def job_queue_names(self, project_id: str | None = None) -> set[str]:
        """Every queue a live job (of ``project_id``, else of anyone) names."""
        q = sa.select(J.c.queue_name).where(*_live_jobs(project_id)).distinct()
        return {r[0] for r in self.conn.execute(q)}

    def profile_queue_names(self) -> set[str]:
        q = sa.select(P.c.queue_name).where(P.c.is_active.is_(True)).distinct()
        return {r[0] for r in self.conn.execute(q)}

    def queue_states(self) -> list[Row]:
        return [dict(r._mapping) for r in self.conn.execute(sa.select(Q))]

    def queue_state(self, name: str) -> Row | None:
        row = self.conn.execute(sa.select(Q).where(Q.c.queue_name == name)).first()
        return dict(row._mapping) if row else None

    def set_queue_paused(self, name: str, paused: bool, now: datetime) -> None:
        """Upsert without dialect SQL: update, else insert; a racing insert means update."""
        q = sa.update(Q).where(Q.c.queue_name == name).values(paused=paused, updated_at=now)
        if self.conn.execute(q).rowcount == 1:
            return
        try:
            with self.conn.begin_nested():
                self.conn.execute(
                    sa.insert(Q).values(queue_name=name, paused=paused, updated_at=now)
                )
        except sa.exc.IntegrityError:  # a concurrent first switch for this queue
            self.conn.execute(q)

    # -- /metrics ----------------------------------------------------------------

    def newest_job_id(self) -> int:
        """The highest job id (MariaDB answers from the primary key's last entry)."""
        return int(self.conn.execute(sa.select(sa.func.max(J.c.job_id))).scalar() or 0)

    def job_counts_by_status_type(self) -> list[Row]:
        q = (
            sa.select(J.c.status, J.c.job_type, sa.func.count().label("count"))
            .where(J.c.deleted_at.is_(None))
            .group_by(J.c.status, J.c.job_type)
        )
        return [dict(r._mapping) for r in self.conn.execute(q)]

    def attempt_duration_histogram(
        self,
        bounds_ms: Sequence[float],
        job_ids: Sequence[int] | None = None,
        *,
        after: int = 0,
        upto: int | None = None,
    ) -> list[Row]:
        """Per job type: ``le_<i>`` attempts with duration_ms <= bounds_ms[i], sum
        and count; of the attempts with ids in (``after``, ``upto``] (the
        primary key's range), of every job or of ``job_ids``' only."""
        d = A.c.duration_ms
        cols = [_count_if(d <= b).label(f"le_{i}") for i, b in enumerate(bounds_ms)]
        q = (
            sa.select(
                J.c.job_type,
                sa.func.count().label("count"),
                sa.func.coalesce(sa.func.sum(d), 0).label("sum_ms"),
                *cols,
            )
            .select_from(A.join(J, J.c.job_id == A.c.job_id))
            .where(d.is_not(None))
            .group_by(J.c.job_type)
        )
        if job_ids is not None:
            q = q.where(A.c.job_id.in_(list(job_ids)))
        if after:
            q = q.where(A.c.attempt_id > after)
        if upto is not None:
            q = q.where(A.c.attempt_id <= upto)
        return [dict(r._mapping) for r in self.conn.execute(q)]

    def pruned_durations(self) -> list[Row]:
        return [dict(r._mapping) for r in self.conn.execute(sa.select(PD))]

    # -- the attempt fold (scheduler/attempt_fold.py) --------------------------------

    def attempt_fold(self, *, lock: bool = False) -> Row:
        """watermark, seen, seen_at; ``lock``: the fold's and retention's turn
        (SQLite: the write lock is held already)."""
        q = sa.select(AF.c.watermark, AF.c.seen, AF.c.seen_at).where(AF.c.name == _FOLD)
        if lock and self.dialect != "sqlite":
            q = q.with_for_update()
        row = self.conn.execute(q).first()
        return dict(row._mapping) if row else {"watermark": 0, "seen": 0, "seen_at": None}

    def set_attempt_fold(self, values: Row, now: datetime) -> None:
        values = {**values, "updated_at": now}
        q = sa.update(AF).where(AF.c.name == _FOLD).values(values)
        if self.conn.execute(q).rowcount == 0:  # MariaDB: 0 also when nothing changed
            try:
                with self.conn.begin_nested():
                    self.conn.execute(sa.insert(AF).values(name=_FOLD, **values))
            except sa.exc.IntegrityError:
                pass  # the row is there, already as asked

    def attempt_ids(self) -> tuple[int, int | None]:
        """The newest attempt id, and the oldest of the attempts still running."""
        newest = self.conn.execute(sa.select(sa.func.max(A.c.attempt_id))).scalar()
        running = sa.select(sa.func.min(A.c.attempt_id)).where(A.c.status == "started")
        return int(newest or 0), self.conn.execute(running).scalar()

    def worker_counts_by_status(self) -> dict[str, int]:
        q = sa.select(W.c.status, sa.func.count()).group_by(W.c.status)
        return {r[0]: int(r[1]) for r in self.conn.execute(q)}

    # -- seed 001 view -------------------------------------------------------------

    def job_id_by_uuid(self, job_uuid: str) -> int | None:
        q = sa.select(J.c.job_id).where(J.c.job_uuid == job_uuid, J.c.deleted_at.is_(None))
        value = self.conn.execute(q).scalar()
        return None if value is None else int(value)

    def jobs_in(
        self,
        project_id: str,
        *,
        statuses: Sequence[str] | None = None,
        started_only: bool = False,
        unstarted: Sequence[str] = (),
        job_types: Sequence[str] | None = None,
        object_id: int | None = None,
        before_id: int | None = None,
        limit: int = 50,
    ) -> list[Row]:
        """A project's jobs, newest first, filtered by sets of statuses and job
        types.  ``started_only``: of ``statuses``, those with a ``started_at``;
        ``unstarted``: these statuses too, for rows without one (seed 001's
        running and pending, legacy.statuses_for)."""
        q = sa.select(*JOB_VIEW).where(*_live_jobs(project_id))
        if statuses is not None:
            named: sa.ColumnElement[bool] = J.c.status.in_(list(statuses))
            if started_only:
                named = sa.and_(named, J.c.started_at.is_not(None))
            if unstarted:
                never = sa.and_(J.c.status.in_(list(unstarted)), J.c.started_at.is_(None))
                named = sa.or_(named, never)
            q = q.where(named)
        if job_types is not None:
            q = q.where(J.c.job_type.in_(list(job_types)))
        if object_id is not None:
            q = q.where(J.c.object_id == object_id)
        if before_id is not None:
            q = q.where(J.c.job_id < before_id)
        q = q.order_by(J.c.job_id.desc()).limit(limit)
        return [dict(r._mapping) for r in self.conn.execute(q)]

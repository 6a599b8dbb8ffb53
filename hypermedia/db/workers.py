"""Queries about workers, their metrics, the leader lease and queue switches."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from hypermedia.db.schema import leader_leases as L
from hypermedia.db.schema import processing_jobs as J
from hypermedia.db.schema import processing_profiles as P
from hypermedia.db.schema import queue_states as Q
from hypermedia.db.schema import worker_metrics as M
from hypermedia.db.schema import worker_metrics_hourly as H
from hypermedia.db.schema import workers as W

Row = dict[str, Any]
LIVE = ("active", "idle", "draining")


class WorkerQueries:
    conn: sa.Connection
    dialect: str

    def insert_worker(self, values: Row) -> None:
        """Idempotent: a worker id is new per process, so a row already there
        is this worker's own, from a retry after a commit whose answer was lost."""
        try:
            with self.conn.begin_nested():
                self.conn.execute(sa.insert(W).values(values))
        except sa.exc.IntegrityError:
            mine = sa.select(W.c.worker_id).where(W.c.worker_id == values["worker_id"])
            if self.conn.execute(mine).first() is None:
                raise

    def update_worker(self, worker_id: str, values: Row) -> bool:
        values = dict(values)
        if values.get("status") in ("active", "idle"):
            # An operator's drain is sticky: the heartbeat writes active/idle
            # and must not undo a drain the worker has not yet seen.
            values["status"] = sa.case(
                (W.c.status == "draining", W.c.status), else_=values["status"]
            )
            # Back from the dead (given up as gone, then woken: SIGCONT, a VM
            # resumed), it is not terminated: "active" beside a terminated_at.
            values["terminated_at"] = None
        q = sa.update(W).where(W.c.worker_id == worker_id).values(values)
        return self.conn.execute(q).rowcount == 1

    def set_worker_status(self, worker_id: str, from_statuses: Sequence[str], status: str) -> bool:
        """Guarded status change; False when the worker was not in an allowed status."""
        q = (
            sa.update(W)
            .where(W.c.worker_id == worker_id, W.c.status.in_(list(from_statuses)))
            .values(status=status)
        )
        return self.conn.execute(q).rowcount == 1

    def worker_status(self, worker_id: str) -> str | None:
        q = sa.select(W.c.status).where(W.c.worker_id == worker_id)
        return self.conn.execute(q).scalar()

    def worker(self, worker_id: str) -> Row | None:
        row = self.conn.execute(sa.select(W).where(W.c.worker_id == worker_id)).first()
        return dict(row._mapping) if row else None

    def workers(self, *, include_terminated: bool = False) -> list[Row]:
        q = sa.select(W).order_by(W.c.started_at.desc())
        if not include_terminated:
            q = q.where(W.c.status != "terminated")
        return [dict(r._mapping) for r in self.conn.execute(q)]

    def mark_stale_workers(self, cutoff: datetime) -> list[str]:
        """Flip live workers silent since ``cutoff`` to unhealthy; return their ids.

        A draining one stays ``draining`` (its jobs released all the same):
        marked unhealthy, it lost its drain, and a worker that was only
        stopped (SIGSTOP, a paused VM) went on working when it came back.
        It is taken once: with no jobs left it is not taken again."""
        draining = W.c.status == "draining"
        q = sa.select(W.c.worker_id).where(
            W.c.status.in_(LIVE),
            W.c.last_heartbeat < cutoff,
            ~sa.and_(draining, W.c.current_jobs == 0),
        )
        if self.dialect != "sqlite":
            q = q.with_for_update(skip_locked=True)
        ids = [r[0] for r in self.conn.execute(q)]
        if ids:
            self.conn.execute(
                sa.update(W)
                .where(W.c.worker_id.in_(ids), W.c.status.in_(LIVE))
                # Its jobs are released with it: it holds none any more.
                .values(status=sa.case((draining, W.c.status), else_="unhealthy"), current_jobs=0)
            )
        return ids

    def mark_dead_workers(self, worker_ids: Sequence[str], hostname: str) -> list[str]:
        """Flip these live workers of ``hostname`` (their process died) to
        unhealthy; their ids."""
        q = sa.select(W.c.worker_id).where(
            W.c.worker_id.in_(list(worker_ids)), W.c.status.in_(LIVE), W.c.hostname == hostname
        )
        if self.dialect != "sqlite":
            q = q.with_for_update()
        ids = [r[0] for r in self.conn.execute(q)]
        if ids:
            self.conn.execute(
                sa.update(W)
                .where(W.c.worker_id.in_(ids), W.c.status.in_(LIVE))
                .values(status="unhealthy", current_jobs=0)
            )
        return ids

    def mark_gone_workers(self, cutoff: datetime, now: datetime) -> int:
        """Unhealthy (or draining) workers silent since ``cutoff`` → terminated
        at ``now`` (when they were given up: a worker that stops cleanly sets
        its own).  Guarded on both: a worker whose heartbeat came back in
        between is left alone."""
        q = (
            sa.update(W)
            .where(W.c.status.in_(("unhealthy", "draining")), W.c.last_heartbeat < cutoff)
            .values(status="terminated", terminated_at=now)
        )
        return int(self.conn.execute(q).rowcount)

    # -- metrics -------------------------------------------------------------

    def insert_metric(self, values: Row) -> None:
        self.conn.execute(sa.insert(M).values(values))

    def latest_metrics(self, worker_ids: Sequence[str]) -> dict[str, Row]:
        """Each worker's newest worker_metrics row (the highest metric_id), by worker id."""
        if not worker_ids:
            return {}
        newest = (
            sa.select(sa.func.max(M.c.metric_id))
            .where(M.c.worker_id.in_(list(worker_ids)))
            .group_by(M.c.worker_id)
        )
        q = sa.select(M).where(M.c.metric_id.in_(newest.scalar_subquery()))
        return {r.worker_id: dict(r._mapping) for r in self.conn.execute(q)}

    def oldest_metric_before(self, cutoff: datetime) -> datetime | None:
        q = sa.select(sa.func.min(M.c.recorded_at)).where(M.c.recorded_at < cutoff)
        value = self.conn.execute(q).scalar()
        return value if isinstance(value, datetime) else None

    def metrics_between(self, start: datetime, end: datetime, *, lock: bool = False) -> list[Row]:
        """The raw samples of [start, end); ``lock``: held until the
        transaction ends, or an error at once if another holds them (NOWAIT:
        see dialects.is_lock_busy; SQLite's write lock holds everything already)."""
        q = sa.select(M).where(M.c.recorded_at >= start, M.c.recorded_at < end)
        if lock and self.dialect != "sqlite":
            q = q.with_for_update(nowait=True)
        return [dict(r._mapping) for r in self.conn.execute(q)]

    def delete_metrics_between(self, start: datetime, end: datetime) -> int:
        q = sa.delete(M).where(M.c.recorded_at >= start, M.c.recorded_at < end)
        return int(self.conn.execute(q).rowcount)

    def insert_hourly(self, rows: Sequence[Row]) -> None:
        if rows:
            self.conn.execute(sa.insert(H), list(rows))

    def hourly_at(self, hour: datetime, worker_ids: Sequence[str]) -> dict[str, Row]:
        """The hourly rows of ``hour`` these workers have already, by worker id."""
        if not worker_ids:
            return {}
        q = sa.select(H).where(H.c.hour == hour, H.c.worker_id.in_(list(worker_ids)))
        return {r.worker_id: dict(r._mapping) for r in self.conn.execute(q)}

    def delete_hourly_at(self, hour: datetime, worker_ids: Sequence[str]) -> None:
        if worker_ids:
            q = sa.delete(H).where(H.c.hour == hour, H.c.worker_id.in_(list(worker_ids)))
            self.conn.execute(q)

    # -- leader lease ----------------------------------------------------------

    def take_lease(self, name: str, holder: str, now: datetime, until: datetime) -> bool:
        """Renew our lease or take an expired one; portable, no upsert needed."""
        q = (
            sa.update(L)
            .where(L.c.name == name, sa.or_(L.c.holder == holder, L.c.expires_at < now))
            .values(holder=holder, expires_at=until, acquired_at=now)
        )
        if self.conn.execute(q).rowcount == 1:
            return True
        if self.conn.execute(sa.select(L.c.name).where(L.c.name == name)).first():
            return False
        try:
            with self.conn.begin_nested():
                self.conn.execute(
                    sa.insert(L).values(name=name, holder=holder, acquired_at=now, expires_at=until)
                )
        except sa.exc.IntegrityError:
            return False
        return True

    def release_lease(self, name: str, holder: str) -> None:
        self.conn.execute(sa.delete(L).where(L.c.name == name, L.c.holder == holder))

    def lease_holder(self, name: str, now: datetime) -> str | None:
        q = sa.select(L.c.holder).where(L.c.name == name, L.c.expires_at >= now)
        return self.conn.execute(q).scalar()

    # -- queue switches --------------------------------------------------------

    def paused_queues(self) -> set[str]:
        q = sa.select(Q.c.queue_name).where(Q.c.paused.is_(True))
        return {r[0] for r in self.conn.execute(q)}

    def named_queues(self) -> set[str]:
        """Queues an active profile sends its jobs to, or an operator switched,
        or a deactivated profile sent jobs to that are still to run: a queue
        of its own, no longer named, held them queued for ever."""
        profiles = sa.select(P.c.queue_name).where(P.c.is_active.is_(True)).distinct()
        named = {r[0] for r in self.conn.execute(profiles)}
        named |= {r[0] for r in self.conn.execute(sa.select(Q.c.queue_name))}
        retired = sa.select(P.c.queue_name).where(P.c.is_active.is_(False)).distinct()
        left = {r[0] for r in self.conn.execute(retired)} - named
        if left:  # (status, queue_name) leads idx_status_queue: a probe per queue
            waiting = (
                sa.select(J.c.queue_name)
                .where(J.c.status.in_(("queued", "retry_wait")), J.c.queue_name.in_(sorted(left)))
                .distinct()
            )
            named |= {r[0] for r in self.conn.execute(waiting)}
        return named

"""Queries of job retention: find finished jobs past their time, delete them
with their history, and keep the credits they had used."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from hypermedia.db.schema import job_attempts as A
from hypermedia.db.schema import job_events as E
from hypermedia.db.schema import job_outputs as O
from hypermedia.db.schema import processing_jobs as J
from hypermedia.db.schema import pruned_attempt_durations as PD
from hypermedia.db.schema_storage import variant_jobs as VJ
from hypermedia.queue import durations
from hypermedia.queue.states import TERMINAL

Row = dict[str, Any]
_DONE = sorted(TERMINAL)


def _finished_before(before: datetime) -> list[sa.ColumnElement[bool]]:
    # created_at <= updated_at always: the created_at bound lets idx_created
    # lead to the oldest jobs first; updated_at is when the job ended.
    return [J.c.created_at < before, J.c.updated_at < before, J.c.status.in_(_DONE)]


class RetentionQueries:
    conn: sa.Connection
    dialect: str

    def prunable_jobs(
        self, before: datetime, limit: int, after: tuple[datetime, int] | None = None
    ) -> list[Row]:
        """Lock up to ``limit`` jobs that ended before ``before``, oldest first
        (by ``created_at``, then ``job_id``), past ``after`` if given.

        Rows another transaction holds (an explicit retry, say) are skipped;
        the lock keeps them finished until this transaction deletes them.
        """
        q = (
            sa.select(
                J.c.job_id,
                J.c.project_id,
                J.c.status,
                J.c.idempotency_key,
                J.c.credits_folded,
                J.c.created_at,
                sa.func.coalesce(J.c.actual_credits, J.c.estimated_credits).label("credits"),
            )
            .where(*_finished_before(before))
            .order_by(J.c.created_at, J.c.job_id)
            .limit(limit)
        )
        if after is not None:
            at, job_id = after
            q = q.where(
                sa.or_(J.c.created_at > at, sa.and_(J.c.created_at == at, J.c.job_id > job_id))
            )
        if self.dialect != "sqlite":  # SQLite: the write lock is held already
            q = q.with_for_update(skip_locked=True)
        return [dict(r._mapping) for r in self.conn.execute(q)]

    def photos_with_variant_rows(self, photo_ids: Sequence[str]) -> set[str]:
        """Those of ``photo_ids`` whose variant_jobs row is still there."""
        if not photo_ids:
            return set()
        q = sa.select(VJ.c.photo_id).where(VJ.c.photo_id.in_(sorted(set(photo_ids))))
        return {r[0] for r in self.conn.execute(q)}

    def delete_jobs(self, job_ids: Sequence[int], before: datetime) -> int:
        """Delete finished jobs with their attempts, events and output rows."""
        if not job_ids:
            return 0
        ids = list(job_ids)
        for table in (E, A, O):
            self.conn.execute(sa.delete(table).where(table.c.job_id.in_(ids)))
        q = sa.delete(J).where(J.c.job_id.in_(ids), *_finished_before(before))
        gone = int(self.conn.execute(q).rowcount)
        if gone != len(ids):
            # Callers lock the rows first, so this is a bug: raising rolls
            # back the history deleted above with the jobs it belonged to.
            raise RuntimeError(f"{len(ids) - gone} of {len(ids)} jobs changed while locked")
        return gone

    def add_pruned_durations(
        self, histogram: Sequence[Row], bounds_ms: Sequence[float], now: datetime
    ) -> None:
        """Add the histogram of attempts about to be deleted (rows of
        ``attempt_duration_histogram``) to what earlier deletions left."""
        for h in histogram:
            added = {durations.key(b): int(h[f"le_{i}"]) for i, b in enumerate(bounds_ms)}
            if self._add_durations(h, added, now):
                continue
            try:
                with self.conn.begin_nested():
                    self.conn.execute(
                        sa.insert(PD).values(
                            job_type=h["job_type"],
                            attempts=int(h["count"]),
                            sum_ms=int(h["sum_ms"]),
                            buckets=added,
                            updated_at=now,
                        )
                    )
            except sa.exc.IntegrityError:  # another pruner's first row of the type
                self._add_durations(h, added, now)

    def _add_durations(self, h: Row, added: dict[str, int], now: datetime) -> bool:
        q = sa.select(PD.c.buckets).where(PD.c.job_type == h["job_type"])
        if self.dialect != "sqlite":
            q = q.with_for_update()
        row = self.conn.execute(q).first()
        if row is None:
            return False
        buckets = {k: int(v) for k, v in dict(row.buckets).items()}
        for k, n in added.items():
            buckets[k] = buckets.get(k, 0) + n
        self.conn.execute(
            sa.update(PD)
            .where(PD.c.job_type == h["job_type"])
            .values(
                attempts=PD.c.attempts + int(h["count"]),
                sum_ms=PD.c.sum_ms + int(h["sum_ms"]),
                buckets=buckets,
                updated_at=now,
            )
        )
        return True

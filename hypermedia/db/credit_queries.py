"""Queries of credits: project budgets, credit use, and the leader's fold.

A project's credit use is ``project_credits.settled_credits`` plus, over its
jobs whose credits are not folded into that counter yet: a completed job's
actual credits (its estimate if they were never recorded), a live job's
estimate, nothing for a failed or cancelled one.  Completed is final, so once
folded a job never counts again; a failed or cancelled job folds for nothing
and an explicit retry unflags it (queue/engine.py), so it holds its estimate
again while it is live.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from hypermedia.db.schema import processing_jobs as J
from hypermedia.db.schema_storage import objects as OB
from hypermedia.db.schema_storage import project_credits as PC
from hypermedia.queue.states import STATUSES, TERMINAL

Row = dict[str, Any]
# Jobs not yet terminal: they hold their estimated credits.
LIVE = frozenset(STATUSES) - TERMINAL
# "= false", not "IS false": only the former reads off idx_project.
UNFOLDED = J.c.credits_folded == sa.false()
_CREDITS = sa.func.coalesce(J.c.actual_credits, J.c.estimated_credits)
_USED = sa.func.coalesce(
    sa.func.sum(
        sa.case(
            (J.c.status == "completed", _CREDITS),
            (J.c.status.in_(sorted(LIVE)), J.c.estimated_credits),
            else_=0,
        )
    ),
    0,
)


class CreditQueries:
    conn: sa.Connection
    dialect: str

    def budget(self, project_id: str, *, lock: bool = False) -> Row | None:
        """A project's budget row; ``lock`` serialises enqueues of the project
        (SQLite: the write lock is held already).  Whatever changes the
        project's credit use outside a job row (the fold, retention) updates
        this row in its transaction, so it cannot commit between the two
        reads of ``credit_use`` while an enqueue holds the lock."""
        q = sa.select(PC).where(PC.c.project_id == project_id)
        if lock and self.dialect != "sqlite":
            q = q.with_for_update()
        row = self.conn.execute(q).first()
        return dict(row._mapping) if row else None

    def budgets(self) -> list[Row]:
        rows = self.conn.execute(sa.select(PC).order_by(PC.c.project_id))
        return [dict(r._mapping) for r in rows]

    def set_budget(self, project_id: str, credits: int | None, now: datetime) -> None:
        values = {"budget_credits": credits, "updated_at": now}
        self._upsert_credits(project_id, values, values, now)

    def add_settled_credits(self, project_id: str, credits: int, now: datetime) -> None:
        """Count ``credits`` into the project's use for good: their jobs were
        folded or deleted in this transaction."""
        if credits > 0:
            change = {"settled_credits": PC.c.settled_credits + credits, "updated_at": now}
            first = {"budget_credits": None, "settled_credits": credits, "updated_at": now}
            self._upsert_credits(project_id, change, first, now)

    def _upsert_credits(self, project_id: str, change: Row, first: Row, now: datetime) -> None:
        """Update the project's row with ``change``, or make it with ``first``."""
        q = sa.update(PC).where(PC.c.project_id == project_id).values(change)
        if self.conn.execute(q).rowcount:
            return
        try:
            with self.conn.begin_nested():
                self.conn.execute(
                    sa.insert(PC).values(project_id=project_id, created_at=now, **first)
                )
        except sa.exc.IntegrityError:  # another transaction's first row for the project
            self.conn.execute(q)

    def credit_use(self, project_id: str) -> int:
        q = sa.select(_USED).where(J.c.project_id == project_id, UNFOLDED)
        settled = sa.select(PC.c.settled_credits).where(PC.c.project_id == project_id)
        unfolded = int(self.conn.execute(q).scalar_one())
        return unfolded + int(self.conn.execute(settled).scalar() or 0)

    def project_has_jobs(self, project_id: str) -> bool:
        q = sa.select(J.c.job_id).where(J.c.project_id == project_id).limit(1)
        return self.conn.execute(q).first() is not None

    def project_has_objects(self, project_id: str) -> bool:
        """Whether the project stored anything.  No index leads with the
        project: the first match ends the scan, a project with none reads
        every row (an admin's one-off check, asked last)."""
        q = sa.select(OB.c.object_id).where(OB.c.project_id == project_id).limit(1)
        return self.conn.execute(q).first() is not None

    def credit_use_by_project(self) -> dict[str, int]:
        q = sa.select(J.c.project_id, _USED).where(UNFOLDED).group_by(J.c.project_id)
        if self.dialect == "mysql":
            # MariaDB grouped by walking a whole index in project order and
            # reading every job's row (50 s at a million jobs, 7% unfolded):
            # here each project's unfolded jobs are found through idx_project
            # (5 s cold, against 3 ms per project).
            projects = sa.select(J.c.project_id).distinct().subquery("projects")
            joined = projects.join(J, sa.and_(J.c.project_id == projects.c.project_id, UNFOLDED))
            q = sa.select(J.c.project_id, _USED).select_from(joined).group_by(J.c.project_id)
        used = {r[0]: int(r[1]) for r in self.conn.execute(q)}
        settled = sa.select(PC.c.project_id, PC.c.settled_credits).where(PC.c.settled_credits > 0)
        for project_id, credits in self.conn.execute(settled):
            used[project_id] = used.get(project_id, 0) + int(credits)
        return used

    # -- the fold (scheduler/credits.py) --------------------------------------

    def budgeted_projects(self) -> list[str]:
        q = sa.select(PC.c.project_id).where(PC.c.budget_credits.is_not(None))
        return [r[0] for r in self.conn.execute(q.order_by(PC.c.project_id))]

    def foldable_jobs(self, project_id: str, after: int, limit: int) -> list[Row]:
        """Lock up to ``limit`` of the project's finished jobs not folded yet,
        by job id from ``after`` on (idx_project's order: a run walks the
        index once instead of scanning past what it folded); rows another
        transaction holds (an explicit retry, say) are skipped."""
        q = (
            sa.select(J.c.job_id, J.c.status, _CREDITS.label("credits"))
            .where(
                J.c.project_id == project_id,
                UNFOLDED,
                J.c.job_id > after,
                J.c.status.in_(sorted(TERMINAL)),
            )
            .order_by(J.c.job_id)
            .limit(limit)
        )
        if self.dialect != "sqlite":  # SQLite: the write lock is held already
            q = q.with_for_update(skip_locked=True)
        return [dict(r._mapping) for r in self.conn.execute(q)]

    def mark_folded(self, job_ids: Sequence[int]) -> int:
        if not job_ids:
            return 0
        q = (
            sa.update(J)
            .where(J.c.job_id.in_(list(job_ids)), UNFOLDED, J.c.status.in_(sorted(TERMINAL)))
            .values(credits_folded=True)
        )
        return int(self.conn.execute(q).rowcount)

"""What a user does to a job (seed 001's methods: release, cancel, retry,
``can_retry``, ``duration``) and how it is read.  Part of the engine
(``Engine`` inherits it): each action is one guarded transition with its
event, in one transaction, as every state change is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from hypermedia.db.driver import Driver
from hypermedia.errors import InvalidRequest, NotFound, StaleTransition
from hypermedia.queue import states
from hypermedia.queue.enqueue import check_budgets
from hypermedia.queue.events import event
from hypermedia.queue.models import QUEUE_NAME, check_queue_name

Row = dict[str, Any]


class UserActions:
    db: Driver
    clock: Callable[[], datetime]
    _priced: Callable[[Any, int], tuple[str, Any]]  # the engine's: a version's "key:vN"

    def release(self, job_id: int, actor: str | None = None) -> None:
        """created → queued."""
        self._move(job_id, "release", {}, actor, "released")

    def cancel(self, job_id: int, actor: str | None = None) -> str:
        """Cancel: waiting jobs at once; running ones are asked to stop. Returns the new status."""
        with self.db.tx() as tx:
            return self.cancel_in(tx, job_id, actor)

    def cancel_in(self, tx: Any, job_id: int, actor: str | None = None) -> str:
        """``cancel`` inside ``tx``, the job row locked until it commits (a
        photo's delete stops its variant jobs in its own transaction)."""
        now = self.clock()
        job = _locked_job(tx, job_id)
        status = job["status"]
        if status == "cancel_requested":
            return status
        if status in states.sources("cancel"):
            values = {  # as settle.CANCELLED: no error code left from an earlier attempt
                "error_code": None,
                "outcome": "cancelled",
                "category": "cancellation",
                "retryable": False,  # as settle.CANCELLED
                "safe_reason": "cancelled by request",
                "completed_at": now,
            }
            self._guarded(tx, job, "cancel", values, actor, "cancelled by request")
            return "cancelled"
        if status in states.sources("request_cancel"):
            self._guarded(tx, job, "request_cancel", {}, actor, "cancel requested")
            return "cancel_requested"
        raise StaleTransition(job_id, "cancel", status)

    def retry(self, job_id: int, actor: str | None = None) -> None:
        """failed/cancelled → queued as a new attempt; earlier attempts stay in history."""
        now = self.clock()
        with self.db.tx() as tx:
            job = _locked_job(tx, job_id)
            values = {
                "max_attempts": max(job["max_attempts"], job["attempt_count"] + 1),
                "outcome": None,
                "category": None,
                "retryable": None,
                "error_code": None,
                "safe_reason": None,
                "completed_at": None,
                # The last attempt's, not this one's: a retry cancelled before
                # it ran had a duration from that attempt's start to its cancel.
                "started_at": None,
                "claimed_at": None,
                "claimed_by": None,
                "available_at": now,
                "visibility_timeout": None,
                "credits_folded": False,  # back among the rows credit use sums
                # The new attempt starts from nothing (the last one's 100 %
                # stayed shown, as in a retry_wait, through the next attempt).
                "progress": None,
            }
            if job["status"] in states.sources("retry"):
                # Live again, it needs its input (GC collects the inputs of
                # finished jobs) and holds its estimate: as an enqueue.
                _input_still_there(tx, job)
                check_budgets(tx, [job])
            self._guarded(tx, job, "retry", values, actor, "retried by request")
            tx.notify({job["queue_name"]})

    def _move(self, job_id: int, action: str, values: Row, actor: str | None, msg: str) -> None:
        with self.db.tx() as tx:
            job = _locked_job(tx, job_id)
            self._guarded(tx, job, action, values, actor, msg)
            if states.target(action) == "queued":
                tx.notify({job["queue_name"]})

    def _guarded(
        self, tx: Any, job: Row, action: str, values: Row, actor: str | None, msg: str
    ) -> None:
        now = self.clock()
        dst = states.target(action)
        full = {"status": dst, "updated_at": now, "updated_by": actor, **values}
        if not tx.update_job(job["job_id"], states.sources(action), full):
            raise StaleTransition(job["job_id"], action, job["status"])
        tx.insert_events(
            [
                event(
                    job["job_id"],
                    now,
                    job["status"],
                    dst,
                    actor=actor,
                    message=msg,
                    attempt_number=job["attempt_count"] or None,
                )
            ]
        )

    def can_retry(self, job: Row) -> bool:
        return job["status"] in states.sources("retry")

    @staticmethod
    def duration(job: Row) -> timedelta | None:
        if job.get("started_at") and job.get("completed_at"):
            return job["completed_at"] - job["started_at"]
        return None

    # -- reading -----------------------------------------------------------------

    def get(self, job_id: int, *, project_id: str | None = None) -> Row:
        """The job with its attempts, events and outputs.  ``project_id``:
        another project's job is not found, and found out before anything else
        is read (its whole read took longer than a missing job's 404)."""
        with self.db.read() as tx:
            job = tx.job(job_id)
            if job is None or project_id not in (None, job["project_id"]):
                raise NotFound(f"job {job_id} not found")
            job["attempts"] = tx.attempts(job_id)
            job["events"] = tx.events(job_id)
            job["outputs"] = tx.outputs(job_id)
            # And only while its input is there: a retry of a job whose input
            # GC collected is refused (422), so it said true for nothing.
            retry = self.can_retry(job) and _input_ready(tx, job)
            # The version as people name it ("image-thumbnail:v2"), beside its id.
            job["profile"] = (
                None if job["profile_id"] is None else self._priced(tx, job["profile_id"])[0]
            )
        job["legacy_status"] = states.legacy_status(job["status"], job["started_at"])
        job["can_retry"] = retry
        return job

    def recent_failures(self, project_id: str, limit: int = 10) -> list[Row]:
        with self.db.read() as tx:
            return tx.recent_failures(project_id, limit)

    def list(self, **filters: Any) -> list[Row]:
        status = filters.get("status")
        if status is not None and status not in states.STATUSES:
            raise InvalidRequest(f"status must be one of {', '.join(states.STATUSES)}")
        # A filter no job could match is a mistake in it, said (the API's 422).
        if filters.get("queue") is not None:
            check_queue_name(filters["queue"])
        job_type = filters.get("job_type")
        if job_type is not None and not QUEUE_NAME.fullmatch(job_type):  # the same characters
            raise InvalidRequest(
                "a job type has 1 to 50 characters: lower-case letters, digits, '.', '_', '-'"
            )
        with self.db.read() as tx:
            return list(tx.jobs(**filters))

    def row(self, job_id: int) -> Row:
        """The job's own row, without its attempts, events or outputs: what an
        ownership check (and a job type's) needs, in one query."""
        with self.db.read() as tx:
            job = tx.job(job_id)
        if job is None:
            raise NotFound(f"job {job_id} not found")
        return job

    def events_since(self, job_id: int, after_id: int = 0) -> tuple[str, Sequence[Row]]:
        """The job's status, then its events after ``after_id``.

        Status first: if it is terminal, the events read next include the one
        that made it so, so a follower that sees both can stop.
        """
        with self.db.read() as tx:
            job = tx.job(job_id)
            if job is None:
                raise NotFound(f"job {job_id} not found")
            return job["status"], tx.events(job_id, after_id)


def _input_ready(tx: Any, job: Row) -> bool:
    if job["object_id"] is None:
        return True
    obj = tx.object(job["object_id"])
    return obj is not None and obj["state"] == "ready"


def _input_still_there(tx: Any, job: Row) -> None:
    """Locked like an enqueue's input, so GC cannot mark it meanwhile (gc.py)."""
    if job["object_id"] is None:
        return
    obj = tx.object(job["object_id"], lock=True)
    if obj is None or obj["state"] != "ready":
        # Wrong in itself, as an enqueue naming that object is: no retry of
        # this job can ever succeed (the CLI's exit 2, the API's 422).
        raise InvalidRequest(
            f"job {job['job_id']}'s input object {job['object_id']} no longer exists "
            "(collected after the job ended): upload the file again for a new job"
        )


def _locked_job(tx: Any, job_id: int) -> Row:
    job = tx.job(job_id, lock=True)
    if job is None:
        raise NotFound(f"job {job_id} not found")
    return dict(job)

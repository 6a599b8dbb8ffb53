"""Seed 001's ProcessingJob, as a view over our jobs (the ``/v0`` API uses it).

The mapping (documented for users in ``api/routes/v0.py`` and
docs/operations.md): ``id`` is ``job_uuid``, ``file_id`` is ``object_id``,
job types and statuses are renamed, priority is flipped (seed: higher is more
important, 0 by default; ours: 1 highest … 10 lowest, 5 by default), and
``max_retries``/``retry_count`` count attempts after the first.
"""

from __future__ import annotations

import uuid
from typing import Any

from hypermedia.errors import InvalidRequest, NotFound
from hypermedia.queue import states
from hypermedia.queue.engine import Engine

Row = dict[str, Any]

# Seed 001 job type -> ours.  video_thumbnail has no pipeline here: the engine
# refuses it as an unknown job type, and would run it once one is registered.
JOB_TYPES: dict[str, str] = {
    "thumbnail_generation": "image.thumbnail",
    "video_thumbnail": "video.thumbnail",
    "document_preview": "pdf.preview",
    "compression": "image.compress",
    "virus_scan": "security.virus_scan",
    "deduplication_check": "storage.dedup_check",
}
SEED_TYPE = {ours: seed for seed, ours in JOB_TYPES.items()}
SEED_STATUSES = ("pending", "running", "completed", "failed", "cancelled")
# Seed priority 0 (its default) is our 5 (ours); each step up is one more important.
PRIORITY_ZERO = 5


def to_priority(seed: int) -> int:
    """Seed priority (higher = more important) -> ours (1 highest … 10 lowest), clamped."""
    return min(10, max(1, PRIORITY_ZERO - seed))


def from_priority(ours: int) -> int:
    return PRIORITY_ZERO - ours


def statuses_for(seed_status: str) -> Row:
    """The filter of ``Tx.jobs_in`` for the jobs the seed shows as
    ``seed_status`` (``seed_status()``'s rule: a running status without
    started_at is pending), as its keyword arguments."""
    if seed_status not in SEED_STATUSES:
        raise InvalidRequest(f"status must be one of {', '.join(SEED_STATUSES)}")
    named = sorted(s for s, legacy in states.LEGACY_STATUS.items() if legacy == seed_status)
    running = sorted(s for s, legacy in states.LEGACY_STATUS.items() if legacy == "running")
    if seed_status == "running":
        return {"statuses": named, "started_only": True}
    if seed_status == "pending":
        return {"statuses": named, "unstarted": running}
    return {"statuses": named}


def our_job_type(seed_type: str) -> str:
    if seed_type not in JOB_TYPES:
        raise InvalidRequest(f"job_type must be one of {', '.join(JOB_TYPES)}")
    return JOB_TYPES[seed_type]


def seed_status(row: Row) -> str:
    """The seed's status of one of our rows.  Seed 001 holds running ⇒
    started_at: a cancel asked of a job claimed but never started
    (cancel_requested, no started_at) is still pending there."""
    return states.legacy_status(row["status"], row["started_at"])


def processing_job(row: Row) -> Row:
    """One of our job rows in seed 001's ProcessingJob shape (and nothing else)."""
    return {
        "id": row["job_uuid"],
        "file_id": row["object_id"],
        "job_type": SEED_TYPE[row["job_type"]],
        "status": seed_status(row),
        "priority": from_priority(int(row["priority"])),
        "input_data": row["params"],
        "result_data": row["result"],
        # The last error's user-safe reason; a cancel is not an error.
        "error_message": row["safe_reason"] if row["error_code"] else None,
        "started_at": row["started_at"],
        "completed_at": row["completed_at"],
        "retry_count": max(0, int(row["attempt_count"]) - 1),
        "max_retries": int(row["max_attempts"]) - 1,
        "metadata": {
            "created_at": row["created_at"],
            "updated_at": row["updated_at"],
            "deleted_at": row["deleted_at"],
            "created_by": row["created_by"],
            "updated_by": row["updated_by"],
            "deleted_by": row["deleted_by"],
        },
    }


class LegacyJobs:
    """Finding and listing jobs the seed-001 way; changes go through the Engine."""

    def __init__(self, engine: Engine) -> None:
        self.db = engine.db

    def find(self, job_uuid: str, project_id: str) -> Row:
        """The job row by uuid; another project's job, or one of a type the seed
        cannot name, is not found."""
        try:  # uuid text is case-insensitive (RFC 9562); ours are stored lower-case
            canonical = str(uuid.UUID(job_uuid))
        except ValueError:
            raise NotFound("processing job not found: its id is not a uuid") from None
        with self.db.read() as tx:
            job_id = tx.job_id_by_uuid(canonical)
            row = None if job_id is None else tx.job(job_id)
        if row is None or row["project_id"] != project_id or row["job_type"] not in SEED_TYPE:
            raise NotFound(f"processing job {canonical} not found")
        return row

    def list(
        self,
        project_id: str,
        *,
        status: str | None = None,
        job_type: str | None = None,
        file_id: int | None = None,
        before_id: int | None = None,
        limit: int = 50,
    ) -> list[Row]:
        with self.db.read() as tx:
            return tx.jobs_in(
                project_id,
                **(statuses_for(status) if status else {}),
                job_types=[our_job_type(job_type)] if job_type else sorted(SEED_TYPE),
                object_id=file_id,
                before_id=before_id,
                limit=limit,
            )

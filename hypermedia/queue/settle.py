"""How an attempt's result turns into the job's next state (pure, no I/O).

Completed → completed.  A job whose cancel was requested ends cancelled
whatever the attempt did (unless it completed).  A failure consults the
error-code policy: retryable codes with attempts left go to ``retry_wait``
with backoff, everything else fails for good with its outcome and category.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from hypermedia.config import Settings
from hypermedia.errors import policy_for
from hypermedia.queue.backoff import retry_delay
from hypermedia.queue.models import AttemptResult
from hypermedia.redact import redact

Row = dict[str, Any]

# The error code an attempt status implies when the worker gave none.
IMPLIED_CODE = {"timeout": "TIMEOUT", "crashed": "CRASHED", "orphaned": "ORPHANED"}


@dataclass
class Decision:
    """One transition of one job, decided from the job as it was seen."""

    job_id: int
    attempt: int
    seen: str  # the status decided from: the write is guarded by it
    action: str
    job_values: Row
    attempt_values: Row
    event: Row
    outputs: list[Row] = field(default_factory=list)
    # On completion: what the job found out about its input object (pages,
    # duration_ms, width, height), written to that object with the completion.
    input_facts: Row = field(default_factory=dict)
    object_id: int | None = None


def decide(
    job: Row,
    res: AttemptResult,
    now: datetime,
    settings: Settings,
    rng: random.Random,
    credits: int | None = None,
) -> Decision:
    """What ``res`` does to ``job``; ``credits`` prices a completion that
    reported no ``actual_credits`` of its own."""
    code = res.code or IMPLIED_CODE.get(res.status)
    if res.status == "completed":
        code = None
    reason = redact(res.message) if res.message else None
    attempt_values = {
        "job_id": res.job_id,
        "attempt_number": res.attempt,
        "status": res.status,
        "error_code": code,
        "error_message": redact(res.message, 2000) if res.message else None,
        "finished_at": now,
        "duration_ms": res.duration_ms,
        "peak_memory_mb": res.peak_memory_mb,
        "cpu_time_ms": res.cpu_time_ms,
    }
    base = {"updated_at": now, "visibility_timeout": None, "error_code": code}
    # A worker's held view of the row (PostgreSQL's batch path) has no
    # started_at: its status says whether the start was written.
    unstarted = job["status"] == "claimed" or job.get("started_at", False) is None
    if unstarted and res.duration_ms is not None:
        # The worker folded this attempt's start into its result (it finished
        # before the start was written; or a cancel, asked meanwhile, refused
        # the start): record when it really began.
        base["started_at"] = now - timedelta(milliseconds=res.duration_ms)
    if res.status == "completed":
        action, message = "complete", "attempt completed"
        values = {**base, **_completed(res, now, credits)}
    elif job["status"] == "cancel_requested":
        action, message = "confirm_cancel", "attempt stopped: cancelled by request"
        values = {**base, **CANCELLED, "completed_at": now}
    else:
        given = _given_back(job, res)
        seen = {**job, "max_attempts": job["max_attempts"] + 1} if given else job
        why = code or "INTERNAL"
        action, values, message = _failure(seen, res, why, reason, now, settings, rng)
        if given and action == "retry_later":
            values["max_attempts"] = seen["max_attempts"]
            message += " (it never started: the attempt is not charged)"
        values = {**base, **values}
    ev = {
        "job_id": res.job_id,
        # A cancel the user asked for is no error, however the attempt ended.
        "kind": "error" if action in ("fail", "retry_later") else "event",
        "from_status": job["status"],
        "to_status": values["status"],
        "attempt_number": res.attempt,
        "code": code,
        "message": redact(message, 1000),
        "actor": res.actor or res.worker_id or job.get("claimed_by"),
        "created_at": now,
    }
    outputs = _output_rows(res, now) if action == "complete" else []
    return Decision(
        res.job_id, res.attempt, job["status"], action, values, attempt_values, ev, outputs
    )


# Attempts given back stop here: a job that kills its worker within the
# start's write delay every time (an exploit) runs no more than this.
MAX_GIVEN_BACK_ATTEMPTS = 100


def _given_back(job: Row, res: AttemptResult) -> bool:
    """Whether the reaper ends an attempt whose start was never written: its
    worker died (``kill -9``) with the job claimed ahead in its buffer, or at
    most the start's write delay (worker/flusher.py) after starting it.
    Charged, such jobs lost an attempt each, and one on its last attempt
    failed ORPHANED without running; the job gets it back (its max_attempts
    grows by one), up to MAX_GIVEN_BACK_ATTEMPTS."""
    return (
        res.status == "orphaned"
        and res.actor == "reaper"
        and job["status"] == "claimed"
        and job["max_attempts"] < MAX_GIVEN_BACK_ATTEMPTS
    )


# What a cancel the user asked for leaves on the job row, however its attempt
# ended (killed: ORPHANED, CRASHED; the attempt row keeps that): no error code,
# as when the worker confirms it (/v0 shows an error_message for an error code).
CANCELLED = {
    "error_code": None,
    "status": "cancelled",
    "outcome": "cancelled",
    "category": "cancellation",
    # Whether the engine retries it by itself (as of a failure's code): never
    # a cancelled job (true said "retried", as of no failure); `can_retry`
    # says an explicit retry may run it again.
    "retryable": False,
    "safe_reason": "cancelled by request",
}


def _completed(res: AttemptResult, now: datetime, credits: int | None) -> dict[str, Any]:
    return {
        "status": "completed",
        "outcome": "completed",
        "category": None,
        "retryable": False,
        "safe_reason": None,
        "completed_at": now,
        "result": res.result,
        "actual_credits": credits if res.actual_credits is None else res.actual_credits,
    }


def _output_rows(res: AttemptResult, now: datetime) -> list[dict[str, Any]]:
    """``job_outputs`` rows, plus what the output's object row takes."""
    return [
        {
            "job_id": res.job_id,
            "output_type": o.output_type,
            "object_id": o.object_id,
            "output_key": o.output_key,
            "output_size_bytes": o.output_size_bytes,
            "mime_type": o.mime_type,
            "metadata": o.metadata,
            "profile_version": o.profile_version,
            "created_at": now,
            # For the object, not job_outputs columns:
            "checksum": o.checksum,
            "width": o.width or _dimension(o.metadata, "width"),
            "height": o.height or _dimension(o.metadata, "height"),
        }
        for o in res.outputs
    ]


def _dimension(metadata: Any, key: str) -> int:
    """An output's size as its pipeline reported it, where sniffing its header
    found none (AVIF, TIFF): checked, since a child's word is not trusted."""
    value = metadata.get(key) if isinstance(metadata, dict) else None
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**31
    return int(value) if ok else 0  # type: ignore[arg-type]


def _failure(
    job: Row,
    res: AttemptResult,
    code: str,
    reason: str | None,
    now: datetime,
    settings: Settings,
    rng: random.Random,
) -> tuple[str, Row, str]:
    pol = policy_for(code)
    safe = reason or code.lower().replace("_", " ")
    common = {"category": pol.category, "safe_reason": safe}
    # What the attempt had: a worker gives no attempt more than its own
    # machine's ceiling, whatever a retry on a bigger one asked for.
    memory = min(job.get("memory_limit_mb") or settings.child_memory_mb, settings.memory_ceiling_mb)
    # An attempt that ran out of memory is retried with more, up to the
    # ceiling: one that had the most a retry may get would fail the same way.
    grows = pol.memory_factor != 1.0
    spent = grows and memory >= settings.memory_ceiling_mb
    again = pol.retry_once and job.get("error_code") == code
    if pol.retryable and job["attempt_count"] < job["max_attempts"] and not (spent or again):
        base = settings.backoff_base_seconds * pol.backoff_factor
        delay = retry_delay(job["attempt_count"], base, settings.backoff_max_seconds, rng)
        values: Row = {
            **common,
            "status": "retry_wait",
            "available_at": now + timedelta(seconds=delay),
            "retryable": True,
            # The next attempt starts from nothing: the last one's bar (100 %
            # at its final step) was shown while the job waited.  A job that
            # fails for good keeps where it stopped.
            "progress": None,
            # Nobody holds it while it waits (the attempt rows keep who ran
            # what): a waiting job named its last worker and start, as an
            # explicit retry no longer does.
            "claimed_by": None,
            "claimed_at": None,
            "started_at": None,
        }
        if grows:
            grown = int(memory * pol.memory_factor)
            values["memory_limit_mb"] = min(grown, settings.memory_ceiling_mb)
        return "retry_later", values, f"{code}: {safe}; retry in {delay:.1f}s"
    values = {
        **common,
        "status": "failed",
        "outcome": pol.outcome,
        "retryable": pol.retryable,
        "completed_at": now,
    }
    if spent:
        why = f"it had {memory} MB, the most an attempt may get"
    elif again:
        why = "the attempt before it ended so too"
    else:
        why = "no attempts left" if pol.retryable else "permanent error"
    return "fail", values, f"{code}: {safe} ({why})"

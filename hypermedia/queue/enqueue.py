"""Enqueueing: new jobs validated, priced, checked against their project's
budget and written with their first event, in the caller's transaction or
their own.  Part of the engine (``Engine`` inherits it): these are the state
changes that create a job.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from hypermedia.db.driver import Driver
from hypermedia.errors import Conflict, IdempotencyConflict, InvalidRequest, JobError, Refused
from hypermedia.pipelines import registry
from hypermedia.queue import profiles as pricing
from hypermedia.queue.events import event
from hypermedia.queue.models import (
    MAX_TIMEOUT_SECONDS,
    NewJob,
    check_idempotency_key,
    check_params,
    check_project_id,
    check_queue_name,
)

Row = dict[str, Any]


class Enqueuing:
    db: Driver
    clock: Callable[[], datetime]

    def enqueue(self, job: NewJob) -> int:
        """Create one job; with an idempotency key, a repeat returns the first job."""
        try:
            with self.db.tx() as tx:
                return self.enqueue_in(tx, [job])[0]
        except (Conflict, Refused):
            if job.idempotency_key is None:
                raise
            # Fix: a concurrent enqueue with the same key committed between our
            # lookup and our insert (the unique key refused ours), or while we
            # waited for the project's budget lock (the budget, counting its
            # job, refused ours: "credit budget exceeded" to a repeat of a
            # request that had been accepted).  Its job is the answer, exactly
            # as if it had been found up front.
            with self.db.read() as tx:
                found = tx.job_by_idempotency_key(job.project_id, job.idempotency_key)
                if found is None:
                    raise
                if not self._repeats(tx, found, job):
                    raise IdempotencyConflict(
                        "this Idempotency-Key was already used for a different request"
                    ) from None
            return int(found["job_id"])

    def enqueue_many(self, jobs: Sequence[NewJob], chunk: int = 1000) -> list[int]:
        """Create many jobs in one transaction, all or none; ids in the order given.

        Written ``chunk`` jobs at a time, so a million jobs do not sit in
        memory at once.  Each chunk's credits are checked against the budget
        as read under the lock the first chunk took, plus the chunks before
        it: one check of the whole batch, which a budget refuses whole (it
        used to be one transaction per 1000 jobs, and a refusal left the
        first thousands queued behind an error).
        """
        if not jobs:
            return []
        with self.db.tx() as tx:
            ids: list[int] = []
            held: dict[str, list[Any]] = {}
            # One reading of each profile for the whole request: read again
            # per chunk, a version deactivated or created meanwhile (READ
            # COMMITTED) split one `--count N` between two versions.
            profiles: dict[str, Row] = {}
            for start in range(0, len(jobs), chunk):
                more = start + chunk < len(jobs)
                part = jobs[start : start + chunk]
                ids += self.enqueue_in(tx, part, held=held, more=more, profiles=profiles)
            return ids

    def enqueue_in(
        self,
        tx: Any,
        jobs: Sequence[NewJob],
        *,
        held: dict[str, list[Any]] | None = None,
        more: bool = False,
        profiles: dict[str, Row] | None = None,
    ) -> list[int]:
        """``enqueue_many`` inside the caller's transaction: the jobs commit with its other writes.

        A job whose idempotency key was used before answers with the first job
        (IdempotencyConflict if that one asked for something else).  Every new
        job is validated before anything is written.  A concurrent enqueue of
        the same key raises Conflict: the caller's transaction must roll back.
        ``held``: budgets this transaction checked already (see ``check_budgets``);
        ``more``: jobs of the same request come in later chunks; ``profiles``:
        the profiles its earlier chunks read, by reference.
        """
        profiles = {} if profiles is None else profiles
        found: dict[int, int] = {}
        built: list[tuple[int, Row, str]] = []
        for i, j in enumerate(jobs):
            if j.idempotency_key is not None:
                check_idempotency_key(j.idempotency_key)
                prior = tx.job_by_idempotency_key(j.project_id, j.idempotency_key)
                if prior is not None:
                    if not self._repeats(tx, prior, j):
                        raise IdempotencyConflict(
                            "this Idempotency-Key was already used for a different request"
                        )
                    found[i] = int(prior["job_id"])
                    continue
            built.append((i, *self._new_row(tx, j, profiles)))
        check_budgets(tx, [r for _, r, _ in built], held, more=more)
        ids = tx.insert_jobs([r for _, r, _ in built])
        tx.insert_events(
            [
                event(
                    ids[r["job_uuid"]],
                    r["created_at"],
                    None,
                    r["status"],
                    message=msg,
                    actor=r["created_by"],
                )
                for _, r, msg in built
            ]
        )
        tx.notify({r["queue_name"] for _, r, _ in built if r["status"] == "queued"})
        found.update({i: ids[r["job_uuid"]] for i, r, _ in built})
        return [found[i] for i in range(len(jobs))]

    def _repeats(self, tx: Any, prior: Row, job: NewJob) -> bool:
        """Whether ``job`` asks for what ``prior`` is.  Stored params are validated
        ones (profile defaults filled in): validate the request's params against
        the prior job's profile before comparing."""
        profile = tx.profile_by_id(prior["profile_id"]) or {}
        # Fix: the profile is part of the request.  Another profile (or another
        # pinned version) is another request, even with the same params: it
        # has its own settings and prices.  ``KEY`` unpinned repeats a job made
        # with any version of KEY: newer versions may have come since.
        if not _same_profile(profile, job):
            return False
        if _same_request(prior, job):
            return True
        try:
            settings = dict(profile.get("settings") or {})
            params = registry.get(job.job_type).validate(dict(job.params), settings)
        except JobError:
            return False
        return _same_request(prior, replace(job, params=params))

    def _new_row(
        self, tx: Any, job: NewJob, profiles: dict[str, Row] | None = None
    ) -> tuple[Row, str]:
        try:
            pipeline = registry.get(job.job_type)
        except JobError as exc:
            # Fix: an unknown job type is a bad request, not a pipeline failure;
            # callers (API, CLI) map InvalidRequest to a 4xx, JobError to nothing.
            raise InvalidRequest(exc.reason) from None
        profile = self._profile(tx, job, {} if profiles is None else profiles)
        if profile["job_type"] != job.job_type:
            raise InvalidRequest(
                f"profile {profile['profile_key']} is for {profile['job_type']}, not {job.job_type}"
            )
        check_params(job.params)
        try:
            params = pipeline.validate(dict(job.params), dict(profile["settings"] or {}))
        except JobError as exc:
            raise InvalidRequest(exc.reason) from None
        if not 1 <= job.priority <= 10:
            raise InvalidRequest("priority must be from 1 (highest) to 10 (lowest)")
        if not 1 <= job.max_attempts <= 100:
            raise InvalidRequest("max_attempts must be from 1 to 100")
        if job.timeout_seconds is not None and not 1 <= job.timeout_seconds <= MAX_TIMEOUT_SECONDS:
            raise InvalidRequest(f"timeout_seconds must be from 1 to {MAX_TIMEOUT_SECONDS}")
        if job.queue is not None:
            check_queue_name(job.queue)
        check_project_id(job.project_id)
        pool_id, input_key, input_size = job.pool_id, job.input_key, job.input_size_bytes
        pages = duration_ms = None
        if job.object_id is None and pipeline.needs_input:
            raise InvalidRequest(f"{job.job_type} needs an input object (object_id)")
        if job.object_id is not None:
            obj = _input_object(tx, job.object_id, job.project_id)
            pool_id, input_key, input_size = obj["pool_id"], obj["storage_key"], obj["size"]
            pages, duration_ms = obj.get("pages"), obj.get("duration_ms")
        if pipeline.pages is not None:
            pages = pipeline.pages(params, pages)
        if input_size > profile["max_input_bytes"]:
            raise InvalidRequest(
                f"the input is larger than profile {pricing.ref_of(profile)} accepts "
                f"({input_size} bytes; at most {profile['max_input_bytes']})"
            )
        now = self.clock()
        status = "created" if job.hold else "queued"
        row = {
            "job_uuid": str(uuid.uuid4()),
            "object_id": job.object_id,
            "pool_id": pool_id,
            "owner_id": job.owner_id,
            "project_id": job.project_id,
            "job_type": job.job_type,
            "queue_name": job.queue or profile["queue_name"],
            "priority": job.priority,
            "status": status,
            "profile_id": profile["profile_id"],
            "params": params,
            "input_key": input_key,
            "input_size_bytes": input_size,
            "estimated_credits": pricing.estimate(
                pricing.Prices.of(profile), input_size, pages, duration_ms
            ),
            "max_attempts": job.max_attempts,
            "attempt_count": 0,
            "timeout_seconds": job.timeout_seconds or profile["timeout_seconds"],
            "available_at": job.run_at or now,
            "idempotency_key": job.idempotency_key,
            "created_by": job.created_by,
            "updated_by": job.created_by,
            "created_at": now,
            "updated_at": now,
        }
        return row, f"{job.job_type} {status} with profile {profile['profile_key']}:" + str(
            profile["profile_version"]
        )

    def _profile(self, tx: Any, job: NewJob, seen: dict[str, Row]) -> Row:
        """The job's profile; ``seen`` caches lookups within one enqueue batch."""
        ref = job.profile or registry.get(job.job_type).profile_key
        if ref in seen:
            return seen[ref]
        # Fix: the one reference rule (KEY or KEY:vN), as everywhere else: a
        # bare "KEY:" was read as KEY, " KEY" as no profile at all.
        key, version = pricing.parse_ref(ref)
        profile = tx.profile(key, version)
        # Fix: tx.profile returns an explicitly named version even when it was
        # deactivated; seed 000 deactivates versions "to prevent new jobs from
        # using them", so a pinned inactive version is refused too.
        if profile is None or not profile["is_active"]:
            if profile is not None:
                raise InvalidRequest(f"profile {ref} is deactivated: new jobs cannot use it")
            if not version and tx.has_profile_key(key):
                raise InvalidRequest(
                    f"profile {key} has no active version: every version is deactivated"
                )
            raise InvalidRequest(f"no profile {ref}")  # the words of Profiles.show
        seen[ref] = dict(profile)
        return seen[ref]


def _input_object(tx: Any, object_id: int, project_id: str) -> Row:
    """The job's input, locked so GC cannot mark it while the job is being created.

    Another project's object answers like a missing one: nothing to probe.
    """
    obj = tx.object(object_id, lock=True)
    if obj is None or obj["project_id"] != project_id:
        raise InvalidRequest(f"object {object_id} does not exist")
    if obj["state"] != "ready":
        raise InvalidRequest(f"object {object_id} is {obj['state']}, not ready")
    return dict(obj)


def _same_profile(profile: Row, job: NewJob) -> bool:
    """Whether ``job`` names the profile a prior job was made with."""
    try:
        ref = job.profile or registry.get(job.job_type).profile_key
        key, version = pricing.parse_ref(ref)
    except (JobError, InvalidRequest):
        return False
    return profile.get("profile_key") == key and version in (None, profile.get("profile_version"))


def _same_request(found: Row, job: NewJob) -> bool:
    return (
        found["job_type"] == job.job_type
        and (found["params"] or {}) == (job.params or {})
        and found["priority"] == job.priority
        and (job.queue is None or found["queue_name"] == job.queue)
        and found["object_id"] == job.object_id
        and _same_attempts(found, job.max_attempts)
        # None: the profile's, whatever it was; a number must be the one kept.
        and (job.timeout_seconds is None or found["timeout_seconds"] == job.timeout_seconds)
    )


def _same_attempts(found: Row, asked: int) -> bool:
    """Whether ``found`` was made with ``asked`` attempts.  Its max_attempts
    only ever grows with attempts made: an explicit retry raises it to the
    attempt count + 1, and the reaper by one for each attempt it gives back
    unstarted (settle.py), each of which was claimed, so counted.  A job
    grown so still answers the request that made it (one given back was
    refused as "a different request"); one asking for more than it holds,
    or for fewer than its growth allows, is another request."""
    kept = int(found["max_attempts"])
    return kept == asked or (asked < kept <= asked + int(found["attempt_count"]))


def check_budgets(
    tx: Any, rows: Sequence[Row], held: dict[str, list[Any]] | None = None, *, more: bool = False
) -> None:
    """Refuse new jobs that would take a project past its credit budget.

    The project's budget row is locked first, so concurrent enqueues of
    one project take turns: each one counts the jobs the others committed
    (READ COMMITTED sees them once the lock is granted; SQLite holds the
    write lock already).  Free jobs are never refused, and lock nothing.

    ``held`` (project -> [limit, used, needed so far]) carries what this
    transaction read under the lock to its next check: a batch written in
    chunks is checked as a whole, without summing the project's jobs again
    (and again over the chunks it wrote) for every chunk.  A refusal says
    "or more" when chunks of the request come after this one (``more``):
    only then is the figure, this chunk's and those before it, not the
    whole request's.
    """
    needs: dict[str, int] = {}
    for r in rows:
        needs[r["project_id"]] = needs.get(r["project_id"], 0) + r["estimated_credits"]
    for project_id in sorted(p for p, n in needs.items() if n > 0):
        known = None if held is None else held.get(project_id)
        if known is None:
            budget = tx.budget(project_id, lock=True)
            if budget is None or budget["budget_credits"] is None:
                known = [None, 0, 0]
            else:
                known = [int(budget["budget_credits"]), tx.credit_use(project_id), 0]
            if held is not None:
                held[project_id] = known
        limit, used, before = known
        need = before + needs[project_id]
        known[2] = need
        if limit is not None and used + need > limit:
            raise Refused(
                f"credit budget exceeded: {used} of {limit} used, "
                f"this request needs {need}{' or more' if more else ''}"
            )

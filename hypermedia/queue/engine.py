"""The job engine: every state change of a job is one of these methods.

Each method runs one transaction through the driver seam, guards the change
with the transition table (``states.TRANSITIONS``), and writes a diagnostic
event in the same transaction.  Worker-side reports (start, settle, renew) are
fenced by (job, attempt number, worker): a superseded attempt changes nothing.
The changes that create a job are in enqueue.py (``Enqueuing``), those a
user asks for (release, cancel, retry) and the reads in actions.py
(``UserActions``): both inherited.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from hypermedia.config import Settings
from hypermedia.db.driver import Driver
from hypermedia.queue import profiles as pricing
from hypermedia.queue import states
from hypermedia.queue.actions import UserActions
from hypermedia.queue.clock import utcnow
from hypermedia.queue.enqueue import Enqueuing
from hypermedia.queue.events import event
from hypermedia.queue.models import AttemptResult, Claimed
from hypermedia.queue.settle import Decision, decide
from hypermedia.redact import redact
from hypermedia.storage.keys import object_prefix

log = logging.getLogger(__name__)

Row = dict[str, Any]
# Carried with a decision's outputs for their objects' rows, not job_outputs columns.
_OBJECT_ONLY = ("checksum", "width", "height")
# A job keeps its newest 50 progress and log entries (seed 004, DESIGN §7);
# every state change is kept.
DIAGNOSTIC_HISTORY = 50
# Why a completion is refused when an output's ledger row is gone: the
# pending sweep took it while the output was on its way (see _lost_outputs).
LOST_OUTPUT = "an output's ledger row was swept before the job could complete"


class Engine(Enqueuing, UserActions):
    def __init__(
        self,
        db: Driver,
        settings: Settings,
        *,
        clock: Callable[[], datetime] = utcnow,
        rng: random.Random | None = None,
    ) -> None:
        self.db = db
        self.settings = settings
        self.clock = clock
        self.rng = rng or random.Random()
        # profile_id -> ("key:vN", prices): see _priced.
        self._versions: dict[int, tuple[str, pricing.Prices]] = {}

    # -- worker side -----------------------------------------------------------

    def claim(
        self, worker_id: str, queues: Sequence[str], n: int, only: Collection[int] | None = None
    ) -> list[Claimed]:
        """Take up to ``n`` ready jobs (``only``: of these): status, lease and
        attempt row in one transaction."""
        if n <= 0 or not queues:
            return []
        # Restricted, the claim is several statements: a transaction of its own.
        with self.db.auto() if only is None else self.db.tx() as tx:
            return self._claim(tx, worker_id, queues, n, only)

    def prime(self, worker_id: str, queues: Sequence[str], n: int) -> None:
        """Compile what a claim and its completions execute, before the first
        real claim: a claim of up to ``n`` jobs, settled as completed, in a
        transaction that is rolled back, so nothing changes.  A fresh worker's
        first claim otherwise spends 5-25 ms of CPU compiling its statements,
        with its first jobs' clocks already running."""
        if n <= 0 or not queues:
            return
        try:
            with self.db.tx() as tx:
                jobs = self._claim(tx, worker_id, queues, n)
                results = [AttemptResult(j.job_id, j.attempt, "completed") for j in jobs]
                self._settle(tx, worker_id, results)
                raise _DryRun
        except _DryRun:
            pass

    def _claim(
        self,
        tx: Any,
        worker_id: str,
        queues: Sequence[str],
        n: int,
        only: Collection[int] | None = None,
    ) -> list[Claimed]:
        # The driver writes the attempt rows and claim events too: on
        # PostgreSQL all of it is a single statement.
        rows = tx.claim(worker_id, list(queues), n, *self._lease(), only=only)
        return self._claimed_jobs(tx, rows)

    def _lease(self) -> tuple[datetime, datetime]:
        """Now, and when a lease taken now runs out."""
        now = self.clock()
        return now, now + timedelta(seconds=self.settings.lease_seconds)

    def _claimed_jobs(self, tx: Any, rows: list[Row]) -> list[Claimed]:
        # Their inputs' rows too, in one statement: the worker fetches each
        # input without a read transaction of its own.
        ids = sorted({r["object_id"] for r in rows if r["object_id"] is not None})
        inputs = tx.ready_inputs(ids) if ids else {}
        return [_claimed(r, inputs.get(r["object_id"])) for r in rows]

    def start(self, worker_id: str, items: Sequence[tuple[int, int]]) -> set[int]:
        """claimed → processing for these (job, attempt); returns the ids that moved."""
        with self.db.tx() as tx:
            return self._start(tx, worker_id, items)

    def _start(self, tx: Any, worker_id: str, items: Sequence[tuple[int, int]]) -> set[int]:
        held = tx.fenced(worker_id, items, states.sources("start"))
        if not held:
            return set()
        now = self.clock()
        ids = [r["job_id"] for r in held]
        tx.update_jobs_by_ids(
            ids,
            states.sources("start"),
            {"status": "processing", "started_at": now, "updated_at": now},
        )
        tx.insert_events(
            [
                event(
                    r["job_id"],
                    now,
                    "claimed",
                    "processing",
                    actor=worker_id,
                    attempt_number=r["attempt_count"],
                )
                for r in held
            ]
        )
        return set(ids)

    def flush(
        self,
        worker_id: str,
        starts: Sequence[tuple[int, int]],
        results: Sequence[AttemptResult],
        held: Mapping[int, Row] | None = None,
    ) -> set[int]:
        """Write a batch of starts and finished attempts.

        Returns the job ids whose result was accepted; any other result came
        from a superseded attempt and was dropped.  ``held``: the jobs as the
        worker holds them (see ``held_row``), which lets plain completions be
        decided without reading their rows first.
        """
        if self.db.autocommit:
            return self._flush_optimistic(worker_id, starts, results, held)[0]
        with self.db.tx() as tx:
            if starts:
                self._start(tx, worker_id, starts)
            return self._settle(tx, worker_id, results)

    def flush_and_claim(
        self,
        worker_id: str,
        starts: Sequence[tuple[int, int]],
        results: Sequence[AttemptResult],
        queues: Sequence[str],
        n: int,
        held: Mapping[int, Row] | None = None,
        only: Collection[int] | None = None,
    ) -> tuple[set[int], list[Claimed]]:
        """``flush``, then ``claim`` up to ``n`` jobs (``only``: of these), in
        one transaction.

        One commit per batch instead of two: on SQLite also one taking of the
        write lock, and no claim loop and flusher waiting on each other's
        lock; on PostgreSQL one statement for the results and the claim.
        """
        if self.db.autocommit and only is None:
            return self._flush_optimistic(worker_id, starts, results, held, (queues, n))
        with self.db.tx() as tx:
            if starts:
                self._start(tx, worker_id, starts)
            accepted = self._settle(tx, worker_id, results)
            return accepted, self._claim(tx, worker_id, queues, n, only)

    def _flush_optimistic(
        self,
        worker_id: str,
        starts: Sequence[tuple[int, int]],
        results: Sequence[AttemptResult],
        held: Mapping[int, Row] | None,
        claim: tuple[Sequence[str], int] | None = None,
    ) -> tuple[set[int], list[Claimed]]:
        # Decide without locks (from what the worker holds, else from rows
        # read), then write each job guarded by the status it was decided
        # from, with the claim, as one self-committing statement.  A job that
        # changed in between (a cancel request, say) is settled again the
        # careful way, under a lock.
        now, until = self._lease()
        done = {r.job_id for r in results}
        # A start with its result in the same batch is written first: the
        # result is decided from "processing" (one statement changes a row once).
        early = [k for k in starts if k[0] in done]
        late = [_start_decision(worker_id, k, now) for k in starts if k[0] not in done]
        jobs: list[Claimed] = []
        with self.db.auto() as tx:
            if early:
                tx.apply_transitions(worker_id, [_start_decision(worker_id, k, now) for k in early])
            blind = [] if early else self._decide_held(tx, worker_id, results, held or {}, now)
            known = {d.job_id for d in blind}
            rest = [r for r in results if r.job_id not in known]
            decisions = blind + (self._decide(tx, worker_id, rest, now) if rest else [])
            # Outputs and input facts write other tables with the completion:
            # those go the careful way, in one transaction.
            quick = [
                d
                for d in decisions
                if not d.outputs and not d.input_facts and d.seen in states.sources(d.action)
            ]
            claim_args = None if claim is None or claim[1] <= 0 else (*claim, now, until)
            changed, rows = tx.apply_transitions(worker_id, late + quick, claim_args)
            if rows:
                jobs = self._claimed_jobs(tx, rows)
        accepted = changed & {d.job_id for d in quick}
        redo = {d.job_id for d in decisions} - accepted
        if redo:
            accepted |= self.settle(worker_id, [r for r in results if r.job_id in redo])
        return accepted, jobs

    def _decide_held(
        self,
        tx: Any,
        worker_id: str,
        results: Sequence[AttemptResult],
        held: Mapping[int, Row],
        now: datetime,
    ) -> list[Decision]:
        """Decisions for plain completions of jobs the worker holds, from its
        own view of them (``held_row``): no row read.  The write's guard
        (status, attempt, worker) proves the view still true; when it is not,
        the job is settled again under a lock."""
        decisions: list[Decision] = []
        decided: set[int] = set()  # one decision per job: one statement changes a row once
        for res in results:
            row = held.get(res.job_id)
            if (
                row is None
                or res.job_id in decided
                or row["attempt_count"] != res.attempt
                or res.status != "completed"
                or res.outputs
                or (res.worker_id is not None and res.worker_id != worker_id)
                or pricing.input_facts(res.result)
            ):
                continue
            prices = self._priced(tx, row["profile_id"])[1]
            if res.actual_credits is None and not prices.flat:
                continue  # priced by its input: read under the fence
            credits = _actual_credits(prices, None, res)
            decisions.append(decide(row, res, now, self.settings, self.rng, credits))
            decided.add(res.job_id)
        return decisions

    def settle(self, worker_id: str | None, results: Sequence[AttemptResult]) -> set[int]:
        with self.db.tx() as tx:
            return self._settle(tx, worker_id, results)

    def _settle(
        self,
        tx: Any,
        worker_id: str | None,
        results: Sequence[AttemptResult],
        *,
        lease_expired_before: datetime | None = None,
    ) -> set[int]:
        now = self.clock()
        decisions = self._decide(tx, worker_id, results, now, lease_expired_before, careful=True)
        self._apply(tx, worker_id, decisions, now)
        return {d.job_id for d in decisions}

    def _decide(
        self,
        tx: Any,
        worker_id: str | None,
        results: Sequence[AttemptResult],
        now: datetime,
        lease_expired_before: datetime | None = None,
        *,
        careful: bool = False,
    ) -> list[Decision]:
        """The decisions for ``results``; ``careful``: in the transaction that
        writes them, the jobs locked (not ``_flush_optimistic``'s read)."""
        if not results:
            return []
        # The reaper (no worker) skips rows another transaction holds: one
        # frozen lock holder must not stall every other release, nor the
        # leader's other services behind it.  It retries them next round.
        held = {
            r["job_id"]: r
            for r in tx.fenced(
                worker_id,
                [(x.job_id, x.attempt) for x in results],
                states.RUNNING_SIDE,
                skip_locked=worker_id is None,
            )
        }
        taken: list[tuple[Row, AttemptResult]] = []
        decided: set[int] = set()
        for res in results:
            if res.job_id in decided:  # one decision per job, whatever the batch repeats
                continue
            row = held.get(res.job_id)
            # Fix: ``fenced`` returns the job once even when the batch also holds
            # a superseded attempt's result for it; only the current attempt's
            # result may decide.
            if row is None or row["attempt_count"] != res.attempt:
                continue
            if res.worker_id is not None and row["claimed_by"] != res.worker_id:
                continue
            if lease_expired_before is not None and not _expired(row, lease_expired_before):
                continue
            taken.append((row, res))
            decided.add(res.job_id)
        self._drop_stale_outputs(tx, results, taken, now)
        if careful:
            taken = self._lost_outputs(tx, taken, now)
        inputs = self._credit_inputs(tx, taken)
        decisions: list[Decision] = []
        for row, res in taken:
            job_input = inputs.get(res.job_id)
            credits = None
            if res.outputs or res.status == "completed":
                version, prices = self._priced(tx, row["profile_id"])
                for o in res.outputs:
                    o.profile_version = o.profile_version or version
                if res.status == "completed" and res.actual_credits is None:
                    credits = _actual_credits(prices, job_input, res)
            d = decide(row, res, now, self.settings, self.rng, credits)
            if d.action == "complete" and job_input and job_input["object_id"] is not None:
                d.input_facts = pricing.input_facts(res.result)
                d.object_id = job_input["object_id"]
            decisions.append(d)
        return decisions

    @staticmethod
    def _drop_stale_outputs(
        tx: Any,
        results: Sequence[AttemptResult],
        taken: list[tuple[Row, AttemptResult]],
        now: datetime,
    ) -> None:
        """The outputs of results refused here (a superseded attempt's, a
        worker's whose lease another took over) go to GC now: they were
        stored under reserved rows that nothing will make ready, and waited
        for the pending sweep (hours; 86 files after six stale results)."""
        kept = {i for _, res in taken for i in _output_ids(res)}
        accepted = {id(res) for _, res in taken}
        dropped = [
            i
            for res in results
            if id(res) not in accepted
            for i in _output_ids(res)
            if i not in kept
        ]
        if dropped:  # only rows still pending: a reservation, never a ready object
            tx.mark_deleting(dropped, "pending", now)

    def _lost_outputs(
        self, tx: Any, taken: list[tuple[Row, AttemptResult]], now: datetime
    ) -> list[tuple[Row, AttemptResult]]:
        """Completions whose output rows are still there, and in place of the
        others a retryable failure, ``STORAGE_UNAVAILABLE``.

        An output's blob is stored under a ``pending`` row reserved for it
        (storage/reserve.py) and the completion makes the row ready.  A row
        the pending sweep took meanwhile (GC marked it ``deleting``, or
        removed it) would have left the job completed with an output object
        that does not exist, its blob on no row GC or a scrub ever sees.  As
        an upload swept on its way fails ("took too long and was swept"), the
        attempt fails, and is tried again.  The rows checked are locked: GC's
        mark skips locked rows, so none is taken between this check and the
        promotion that makes them ready.
        """
        ids = [i for _, res in taken if res.status == "completed" for i in _output_ids(res)]
        if not ids:
            return taken
        found: dict[int, str] = tx.object_states(ids, lock=True)
        checked = []
        for row, res in taken:
            lost = [i for i in _output_ids(res) if found.get(i) in (None, "deleting")]
            if res.status != "completed" or not lost:
                checked.append((row, res))
                continue
            self._hand_to_gc(tx, row["job_id"], res, found, now)
            failed = dataclasses.replace(
                res,
                status="failed",
                code="STORAGE_UNAVAILABLE",
                message=LOST_OUTPUT,
                result=None,
                outputs=[],
                actual_credits=None,
            )
            checked.append((row, failed))
        return checked

    def _hand_to_gc(
        self, tx: Any, job_id: int, res: AttemptResult, found: Mapping[int, str], now: datetime
    ) -> None:
        """The blobs of a completion refused by ``_lost_outputs``, for GC: its
        outputs' rows still ``pending`` are marked ``deleting`` (nothing will
        make them ready now), and a blob whose row is gone gets a ``deleting``
        row of its own, since GC works from rows and would never find it."""
        ids = _output_ids(res)
        tx.mark_deleting([i for i in ids if found.get(i) == "pending"], "pending", now)
        # Only a key under the output's own prefix: that is where its blob went
        # (storage/reserve.py), and no other object's blob is there.
        orphans = [
            o.output_key
            for o in res.outputs
            if o.object_id
            and o.object_id not in found
            and o.output_key.startswith(object_prefix(o.object_id))
        ]
        if not orphans:
            return
        job = tx.job(job_id) or {}
        # Where the worker stored them: the input's pool, else the default one.
        pool = (
            tx.pool(pool_id=job["pool_id"])
            if job.get("pool_id") is not None
            else tx.pool(name=self.settings.default_pool)
        )
        if pool is None:  # removed meanwhile (`pools rm`): nothing in its store is deleted
            log.warning("job %d: the blob of a swept output is left in a removed pool", job_id)
            return
        for key in orphans:
            tx.record_orphan(pool["pool_id"], key, job.get("project_id", ""), now)

    def _priced(self, tx: Any, profile_id: int) -> tuple[str, pricing.Prices]:
        """A job's profile version ("key:vN") and prices, looked up once.

        A version never changes its key, number or prices (only whether new
        jobs may use it), so what was read stays true for the engine's life.
        """
        got = self._versions.get(profile_id)
        if got is None:
            profile = tx.profile_by_id(profile_id)
            if profile is None:
                return "unknown", pricing.Prices()
            got = (pricing.ref_of(profile), pricing.Prices.of(profile))
            if len(self._versions) >= 10_000:
                self._versions.clear()
            self._versions[profile_id] = got
        return got

    def _credit_inputs(self, tx: Any, taken: Sequence[tuple[Row, AttemptResult]]) -> dict[int, Row]:
        """Input size, object and its facts of the completions that need them:
        priced by size, pages or minutes, or reporting facts about their input."""
        need = [
            res.job_id
            for row, res in taken
            if res.status == "completed"
            and (
                pricing.input_facts(res.result)
                or (res.actual_credits is None and not self._priced(tx, row["profile_id"])[1].flat)
            )
        ]
        return tx.credit_inputs(need) if need else {}

    def _apply(
        self, tx: Any, worker_id: str | None, decisions: list[Decision], now: datetime
    ) -> None:
        # Jobs that end the same way (say, a batch of completions with no
        # result) share one UPDATE … WHERE job_id IN (…); the rest go as one
        # executemany per action and column set (pipelined by the driver).
        groups: dict[tuple[str, Any], tuple[Row, list[int]]] = {}
        for d in decisions:
            key = (d.action, _same_values_key(d.job_values))
            groups.setdefault(key, (d.job_values, []))[1].append(d.job_id)
        singles: dict[tuple[str, tuple[str, ...]], list[Row]] = {}
        for (action, _), (values, ids) in groups.items():
            if len(ids) > 1:
                tx.update_jobs_by_ids(ids, states.sources(action), values)
            else:
                singles.setdefault((action, tuple(sorted(values))), []).append(
                    {"_id": ids[0], **values}
                )
        for (action, _), rows in singles.items():
            tx.update_jobs_many(states.sources(action), rows)
        tx.finish_attempts([d.attempt_values for d in decisions])
        outputs = [o for d in decisions for o in d.outputs]
        tx.insert_outputs([{k: v for k, v in o.items() if k not in _OBJECT_ONLY} for o in outputs])
        self._retire_unwanted(tx, decisions, now)
        # Output blobs were uploaded under reserved pending rows; the completion
        # makes them ready, with their key, type, size and checksum, in the same
        # transaction (DESIGN §3; storage/reserve.py).
        tx.promote_objects(
            [
                {
                    "object_id": o["object_id"],
                    "size": o["output_size_bytes"],
                    "checksum": o.get("checksum", ""),
                    "storage_key": o["output_key"],
                    # Its download name: thumb.webp, preview.jpg (the key's last part).
                    "filename": o["output_key"].rpartition("/")[2],
                    "mime_type": o["mime_type"],
                    "width": o.get("width") or 0,
                    "height": o.get("height") or 0,
                }
                for o in outputs
                if o["object_id"]
            ],
            now,
        )
        for d in decisions:
            if d.input_facts and d.object_id is not None:
                tx.set_object_facts(d.object_id, {**d.input_facts, "updated_at": now})
        tx.insert_events([d.event for d in decisions])

    @staticmethod
    def _retire_unwanted(tx: Any, decisions: list[Decision], now: datetime) -> None:
        """Outputs of a photo's variant job that completed after the photo was
        deleted: the delete asked the job to stop (cancel_requested), too
        late, and retired the outputs there were then.  These are retired as
        they arrive, so that they pin nothing: GC collects what no photo
        uses, instead of keeping it as long as job retention keeps the job."""
        late = [d.job_id for d in decisions if d.outputs and d.seen == "cancel_requested"]
        if late:
            tx.retire_outputs(tx.jobs_of_deleted_photos(late), now)

    def renew(self, worker_id: str, items: Sequence[tuple[int, int]]) -> dict[int, str]:
        """Extend the leases of running attempts; return each job's status.

        A job missing from the answer is no longer this worker's attempt: its
        lease expired and someone else owns it now, so the worker should stop it.
        """
        if not items:
            return {}
        now = self.clock()
        until = now + timedelta(seconds=self.settings.lease_seconds)
        with self.db.tx() as tx:
            statuses = tx.statuses_of(worker_id, items)
            mine = [i for i, _ in items if i in statuses]
            tx.renew_leases(worker_id, mine, until, now)
        return statuses

    def report_progress(
        self, worker_id: str, reports: dict[tuple[int, int], dict[str, Any]]
    ) -> int:
        """Store the latest progress snapshot of running attempts (fenced)."""
        now = self.clock()
        with self.db.tx() as tx:
            held = tx.fenced(worker_id, list(reports), states.RUNNING_SIDE)
            rows, events = [], []
            for r in held:
                snap = _snapshot(reports[(r["job_id"], r["attempt_count"])], now)
                if snap is None:
                    continue
                rows.append({"_id": r["job_id"], "progress": snap})
                events.append(
                    event(
                        r["job_id"],
                        now,
                        None,
                        None,
                        kind="progress",
                        attempt_number=r["attempt_count"],
                        actor=worker_id,
                        message=_progress_text(snap),
                    )
                )
            tx.update_jobs_many(states.RUNNING_SIDE, rows)
            tx.insert_events(events)
            tx.trim_history([r["_id"] for r in rows], DIAGNOSTIC_HISTORY)
        return len(rows)

    def poll_statuses(self, worker_id: str, items: Sequence[tuple[int, int]]) -> dict[int, str]:
        """Read-only variant of ``renew`` used for the frequent cancel check."""
        with self.db.read() as tx:
            return tx.statuses_of(worker_id, items)

    def hand_back(
        self,
        worker_id: str,
        items: Sequence[tuple[int, int]],
        why: str = "handed back unstarted by a draining worker",
    ) -> set[int]:
        """Return claimed-but-unstarted jobs to the queue; the attempt never ran."""
        with self.db.tx() as tx:
            held = tx.fenced(worker_id, items, states.sources("hand_back"))
            self._handed_back(tx, held, why, worker_id)
            tx.notify({r["queue_name"] for r in held})
        return {r["job_id"] for r in held}

    def hand_back_queue(self, tx: Any, queue_name: str, why: str, actor: str) -> int:
        """In ``tx``: return every job claimed from ``queue_name`` and not
        started, whichever worker holds it (a pause: the worker finds it
        gone when it would start it, and runs nothing)."""
        held = tx.claimed_in_queue(queue_name)
        self._handed_back(tx, held, why, actor)
        return len(held)

    def _handed_back(self, tx: Any, held: Sequence[Row], why: str, actor: str) -> None:
        now = self.clock()
        for r in held:
            tx.update_job(
                r["job_id"],
                states.sources("hand_back"),
                {
                    "status": "queued",
                    "attempt_count": r["attempt_count"] - 1,
                    "claimed_by": None,
                    "claimed_at": None,
                    "visibility_timeout": None,
                    "updated_at": now,
                },
                attempt=r["attempt_count"],
                worker_id=r["claimed_by"],
            )
            tx.delete_attempt(r["job_id"], r["attempt_count"])
        tx.insert_events(
            [event(r["job_id"], now, "claimed", "queued", actor=actor, message=why) for r in held]
        )

    def hand_back_lost_claims(self, worker_id: str, held: Collection[int]) -> set[int]:
        """Hand back the jobs this worker claimed and does not hold (``held``):
        a claim whose commit went through but whose answer was lost with its
        connection.  Left alone, each sat until its lease ran out and was
        then charged an attempt that never ran (one on its last attempt
        failed without running)."""
        with self.db.read() as tx:
            lost = [k for k in tx.claimed_unstarted(worker_id) if k[0] not in held]
        if not lost:
            return set()
        return self.hand_back(worker_id, lost, why="handed back: its claim's answer was lost")

    def confirm_cancels(self, worker_id: str, items: Sequence[tuple[int, int]]) -> set[int]:
        """End the jobs a cancel was asked of while this worker held them
        unstarted (a drain hands back the rest): cancelled now, their attempts
        closed, instead of left to the reaper once their leases ran out."""
        with self.db.tx() as tx:
            asked = tx.fenced(worker_id, items, states.sources("confirm_cancel"))
            why = "cancelled before start"
            results = [
                AttemptResult(r["job_id"], r["attempt_count"], "cancelled", None, why)
                for r in asked
            ]
            return self._settle(tx, worker_id, results) if results else set()

    # -- maintenance -------------------------------------------------------------

    def promote(self, limit: int = 1000) -> int:
        """retry_wait → queued for jobs whose backoff has passed."""
        now = self.clock()
        with self.db.tx() as tx:
            due = tx.due_retries(now, limit)
            ids = [r["job_id"] for r in due]
            if not ids:
                return 0
            tx.update_jobs_by_ids(
                ids, states.sources("promote"), {"status": "queued", "updated_at": now}
            )
            moved = {r["job_id"]: r for r in tx.jobs_where(ids) if r["status"] == "queued"}
            tx.insert_events(
                [event(i, now, "retry_wait", "queued", message="backoff over") for i in moved]
            )
            tx.notify({r["queue_name"] for r in moved.values()})
        return len(moved)

    def release_dead(self, worker_ids: Sequence[str], hostname: str) -> int:
        """Workers of ``hostname`` whose process is known to have died marked
        unhealthy and their jobs released at once, as the reaper does with
        silent ones; how many jobs."""
        with self.db.tx() as tx:
            dead = tx.mark_dead_workers(worker_ids, hostname)
            orphans = tx.held_by(dead)
            released = self._settle(tx, None, _orphaned(orphans, "its worker's process died"))
        return len(released)

    def reap(self, limit: int = 500) -> dict[str, int]:
        """Release jobs whose lease expired, mark silent workers unhealthy, and
        those silent for ``worker_gone_seconds`` terminated."""
        now = self.clock()
        stale_cutoff = now - timedelta(seconds=self.settings.worker_stale_seconds)
        gone_cutoff = now - timedelta(seconds=self.settings.worker_gone_seconds)
        with self.db.tx() as tx:
            gone = tx.mark_gone_workers(gone_cutoff, now)
            stale = tx.mark_stale_workers(stale_cutoff)
            orphans = tx.held_by(stale)
            released = self._settle(tx, None, _orphaned(orphans, "its worker stopped heartbeating"))
        with self.db.tx() as tx:
            expired = tx.expired_leases(now, limit)
            released |= self._settle(
                tx, None, _orphaned(expired, "its worker's lease expired"), lease_expired_before=now
            )
        return {
            "unhealthy_workers": len(stale),
            "terminated_workers": gone,
            "released_jobs": len(released),
        }


def _same_values_key(values: Row) -> Any:
    """Equal for equal column values: a tuple when every value is hashable
    (the usual case, and several times cheaper than JSON), else JSON text."""
    key = tuple(sorted(values.items()))  # keys are unique: values never compared
    try:
        hash(key)
    except TypeError:  # a JSON result (dict or list)
        return json.dumps(values, sort_keys=True, default=str)
    return key


def _output_ids(res: AttemptResult) -> list[int]:
    """The object ids of a result's outputs (data-only outputs have none)."""
    return [o.object_id for o in res.outputs if o.object_id]


def _actual_credits(prices: pricing.Prices, job_input: Row | None, res: AttemptResult) -> int:
    """What a completed attempt costs: see ``profiles.actual``."""
    if prices.flat:
        return prices.base
    job_input = job_input or {}
    return pricing.actual(
        prices,
        int(job_input.get("input_size_bytes") or 0),
        job_input.get("pages"),
        job_input.get("duration_ms"),
        res.result,
    )


class _DryRun(Exception):
    """Raised to roll back ``Engine.prime``'s transaction."""


def _claimed(r: Row, input_object: Row | None = None) -> Claimed:
    return Claimed(
        job_id=r["job_id"],
        job_uuid=r["job_uuid"],
        job_type=r["job_type"],
        queue_name=r["queue_name"],
        priority=r["priority"],
        params=r["params"] or {},
        attempt=r["attempt_count"],
        max_attempts=r["max_attempts"],
        timeout_seconds=r["timeout_seconds"],
        memory_limit_mb=r["memory_limit_mb"],
        profile_id=r["profile_id"],
        project_id=r["project_id"],
        object_id=r["object_id"],
        pool_id=r["pool_id"],
        input_key=r["input_key"],
        input_size_bytes=r["input_size_bytes"],
        input_object=None
        if input_object is None
        else {k: input_object[k] for k in ("pool_id", "storage_key", "checksum")},
    )


def held_row(job: Claimed, worker_id: str, started: bool) -> Row:
    """A job as the worker holding it knows it (claimed, and started if its
    start was written), for ``Engine.flush(held=...)``."""
    return {
        "job_id": job.job_id,
        "status": "processing" if started else "claimed",
        "attempt_count": job.attempt,
        "max_attempts": job.max_attempts,
        "claimed_by": worker_id,
        "memory_limit_mb": job.memory_limit_mb,
        "profile_id": job.profile_id,
    }


def _start_decision(worker_id: str, key: tuple[int, int], now: datetime) -> Decision:
    job_id, attempt = key
    (seen,) = states.sources("start")
    return Decision(
        job_id,
        attempt,
        seen,
        "start",
        {"status": "processing", "started_at": now, "updated_at": now},
        {},
        event(job_id, now, seen, "processing", actor=worker_id, attempt_number=attempt),
    )


def _orphaned(rows: Sequence[Row], why: str) -> list[AttemptResult]:
    return [
        AttemptResult(
            job_id=r["job_id"],
            attempt=r["attempt_count"],
            status="orphaned",
            code="ORPHANED",
            message=f"attempt abandoned: {why}",
            worker_id=r["claimed_by"],
            actor="reaper",
        )
        for r in rows
    ]


def _expired(row: Row, before: datetime) -> bool:
    vt = row.get("visibility_timeout")
    return vt is not None and vt < before


def _snapshot(report: dict[str, Any], now: datetime) -> Row | None:
    """A progress snapshot (seed 004): determinate 0..100, or a step only."""
    percent = report.get("percent")
    step = report.get("step")
    if percent is not None:
        if not isinstance(percent, int | float) or not 0 <= percent <= 100:
            return None
        mode = "determinate"
    else:
        mode = "step" if step else "indeterminate"
    return {
        "mode": mode,
        "percent": None if percent is None else round(float(percent), 1),
        "step": redact(step, 100) if step else None,
        "updated_at": now.isoformat(),
    }


def _progress_text(snap: Row) -> str:
    parts = []
    if snap["percent"] is not None:
        parts.append(f"{snap['percent']:g}%")
    if snap["step"]:
        parts.append(str(snap["step"]))
    return " ".join(parts) or snap["mode"]

"""Writes what slots report (starts, progress, results) in batched transactions.

A slot never waits on the database: it hands its report here and takes the
next job.  Whatever piles up while one transaction runs goes into the next,
so batches grow exactly when the database is the bottleneck.  If the database
is down, reports are kept and retried; a result that arrives after its lease
was taken over is dropped by the engine's fencing, never applied twice.

On SQLite the flusher also claims the worker's next jobs, in the transaction
that writes the last ones' results: the database has one writer at a time,
and a claim transaction of its own would wait for the flusher's lock, then
make it wait in turn, with a durable commit each.  (On PostgreSQL the claim
loop claims on its own connection, in parallel with the flusher's writes:
measured faster than one statement doing both in turn.)

Plain completions are decided from the jobs as the worker holds them
(``lookup``, plus the starts written here) instead of rows read first: on
PostgreSQL a batch of results is one statement, and the write's guard
(status, attempt, worker) checks that view.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from typing import Any

from hypermedia import said
from hypermedia.db.dialects import is_transient
from hypermedia.linux import name_native
from hypermedia.queue.engine import Engine, held_row
from hypermedia.queue.models import AttemptResult, Claimed
from hypermedia.redact import brief

log = logging.getLogger(__name__)

MAX_BATCH = 500
# A start waits this long before it is written on its own: an attempt that
# ends sooner has its start folded into its result (one write instead of two).
# Nothing waits on the "processing" status: the lease was taken at the claim.
START_DELAY = 0.2
# With one writer at a time (SQLite), results that come in a stream (the
# last one less than this long ago) wait up to this long for the worker's next
# claim, or until a batch of them is ready: each transaction on its own is a
# durable commit, and a claim comes every half batch anyway.  A result that
# comes alone (attempts that run longer than this) is written at once: waiting
# would only make its job end later.  So is the last of a stream, when the
# worker holds no other job whose result could join it (the end of a burst).
RESULT_DELAY = 0.005
# Progress is written at most this often on its own (it rides along with any
# other write): a pipeline that reports every page or every strip would
# otherwise make a transaction of each report.  Only the latest report of an
# attempt is kept meanwhile, so the last one written is always the newest.
PROGRESS_DELAY = 0.5


class _ClaimRequest:
    def __init__(self, queues: list[str], n: int, only: Collection[int] | None) -> None:
        self.queues, self.n, self.only = queues, n, only
        self.done = threading.Event()
        self.jobs: list[Claimed] = []
        self.error: BaseException | None = None


class Flusher(threading.Thread):
    def __init__(
        self,
        engine: Engine,
        worker_id: str,
        on_result: Callable[[AttemptResult, bool], None] | None = None,
        *,
        gather: int | None = None,
        held: Callable[[], int] | None = None,
        lookup: Callable[[int], Claimed | None] | None = None,
    ) -> None:
        super().__init__(name="flusher", daemon=True)
        self.engine = engine
        self.worker_id = worker_id
        self.on_result = on_result
        # Runs before a batch of results is written: makes their output blobs
        # durable (an output may become ready only once its blob is on disk).
        self.before_results: Callable[[], None] | None = None
        self._cond = threading.Condition()
        self._starts: dict[tuple[int, int], float] = {}  # (job, attempt) -> when started
        self._results: list[AttemptResult] = []
        self._results_since = 0.0  # when the oldest waiting result came
        self._last_result = -1e9  # when the latest result came
        self._hold = False  # whether the waiting results came in a stream
        # Results to gather before a transaction of their own (None: no wait).
        self._gather = gather
        # How many jobs the worker holds (running, buffered, or with a result
        # waiting here): None when unknown.
        self._held = held
        # The job the worker holds under an id (None: not known); with the
        # starts written, what lets results be decided without a read.
        self._lookup = lookup
        self._written: set[tuple[int, int]] = set()  # starts written, result not yet
        self._progress: dict[tuple[int, int], dict[str, Any]] = {}
        self._progress_written = -1e9  # when progress was last written
        self._claim: _ClaimRequest | None = None
        self._busy = False
        self._closing = False

    # -- called by slots -------------------------------------------------------

    def started(self, job_id: int, attempt: int) -> None:
        with self._cond:
            # A start is due only START_DELAY from now: a flusher that holds
            # an earlier start or a result already waits with a deadline and
            # sees this one then.  Only one with nothing pending (an untimed
            # wait) needs waking; a needless wake is a context switch and a
            # GIL hand-over per job.
            untimed = not self._starts and not self._results
            self._starts[(job_id, attempt)] = time.monotonic()
            if untimed:
                self._cond.notify()

    def finished(self, result: AttemptResult) -> None:
        with self._cond:
            now = time.monotonic()
            if not self._results:
                self._results_since = now
                self._hold = now - self._last_result < RESULT_DELAY
            self._last_result = now
            self._results.append(result)
            self._cond.notify()

    def progress(self, job_id: int, attempt: int, payload: dict[str, Any]) -> None:
        with self._cond:
            self._progress[(job_id, attempt)] = payload
            self._cond.notify()

    def claim(
        self, queues: list[str], n: int, only: Collection[int] | None = None
    ) -> list[Claimed]:
        """Claim up to ``n`` jobs (``only``: of these) in the next transaction
        (waits for it).

        Raises what the transaction raised: the caller backs off as after a
        failed claim of its own.
        """
        req = _ClaimRequest(queues, n, only)
        with self._cond:
            if self._closing or not self.is_alive():
                return []
            self._claim = req
            self._cond.notify()
        while not req.done.wait(1.0):
            if not self.is_alive():
                return []
        if req.error is not None:
            raise req.error
        return req.jobs

    def idle(self) -> bool:
        with self._cond:
            return not (self._busy or self._starts or self._results or self._progress)

    # -- the thread ----------------------------------------------------------------

    def run(self) -> None:
        name_native()
        delay = 0.05
        while True:
            with self._cond:
                while not (
                    self._results_due()
                    or self._progress_due()
                    or self._claim
                    or self._closing
                    or self._due()
                ):
                    self._cond.wait(self._until_due())
                if self._closing and not (self._starts or self._results or self._progress):
                    self._refuse_claim()
                    return
                claim, self._claim = self._claim, None
                results, self._results = self._results[:MAX_BATCH], self._results[MAX_BATCH:]
                self._results_since = time.monotonic()
                progress = self._progress_taken(results)
                # Folded into their results, or due (old enough, reporting
                # progress, or the worker is stopping): the rest wait on.
                for r in results:
                    self._starts.pop((r.job_id, r.attempt), None)
                starts = [k for k in self._starts if k in progress or self._due_now(k)]
                starts = starts[:MAX_BATCH]
                for k in starts:
                    del self._starts[k]
                self._busy = True
            try:
                self._write(starts, results, progress, claim)
                delay = 0.05
                said.ended("flusher")
            except Exception as exc:
                if claim is not None:
                    claim.error = exc
                    claim.done.set()
                if not is_transient(exc):
                    starts, results, progress = self._isolate(exc, starts, results, progress)
                if not (starts or results or progress):
                    continue
                # Database away: keep everything, try again.
                said.warning(log, "flusher", "could not record results (%s); retrying", brief(exc))
                with self._cond:
                    for k in starts:
                        self._starts.setdefault(k, 0.0)
                    self._results[:0] = results
                    for k, v in progress.items():
                        self._progress.setdefault(k, v)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
            finally:
                with self._cond:
                    self._busy = False

    def _isolate(
        self,
        exc: Exception,
        starts: list[tuple[int, int]],
        results: list[AttemptResult],
        progress: dict[tuple[int, int], dict[str, Any]],
    ) -> tuple[list[tuple[int, int]], list[AttemptResult], dict[tuple[int, int], dict[str, Any]]]:
        """Write a batch the database refused one item at a time, so that the
        item it refuses (it would every time) cannot hold up the others for
        ever: a start or a progress report is dropped, a result becomes a
        failed attempt, and a failure it refuses too is dropped (the reaper
        ends that job when its lease runs out).  Returns what is left when
        the database goes away meanwhile."""
        log.error("the database refused a batch (%s); writing it item by item", brief(exc))
        items: list[tuple[str, int, Any]] = [
            *(("start", k[0], k) for k in starts),
            *(("progress", kv[0][0], kv) for kv in progress.items()),
            *(("result", r.job_id, r) for r in results),
        ]
        for i, (kind, job_id, item) in enumerate(items):
            try:
                self._write_one(kind, item)
            except Exception as err:
                if is_transient(err):
                    left = items[i:]
                    return (
                        [k for kind_, _, k in left if kind_ == "start"],
                        [r for kind_, _, r in left if kind_ == "result"],
                        dict(kv for kind_, _, kv in left if kind_ == "progress"),
                    )
                log.error("dropped a %s of job %s the database refused", kind, job_id)
                if kind == "result" and self.on_result:
                    self.on_result(item, False)
        return [], [], {}

    def _write_one(self, kind: str, item: Any) -> None:
        if kind == "start":
            self._write([item], [], {})
        elif kind == "progress":
            self._write([], [], dict([item]))
        else:
            try:
                self._write([], [item], {})
            except Exception as err:
                if is_transient(err):
                    raise
                self._write([], [_unrecordable(item)], {})

    def _due_now(self, key: tuple[int, int]) -> bool:
        return self._closing or time.monotonic() - self._starts[key] >= START_DELAY

    def _due(self) -> bool:
        return bool(self._starts) and self._due_now(next(iter(self._starts)))

    def _progress_taken(
        self, results: list[AttemptResult]
    ) -> dict[tuple[int, int], dict[str, Any]]:
        """The progress reports to write now: all of them once PROGRESS_DELAY
        has passed, else only the last report of each attempt whose result
        goes out with them.  Taken whenever anything was written, they came
        16 a second under a stream of other jobs (docs: two a second)."""
        if not self._progress:
            return {}
        if self._progress_due():
            taken, self._progress = self._progress, {}
            self._progress_written = time.monotonic()
            return taken
        ending = {(r.job_id, r.attempt) for r in results}
        return {k: self._progress.pop(k) for k in list(self._progress) if k in ending}

    def _progress_due(self) -> bool:
        if not self._progress:
            return False
        return self._closing or time.monotonic() - self._progress_written >= PROGRESS_DELAY

    def _results_due(self) -> bool:
        if not self._results:
            return False
        if self._gather is None or len(self._results) >= self._gather:
            return True
        return time.monotonic() - self._results_since >= self._window()

    def _window(self) -> float:
        """How long the oldest waiting result may wait for more (when gathering)."""
        if not self._hold:
            return 0.0
        if self._held is not None and self._held() <= len(self._results):
            return 0.0  # nothing else could come
        return RESULT_DELAY

    def _until_due(self) -> float | None:
        """How long until the oldest waiting start, result or progress report is
        due (None: nothing waits)."""
        now = time.monotonic()
        left = [self._window() - (now - self._results_since)] if self._results else []
        if self._starts:
            left.append(START_DELAY - (now - next(iter(self._starts.values()))))
        if self._progress:
            left.append(PROGRESS_DELAY - (now - self._progress_written))
        return max(0.0, min(left)) if left else None

    def _write(
        self,
        starts: list[tuple[int, int]],
        results: list[AttemptResult],
        progress: dict[tuple[int, int], dict[str, Any]],
        claim: _ClaimRequest | None = None,
    ) -> None:
        if progress:
            # An attempt's first report comes with its start: the start goes
            # first, so that the events read claimed -> processing, then the
            # progress (a job reported 25 % while still shown claimed).
            early = [k for k in starts if k in progress]
            if early:
                self.engine.flush(self.worker_id, early, [], {})
                self._written.update(early)
                starts = [k for k in starts if k not in progress]
            self.engine.report_progress(self.worker_id, progress)
        if results and self.before_results is not None:
            self.before_results()
        held = self._held_rows(results)
        if claim is not None:
            accepted, claim.jobs = self.engine.flush_and_claim(
                self.worker_id, starts, results, claim.queues, claim.n, held, only=claim.only
            )
            claim.done.set()
        elif starts or results:
            accepted = self.engine.flush(self.worker_id, starts, results, held)
        else:
            return
        self._written.update(starts)
        self._written.difference_update((r.job_id, r.attempt) for r in results)
        if len(self._written) > 4 * MAX_BATCH and self._lookup is not None:
            # Started jobs that never report here (handed back on a drain).
            self._written = {k for k in self._written if self._lookup(k[0]) is not None}
        for r in results:
            ok = r.job_id in accepted
            if not ok:
                log.info("dropped a stale result for job %s attempt %s", r.job_id, r.attempt)
            if self.on_result:
                self.on_result(r, ok)

    def _held_rows(self, results: list[AttemptResult]) -> dict[int, dict[str, Any]]:
        # Only PostgreSQL's optimistic flush uses them: elsewhere the rows
        # are read under a lock in the flush's own transaction anyway.
        if self._lookup is None or not self.engine.db.autocommit:
            return {}
        rows = {}
        for r in results:
            job = self._lookup(r.job_id)
            if job is not None and job.attempt == r.attempt:
                key = (r.job_id, r.attempt)
                rows[r.job_id] = held_row(job, self.worker_id, key in self._written)
        return rows

    def _refuse_claim(self) -> None:
        if self._claim is not None:
            self._claim.done.set()  # no jobs: the worker is stopping
            self._claim = None

    def close(self, timeout: float) -> bool:
        """Stop after writing what is pending; False if that took too long."""
        with self._cond:
            self._closing = True
            self._refuse_claim()
            self._cond.notify()
        self.join(timeout)
        return not self.is_alive()


def _unrecordable(r: AttemptResult) -> AttemptResult:
    """The failure recorded in place of a result the database refuses."""
    return AttemptResult(
        r.job_id,
        r.attempt,
        "failed",
        "INTERNAL",
        "the attempt's result could not be recorded",
        duration_ms=r.duration_ms,
        peak_memory_mb=r.peak_memory_mb,
        cpu_time_ms=r.cpu_time_ms,
        worker_id=r.worker_id,
    )

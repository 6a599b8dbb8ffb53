"""Inputs in and outputs out, off the slots' way.

While a slot fetches an input or stores an output, its child sits idle: for a
thumbnail that was a fifth of the job's time.  So a slot only starts attempts:

* the **Stager** fetches (copies and verifies) the inputs of claimed jobs
  while the children work, a few jobs ahead, in the order the slots will take
  them;
* the **Storer** completes attempts that have something to store (a
  pipeline's ``finish`` step, output files) while the slot's child already
  runs the next attempt, then hands the result to the flusher.

Both only move bytes and call the storage layer; what a job's result is, the
engine still decides when the flusher writes it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypermedia.errors import JobError
from hypermedia.linux import name_native
from hypermedia.pipelines import registry
from hypermedia.queue.models import AttemptResult, Claimed, Output
from hypermedia.storage.ledger import Storage
from hypermedia.worker.files import fetch_input, inside, storable, store_outputs

log = logging.getLogger(__name__)


@dataclass
class Staging:
    """One job's input on its way in: queued, fetching, ready or dropped."""

    state: str = "queued"
    name: str | None = None
    error: JobError | None = None
    done: threading.Event = field(default_factory=threading.Event)


class Stager(threading.Thread):
    """Fetches claimed jobs' inputs ahead of the slots, at most ``depth`` waiting.

    A slot that reaches a job whose input is not fetched yet fetches it itself
    rather than wait behind the stager; one being fetched it waits for.
    """

    def __init__(self, storage: Storage, root: Path, depth: int, *, link: bool = False) -> None:
        super().__init__(name="stager", daemon=True)
        self.storage = storage
        self.root = root
        self.link = link  # hard links to local blobs (files.fetch_input)
        self.depth = max(1, depth)
        self._cond = threading.Condition()
        self._queue: deque[tuple[Claimed, Staging]] = deque()
        self._ready = 0  # fetched and not taken yet: bounded by depth (disk space)
        self._closing = False

    def add(self, job: Claimed) -> Staging | None:
        if job.object_id is None or not job.input_key:
            return None
        staging = Staging()
        with self._cond:
            self._queue.append((job, staging))
            self._cond.notify()
        return staging

    @staticmethod
    def _prefix(job: Claimed) -> str:
        # Staged inputs sit side by side under root, not in a directory per
        # job: a hard link makes no inode, a directory does (see move_outputs).
        return f"{job.job_id}-{job.attempt}-"

    def take(self, job: Claimed, staging: Staging | None, scratch: Path) -> str | None:
        """The job's input, moved into ``scratch``: its file name, or JobError."""
        if staging is None:
            return fetch_input(self.storage, job, scratch, link=self.link)
        with self._cond:
            state = staging.state
            if state == "queued":
                staging.state = "taken"
        if state == "queued":  # not begun: ours to fetch, no waiting behind other jobs
            return fetch_input(self.storage, job, scratch, link=self.link)
        staging.done.wait()
        with self._cond:
            self._ready -= 1
            staging.state = "taken"
            self._cond.notify()
        if staging.error is not None:
            raise staging.error
        if staging.name is None:
            return None
        name = staging.name[len(self._prefix(job)) :]
        os.rename(self.root / staging.name, scratch / name)
        return name

    def drop(self, job: Claimed, staging: Staging | None) -> None:
        """The job will not run here (cancelled, handed back): forget its input."""
        if staging is None:
            return
        with self._cond:
            state, staging.state = staging.state, "dropped"
            if state == "ready":
                self._ready -= 1
                self._cond.notify()
        if state == "ready":
            self._remove(staging)

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self.join(5)

    def run(self) -> None:
        name_native()
        while True:
            with self._cond:
                while not self._closing and not (self._queue and self._ready < self.depth):
                    self._cond.wait()
                if self._closing:
                    return
                job, staging = self._queue.popleft()
                if staging.state != "queued":  # taken by its slot, or dropped
                    continue
                staging.state = "fetching"
                self._ready += 1
            self._fetch(job, staging)

    def _remove(self, staging: Staging) -> None:
        if staging.name is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.root / staging.name)

    def _fetch(self, job: Claimed, staging: Staging) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            staging.name = fetch_input(
                self.storage, job, self.root, prefix=self._prefix(job), link=self.link
            )
        except JobError as exc:
            staging.error = exc
        except Exception:  # never the stager's end: the slot reports it
            log.exception("staging the input of job %s failed", job.job_id)
            staging.error = JobError("STORAGE_UNAVAILABLE", "could not read the input")
        with self._cond:
            dropped = staging.state == "dropped"
            staging.state = "ready"
            if dropped:
                self._ready -= 1
                self._cond.notify()
        if dropped:
            self._remove(staging)
        staging.done.set()


def complete(
    storage: Storage | None,
    job: Claimed,
    res: AttemptResult,
    declared: list[dict[str, Any]],
    files: Path,
) -> AttemptResult:
    """A completed attempt's last steps: the pipeline's ``finish`` (storage.dedup_check
    runs here, where the database is), then its outputs stored as pending objects
    from ``files``.  What goes wrong fails the attempt, never the worker."""
    try:
        declared = _finish(storage, job, res, declared)
        res.result, declared = storable(res.result, declared)
        if storage is not None:
            res.outputs = store_outputs(storage, job, files, declared)
        else:
            res.outputs = [Output(**{k: v for k, v in o.items() if k != "path"}) for o in declared]
    except JobError as exc:
        res.status, res.code, res.message, res.result = "failed", exc.code, exc.reason, None
        res.outputs = []
    return res


def _finish(
    storage: Storage | None, job: Claimed, res: AttemptResult, declared: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    try:
        finish = registry.get(job.job_type).finish
    except JobError:  # a type only the child knows (tests): nothing to finish
        return declared
    if finish is None:
        return declared
    if storage is None:
        raise JobError("STORAGE_UNAVAILABLE", "this worker has no access to the ledger")
    ctx = registry.FinishContext(storage, job, dict(res.result or {}))
    try:
        res.result = finish(ctx)
    except JobError:
        raise
    except Exception:
        log.exception("job %s: the %s finish step failed", job.job_id, job.job_type)
        raise JobError("INTERNAL", "the attempt could not be completed") from None
    return [*declared, *ctx.outputs]


def needs_completing(job_type: str, declared: list[dict[str, Any]]) -> bool:
    if declared:
        return True
    try:
        return registry.get(job_type).finish is not None
    except JobError:
        return False


def move_outputs(
    scratch: Path, declared: list[dict[str, Any]], outbox: Path, prefix: str = ""
) -> None:
    """Move the declared output files out of ``scratch`` (the next attempt's) into
    ``outbox``, as ``{prefix}{i}-{name}``, renaming each entry's ``path``; a bad
    path raises INVALID_OUTPUT.  One outbox for all: a directory per attempt was
    an inode made and freed per job, and on an ext4 without a journal every
    freed inode slows the next creates down for minutes (docs/benchmarks.md)."""
    files = [(o, inside(scratch, o["path"])) for o in declared if o.get("path")]
    if not files:
        return
    outbox.mkdir(parents=True, exist_ok=True)
    for i, (o, src) in enumerate(files):
        name = f"{prefix}{i}-{src.name}"
        os.rename(src, outbox / name)
        o["path"] = name


class Storer:
    """Runs ``complete`` for attempts in a few threads, then reports their results."""

    def __init__(
        self, storage: Storage, report: Callable[[AttemptResult], None], threads: int
    ) -> None:
        self.storage = storage
        self.report = report
        self._pool = ThreadPoolExecutor(
            max(1, threads), thread_name_prefix="storer", initializer=name_native
        )

    def submit(
        self, job: Claimed, res: AttemptResult, declared: list[dict[str, Any]], outbox: Path
    ) -> None:
        self._pool.submit(self._complete, job, res, declared, outbox)

    def _complete(
        self, job: Claimed, res: AttemptResult, declared: list[dict[str, Any]], outbox: Path
    ) -> None:
        names = [o["path"] for o in declared if o.get("path")]  # complete() takes them
        try:
            res = complete(self.storage, job, res, declared, outbox)
        except Exception:  # complete() turns JobErrors into failures; anything else is ours
            log.exception("completing job %s failed", job.job_id)
            res.status, res.code, res.result, res.outputs = "failed", "INTERNAL", None, []
            res.message = "the attempt could not be completed"
        finally:
            for name in names:  # this attempt's files only: the outbox is shared
                with contextlib.suppress(OSError):
                    os.unlink(outbox / name)
        self.report(res)

    def close(self, *, now: bool = False) -> None:
        """Wait for what was submitted; with ``now``, only for what already runs
        (the rest is left to the reaper, like any attempt of a stopped worker)."""
        self._pool.shutdown(wait=True, cancel_futures=now)

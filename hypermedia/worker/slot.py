"""One concurrency slot: runs claimed jobs one after another in its own child.

The slot enforces the attempt's deadline and reacts to cancel or a lost lease
by killing the child's whole process group.  It never touches the database:
starts, progress and results go to the flusher.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from hypermedia.errors import JobError
from hypermedia.pipelines import registry
from hypermedia.queue.models import AttemptResult, Claimed, Output
from hypermedia.storage.ledger import Storage
from hypermedia.worker.files import fetch_input, store_outputs
from hypermedia.worker.flusher import Flusher
from hypermedia.worker.pool import Child, Exit

log = logging.getLogger(__name__)

POLL = 0.1  # how often a slot looks at cancel/lost flags while a child works


@dataclass
class Running:
    job: Claimed
    cancel: threading.Event = field(default_factory=threading.Event)
    lost: threading.Event = field(default_factory=threading.Event)
    stop_now: threading.Event = field(default_factory=threading.Event)

    @property
    def key(self) -> tuple[int, int]:
        return (self.job.job_id, self.job.attempt)


@dataclass
class SlotConfig:
    scratch_root: Path
    memory_mb: int
    max_attempts_per_child: int


# A child that takes longer than this to load its libraries is not waited
# for: the worker starts claiming anyway.
WARM_TIMEOUT = 20.0


class Slot:
    def __init__(
        self, index: int, cfg: SlotConfig, flusher: Flusher, storage: Storage | None = None
    ) -> None:
        self.index = index
        self.cfg = cfg
        self.flusher = flusher
        self.storage = storage
        self.child: Child | None = None
        self._scratch_mtime: int | None = None

    def warm(self, job_types: list[str], timeout: float = WARM_TIMEOUT) -> None:
        """Start the child now, have it load these job types' libraries, and
        wait (at most ``timeout``) until it has: the first attempt then finds
        it ready.  Called from the slot's own thread: the child's
        parent-death signal is tied to the thread that starts it."""
        if self.child is not None or not job_types:
            return
        child = self.child = Child()
        if not child.send({"op": "warm", "job_types": job_types}):
            self.child = None
            return
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            ready, msg = child.poll(left)
            if ready and msg is None:  # died while loading: the next attempt starts afresh
                child.kill()
                self.child = None
                return
            if ready and msg.get("op") == "warm":
                return

    def run(self, rj: Running) -> AttemptResult | None:
        """Run one attempt to its end; None when the lease was lost (nothing to report)."""
        job = rj.job
        if rj.cancel.is_set():
            return self._result(rj, "cancelled", None, "cancelled before start", 0, None, None)
        # One scratch directory per slot, emptied after each attempt: cheaper
        # than a fresh directory per attempt, and never shared between children.
        scratch = self.cfg.scratch_root / f"slot-{self.index}"
        if self._scratch_mtime is None:
            scratch.mkdir(parents=True, exist_ok=True)
            self._scratch_mtime = scratch.stat().st_mtime_ns
        self.flusher.started(job.job_id, job.attempt)
        try:
            return self._attempt(rj, scratch)
        finally:
            # A directory's mtime changes whenever an entry is added or removed:
            # one stat() tells whether the attempt left anything behind.
            if scratch.stat().st_mtime_ns != self._scratch_mtime:
                _empty(scratch)
                self._scratch_mtime = scratch.stat().st_mtime_ns

    def _attempt(self, rj: Running, scratch: Path) -> AttemptResult | None:
        job = rj.job
        mem = job.memory_limit_mb or self.cfg.memory_mb
        t0 = time.monotonic()
        try:
            input_name = fetch_input(self.storage, job, scratch) if self.storage else None
        except JobError as exc:
            ms = int((time.monotonic() - t0) * 1000)
            return self._result(rj, "failed", exc.code, exc.reason, ms, None, None)
        message = {
            "op": "run",
            "job_id": job.job_id,
            "job_type": job.job_type,
            "params": job.params,
            "scratch": str(scratch),
            "mem_mb": mem,
            "cpu_s": job.timeout_seconds + 5,
            "input": str(scratch / input_name) if input_name else None,
        }
        child = self._child_for(message)
        deadline = t0 + job.timeout_seconds
        while True:
            elapsed_ms = int((time.monotonic() - t0) * 1000)
            if rj.stop_now.is_set():
                ex = self._kill()
                return self._result(
                    rj,
                    "orphaned",
                    "ORPHANED",
                    "the worker stopped at once",
                    elapsed_ms,
                    ex.peak_mb,
                    self._cpu(child, ex),
                )
            if rj.cancel.is_set():
                ex = self._kill()
                return self._result(
                    rj,
                    "cancelled",
                    None,
                    "cancelled by request",
                    elapsed_ms,
                    ex.peak_mb,
                    self._cpu(child, ex),
                )
            if rj.lost.is_set():
                self._kill()
                log.warning("job %s: lease lost, attempt %s abandoned", job.job_id, job.attempt)
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                ex = self._kill()
                return self._result(
                    rj,
                    "timeout",
                    "TIMEOUT",
                    f"the attempt exceeded its {job.timeout_seconds}s timeout",
                    elapsed_ms,
                    ex.peak_mb,
                    self._cpu(child, ex),
                )
            ready, msg = child.poll(min(remaining, POLL))
            if not ready:
                continue
            elapsed_ms = int((time.monotonic() - t0) * 1000)
            if msg is None:
                return self._died(rj, child, mem, elapsed_ms)
            if msg.get("op") == "progress":
                self.flusher.progress(
                    job.job_id,
                    job.attempt,
                    {"percent": msg.get("percent"), "step": msg.get("step")},
                )
                continue
            return self._done(rj, child, msg, elapsed_ms, scratch)

    def _child_for(self, message: dict[str, object]) -> Child:
        """Our warm child, or a new one if there is none or it has died since."""
        if self.child is not None and self.child.send(message):
            return self.child
        if self.child is not None:
            self.child.kill()
        self.child = Child()
        if not self.child.send(message):
            raise RuntimeError("a fresh child process refused its first job")
        return self.child

    def _done(
        self, rj: Running, child: Child, msg: dict, elapsed_ms: int, scratch: Path
    ) -> AttemptResult:
        child.attempts += 1
        child.cpu_seen_ms = msg.get("cpu_total_ms", child.cpu_seen_ms)
        code = msg.get("code")
        if code == "OOM":
            self._kill()  # a child that hit its memory limit is never reused
        elif child.attempts >= self.cfg.max_attempts_per_child:
            child.stop()
            self.child = None
        status = msg["status"]
        res = self._result(
            rj,
            status,
            code,
            msg.get("message", ""),
            elapsed_ms,
            msg.get("peak_mb"),
            msg.get("cpu_ms"),
        )
        res.result = msg.get("result")
        declared = msg.get("outputs") or []
        if status != "completed":
            return res
        try:
            # A pipeline's finish step (storage.dedup_check) runs here, in the
            # worker, where the database is; before outputs are stored, so a
            # failed finish stores nothing.
            declared = self._finish(rj.job, res, declared)
            _check_storable(res.result, declared)
            if self.storage is not None:
                res.outputs = store_outputs(self.storage, rj.job, scratch, declared)
            else:
                res.outputs = [
                    Output(**{k: v for k, v in o.items() if k != "path"}) for o in declared
                ]
        except JobError as exc:
            res.status, res.code, res.message, res.result = "failed", exc.code, exc.reason, None
        return res

    def _finish(self, job: Claimed, res: AttemptResult, declared: list[dict]) -> list[dict]:
        """Run the pipeline's ``finish`` on a completed attempt: it sets the final
        result and may add data-only outputs.  Whatever goes wrong in it fails
        the attempt with a JobError (retryable unless the pipeline says otherwise),
        never the slot."""
        try:
            finish = registry.get(job.job_type).finish
        except JobError:  # a type only the child knows (tests): nothing to finish
            return declared
        if finish is None:
            return declared
        if self.storage is None:
            raise JobError("STORAGE_UNAVAILABLE", "this worker has no access to the ledger")
        ctx = registry.FinishContext(self.storage, job, dict(res.result or {}))
        try:
            res.result = finish(ctx)
        except JobError:
            raise
        except Exception:
            log.exception("job %s: the %s finish step failed", job.job_id, job.job_type)
            raise JobError("INTERNAL", "the attempt could not be completed") from None
        return [*declared, *ctx.outputs]

    def _died(self, rj: Running, child: Child, mem: int, elapsed_ms: int) -> AttemptResult:
        ex = child.reap()
        self.child = None
        if ex.signal == signal.SIGXCPU:
            code, status, why = "TIMEOUT", "timeout", "the attempt used up its CPU time"
        elif ex.signal == signal.SIGKILL and ex.peak_mb >= mem * 0.9:
            code, status, why = "OOM", "failed", "the attempt was killed for using too much memory"
        else:
            code, status = "CRASHED", "crashed"
            why = f"the processing child died ({_signame(ex.signal)})"
        return self._result(rj, status, code, why, elapsed_ms, ex.peak_mb, self._cpu(child, ex))

    def _kill(self) -> Exit:
        child, self.child = self.child, None
        if child is None:
            return Exit(0, 0, None)
        return child.kill()

    @staticmethod
    def _cpu(child: Child, ex: Exit) -> int:
        return max(0, ex.cpu_total_ms - child.cpu_seen_ms)

    @staticmethod
    def _result(
        rj: Running,
        status: str,
        code: str | None,
        message: str,
        duration_ms: int,
        peak_mb: int | None,
        cpu_ms: int | None,
    ) -> AttemptResult:
        return AttemptResult(
            job_id=rj.job.job_id,
            attempt=rj.job.attempt,
            status=status,
            code=code,
            message=message,
            duration_ms=duration_ms,
            peak_memory_mb=peak_mb,
            cpu_time_ms=cpu_ms,
        )

    def close(self) -> None:
        if self.child is not None:
            self.child.stop()
            self.child = None


MAX_RESULT_BYTES = 256 * 1024


def _check_storable(result: object, declared: list[dict]) -> None:
    """A result and output metadata the database can store, or INVALID_OUTPUT.

    The child speaks pickle, so NaN, infinities, bytes or a megabyte of text
    reach us; stored as they are, the settling transaction would fail every
    time and the job would never end.
    """
    try:
        size = len(json.dumps(result, allow_nan=False))
        for o in declared:
            size += len(json.dumps(o.get("metadata") or {}, allow_nan=False))
    except (TypeError, ValueError):
        raise JobError(
            "INVALID_OUTPUT", "the pipeline returned a result that is not plain JSON"
        ) from None
    if size > MAX_RESULT_BYTES:
        raise JobError("INVALID_OUTPUT", "the pipeline returned a result over 256 KiB")


def _empty(directory: Path) -> None:
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


def _signame(sig: int | None) -> str:
    if sig is None:
        return "exited"
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def scratch_root(home: Path, worker_id: str) -> Path:
    root = home.resolve() / "scratch" / worker_id
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    return root

"""One concurrency slot: runs claimed jobs one after another in its own child.

The slot enforces the attempt's deadline and reacts to cancel or a lost lease
by killing the child's whole process group.  It never touches the database:
inputs arrive through the stager, outputs leave through the storer, and
starts, progress and results go to the flusher.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from hypermedia import leftovers
from hypermedia.errors import JobError
from hypermedia.pipelines import registry
from hypermedia.queue.models import AttemptResult, Claimed
from hypermedia.storage.ledger import Storage
from hypermedia.worker.files import fetch_input
from hypermedia.worker.flusher import Flusher
from hypermedia.worker.pool import Child, Exit
from hypermedia.worker.sandbox import spec_for
from hypermedia.worker.transfer import (
    Stager,
    Staging,
    Storer,
    complete,
    move_outputs,
    needs_completing,
)

log = logging.getLogger(__name__)

POLL = 0.1  # how often a slot looks at cancel/lost flags while a child works
BUDGET_GRACE = 2.0  # seconds past a step's budget (Context.budget) before its child is killed
# How C and C++ libraries die when an allocation fails under RLIMIT_AS, where
# Python would raise MemoryError: abort() (std::bad_alloc, pdfium inflating a
# huge stream), a trap (PartitionAlloc's OOM_CRASH, GLib's g_error) or a
# write through the NULL it got back.
NATIVE_ABORTS = frozenset(
    {signal.SIGABRT, signal.SIGTRAP, signal.SIGILL, signal.SIGSEGV, signal.SIGBUS}
)
# Such a death is an OOM when the attempt had taken at least this share of
# the room its limit left it (sampled every POLL, so the last sample lags).
FILLED = 0.5
# How often a slot totals its scratch folder while an attempt runs (a walk
# of the folder: most attempts end before the first), and the most entries
# it may hold: RLIMIT_FSIZE bounds one file, not how many.
SCRATCH_CHECK = 1.0
MAX_SCRATCH_ENTRIES = 100_000
# Why an attempt ends before its child reports: (status, error code, reason).
Stop = tuple[str, str | None, str]
LOST: Stop = ("lost", None, "")  # the lease went: the result is nobody's to take


class Flag:
    """Set once by one thread, polled by the slot (every POLL): never waited
    on, so no lock.  A threading.Event is a lock and a condition, and a job
    carries three: 15 µs of the claim loop's 76 for a tiny job."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


@dataclass
class Running:
    job: Claimed
    cancel: Flag = field(default_factory=Flag)
    lost: Flag = field(default_factory=Flag)
    stop_now: Flag = field(default_factory=Flag)
    staging: Staging | None = None  # its input, when the stager fetches it ahead
    input_name: str | None = None  # its input's file name in the slot's inbox, once there
    started: bool = False  # a slot took it (else it waits, claimed ahead)
    # Decided under the worker's lock, once: a slot took it from the buffer,
    # or it left the buffer unrun (cancelled while it waited, see runner.py).
    taken: bool = False
    dropped: bool = False
    ended: bool = False  # its child is done (its result may wait to be stored or written)

    @property
    def key(self) -> tuple[int, int]:
        return (self.job.job_id, self.job.attempt)


@dataclass
class SlotConfig:
    scratch_root: Path
    memory_mb: int
    max_attempts_per_child: int
    # No attempt gets more, whatever its job asks (Settings.memory_ceiling_mb).
    memory_ceiling_mb: int
    max_file_mb: int = 4096
    max_scratch_mb: int = 8192
    recycle_rss_mb: int = 512
    sandbox: str = "off"  # auto | required | off (see sandbox.py)
    connect_ports: list[int] | None = None  # TCP ports a sandboxed child may reach
    link_inputs: bool = False  # inputs hard-linked from a local pool (read-only to the child)


# A child that takes longer than this to load its libraries is not waited
# for: the worker starts claiming anyway.
WARM_TIMEOUT = 20.0


class Slot:
    def __init__(
        self,
        index: int,
        cfg: SlotConfig,
        flusher: Flusher,
        storage: Storage | None = None,
        *,
        stager: Stager | None = None,
        storer: Storer | None = None,
    ) -> None:
        self.index = index
        self.cfg = cfg
        self.flusher = flusher
        self.storage = storage
        self.stager = stager
        self.storer = storer
        self.child: Child | None = None
        self._job_types: list[str] = []  # what a new child loads before its first job
        self._retiring: list[threading.Thread] = []  # each stops one worn child
        # One scratch directory per slot, emptied after each attempt: cheaper
        # than a fresh directory per attempt, and never shared between children.
        # Its path is made once (pathlib costs more than the stat itself).
        self.scratch = cfg.scratch_root / f"slot-{index}"
        self._scratch_str = str(self.scratch)
        self._scratch_made = False
        # The input waits beside scratch, not in it: on a local pool it is a
        # hard link to the stored blob, and a sandboxed child may only read
        # this folder (a write through the link would change the original).
        self.inbox = cfg.scratch_root / f"slot-{index}-in"
        self._handed = 0  # attempts handed to the storer, for unique outboxes
        self._sandbox: dict[str, object] | None = None
        if cfg.sandbox != "off":
            spec = spec_for(cfg.sandbox, self._scratch_str, cfg.connect_ports)
            spec.read.append(str(self.inbox))
            self._sandbox = spec.to_json()
        # Children come in two kinds: without sockets (most attempts) and
        # with (pipelines that talk to a daemon, see seccomp.py).  A slot
        # keeps one warm child of each kind it has needed, and swaps them.
        self._net = False  # the kind of self.child
        self._parked: Child | None = None  # the other kind's warm child

    def warm(self, job_types: list[str], timeout: float = WARM_TIMEOUT) -> bool:
        """Start the child now, have it load these job types' libraries, and
        wait (at most ``timeout``) until it has: the first attempt then finds
        it ready.  False if the child died instead (a broken install, an
        interpreter that cannot start): every attempt would crash the same
        way.  Called from the slot's own thread: the child's parent-death
        signal is tied to the thread that starts it."""
        self._job_types = list(job_types)
        if self.child is not None or not job_types:
            return True
        child = self._spawn()
        if child is None:
            return False
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            ready, msg = child.poll(left)
            if ready and msg is None:
                child.kill()
                self.child = None
                return False
            if ready and msg.get("op") == "warm":
                child.warmed = True
                child.cpu_seen_ms = int(msg.get("cpu_total_ms") or 0)
                return True
        return True  # slow, not dead: the first attempt waits for it

    def run(self, rj: Running) -> bool:
        """Run one attempt to its end and report its result to the flusher, now
        or (outputs to store) through the storer.  False when the lease was lost:
        nothing is reported."""
        job = rj.job
        if rj.cancel.is_set():
            if self.stager is not None:
                self.stager.drop(job, rj.staging)
            self.flusher.finished(self.cancelled_before_start(rj))
            return True
        scratch = self.scratch
        if not self._scratch_made:
            scratch.mkdir(parents=True, exist_ok=True)
            self.inbox.mkdir(parents=True, exist_ok=True)
            self._scratch_made = True
        rj.started = True
        self.flusher.started(job.job_id, job.attempt)
        try:
            done = self._attempt(rj)
            rj.ended = True  # the slot is free for its next job
            if done is None:
                return False
            res, declared = done
            if res.status == "completed":
                if self.storer is not None and needs_completing(job.job_type, declared):
                    self._hand_off(job, res, declared, scratch)
                    return True
                # Nothing to store: checked (plain JSON, size) and reported now.
                res = complete(self.storage, job, res, declared, scratch)
            self.flusher.finished(res)
            return True
        finally:
            rj.ended = True
            if rj.input_name is not None:
                with contextlib.suppress(OSError):
                    os.unlink(self.inbox / rj.input_name)
            # Listed, not judged by its mtime: the child may write the folder,
            # so it could set the mtime back and leave files to the next job.
            with os.scandir(self._scratch_str) as entries:
                left = next(entries, None) is not None
            if left:
                _empty(scratch)

    def _hand_off(
        self, job: Claimed, res: AttemptResult, declared: list[dict], scratch: Path
    ) -> None:
        assert self.storer is not None
        # The files leave scratch (the next attempt's) for the worker's outbox.
        self._handed += 1
        outbox = self.cfg.scratch_root / "out"
        try:
            move_outputs(scratch, declared, outbox, prefix=f"{self.index}-{self._handed}-")
        except JobError as exc:
            res.status, res.code, res.message, res.result = "failed", exc.code, exc.reason, None
            self.flusher.finished(res)
            return
        self.storer.submit(job, res, declared, outbox)

    def _input(self, rj: Running) -> str | None:
        if self.stager is not None:
            rj.input_name = self.stager.take(rj.job, rj.staging, self.inbox)
        elif self.storage is not None:
            rj.input_name = fetch_input(self.storage, rj.job, self.inbox, link=self.cfg.link_inputs)
        return rj.input_name

    def _attempt(self, rj: Running) -> tuple[AttemptResult, list[dict]] | None:
        job = rj.job
        mem = min(job.memory_limit_mb or self.cfg.memory_mb, self.cfg.memory_ceiling_mb)
        t0 = time.monotonic()
        try:
            input_name = self._input(rj)
        except JobError as exc:
            ms = int((time.monotonic() - t0) * 1000)
            return self._result(rj, "failed", exc.code, exc.reason, ms, None, None), []
        message = {
            "op": "run",
            "job_id": job.job_id,
            "job_type": job.job_type,
            "params": job.params,
            "scratch": self._scratch_str,
            "mem_mb": mem,
            "mem_ceiling_mb": self.cfg.memory_ceiling_mb,
            "cpu_s": job.timeout_seconds + 5,
            "file_mb": self.cfg.max_file_mb,
            "input": f"{self.inbox}/{input_name}" if input_name else None,
        }
        net = self._sandbox is not None and registry.needs_network(job.job_type, job.params)
        # Its address space before and at most during the attempt (sampled
        # each POLL): how a native library's abort is told to be an OOM.
        child, vm_start = self._child_for(job, message, net)
        vm_peak = vm_start
        deadline = t0 + job.timeout_seconds
        budget: tuple[float, str] | None = None  # a step's end, by the child's word
        scratch = ScratchWatch(self._scratch_str, self.cfg.max_scratch_mb, t0, child.pid)
        while True:
            stop = self._why_stop(rj, budget, deadline) or scratch.over()
            if stop is LOST:
                self._kill()
                self._replace(rj)
                # Not only a lease that ran out: a pause hands back a job whose
                # start the flusher had not written yet ("lease lost" sent
                # operators looking for a clock fault after a routine pause).
                log.warning(
                    "job %s: no longer this worker's (its lease ran out, or its queue was "
                    "paused before its start was recorded); attempt %s abandoned",
                    job.job_id,
                    job.attempt,
                )
                return None
            if stop is not None:
                elapsed_ms = int((time.monotonic() - t0) * 1000)  # the kill is not the attempt's
                ex = self._kill()
                self._replace(rj)
                status, code, reason = stop
                return self._result(
                    rj, status, code, reason, elapsed_ms, ex.peak_mb, self._cpu(child, ex)
                ), []
            ready, msg = child.poll(max(0.0, min(deadline - time.monotonic(), POLL)))
            if not ready:
                vm_peak = max(vm_peak, child.vm_mb())
                continue
            elapsed_ms = int((time.monotonic() - t0) * 1000)
            grew = (vm_start, vm_peak)
            if msg is None:
                died = self._died(rj, child, mem, elapsed_ms, grew)
                self._replace(rj)
                return died, []
            if msg["op"] == "progress":
                self.flusher.progress(
                    job.job_id, job.attempt, {"percent": msg["percent"], "step": msg["step"]}
                )
                continue
            if msg["op"] == "warm" and not child.warmed:  # a replacement's libraries loaded
                # The attempt starts now: its time and CPU were the child's
                # start-up's (466 ms for a 300 ms sleep after a crash).  Once
                # per child: a second one is out of turn, or a child that
                # took over could push its deadline back for ever.
                child.warmed = True
                child.cpu_seen_ms = int(msg.get("cpu_total_ms") or 0)
                t0 = time.monotonic()
                deadline = t0 + job.timeout_seconds
                continue
            if msg["op"] == "budget":
                # A grace beyond it: a pipeline that can stop itself on time
                # does (its child lives on); this is for one that cannot.
                budget = None
                if msg["seconds"] is not None:
                    budget = (time.monotonic() + msg["seconds"] + BUDGET_GRACE, msg["reason"])
                continue
            if msg["op"] != "done":
                child.refuse("a report out of turn")
                died = self._died(rj, child, mem, elapsed_ms, grew)
                self._replace(rj)
                return died, []
            return self._done(rj, child, msg, elapsed_ms)

    @staticmethod
    def _why_stop(rj: Running, budget: tuple[float, str] | None, deadline: float) -> Stop | None:
        """Why the attempt must end now, if it must: (status, code, reason),
        or LOST when the lease went and nobody will take the result."""
        if rj.stop_now.is_set():
            return ("orphaned", "ORPHANED", "the worker stopped at once")
        if rj.cancel.is_set():
            return ("cancelled", None, "cancelled by request")
        if rj.lost.is_set():
            return LOST
        now = time.monotonic()
        if budget is not None and now > budget[0]:
            return ("failed", "LIMIT_EXCEEDED", budget[1])
        if now >= deadline:
            return (
                "timeout",
                "TIMEOUT",
                f"the attempt exceeded its {rj.job.timeout_seconds}s timeout",
            )
        return None

    def _child_for(self, job: Claimed, message: dict[str, object], net: bool) -> tuple[Child, int]:
        """Our warm child of that kind, or a new one if there is none or it has
        died since, with its address space (MB) read before it got the job: a
        quick child could have grown already if read after."""
        if net != self._net:
            self.child, self._parked, self._net = self._parked, self.child, net
        if self.child is not None:
            vm = self.child.vm_mb()
            self.child.stderr.attempt(job.job_id, job.attempt)
            if self.child.send(message):
                return self.child, vm
            self.child.kill()
        self.child = self._new_child()
        vm = self.child.vm_mb()
        self.child.stderr.attempt(job.job_id, job.attempt)
        if not self.child.send(message):
            raise RuntimeError("a fresh child process refused its first job")
        return self.child, vm

    def _done(
        self, rj: Running, child: Child, msg: dict, elapsed_ms: int
    ) -> tuple[AttemptResult, list[dict]]:
        """The child's report as a result, with the outputs it declared."""
        child.attempts += 1
        if msg["cpu_total_ms"] is not None:
            child.cpu_seen_ms = msg["cpu_total_ms"]
        code = msg["code"]
        if code in ("OOM", "PERMISSION_DENIED") or msg["stray"]:
            # Never reused: a child that hit its memory limit, one whose
            # attempt left a process running (killed with its whole group),
            # or one that tried to reach outside its sandbox (an exploited
            # decoder may have left a thread behind, waiting for later jobs).
            self._kill()
            self._replace(rj)
        elif child.attempts >= self.cfg.max_attempts_per_child or (
            msg["rss_mb"] is not None and msg["rss_mb"] > self.cfg.recycle_rss_mb
        ):
            self._recycle(child)
        status = msg["status"]
        res = self._result(
            rj, status, code, msg["message"], elapsed_ms, msg["peak_mb"], msg["cpu_ms"]
        )
        res.result = msg["result"]
        return res, msg["outputs"]

    def _new_child(self) -> Child:
        # A sandboxed child is allowed these folders: they must exist first.
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.inbox.mkdir(parents=True, exist_ok=True)
        if self._sandbox is None:
            return Child(None)
        return Child({**self._sandbox, "network": self._net})

    def _spawn(self) -> Child | None:
        """A new child, already told to load this slot's libraries (its answer
        comes before its first report; nobody waits for it)."""
        child = self.child = self._new_child()
        if self._job_types and not child.send({"op": "warm", "job_types": self._job_types}):
            child.kill()
            self.child = None
            return None
        return child

    def _replace(self, rj: Running) -> None:
        """After a child was killed or died: its successor loads its libraries
        while the result is reported, so that the next attempt finds it warm
        (as after a recycle) instead of paying a cold start.  Not when the
        worker stops at once: nothing will run on it."""
        if self.child is None and self._job_types and not rj.stop_now.is_set():
            self._spawn()

    def _recycle(self, child: Child) -> None:
        """Retire a worn child without waiting for it: a thread of its own
        asks it to exit and reaps it (killing it after a grace period) while
        its replacement loads its libraries; the slot takes its next job at
        once (the replacement answers when it is ready)."""
        self._retiring = [t for t in self._retiring if t.is_alive()]
        retire = threading.Thread(target=child.stop, name=f"retire-{child.pid}", daemon=True)
        retire.start()
        self._retiring.append(retire)
        self.child = None
        if self._job_types:
            self._spawn()

    def _died(
        self, rj: Running, child: Child, mem: int, elapsed_ms: int, vm: tuple[int, int]
    ) -> AttemptResult:
        ex = child.reap()
        self.child = None
        if child.violation is not None:
            code, status = "CRASHED", "crashed"
            why = "the processing child sent a malformed report and was stopped"
        elif ex.signal == signal.SIGXCPU:
            code, status, why = "TIMEOUT", "timeout", "the attempt used up its CPU time"
        elif ex.signal == signal.SIGKILL and ex.peak_mb >= mem * 0.9:
            code, status, why = "OOM", "failed", "the attempt was killed for using too much memory"
        elif ex.signal in NATIVE_ABORTS and (
            _filled(vm, mem) or ex.peak_mb >= mem * 0.8 or _said_no_memory(child)
        ):
            # The sampled address space lags a fast last allocation; a
            # resident peak near the limit tells the same story afterwards,
            # and so does the library's last word (one refused allocation).
            code, status, why = "OOM", "failed", "the attempt ran out of memory in a native library"
        else:
            code, status = "CRASHED", "crashed"
            why = f"the processing child died ({_signame(ex.signal)})"
        # One line in the worker's log too: a child killed on the spot prints
        # nothing of its own, and the log said nothing at all of it.
        log.warning("job %s attempt %s: %s", rj.job.job_id, rj.job.attempt, why)
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

    @classmethod
    def cancelled_before_start(cls, rj: Running) -> AttemptResult:
        return cls._result(rj, "cancelled", None, "cancelled before start", 0, None, None)

    def close(self) -> None:
        for child in (self.child, self._parked):
            if child is not None:
                child.stop()
        self.child = self._parked = None
        for retire in self._retiring:
            retire.join()  # each ends within the grace of Child.stop


class ScratchWatch:
    """The scratch folder's total, taken every SCRATCH_CHECK while an attempt
    runs: a hostile input that writes file after file, each under the file
    limit, filled the disk the database and the blobs live on, bounded only
    by the attempt's timeout (at 1 GB/s, 300 GB in five minutes)."""

    def __init__(self, path: str, limit_mb: int, started: float, pid: int | None = None) -> None:
        self.path = path
        self.limit_mb = limit_mb
        self.pid = pid
        self._next = started + SCRATCH_CHECK

    def over(self) -> Stop | None:
        now = time.monotonic()
        if now < self._next:
            return None
        self._next = now + SCRATCH_CHECK
        used, entries = scratch_usage(self.path, MAX_SCRATCH_ENTRIES)
        if self.pid is not None:
            used += unlinked_usage(self.pid, self.path)
        if entries > MAX_SCRATCH_ENTRIES:
            why = f"the attempt made more than {MAX_SCRATCH_ENTRIES:,} files in its scratch folder"
            return ("failed", "LIMIT_EXCEEDED", why)
        if used > self.limit_mb << 20:
            why = f"the attempt wrote more than its {self.limit_mb} MB limit to its scratch folder"
            return ("failed", "LIMIT_EXCEEDED", why)
        return None


def scratch_usage(path: str, max_entries: int) -> tuple[int, int]:
    """(bytes on disk, entries) under path, counting stops past max_entries.

    Blocks, not sizes: a sparse file costs the disk nothing.  Links are not
    followed, and whatever vanishes or cannot be read while the child works
    is skipped: this is a bound, not an audit."""
    used = entries = 0
    folders = [path]
    while folders and entries <= max_entries:
        try:
            with os.scandir(folders.pop()) as it:
                for entry in it:
                    entries += 1
                    if entries > max_entries:
                        break
                    with contextlib.suppress(OSError):
                        used += entry.stat(follow_symlinks=False).st_blocks * 512
                        if entry.is_dir(follow_symlinks=False):
                            folders.append(entry.path)
        except OSError:
            continue
    return used, entries


def unlinked_usage(pid: int, path: str) -> int:
    """Bytes on disk of the files under ``path`` that process ``pid`` holds
    open after unlinking them: libvips makes its temporary images so (a
    400 MB canvas of an animated WebP), and the folder's listing never saw
    them against the scratch limit."""
    used, folder = 0, f"/proc/{pid}/fd"
    try:
        fds = os.listdir(folder)
    except OSError:
        return 0
    prefix, gone = path.rstrip("/") + "/", " (deleted)"
    for fd in fds:
        with contextlib.suppress(OSError):
            target = os.readlink(f"{folder}/{fd}")
            if target.startswith(prefix) and target.endswith(gone):
                used += os.stat(f"{folder}/{fd}").st_blocks * 512
    return used


def _empty(directory: Path) -> None:
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


def _said_no_memory(child: Child) -> bool:
    """Whether the dead child's stderr said an allocation failed: read to its
    end first (the relay thread may not have got to its last words)."""
    tag = getattr(child, "stderr", None)
    if tag is None:
        return False
    tag.drain()
    return bool(tag.no_memory)


def _filled(vm: tuple[int, int], mem: int) -> bool:
    """Whether the attempt's address space grew through at least FILLED of its room."""
    start, peak = vm
    return start > 0 and peak - start >= FILLED * max(1, mem - start)


def _signame(sig: int | None) -> str:
    if sig is None:
        return "exited"
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def scratch_root(home: Path, worker_id: str) -> tuple[Path, int, list[str]]:
    """This worker's scratch folder, held for its life (leftovers.py): a worker
    killed on the spot leaves one that the next worker here removes.  Returns
    the folder, the lock's descriptor (closed once the folder is gone) and
    the ids of the workers whose folders were removed: they died."""
    parent = home.resolve() / "scratch"
    dead = leftovers.sweep_folders(parent)
    root = parent / worker_id
    return root, leftovers.hold_folder(root), dead

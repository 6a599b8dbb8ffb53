"""The worker process: claims jobs, feeds slots, drains on SIGTERM or when drained.

Threads: the claim loop (the caller's thread, which also owns the signal
handlers), one thread per concurrency slot, the flusher (batched writes), the
monitor (leases, cancels, heartbeats, metrics) and, on PostgreSQL, a LISTEN
thread that wakes the claim loop as soon as a job is enqueued.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import shutil
import signal
import socket
import threading
import time
import uuid
from collections.abc import Collection, Sequence
from typing import Any

from hypermedia import said
from hypermedia.config import HOME_MODE, connect_ports, sandbox_mode
from hypermedia.db.dialects import is_transient
from hypermedia.db.ready import wait_until_ready
from hypermedia.errors import InvalidRequest
from hypermedia.linux import name_native
from hypermedia.pipelines import registry
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import EVERY_QUEUE, AttemptResult, Claimed
from hypermedia.queue.queues import PAUSED
from hypermedia.redact import brief
from hypermedia.storage.ledger import Storage
from hypermedia.worker import sandbox as landlock
from hypermedia.worker import seccomp
from hypermedia.worker.fleet import every_queue
from hypermedia.worker.flusher import Flusher
from hypermedia.worker.monitor import Monitor, Stats, exit_if_they_die, release_dead, worker_row
from hypermedia.worker.outage import Outage
from hypermedia.worker.pace import Pace
from hypermedia.worker.slot import Running, Slot, SlotConfig, scratch_root
from hypermedia.worker.transfer import Stager, Storer

log = logging.getLogger(__name__)


def new_worker_id() -> str:
    """Fresh per process start: hostname, pid and a random suffix."""
    return f"{socket.gethostname()[:60]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class Worker:
    def __init__(
        self,
        engine: Engine,
        queues: Sequence[str],
        *,
        concurrency: int = 2,
        batch: int | None = None,
        burst: bool = False,
        worker_id: str | None = None,
        job_types: Sequence[str] | None = None,
        only_jobs: Collection[int] | None = None,
    ) -> None:
        self.engine = engine
        self.settings = engine.settings
        # "*": every queue, looked up again as profiles come and go (_claimable).
        self.every_queue = EVERY_QUEUE in queues
        self.queues = sorted(registry.queues()) if self.every_queue else list(queues)
        self.concurrency = max(1, concurrency)
        self.batch = max(1, batch or self.settings.claim_batch)
        self.burst = burst
        # Those whose availability it reports at start (default: its queues').
        self.job_types = list(job_types) if job_types is not None else None
        self.worker_id = worker_id or new_worker_id()
        # None but these jobs (worker/local.py: its command's), whatever else
        # is queued ahead of them in its queues.
        self.only_jobs = frozenset(only_jobs) if only_jobs is not None else None
        self.sandbox, self.connect_ports = sandbox_settings(self.settings)
        self.stats = Stats()
        self.flusher = Flusher(
            engine,
            self.worker_id,
            self._on_result,
            gather=self.batch if engine.db.single_writer else None,
            held=self._held,
            lookup=self._job,
        )
        self.buffer: queue.Queue[Running] = queue.Queue()
        self._running: dict[int, Running] = {}
        self._lock = threading.Lock()
        self.wake = threading.Event()
        self.stop_claiming = threading.Event()
        self.stop_now = threading.Event()
        self.stopped = threading.Event()
        self._paused: set[str] = set()
        self._paused_at = 0.0
        self._status_at = 0.0
        self._signals = 0
        self._warming = threading.Semaphore(0)  # one release per slot once its child is warm
        self.stager: Stager | None = None
        self.storer: Storer | None = None
        # Jobs one worker may hold at once (running, buffered, or finished
        # with the result not yet written): its slots' and, for short jobs,
        # some ahead (pace.py).
        self.pace = Pace(self.batch)
        self.outage = Outage()  # claims held back while the storage is away (outage.py)

    # -- lifecycle -------------------------------------------------------------

    def install_signals(self) -> None:
        """SIGTERM or SIGINT drains; a second stops at once.  `serve` installs
        them before its HTTP server answers: one that came between the first
        ready answer and the worker's start killed it by the signal."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def run(self, *, install_signals: bool = True) -> None:
        if install_signals:
            self.install_signals()
        if not self._register():
            log.info("worker %s stopped before it started", self.worker_id)
            self.stopped.set()
            return
        root, self._scratch_lock, dead = scratch_root(self.settings.home, self.worker_id)
        release_dead(self.engine, dead)
        cfg = SlotConfig(
            root,
            self.settings.child_memory_mb,
            self.settings.child_max_attempts,
            self.settings.memory_ceiling_mb,
            self.settings.child_max_file_mb,
            self.settings.child_max_scratch_mb,
            self.settings.child_recycle_rss_mb,
            self.sandbox,
            self.connect_ports,
            # A child may write to a hard link to the stored blob unless
            # Landlock keeps its inbox read-only: otherwise inputs are copied.
            link_inputs=self.sandbox != "off" and landlock.abi() > 0,
        )
        storage = Storage(self.engine.db, self.settings, clock=self.engine.clock)
        self.flusher.before_results = storage.make_durable
        # Inputs are fetched a slot's worth ahead; outputs stored by up to four
        # threads (uploads to S3 run in parallel, local ones are quick).
        self.stager = Stager(storage, root / "stage", self.concurrency, link=cfg.link_inputs)
        self.storer = Storer(storage, self.flusher.finished, min(self.concurrency, 4))
        slots = [
            Slot(i, cfg, self.flusher, storage, stager=self.stager, storer=self.storer)
            for i in range(self.concurrency)
        ]
        threads = [
            threading.Thread(target=self._slot_loop, args=(s,), name=f"slot-{s.index}", daemon=True)
            for s in slots
        ]
        monitor = Monitor(
            self.engine,
            self.worker_id,
            self.running,
            self.stats,
            self.settings.home,
            self.stopped,
            self._drop_cancelled,
        )
        listener = threading.Thread(
            target=self._listen,
            daemon=True,
            name="listener",
        )
        exit_if_they_die({self.flusher, self.stager})
        for t in (self.flusher, monitor, listener, self.stager, *threads):
            t.start()
        log.info(
            "worker %s on queues %s, concurrency %s",
            self.worker_id,
            ("every queue: " if self.every_queue else "") + ",".join(self.queues),
            self.concurrency,
        )
        # Off the claim loop's way: a clamd probe may wait a second.
        reported = registry.job_types_for(self.queues) if self.job_types is None else self.job_types
        threading.Thread(
            target=report_availability, args=(reported,), daemon=True, name="availability"
        ).start()
        try:
            self._claim_loop()
        finally:
            self._shutdown(threads, slots, monitor)

    def request_stop(self, *, now: bool = False) -> None:
        """What SIGTERM does: the first drains, a second stops at once."""
        self.stop_claiming.set()
        if now:
            self.stop_now.set()
            for rj in self.running():
                rj.stop_now.set()
        self.wake.set()

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._signals += 1
        log.info("signal %s: %s", signum, "draining" if self._signals == 1 else "stopping now")
        self.request_stop(now=self._signals > 1)

    def _register(self) -> bool:
        """Write the worker's row; False if told to stop first.  A database
        that is away (restarting, not up yet, its disk full) or not migrated
        yet is waited for, as the claim loop waits for it later: a worker
        started beside its database need not be started again."""
        self.settings.home.mkdir(mode=HOME_MODE, parents=True, exist_ok=True)
        if not wait_until_ready(self.engine.db, self.stop_claiming):
            return False
        delay = 0.5  # it may go away again before the insert
        while True:
            row = worker_row(
                self.worker_id,
                [EVERY_QUEUE] if self.every_queue else self.queues,
                self.concurrency,
                self.settings.home,
                self.engine.clock(),
            )
            try:
                with self.engine.db.tx() as tx:
                    tx.insert_worker(row)
                return True
            except Exception as exc:
                if not is_transient(exc):
                    raise
                log.warning("cannot register the worker (%s); retrying in %.1fs", brief(exc), delay)
            if self.stop_claiming.wait(delay):
                return False
            delay = min(delay * 2, 5.0)

    # -- claiming --------------------------------------------------------------

    def _claim_loop(self) -> None:
        # While the children warm up: the claim's statements are compiled too.
        try:
            self.engine.prime(self.worker_id, self.queues, self.batch)
        except Exception as exc:  # the database is away: the claim below backs off
            log.debug("could not prime the claim (%s)", brief(exc))
        # No claim before every slot's child is warm (bounded by the slots'
        # own timeout): a lease taken by a worker that cannot start the job
        # yet is time another, ready worker could have used.
        for _ in range(self.concurrency):
            while not self._warming.acquire(timeout=0.2):
                if self.stop_claiming.is_set():
                    return
        delay, unsure = 0.1, False
        while not self.stop_claiming.is_set():
            if self._drain_requested():
                log.info("worker %s: drain requested; draining", self.worker_id)
                self.request_stop()
                break
            # Held jobs include finished ones whose results are not written
            # yet: when the database is slow, claiming slows down with it
            # instead of hoarding jobs other workers could run.
            with self._lock:
                held = len(self._running)
            # Refill once the buffer is half empty, asking for a whole batch
            # (a claim costs the same round trip for 5 jobs or for 10), or
            # for what there is room for once it is empty.
            room = min(self.batch, self.concurrency + self.pace.ahead() - held)
            got, tried = 0, False
            half = self.buffer.qsize() <= self.batch // 2
            if half and (room >= max(1, self.batch // 2) or (room >= 1 and self.buffer.empty())):
                room, pause = self.outage.room(room)
                if pause > 0:  # the storage is away: queued jobs keep their attempts
                    self.stop_claiming.wait(min(pause, self.settings.poll_interval_seconds))
                    continue
                try:
                    if unsure:  # the last claim may have committed: its jobs are ours
                        self._hand_back_lost_claims()
                        unsure = False
                    got, tried = self._claim(room), True
                    delay = 0.1
                    said.ended("claim")
                except Exception as exc:  # database away: back off, keep the jobs we hold
                    said.warning(log, "claim", "claim failed (%s); retrying", brief(exc))
                    unsure = True
                    self.stop_claiming.wait(delay)
                    delay = min(delay * 2, 5.0)
                    continue
            if got:
                continue
            if tried:
                self.pace.idle()
            # Only after a claim that found nothing: the jobs held when no
            # claim was tried may all have finished since (more are queued).
            if self.burst and tried and self._idle():
                return
            if not tried and not self.buffer.empty():
                with contextlib.suppress(Exception):  # the next claim says why, and retries
                    self._read_queues()
            self.wake.wait(self.settings.poll_interval_seconds)
            self.wake.clear()

    def _claim(self, n: int) -> int:
        queues = self._claimable()
        if not queues:
            jobs = []
        elif self.engine.db.single_writer:
            # With the flusher's next results: one commit for both (flusher.py).
            jobs = self.flusher.claim(queues, n, self.only_jobs)
        else:
            jobs = self.engine.claim(self.worker_id, queues, n, self.only_jobs)
        for job in jobs:
            rj = Running(job)
            if self.stager is not None:
                rj.staging = self.stager.add(job)
            with self._lock:
                self._running[job.job_id] = rj
            self.buffer.put(rj)
        return len(jobs)

    def _hand_back_lost_claims(self) -> None:
        """A claim that failed may have failed after its commit (the
        connection dropped at COMMIT): the jobs it took are ours in the
        database, and no slot runs them."""
        with self._lock:
            held = set(self._running)
        back = self.engine.hand_back_lost_claims(self.worker_id, held)
        if back:
            log.info("handed back %d job(s) of a claim whose answer was lost", len(back))

    def _claimable(self) -> list[str]:
        """Our queues but the paused ones; both read at most once per poll interval."""
        self._read_queues()
        return [q for q in self.queues if q not in self._paused]

    def _read_queues(self) -> None:
        """The paused queues (and, serving every queue, the queues there are),
        read again once a poll interval has passed: while no claim is made
        too, for slots to hand back jobs claimed ahead of a pause."""
        if time.monotonic() - self._paused_at > self.settings.poll_interval_seconds:
            with self.engine.db.read() as tx:
                self._paused = tx.paused_queues()
                if self.every_queue:
                    self.queues = sorted(every_queue(tx))
            self._paused_at = time.monotonic()

    def _drain_requested(self) -> bool:
        """Whether an operator marked our row draining (``Fleet.drain``); read at
        most once per poll interval, like the paused queues."""
        if time.monotonic() - self._status_at <= self.settings.poll_interval_seconds:
            return False
        self._status_at = time.monotonic()
        try:
            with self.engine.db.read() as tx:
                status = tx.worker_status(self.worker_id)
        except Exception as exc:  # database away: the claim below backs off
            said.warning(log, "status", "could not read worker status (%s)", brief(exc))
            return False
        said.ended("status")
        return status == "draining"

    def _held(self) -> int:
        with self._lock:
            return len(self._running)

    def _job(self, job_id: int) -> Claimed | None:
        rj = self._running.get(job_id)  # one dict read: atomic, no lock needed
        return None if rj is None else rj.job

    def _idle(self) -> bool:
        with self._lock:
            busy = bool(self._running)
        return not busy and self.buffer.empty() and self.flusher.idle()

    def _listen(self) -> None:
        name_native()
        self.engine.db.listen(self._on_notify, self.stopped, self.settings.watch_interval_seconds)

    def _on_notify(self, queue_name: str) -> None:
        if queue_name == "*" or self.every_queue or queue_name in self.queues:
            # A pause notifies too: its jobs claimed ahead here were handed
            # back, and the switches are read again before a slot takes one.
            self._paused_at = 0.0
            self.wake.set()

    # -- running -----------------------------------------------------------------

    def running(self) -> list[Running]:
        with self._lock:
            return list(self._running.values())

    def _slot_loop(self, slot: Slot) -> None:
        name_native()
        try:
            self._warm(slot)
        finally:
            self._warming.release()
        while not (self.stop_claiming.is_set() and self.buffer.empty()):
            try:
                rj = self.buffer.get(timeout=0.2)
            except queue.Empty:
                continue
            if self.buffer.qsize() <= self.batch // 2:
                self.wake.set()
            with self._lock:
                if rj.dropped:  # cancelled while it waited: ended already
                    continue
                rj.taken = True
                lost = rj.lost.is_set()  # no longer ours (a pause handed it back): never run
                if lost:
                    self._running.pop(rj.job.job_id, None)
            if lost:
                if self.stager is not None:
                    self.stager.drop(rj.job, rj.staging)
                continue
            if self.stop_claiming.is_set():  # draining or stopping: never start new work
                self._hand_back([rj])
                continue
            if rj.job.queue_name in self._paused:  # paused since it was claimed ahead
                self._hand_back([rj], PAUSED)
                continue
            # A reported job stays ours until its result is written (see
            # _on_result): the monitor keeps renewing its lease meanwhile.
            try:
                reported = slot.run(rj)
            except Exception:
                log.exception("slot %s failed running job %s", slot.index, rj.job.job_id)
                self.flusher.finished(
                    AttemptResult(
                        rj.job.job_id,
                        rj.job.attempt,
                        "crashed",
                        "CRASHED",
                        "the worker could not run the attempt",
                    )
                )
                reported = True
            if not reported:
                with self._lock:
                    self._running.pop(rj.job.job_id, None)
        slot.close()

    def _warm(self, slot: Slot) -> None:
        """Warm the slot's child, again and again while it dies as it starts.
        The claim loop claims nothing until every slot is warm: a worker whose
        children could not start took every job and failed it as CRASHED,
        burning the queue's attempts on a broken install."""
        delay = 1.0
        while not slot.warm(registry.job_types_for(self.queues)):
            log.error(
                "slot %s: its child process died as it started (what it printed is logged "
                "above as hypermedia.child); this worker claims nothing until one starts: "
                "trying again in %.0f s",
                slot.index,
                delay,
            )
            if self.stop_claiming.wait(delay):
                return
            delay = min(delay * 2, 60.0)

    def _drop_cancelled(self, items: list[Running]) -> None:
        """Jobs cancelled while they waited in the buffer for a slot: their
        attempts end "cancelled before start" now (a slot that takes one
        later passes it by), as a slot would have ended them."""
        with self._lock:
            dropped = [rj for rj in items if not rj.taken and not rj.dropped]
            for rj in dropped:
                rj.dropped = True
        for rj in dropped:
            if self.stager is not None:
                self.stager.drop(rj.job, rj.staging)
            self.flusher.finished(Slot.cancelled_before_start(rj))

    def _hand_back(
        self, items: list[Running], why: str = "handed back unstarted by a draining worker"
    ) -> None:
        try:
            back = self.engine.hand_back(self.worker_id, [rj.key for rj in items], why)
            # Not handed back: cancelled meanwhile (or lost, which this ignores).
            rest = [rj.key for rj in items if rj.job.job_id not in back]
            if rest:
                self.engine.confirm_cancels(self.worker_id, rest)
        except Exception as exc:  # the reaper will release them after the lease
            log.warning("hand back failed (%s)", brief(exc))
        with self._lock:
            for rj in items:
                self._running.pop(rj.job.job_id, None)
        if self.stager is not None:
            for rj in items:
                self.stager.drop(rj.job, rj.staging)

    def _on_result(self, result: AttemptResult, accepted: bool) -> None:
        with self._lock:
            rj = self._running.get(result.job_id)
            if rj is not None and rj.job.attempt == result.attempt:
                del self._running[result.job_id]
        # Room to claim again, which the claim loop uses only once the buffer
        # is half empty (an empty one also lets a burst worker see it is done):
        # waking it for every result cost a context switch per job.
        if self.buffer.qsize() <= self.batch // 2:
            self.wake.set()
        self.pace.finished(result.duration_ms)
        if self.outage.result(result.code):
            log.warning(
                "the storage is away: claiming one job at a time, with pauses, until it is back"
            )
        if accepted and result.status != "cancelled":  # a cancel is no failure
            self.stats.record(result.status == "completed", result.duration_ms)

    # -- shutdown ----------------------------------------------------------------

    def _write_results(self) -> None:
        """A drain writes its finished attempts' results, waiting for a
        database that is away up to the lease's length (after it, the reaper
        has taken the jobs anyway); they were dropped after 10 s, unsaid, and
        the jobs ran again.  A second SIGTERM ends the wait within a second."""
        draining = not self.stop_now.is_set()
        limit = max(10.0, self.settings.lease_seconds) if draining else 3.0
        started, waiting_said = time.monotonic(), False
        while not self.flusher.close(timeout=1.0):
            waited = time.monotonic() - started
            if waited > limit or (draining and self.stop_now.is_set()):
                break
            if waited > 10 and not waiting_said:
                log.warning(
                    "waiting to write the results of finished attempts (the database "
                    "does not take them); a second SIGTERM stops without them"
                )
                waiting_said = True
        if not self.flusher.idle():
            log.warning(
                "stopped with results not written: their jobs run again once their leases expire"
            )

    def _shutdown(
        self, threads: list[threading.Thread], slots: list[Slot], monitor: Monitor
    ) -> None:
        self.stop_claiming.set()
        monitor.status = "draining"
        leftovers: list[Running] = []
        while True:
            try:
                leftovers.append(self.buffer.get_nowait())
            except queue.Empty:
                break
        with self._lock:  # those cancelled while they waited are ended already
            leftovers = [rj for rj in leftovers if not rj.dropped]
            for rj in leftovers:
                rj.taken = True
        if leftovers:
            self._hand_back(leftovers)
        for t in threads:
            while t.is_alive():
                t.join(0.2)
        if self.stager is not None:
            self.stager.close()
        if self.storer is not None:
            self.storer.close(now=self.stop_now.is_set())
            self.storer.storage.reservations.release()  # no output will take them now
        # Each start makes a new scratch root (HOME/scratch/<worker_id>): it
        # goes with the worker.  Every slot has closed its child by now, so
        # nothing writes there.  (One killed on the spot leaves it to the next
        # worker's sweep: worker/slot.py scratch_root.)
        shutil.rmtree(slots[0].cfg.scratch_root, ignore_errors=True)
        os.close(self._scratch_lock)
        self._write_results()
        self.stopped.set()
        monitor.join(2)
        try:
            with self.engine.db.tx() as tx:
                tx.update_worker(
                    self.worker_id,
                    {
                        "status": "terminated",
                        "current_jobs": 0,
                        "terminated_at": self.engine.clock(),
                    },
                )
        except Exception as exc:
            log.warning("could not mark worker terminated (%s)", brief(exc))
        log.info("worker %s stopped", self.worker_id)


def sandbox_settings(settings: Any) -> tuple[str, list[int] | None]:
    """The children's confinement (mode, TCP ports), checked before the worker
    registers: ``required`` on a kernel without Landlock refuses to start."""
    mode, ports = sandbox_mode(settings), connect_ports(settings)
    if mode == "off":
        return mode, ports
    if not seccomp.available():
        log.warning("attempt children may open sockets: no seccomp filter for this machine")
    version = landlock.abi()
    if version == 0:
        if mode == "required":
            raise InvalidRequest(
                "HYPERMEDIA_CHILD_SANDBOX=required, but this kernel has no Landlock (Linux 5.13+)"
            )
        log.warning("attempt children's files are not confined: this kernel has no Landlock")
    return mode, ports


def report_availability(job_types: list[str]) -> None:
    """Say which of this worker's job types cannot run on this machine, and why
    (a missing library, clamd away): their jobs will fail here, or retry."""
    for job_type, why in registry.availability(job_types).items():
        if why is not None:
            log.warning("%s cannot run on this machine: %s", job_type, why)

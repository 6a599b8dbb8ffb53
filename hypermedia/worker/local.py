"""A worker inside another command's process.

``hypermedia process`` runs one when no worker serves its jobs' queues, so on
the embedded default one command uploads, runs and writes the outputs, with
no ``serve`` in a second terminal.  It is an ordinary worker (children,
fencing, its own ``workers`` row) plus a leader candidate: an earlier run
interrupted with jobs in flight left leases that only the reaper releases.
"""

from __future__ import annotations

import logging
import threading

from hypermedia.queue.engine import Engine
from hypermedia.redact import brief
from hypermedia.scheduler.leader import Leader
from hypermedia.worker.fleet import TEMPORARY
from hypermedia.worker.runner import Worker, new_worker_id

# A graceful stop finishes the attempts that run; past this it stops at once
# (what it ran is orphaned and retried, as when a worker is killed).
DRAIN_SECONDS = 30.0

log = logging.getLogger(__name__)


class LocalWorker:
    def __init__(
        self, engine: Engine, queues: list[str], concurrency: int, job_ids: list[int]
    ) -> None:
        # No availability report: its command says what matters to it (process
        # warns about its profile), not every job type of the queues it serves.
        # It claims its command's jobs only: a stranger's job of the same
        # queue, taken by a slot freed early or queued ahead of them, was cut
        # short by the command's stop at DRAIN_SECONDS and charged (three
        # `process` runs failed a stranger's long job for good).
        self.worker = Worker(
            engine,
            queues,
            concurrency=concurrency,
            job_types=[],
            worker_id=f"{TEMPORARY}{new_worker_id()}",
            only_jobs=job_ids,
        )
        self._thread = threading.Thread(target=self._run, name="local-worker", daemon=True)
        self._leader = Leader(engine, self.worker.worker_id, self.worker.stopped)
        self._stopping = False
        self._error: str | None = None

    def _run(self) -> None:
        try:
            self.worker.run(install_signals=False)  # the command owns its signals
        except Exception as exc:  # said by died(); the traceback goes to the log
            log.exception("the local worker failed")
            self._error = brief(exc)

    def died(self) -> str | None:
        """Why the worker ended before it was asked to, if it did: the command
        waited out its whole timeout for jobs nobody would run."""
        if self._stopping or self._thread.is_alive() or not self._thread.ident:
            return None
        ended = f"failed ({self._error})" if self._error else "stopped"
        return f"the worker this command ran {ended}"

    def start(self) -> None:
        self._thread.start()
        self._leader.start()

    def stop(self, *, now: bool = False) -> None:
        """Drain (``now``: stop at once) and wait until the worker has ended."""
        self._stopping = True
        self.worker.request_stop(now=now)
        self._thread.join(None if now else DRAIN_SECONDS)
        if self._thread.is_alive():
            self.worker.request_stop(now=True)
            self._thread.join()
        self._leader.join(5)

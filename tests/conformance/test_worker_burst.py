"""``hypermedia worker --burst`` exits only when a claim found nothing to do."""

from __future__ import annotations

import queue
import threading

from hypermedia.queue.engine import Engine
from hypermedia.worker.runner import Worker

from ._helpers import new_job, status_of


class _FinishesMeanwhile(Worker):
    """Every job it holds finishes between the claim loop's count of them
    and its idle check: the race that let a burst worker leave queued jobs."""

    def _idle(self) -> bool:
        with self._lock:
            self._running.clear()
        self.buffer.queue.clear()
        return super()._idle()


def test_a_burst_worker_that_was_full_claims_again_before_exiting(engine: Engine, driver) -> None:
    jobs = [new_job(engine) for _ in range(3)]
    w = _FinishesMeanwhile(engine, ["bulk"], concurrency=1, batch=2, burst=True)
    with w._lock:  # full: the first round tries no claim
        full = w.concurrency + 4 * w.batch  # the most a worker holds (worker/pace.py)
        w._running.update({-i: None for i in range(1, full + 1)})  # type: ignore[misc]
    for _ in range(w.concurrency):
        w._warming.release()  # no slots here: their children count as warm
    w.flusher.start()  # SQLite claims in the flusher's transaction

    def finish() -> None:  # ... and if no idle check saw it, they finish anyway
        with w._lock:
            w._running.clear()
        w.wake.set()

    def slot() -> None:  # takes each claimed job and drops it at once (no child here)
        while not w.stopped.is_set():
            try:
                rj = w.buffer.get(timeout=0.05)
            except queue.Empty:
                continue
            with w._lock:
                w._running.pop(rj.job.job_id, None)
            w.wake.set()

    timers = [threading.Timer(0.5, finish), threading.Timer(10, w.stop_claiming.set)]
    slot_thread = threading.Thread(target=slot, daemon=True)
    for t in (*timers, slot_thread):
        t.start()
    try:
        w._claim_loop()  # returns when a claim finds nothing (or after 10 s)
    finally:
        for t in timers:
            t.cancel()
        w.stopped.set()
        slot_thread.join(5)
        w.flusher.close(5)
    assert not w.stop_claiming.is_set(), "the loop never ended by itself"
    assert [status_of(driver, j) for j in jobs] == ["claimed"] * 3

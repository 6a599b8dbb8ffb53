"""The attempt fold: finished attempts' durations counted once, by id.

/metrics' duration histogram used to read every attempt on every scrape
(~0.7 s of database time at 1,000,000 attempts on PostgreSQL).  This leader
service adds the durations of finished attempts to
``pruned_attempt_durations`` in order of attempt id, a primary-key range per
transaction, and records how far it got (``attempt_fold.watermark``); a
scrape then reads the attempts past the watermark only, in the same
snapshot as the counts (``Queues.figures``).  Job retention adds only the
attempts past the watermark of the jobs it deletes.

The watermark stops short of the oldest attempt still running, and of any id
that was not yet the newest a minute ago (``seen``/``seen_at``): an attempt
row is written by a claim whose transaction lasts milliseconds, so by then
every id below is committed and none can appear behind the watermark.  A
finished attempt does not change again, so none counted is ever counted
twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from hypermedia.queue import durations
from hypermedia.queue.engine import Engine
from hypermedia.scheduler.budget import Backlog, Backlogged

STEP = 20_000  # attempt ids per transaction
SETTLE = timedelta(seconds=60)  # how old an id must be to fold past it


@dataclass
class AttemptFold(Backlogged):
    engine: Engine
    name: str = "attempt-fold"
    # Without a budget (``run_once`` in tests) a run goes on until it is done.
    backlog: Backlog = field(default_factory=lambda: Backlog(60.0))

    def run_once(self) -> int:
        """Fold what may be folded; return how many attempt ids the watermark moved."""
        self.backlog.start()
        total = 0
        while not self.backlog.spent():
            moved, done = self._step()
            total += moved
            if done:
                break
        return total

    def _step(self) -> tuple[int, bool]:
        """One transaction: (how far the watermark moved, whether it is as far as it may go)."""
        now = self.engine.clock()
        with self.engine.db.tx() as tx:
            fold = tx.attempt_fold(lock=True)
            newest, running = tx.attempt_ids()
            mark = int(fold["watermark"])
            settled = fold["seen_at"] is not None and fold["seen_at"] <= now - SETTLE
            limit = int(fold["seen"]) if settled else mark
            if running is not None:
                limit = min(limit, int(running) - 1)
            upto = min(limit, mark + STEP)
            values: dict[str, Any] = {}
            if upto > mark:
                histogram = tx.attempt_duration_histogram(
                    durations.BOUNDS_MS, after=mark, upto=upto
                )
                tx.add_pruned_durations(histogram, durations.BOUNDS_MS, now)
                values["watermark"] = upto
            done = upto >= limit
            if done and (settled or fold["seen_at"] is None):
                values |= {"seen": newest, "seen_at": now}  # the next limit, a minute on
            if values:
                tx.set_attempt_fold(values, now)
        return max(upto - mark, 0), done

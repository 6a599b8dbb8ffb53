"""Queues as operators see them: depth, a summary per queue, pause and resume.

Pausing is a switch in ``queue_states``: workers skip paused queues when they
claim (see ``worker.runner``); jobs claimed and not started go back to the
queue with it; jobs started run on.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from hypermedia.queue import durations
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import check_queue_name
from hypermedia.worker.fleet import Fleet

Row = dict[str, Any]
COUNTS = ("queued", "running", "retry_wait", "completed_1h", "failed_1h")
PAUSED = "handed back unstarted: its queue was paused"


class Queues:
    def __init__(self, engine: Engine) -> None:
        self.db = engine.db
        self.clock = engine.clock
        self.engine = engine
        self.fleet = Fleet(engine)

    def depth(self, project_id: str | None = None) -> list[Row]:
        """Open jobs by queue, status and priority: rows queue_name, status, priority, count."""
        with self.db.read() as tx:
            rows = tx.queue_depth(project_id)
        return [{**r, "count": int(r["count"])} for r in rows]

    def summary(self, project_id: str | None = None, *, everyones: bool = True) -> list[Row]:
        """One row per known queue (named by a profile, a job or a switch), by name.

        running = claimed + processing + cancel_requested; completed_1h and
        failed_1h count jobs that ended in the last hour, of ``project_id``
        only if given.  ``everyones=False`` lists only the profiles' queues and
        those the project's jobs name: a queue name is anyone's text, and
        another project's showed on every dashboard (an operator's listing
        keeps them all).
        """
        since = self.clock() - timedelta(hours=1)
        with self.db.read() as tx:
            counts = {r["queue_name"]: r for r in tx.queue_counts(since, project_id)}
            switches = {r["queue_name"]: bool(r["paused"]) for r in tx.queue_states()}
            names = tx.profile_queue_names() | set(counts)
            if everyones:
                names |= set(switches)
            if project_id is not None:
                names |= tx.job_queue_names(project_id if not everyones else None)
        # Why jobs wait for ever: a queue no live worker claims from (a typo,
        # or a worker started with other --queues) says so.
        served = self.fleet.serving(names)
        return [
            {**_summary_row(n, switches.get(n, False), counts.get(n)), "served": n in served}
            for n in sorted(names)
        ]

    def pause(self, name: str) -> Row:
        """Workers stop claiming from ``name``; the jobs they claimed ahead
        from it go back to it, in the same transaction; running jobs finish."""
        return self._switch(name, True)

    def resume(self, name: str) -> Row:
        """Workers claim from ``name`` again.  A queue never switched has no
        switch to turn: nothing is written (a typo such as "imagse" made a row,
        listed from then on), and its row says ``updated_at: None``."""
        return self._switch(name, False)

    def figures(self, bounds_ms: Sequence[float]) -> Row:
        """What /metrics shows of jobs and queues, across every project: jobs by
        status and type, queued jobs by queue and priority, the attempt duration
        histogram (cumulative ``le_<i>`` counts for ``bounds_ms``), paused
        queues, workers (terminated ones left out) and workers by status.

        One snapshot: job retention and the attempt fold move attempts' counts
        from the attempts to ``pruned_attempt_durations`` in one commit, and
        reading the two on either side of it would count them twice, then
        once: a Prometheus counter going down."""
        with self.db.snapshot() as tx:
            folded = int(tx.attempt_fold()["watermark"])  # scheduler/attempt_fold.py
            live = tx.attempt_duration_histogram(bounds_ms, after=folded)
            return {
                "jobs": tx.job_counts_by_status_type(),
                "queued": [r for r in tx.queue_depth() if r["status"] == "queued"],
                "durations": durations.merged(live, tx.pruned_durations(), bounds_ms),
                "switches": tx.queue_states(),
                # In the same snapshot: a worker counted by status has its heartbeat shown.
                "workers": tx.workers(include_terminated=False),
                "worker_counts": tx.worker_counts_by_status(),
            }

    def paused(self) -> set[str]:
        with self.db.read() as tx:
            return tx.paused_queues()

    def _switch(self, name: str, paused: bool) -> Row:
        check_queue_name(name)

        # The switch records no actor (queue_states has no such column).
        def switch(tx: Any) -> Row | None:
            if paused or tx.queue_state(name) is not None:
                tx.set_queue_paused(name, paused, self.clock())
                # Workers read the switches again now (runner._on_notify), not
                # a poll interval later.
                tx.notify({name})
            if paused:
                # QA: claimed ahead, they started up to a poll interval after
                # the pause had answered, while the worker's view was old.
                self.engine.hand_back_queue(tx, name, PAUSED, actor="pause")
            return tx.queue_state(name)

        state = self.db.tx_retrying(switch)  # concurrent first switches race
        if state is None:
            return {"queue_name": name, "paused": False, "updated_at": None}
        return {
            "queue_name": name,
            "paused": bool(state["paused"]),
            "updated_at": state["updated_at"],
        }


def _summary_row(name: str, paused: bool, counts: Row | None) -> Row:
    row: Row = {"queue_name": name, "paused": paused}
    row.update({k: int(counts[k]) if counts else 0 for k in COUNTS})
    return row

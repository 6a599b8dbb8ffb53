"""A worker's heartbeat counts the attempts its slots run: not the jobs
claimed ahead for them, nor the finished ones whose results wait to be
stored or written while the slot runs its next (``workers ls`` showed 2/1)."""

from __future__ import annotations

import threading
from pathlib import Path

from hypermedia.config import Settings
from hypermedia.db.driver import Driver
from hypermedia.db.migrate import upgrade
from hypermedia.queue.engine import Engine
from hypermedia.worker.monitor import Monitor, Stats, worker_row
from hypermedia.worker.slot import Running
from tests.harness import claimed_input


def _running(job_id: int, started: bool, ended: bool) -> Running:
    job = claimed_input({"project_id": "default", "object_id": None}, "debug.noop", job_id=job_id)
    return Running(job, started=started, ended=ended)


def test_the_heartbeat_counts_only_attempts_a_slot_runs(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'hm.db'}"
    upgrade(url)
    engine = Engine(Driver(url), Settings(home=tmp_path, database_url=url))
    with engine.db.tx() as tx:
        tx.insert_worker(worker_row("w1", ["bulk"], 1, tmp_path, engine.clock()))
    with engine.db.read() as tx:  # QA: "active 0/1" until its first heartbeat
        assert (tx.worker("w1")["status"], tx.worker("w1")["current_jobs"]) == ("idle", 0)
    held = [
        _running(1, started=True, ended=True),  # done: its result waits for the flusher
        _running(2, started=True, ended=False),  # running in the one slot
        _running(3, started=False, ended=False),  # claimed ahead
    ]
    monitor = Monitor(engine, "w1", lambda: held, Stats(), tmp_path, threading.Event())
    monitor.heartbeat()
    with engine.db.read() as tx:
        assert tx.worker("w1")["current_jobs"] == 1

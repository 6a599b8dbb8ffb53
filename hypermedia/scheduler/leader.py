"""Leader election through a lease row, and the loop that runs maintenance.

Whoever holds the unexpired ``leader_leases`` row named "maintenance" runs
the services; it renews the lease at a third of its length.  If the leader
dies, another node takes over once the lease has expired.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

from hypermedia import said
from hypermedia.db.ready import wait_until_ready
from hypermedia.linux import name_native
from hypermedia.queue.engine import Engine
from hypermedia.redact import brief
from hypermedia.scheduler.maintenance import Service, default_services

log = logging.getLogger(__name__)

LEASE_NAME = "maintenance"
# Each time this node takes the lead (at start, on a takeover, and when its
# lease check works again after failing: an outage longer than a third of the
# lease), services marked ``waits_for_workers`` (the reaper) wait this long
# once: a worker that lived through a database outage was silent only because
# the database was, and tries its heartbeat and leases every second until
# they are written (worker/monitor.py RETRY_SECONDS).  Reaped at once, every
# job it held was taken from it and its kept results were dropped as stale.
# Once per taking of the lead, so nothing else can hold the reaper back.
WORKER_GRACE_SECONDS = 10.0


class Leader(threading.Thread):
    def __init__(
        self,
        engine: Engine,
        node_id: str,
        stop: threading.Event,
        services: list[Service] | None = None,
    ) -> None:
        super().__init__(name="leader", daemon=True)
        self.engine = engine
        self.node_id = node_id
        self.stop = stop
        self.services = services if services is not None else default_services(engine)
        self.is_leader = False
        self._detached: dict[str, threading.Thread] = {}
        self._workers_heard_by = 0.0  # monotonic: see WORKER_GRACE_SECONDS

    def try_lead(self) -> bool:
        now = self.engine.clock()
        ttl = timedelta(seconds=self.engine.settings.leader_lease_seconds)
        was = self.is_leader
        with self.engine.db.tx() as tx:
            self.is_leader = tx.take_lease(LEASE_NAME, self.node_id, now, now + ttl)
        if self.is_leader != was:  # an operator asks "who runs maintenance?"
            what = "leads maintenance now" if self.is_leader else "no longer leads maintenance"
            log.info("%s %s", self.node_id, what)
            if self.is_leader:
                self._give_workers_time()
        return self.is_leader

    def _give_workers_time(self) -> None:
        self._workers_heard_by = time.monotonic() + WORKER_GRACE_SECONDS

    def run(self) -> None:
        name_native()
        if not wait_until_ready(self.engine.db, self.stop):
            return
        renew_every = self.engine.settings.leader_lease_seconds / 3
        next_renew = 0.0
        due = {s.name: 0.0 for s in self.services}
        while not self.stop.is_set():
            now = time.monotonic()
            if now >= next_renew:
                try:
                    self.try_lead()
                except Exception as exc:
                    said.warning(log, "leader lease", "leader lease check failed (%s)", brief(exc))
                    if self.is_leader:
                        log.info("%s no longer leads maintenance", self.node_id)
                    self.is_leader = False
                else:
                    said.ended("leader lease")
                next_renew = now + renew_every
            if self.is_leader:
                for svc in self.services:
                    if getattr(svc, "waits_for_workers", False) and now < self._workers_heard_by:
                        continue
                    if now >= due[svc.name] and not self._running(svc):
                        if getattr(svc, "detached", False):
                            self._detach(svc, due)
                        else:
                            self._run(svc)
                            due[svc.name] = time.monotonic() + svc.period
            self.stop.wait(0.1)
        self._resign()

    def _run(self, svc: Service) -> None:
        try:
            svc.run_once()
        except Exception as exc:
            said.warning(log, svc.name, "%s failed (%s); will retry", svc.name, brief(exc))
        else:
            said.ended(svc.name)

    def _detach(self, svc: Service, due: dict[str, float]) -> None:
        """Run ``svc`` in a thread of its own: it waits on a store (GC on an
        S3 that hangs), and in this loop it held up the reaper and the
        promoter, and let the lease lapse."""

        def run() -> None:
            self._run(svc)
            due[svc.name] = time.monotonic() + svc.period

        thread = threading.Thread(target=run, name=f"leader-{svc.name}", daemon=True)
        self._detached[svc.name] = thread
        thread.start()

    def _running(self, svc: Service) -> bool:
        thread = self._detached.get(svc.name)
        return thread is not None and thread.is_alive()

    def _resign(self) -> None:
        if not self.is_leader:
            return
        try:
            with self.engine.db.tx() as tx:
                tx.release_lease(LEASE_NAME, self.node_id)
        except Exception:
            log.debug("could not release the leader lease", exc_info=True)

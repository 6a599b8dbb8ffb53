"""Object rows for job outputs, reserved a batch at a time.

Every output blob needs its ``pending`` row *before* the blob is written (a
crash in between must leave a row for GC, never an unowned blob).  A row of
its own per output is a durable transaction per output: for a thumbnail it
cost the worker more CPU than storing the thumbnail did.  So the worker
reserves rows in batches: ``pending``, with a placeholder key
(``pending/{hex}``), no media type yet.  An output takes one, writes its blob
under ``objects/{id}/``, and the completing transaction gives the row its real
key, media type and size as it turns it ``ready``.

A reserved row whose worker died still owns ``objects/{id}/``: GC deletes
what is under that prefix when it collects a row that still has its
placeholder (``is_placeholder``).  Reservations are used within
``RESERVE_TTL`` seconds or deleted (no blob, nothing refers to them): the
pending sweep (``gc_pending_seconds``, hours) must never collect a row a
worker is about to use.  The settings refuse a sweep age under an hour
(config.MIN_GC_PENDING_SECONDS, sixty times ``RESERVE_TTL``); and should a
row go all the same (a sweep that came anyway, ``pools rm``, which drops a
pool's reservations with it), the job's completion is refused and its
attempt retried (``Engine._lost_outputs``), never completed with an output
that does not exist.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from datetime import datetime
from typing import Any

from hypermedia.db.driver import Driver
from hypermedia.queue.clock import utcnow
from hypermedia.storage.base import StorageUnavailable

log = logging.getLogger(__name__)

RESERVE = 16  # rows per reserving transaction
RESERVE_TTL = 60.0  # seconds a reserved row may wait for its output
PLACEHOLDER = "pending/"
UNKNOWN_MIME = "application/octet-stream"


def is_placeholder(key: str) -> bool:
    return key.startswith(PLACEHOLDER)


def placeholder() -> str:
    return f"{PLACEHOLDER}{uuid.uuid4().hex}"


class Reservations:
    """A stock of reserved object ids per (pool, project), for one process."""

    def __init__(
        self,
        db: Driver,
        batch: int = RESERVE,
        ttl: float = RESERVE_TTL,
        *,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.db = db
        self.clock = clock
        self.batch = max(1, batch)
        self.ttl = ttl
        self._lock = threading.Lock()
        self._stock: dict[tuple[int, str], deque[tuple[int, float]]] = {}

    def take(self, pool_id: int, project_id: str) -> int:
        """A reserved ``pending`` object id of this pool and project.

        StorageUnavailable when no row can be reserved (the database is away):
        the attempt is then retried later, not failed for good.
        """
        with self._lock:
            stock = self._stock.setdefault((pool_id, project_id), deque())
            cutoff = time.monotonic() - self.ttl
            stale = []
            while stock and stock[0][1] < cutoff:
                stale.append(stock.popleft()[0])
            if not stock:
                try:
                    stock.extend(self._reserve(pool_id, project_id, stale))
                except Exception as exc:
                    log.warning("could not reserve output rows (%s)", type(exc).__name__)
                    raise StorageUnavailable("could not record an output in the ledger") from exc
            elif stale:
                self._drop(stale)
            return stock.popleft()[0]

    def release(self) -> None:
        """Delete every unused reservation (a worker that stops)."""
        with self._lock:
            ids = [i for stock in self._stock.values() for i, _ in stock]
            self._stock.clear()
        if ids:
            self._drop(ids)

    def _reserve(self, pool_id: int, project_id: str, stale: list[int]) -> list[tuple[int, float]]:
        now = self.clock()
        rows: list[dict[str, Any]] = [
            {
                "pool_id": pool_id,
                "storage_key": placeholder(),
                "project_id": project_id,
                "filename": "",
                "mime_type": UNKNOWN_MIME,
                "state": "pending",
                "created_at": now,
                "updated_at": now,
            }
            for _ in range(self.batch)
        ]
        with self.db.tx() as tx:
            tx.delete_unused_reservations(stale)
            ids = tx.insert_objects(rows)
        at = time.monotonic()
        return [(ids[r["storage_key"]], at) for r in rows]

    def _drop(self, ids: list[int]) -> None:
        try:
            with self.db.tx() as tx:
                tx.delete_unused_reservations(ids)
        except Exception:  # the database is away: GC sweeps them as stale pending
            pass

"""Waiting for a database that cannot serve this process yet: away (not
started, restarting, its disk full) or not migrated to this code's schema.

Workers, the leader and ``serve`` start beside their database, in any order,
and wait instead of dying; ``db upgrade --wait`` does the same for a deploy
script.  What they wait for is said once a minute, not at every retry."""

from __future__ import annotations

import logging
import re
import threading
import time

from hypermedia import said
from hypermedia.db import revisions
from hypermedia.db.dialects import is_transient
from hypermedia.db.driver import Driver
from hypermedia.redact import brief

log = logging.getLogger(__name__)


def _say(kind: str, message: str) -> None:
    """Once a minute per kind, process-wide: a worker and its leader say it once."""
    said.warning(log, f"database {kind}", message)


# What PostgreSQL and MariaDB say when they answer but refuse who, or which
# database, the URL names (SQLSTATE 28000/28P01/3D000, errors 1044/1045/1049).
_REFUSED = re.compile(
    r"password authentication failed|role \S+ does not exist|database \S+ does not exist"
    r"|Access denied for user|Unknown database|no pg_hba\.conf entry",
)


def not_ready(db: Driver, *, schema: bool = True) -> tuple[str, str] | None:
    """(kind, why) the database cannot serve this code now, or None.  An
    error that is not about the database being away is raised: waiting
    would not end it."""
    try:
        with db.read() as tx:
            tx.ping()
            current = tx.schema_revision() if schema else None
            lost = schema and current is None and tx.has_job_tables()
    except Exception as exc:
        if not is_transient(exc):
            raise
        if _REFUSED.search(str(exc)):
            # Still waited for (a deploy may create the role or database
            # next), but said for what it is: no restart will fix the URL.
            return "refused", (
                f"the database refuses this connection ({brief(exc)}): "
                "check HYPERMEDIA_DATABASE_URL"
            )
        return "away", f"the database is unavailable ({brief(exc)})"
    if not schema:
        return None
    if revisions.newer(current):
        _say(
            "newer",
            f"the database schema (revision {current}) is newer than this hypermedia "
            f"(revision {revisions.head()}): upgrade hypermedia",
        )
    why = revisions.behind(current, lost)
    return None if why is None else ("schema", why)


def wait_until_ready(
    db: Driver,
    stop: threading.Event,
    *,
    schema: bool = True,
    deadline: float | None = None,
) -> bool:
    """Block until ``db`` answers (and, with ``schema``, is migrated to this
    code's revision): True, or False once ``stop`` is set or the
    ``deadline`` (time.monotonic()) has passed first."""
    delay = 0.5
    while (reason := not_ready(db, schema=schema)) is not None:
        kind, why = reason
        _say(kind, f"{why}; waiting for it")
        if deadline is not None:
            delay = min(delay, deadline - time.monotonic())
            if delay <= 0:
                return False
        if stop.wait(delay):
            return False
        delay = min(delay * 2, 5.0)
    return True

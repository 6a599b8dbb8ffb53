"""A job's diagnostic events: one row per state change, progress snapshot or note."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from hypermedia.redact import redact

Row = dict[str, Any]


def event(job_id: int, now: datetime, src: str | None, dst: str | None, **kw: Any) -> Row:
    return {
        "job_id": job_id,
        "kind": kw.pop("kind", "event"),
        "from_status": src,
        "to_status": dst,
        "attempt_number": kw.pop("attempt_number", None),
        "code": kw.pop("code", None),
        "message": redact(kw.pop("message", ""), 1000),
        "actor": kw.pop("actor", None),
        "created_at": now,
    }

"""``GET /metrics``: Prometheus text exposition format 0.0.4, written by hand.

Instance-wide figures (a token with the admin scope is required), each from
one query, all in one snapshot: jobs by status and type, queued jobs by queue and
priority, the attempt duration histogram, workers and their heartbeats, and
the queue switches.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from hypermedia.api.deps import scoped, services
from hypermedia.api.strict_json import StrictJSONRoute
from hypermedia.auth.tokens import Principal
from hypermedia.queue import durations

router = APIRouter(tags=["ops"], route_class=StrictJSONRoute)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
BUCKETS = durations.BUCKETS_S
Row = dict[str, Any]


def escape(value: object) -> str:
    """A label value as the format wants it: backslash, quote and newline escaped."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def number(value: float) -> str:
    """Full precision (a Unix timestamp needs more than ``:g``'s 6 digits)."""
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def sample(name: str, labels: dict[str, object], value: float) -> str:
    inner = ",".join(f'{k}="{escape(v)}"' for k, v in labels.items())
    return f"{name}{{{inner}}} {number(value)}" if inner else f"{name} {number(value)}"


def family(name: str, kind: str, doc: str, lines: Iterable[str]) -> Iterator[str]:
    yield f"# HELP {name} {doc}"
    yield f"# TYPE {name} {kind}"
    yield from lines


def _histogram(rows: list[Row]) -> Iterator[str]:
    name = "hypermedia_attempt_duration_seconds"
    for r in sorted(rows, key=lambda r: r["job_type"]):
        jt = r["job_type"]
        for i, bound in enumerate(BUCKETS):
            yield sample(f"{name}_bucket", {"job_type": jt, "le": f"{bound:g}"}, int(r[f"le_{i}"]))
        yield sample(f"{name}_bucket", {"job_type": jt, "le": "+Inf"}, int(r["count"]))
        yield sample(f"{name}_sum", {"job_type": jt}, int(r["sum_ms"]) / 1000)
        yield sample(f"{name}_count", {"job_type": jt}, int(r["count"]))


def _epoch(at: datetime) -> float:
    return at.replace(tzinfo=UTC).timestamp()


def gauge(name: str, doc: str, points: Iterable[tuple[dict[str, object], float]]) -> Iterator[str]:
    return family(name, "gauge", doc, (sample(name, labels, v) for labels, v in points))


def render(figures: Row) -> str:
    jobs = sorted(figures["jobs"], key=lambda r: (r["status"], r["job_type"]))
    queued = sorted(figures["queued"], key=lambda r: (r["queue_name"], r["priority"]))
    switches = sorted(figures["switches"], key=lambda r: r["queue_name"])
    parts = [
        gauge(
            "hypermedia_jobs",
            "Jobs by status and job type.",
            (({"status": r["status"], "job_type": r["job_type"]}, int(r["count"])) for r in jobs),
        ),
        gauge(
            "hypermedia_queue_depth",
            "Queued jobs (ready to claim) by queue and priority (1 highest).",
            (
                ({"queue": r["queue_name"], "priority": r["priority"]}, int(r["count"]))
                for r in queued
            ),
        ),
        family(
            "hypermedia_attempt_duration_seconds",
            "histogram",
            "Duration of finished attempts by job type.",
            _histogram(figures["durations"]),
        ),
        gauge(
            "hypermedia_worker_last_heartbeat_timestamp_seconds",
            "Unix time of each worker's last heartbeat (terminated ones left out).",
            (
                ({"worker_id": w["worker_id"], "status": w["status"]}, _epoch(w["last_heartbeat"]))
                for w in figures["workers"]
            ),
        ),
        gauge(
            "hypermedia_workers",
            "Workers by status (terminated ones included).",
            (({"status": s}, n) for s, n in sorted(figures["worker_counts"].items())),
        ),
        gauge(
            "hypermedia_queue_paused",
            "1 if the queue is paused, 0 if it was switched back on.",
            (({"queue": r["queue_name"]}, int(bool(r["paused"]))) for r in switches),
        ),
    ]
    return "\n".join(line for part in parts for line in part) + "\n"


@router.get("/metrics", summary="Prometheus metrics (admin scope)", response_class=Response)
def metrics(request: Request, principal: Principal = scoped("admin")) -> Response:
    svc = services(request)
    text = render(svc.queues.figures(durations.BOUNDS_MS))
    return Response(text, media_type=CONTENT_TYPE)

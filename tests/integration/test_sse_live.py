"""SSE against a job a real worker runs: every state change and progress report,
in order, as they happen; a reconnect with Last-Event-ID resumes exactly."""

from __future__ import annotations

import json
import threading

from fastapi.testclient import TestClient

from hypermedia.api.app import create_app
from hypermedia.db.driver import Driver
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import NewJob
from hypermedia.services import Services
from tests.integration._procs import Procs, events, sqlite_only


def _messages(body: str) -> list[dict]:  # type: ignore[type-arg]
    out = []
    for block in body.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "id" in fields:
            out.append(
                {"id": int(fields["id"]), "event": fields["event"], **json.loads(fields["data"])}
            )
    return out


@sqlite_only
def test_sse_follows_a_running_job_in_order_and_resumes(
    driver: Driver, live: Engine, procs: Procs
) -> None:
    svc = Services.from_engine(live)
    _, token = svc.tokens.create("default", ["jobs:read"])
    headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
    job_id = live.enqueue(NewJob("debug.sleep", params={"ms": 1200, "steps": 4}, queue="bulk"))
    with TestClient(create_app(svc)) as client:
        seen: list[str] = []

        def follow() -> None:
            with client.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers) as r:
                seen.append("".join(r.iter_text()))

        reader = threading.Thread(target=follow)
        reader.start()  # the stream is open before the worker takes the job
        procs.worker("--concurrency", "1", "--no-maintenance")
        reader.join(60)
        assert not reader.is_alive(), "the stream did not end with the job"
        streamed = _messages(seen[0])
        stored = events(driver, job_id)
        assert [m["id"] for m in streamed] == [e["event_id"] for e in stored]
        changes = [m["to_status"] for m in streamed if m["event"] == "event"]
        assert changes == ["queued", "claimed", "processing", "completed"]
        assert sum(m["event"] == "progress" for m in streamed) >= 2
        assert seen[0].rstrip().endswith('data: {"status": "completed"}')

        middle = streamed[len(streamed) // 2]["id"]
        resumed = {**headers, "Last-Event-ID": str(middle)}
        with client.stream("GET", f"/v1/jobs/{job_id}/events", headers=resumed) as r:
            again = _messages("".join(r.iter_text()))
        assert [m["id"] for m in again] == [m["id"] for m in streamed if m["id"] > middle]

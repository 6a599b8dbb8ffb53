"""Operator endpoints on every database: /v1/queues, /v1/workers and /metrics."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from hypermedia.queue.models import AttemptResult, NewJob
from hypermedia.services import Services
from tests.api.conftest import Project, bearer

# One sample line of the text format 0.0.4: name, optional {labels}, value.
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"(,|$)')


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def parse_metrics(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Samples by (name, labels); fails on any line that is not valid 0.0.4."""
    assert text.endswith("\n")
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    typed: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("gauge", "counter", "histogram"), line
            assert name not in typed, f"{name} typed twice"
            typed[name] = kind
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        name, raw, value = m.groups()
        labels: dict[str, str] = {}
        pos = 0
        while raw and pos < len(raw):
            lm = LABEL.match(raw, pos)
            assert lm, f"bad labels in {line!r}"
            labels[lm.group(1)] = _unescape(lm.group(2))
            pos = lm.end()
        family = re.sub(r"_(bucket|sum|count)$", "", name)
        assert name in typed or family in typed, f"{name} has no TYPE line"
        key = (name, frozenset(labels.items()))
        assert key not in out, f"duplicate sample {line!r}"
        out[key] = float(value)
    return out


def get(samples: dict, name: str, **labels: str) -> float | None:  # type: ignore[type-arg]
    return samples.get((name, frozenset(labels.items())))


def _worker(svc: Services, worker_id: str, status: str = "active", **kw: object) -> None:
    now = svc.engine.clock()
    row = {
        "worker_id": worker_id,
        "status": status,
        "queues": ["bulk"],
        "cpu_cores": 2,
        "memory_mb": 1024,
        "disk_mb": 2048,
        "last_heartbeat": now,
        "started_at": now,
        "created_at": now,
    }
    with svc.engine.db.tx() as tx:
        tx.insert_worker({**row, **kw})


def _run(svc: Services, job_type: str, duration_ms: int, ok: bool = True) -> int:
    """One job of ``job_type`` claimed, started and settled with ``duration_ms``."""
    eng = svc.engine
    job_id = eng.enqueue(NewJob(job_type, {}, project_id="proj-a"))
    (c,) = eng.claim("w-test", ["bulk"], 1)
    assert c.job_id == job_id
    eng.start("w-test", [(job_id, c.attempt)])
    status, code = ("completed", None) if ok else ("failed", "CORRUPT_INPUT")
    res = AttemptResult(job_id, c.attempt, status, code, duration_ms=duration_ms)
    assert eng.settle("w-test", [res]) == {job_id}
    return job_id


# -- queues ------------------------------------------------------------------------------


def test_health_probes_answer_head_as_get(client: TestClient) -> None:
    """Load balancers probe with HEAD; it answered 405."""
    for path in ("/healthz", "/readyz"):
        got, head = client.get(path), client.head(path)
        assert got.status_code == head.status_code == 200, path
        assert head.content == b""


def test_queues_show_summary_and_depth(client: TestClient, svc: Services, a: Project) -> None:
    _run(svc, "debug.noop", 5)
    for p in (1, 1, 9):
        svc.engine.enqueue(NewJob("debug.noop", {}, priority=p, project_id="proj-a"))
    svc.engine.enqueue(NewJob("debug.noop", {}, priority=9, project_id="proj-b"))

    r = client.get("/v1/queues", headers=bearer(a.admin))
    assert r.status_code == 200, r.text
    body = r.json()
    (bulk,) = [q for q in body["items"] if q["queue_name"] == "bulk"]
    assert bulk == {
        "queue_name": "bulk",
        "paused": False,
        "served": False,
        "queued": 4,
        "running": 0,
        "retry_wait": 0,
        "completed_1h": 1,
        "failed_1h": 0,
    }
    depth = {(d["queue_name"], d["status"], d["priority"]): d["count"] for d in body["depth"]}
    assert depth == {("bulk", "queued", 1): 2, ("bulk", "queued", 9): 2}
    mine = client.get("/v1/queues", params={"project": "proj-b"}, headers=bearer(a.admin))
    assert [d["count"] for d in mine.json()["depth"]] == [1]
    # A queue only another project's job names is still listed, with zeros.
    svc.engine.enqueue(NewJob("debug.noop", {}, queue="only-a", project_id="proj-a"))
    mine = client.get("/v1/queues", params={"project": "proj-b"}, headers=bearer(a.admin))
    (only_a,) = [q for q in mine.json()["items"] if q["queue_name"] == "only-a"]
    assert (only_a["queued"], only_a["paused"]) == (0, False)


def test_pause_and_resume_through_the_api(client: TestClient, svc: Services, a: Project) -> None:
    h = bearer(a.admin)
    r = client.post("/v1/queues/images/pause", headers=h)
    assert r.status_code == 200, r.text
    assert (r.json()["queue_name"], r.json()["paused"]) == ("images", True)
    assert svc.queues.paused() == {"images"}
    listed = {
        q["queue_name"]: q["paused"] for q in client.get("/v1/queues", headers=h).json()["items"]
    }
    assert listed["images"] is True
    r = client.post("/v1/queues/images/resume", headers=h)
    assert r.status_code == 200 and r.json()["paused"] is False
    assert svc.queues.paused() == set()
    # A name never switched: answered, not written (as the CLI).
    r = client.post("/v1/queues/imagse/resume", headers=h)
    assert r.status_code == 200 and r.json()["updated_at"] is None
    listed = [q["queue_name"] for q in client.get("/v1/queues", headers=h).json()["items"]]
    assert "imagse" not in listed


def test_bad_queue_names_are_422(client: TestClient, svc: Services, a: Project) -> None:
    for name in ("Images", "a%20b", "x" * 51, "caf%C3%A9", "a;b"):
        r = client.post(f"/v1/queues/{name}/pause", headers=bearer(a.admin))
        assert r.status_code == 422, (name, r.text)
        assert r.json()["code"] == "invalid_request"
    assert svc.queues.paused() == set()
    # QA: a NUL in ?project= was a 200 on MariaDB, a 422 on PostgreSQL.
    for project in ("qa%00x", "a%0Ab", "%7F"):
        r = client.get(f"/v1/queues?project={project}", headers=bearer(a.admin))
        assert r.status_code == 422, (project, r.text)
        assert r.json()["code"] == "invalid_request"


def test_queue_and_worker_routes_need_admin(client: TestClient, a: Project) -> None:
    for scope, token in a.scoped.items():
        h = bearer(token)
        assert client.get("/v1/queues", headers=h).status_code == 403, scope
        assert client.post("/v1/queues/bulk/pause", headers=h).status_code == 403, scope
        assert client.get("/v1/workers", headers=h).status_code == 403, scope
        assert client.post("/v1/workers/w1/drain", headers=h).status_code == 403, scope
    assert client.get("/v1/queues").status_code == 401


# -- workers -----------------------------------------------------------------------------


def test_workers_list_show_and_drain(client: TestClient, svc: Services, a: Project) -> None:
    h = bearer(a.admin)
    _worker(svc, "w-live")
    _worker(svc, "w-old", status="terminated")
    with svc.engine.db.tx() as tx:
        tx.insert_metric(
            {
                "worker_id": "w-live",
                "cpu_percent": 12.5,
                "memory_percent": 40,
                "disk_percent": 50,
                "jobs_completed_1m": 7,
                "recorded_at": svc.engine.clock(),
            }
        )

    items = client.get("/v1/workers", headers=h).json()["items"]
    assert [w["worker_id"] for w in items] == ["w-live"]
    assert items[0]["healthy"] is True
    assert items[0]["last_metrics"]["jobs_completed_1m"] == 7
    every = client.get("/v1/workers", params={"include_terminated": True}, headers=h).json()
    assert {w["worker_id"] for w in every["items"]} == {"w-live", "w-old"}

    assert client.get("/v1/workers/w-live", headers=h).json()["status"] == "active"
    assert client.get("/v1/workers/nope", headers=h).status_code == 404
    # A control character is a 422 on every database (SQLite answered a 404
    # with the NUL in it; PostgreSQL, which stores none, a 422).
    for odd in ("a%00b", "a%1Bb", "a%C2%85b"):
        for r in (
            client.get(f"/v1/workers/{odd}", headers=h),
            client.post(f"/v1/workers/{odd}/drain", headers=h),
        ):
            assert r.status_code == 422, (odd, r.text)
            assert "\x00" not in r.text and "\\u0000" not in r.text

    r = client.post("/v1/workers/w-live/drain", headers=h)
    assert r.status_code == 200 and r.json()["status"] == "draining"
    assert svc.fleet.get("w-live")["status"] == "draining"
    r = client.post("/v1/workers/w-old/drain", headers=h)
    assert r.status_code == 409 and r.json()["code"] == "conflict"
    assert client.post("/v1/workers/nope/drain", headers=h).status_code == 404


# -- /metrics ----------------------------------------------------------------------------


def test_metrics_need_an_admin_token(client: TestClient, a: Project) -> None:
    assert client.get("/metrics").status_code == 401
    for token in a.scoped.values():
        assert client.get("/metrics", headers=bearer(token)).status_code == 403


def test_metrics_parse_and_match_the_jobs(client: TestClient, svc: Services, a: Project) -> None:
    _run(svc, "debug.noop", 3)  # 0.003 s
    _run(svc, "debug.noop", 200)  # 0.2 s
    _run(svc, "debug.noop", 700_000)  # beyond the last bucket
    _run(svc, "debug.sleep", 40, ok=False)
    for p in (2, 2, 6):
        svc.engine.enqueue(NewJob("debug.noop", {}, priority=p, project_id="proj-a"))
    svc.queues.pause("images")
    svc.queues.pause("documents")
    svc.queues.resume("documents")
    beat = datetime(2030, 1, 2, 3, 4, 5)
    _worker(svc, 'odd"id\\with\nnewline', last_heartbeat=beat)
    _worker(svc, "w-idle", status="idle")
    _worker(svc, "w-old", status="terminated")

    r = client.get("/metrics", headers=bearer(a.admin))
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    s = parse_metrics(r.text)

    assert get(s, "hypermedia_jobs", status="completed", job_type="debug.noop") == 3
    assert get(s, "hypermedia_jobs", status="failed", job_type="debug.sleep") == 1
    assert get(s, "hypermedia_jobs", status="queued", job_type="debug.noop") == 3
    assert get(s, "hypermedia_queue_depth", queue="bulk", priority="2") == 2
    assert get(s, "hypermedia_queue_depth", queue="bulk", priority="6") == 1

    h = "hypermedia_attempt_duration_seconds"
    buckets = [
        (float(dict(k[1])["le"]), v)
        for k, v in s.items()
        if k[0] == f"{h}_bucket" and dict(k[1])["job_type"] == "debug.noop"
    ]
    assert [v for _, v in sorted(buckets)] == sorted(v for _, v in buckets)  # cumulative
    assert min(b for b, _ in buckets) == 0.005 and max(b for b, _ in buckets) == float("inf")
    assert get(s, f"{h}_bucket", job_type="debug.noop", le="0.005") == 1
    assert get(s, f"{h}_bucket", job_type="debug.noop", le="0.25") == 2
    assert get(s, f"{h}_bucket", job_type="debug.noop", le="600") == 2
    assert get(s, f"{h}_bucket", job_type="debug.noop", le="+Inf") == 3
    assert get(s, f"{h}_count", job_type="debug.noop") == 3
    assert get(s, f"{h}_sum", job_type="debug.noop") == 700.203
    assert get(s, f"{h}_bucket", job_type="debug.sleep", le="0.05") == 1
    assert get(s, f"{h}_bucket", job_type="debug.sleep", le="0.025") == 0

    stamp = get(
        s,
        "hypermedia_worker_last_heartbeat_timestamp_seconds",
        worker_id='odd"id\\with\nnewline',
        status="active",
    )
    assert stamp == beat.replace(tzinfo=UTC).timestamp()
    names = {dict(k[1]).get("worker_id") for k in s if k[0].endswith("heartbeat_timestamp_seconds")}
    assert "w-old" not in names and "w-idle" in names
    assert get(s, "hypermedia_workers", status="active") == 1
    assert get(s, "hypermedia_workers", status="idle") == 1
    assert get(s, "hypermedia_workers", status="terminated") == 1
    assert get(s, "hypermedia_queue_paused", queue="images") == 1
    assert get(s, "hypermedia_queue_paused", queue="documents") == 0


def test_the_duration_histogram_never_goes_down_when_jobs_are_pruned(
    client: TestClient, svc: Services, a: Project
) -> None:
    from hypermedia.scheduler.retention import JobRetention

    h = "hypermedia_attempt_duration_seconds"

    def histogram() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        r = client.get("/metrics", headers=bearer(a.admin))
        return {k: v for k, v in parse_metrics(r.text).items() if k[0].startswith(h)}

    _run(svc, "debug.noop", 3)
    _run(svc, "debug.noop", 200)
    _run(svc, "debug.sleep", 40, ok=False)
    before = histogram()
    assert get(before, f"{h}_count", job_type="debug.noop") == 2
    later = datetime.now(UTC).replace(tzinfo=None) + timedelta(days=31)
    assert JobRetention(svc.engine).run_once(now=later) == 3
    assert svc.engine.list() == []
    assert histogram() == before  # the same counts, from the pruned table now

    _run(svc, "debug.noop", 3)  # live attempts add to what was pruned
    after = histogram()
    assert get(after, f"{h}_bucket", job_type="debug.noop", le="0.005") == 2
    assert get(after, f"{h}_bucket", job_type="debug.noop", le="0.25") == 3
    assert get(after, f"{h}_count", job_type="debug.noop") == 3
    assert get(after, f"{h}_sum", job_type="debug.noop") == 0.206
    assert JobRetention(svc.engine).run_once(now=later + timedelta(days=1)) == 1
    assert histogram() == after


def test_metrics_on_an_empty_database_still_parse(client: TestClient, a: Project) -> None:
    r = client.get("/metrics", headers=bearer(a.admin))
    s = parse_metrics(r.text)
    assert not [k for k in s if k[0] == "hypermedia_jobs"]
    assert "# TYPE hypermedia_attempt_duration_seconds histogram" in r.text


def test_heartbeat_gauge_is_recent_for_a_live_worker(
    client: TestClient, svc: Services, a: Project
) -> None:
    _worker(svc, "w-now")
    s = parse_metrics(client.get("/metrics", headers=bearer(a.admin)).text)
    stamp = get(
        s, "hypermedia_worker_last_heartbeat_timestamp_seconds", worker_id="w-now", status="active"
    )
    assert stamp is not None
    assert abs(datetime.now(UTC).timestamp() - stamp) < timedelta(minutes=1).total_seconds()


def test_a_prune_between_the_histograms_two_reads_counts_nothing_twice(
    client: TestClient, svc: Services, a: Project, monkeypatch
) -> None:
    """/metrics reads the live attempts, then the pruned counts: a prune that
    commits between the two must not be seen half (once in each)."""
    from hypermedia.db.queries import Tx
    from hypermedia.scheduler.retention import JobRetention

    h = "hypermedia_attempt_duration_seconds"
    _run(svc, "debug.noop", 3)
    _run(svc, "debug.noop", 200)
    before = parse_metrics(client.get("/metrics", headers=bearer(a.admin)).text)
    assert get(before, f"{h}_count", job_type="debug.noop") == 2

    read_pruned = Tx.pruned_durations
    later = datetime.now(UTC).replace(tzinfo=None) + timedelta(days=31)
    pruned: list[int] = []

    def prune_first(tx: Tx) -> list:
        if not pruned:  # once: the prune commits after the live attempts were read
            pruned.append(JobRetention(svc.engine).run_once(now=later))
        return read_pruned(tx)

    monkeypatch.setattr(Tx, "pruned_durations", prune_first)
    during = parse_metrics(client.get("/metrics", headers=bearer(a.admin)).text)
    assert pruned == [2]
    assert get(during, f"{h}_count", job_type="debug.noop") == 2
    assert get(during, f"{h}_sum", job_type="debug.noop") == 0.203
    monkeypatch.undo()
    after = parse_metrics(client.get("/metrics", headers=bearer(a.admin)).text)
    assert get(after, f"{h}_count", job_type="debug.noop") == 2


def test_readiness_probes_of_a_hung_store_share_one_check(
    client: TestClient, svc: Services, a: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each probe held a thread of the API's shared pool for as long as the
    store hung: 45 of them, and a request that needs no storage waited 117 s."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from hypermedia.api.routes import ops

    monkeypatch.setattr(ops, "PROBE_WAIT_SECONDS", 0.3)
    release, calls = threading.Event(), []

    def hung() -> bool:
        calls.append(1)
        release.wait(20)
        return True

    monkeypatch.setattr(svc.storage, "reachable", hung)
    # The database's check answers at once: under load, 60 probes sharing its
    # thread could outwait the shortened wait and say "not checked".
    monkeypatch.setattr(ops, "_database", lambda db: "ok")
    try:
        with ThreadPoolExecutor(60) as pool:
            probes = [pool.submit(client.get, "/readyz") for _ in range(60)]
            answers = [p.result(10) for p in probes]
            started = time.monotonic()
            jobs = client.get("/v1/jobs?limit=1", headers=bearer(a.admin))
            assert jobs.status_code == 200 and time.monotonic() - started < 2
        assert {r.status_code for r in answers} == {503}
        # Under load a probe may also outwait the database's shared check.
        assert {r.json()["storage"] for r in answers} <= {"unreachable", "not checked"}
        assert "unreachable" in {r.json()["storage"] for r in answers}
        assert len(calls) == 1  # one check, however many asked
    finally:
        release.set()
    # Once the store answers, the next probe sees it.
    time.sleep(0.1)
    assert client.get("/readyz").status_code == 200


def test_a_405_names_every_method_its_path_takes(client: TestClient, a: Project) -> None:
    """``PUT /v1/jobs`` said ``Allow: POST`` (the first route's methods only)."""
    for method, path, allow in (
        ("PUT", "/v1/jobs", "GET, HEAD, POST"),
        ("PUT", "/v1/photos/x", "DELETE, GET, HEAD, PATCH"),
        ("DELETE", "/v1/objects", "GET, HEAD, POST"),
        ("POST", "/healthz", "GET, HEAD"),
    ):
        r = client.request(method, path, headers=bearer(a.admin))
        assert (r.status_code, r.headers.get("allow")) == (405, allow), (method, path)
        assert r.json()["code"] == "method_not_allowed"

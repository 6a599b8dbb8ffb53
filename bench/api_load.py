"""The HTTP API under load: 50 concurrent clients submit debug.noop jobs and poll them.

For each target (the embedded default: SQLite + local folder; and PostgreSQL) a
real ``hypermedia serve`` process is started (API + workers + maintenance, as a
user runs it).  Each client has its own token, then loops for ``--seconds``:
POST /v1/jobs, then GET /v1/jobs/{id} every ``--poll-ms`` until the job is
terminal.  Reported per target: requests/s, p50/p99 latency per request kind,
jobs completed end to end, and the error rate (any non-2xx or transport error),
which must be 0.

    .venv/bin/python bench/api_load.py --clients 50 --seconds 30
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import _common as C

from hypermedia.config import Settings
from hypermedia.db.migrate import upgrade
from hypermedia.services import Services


@dataclass
class Tally:
    latencies: dict[str, list[float]] = field(default_factory=lambda: {"submit": [], "poll": []})
    errors: list[str] = field(default_factory=list)
    completed: int = 0
    submitted: int = 0

    @property
    def requests(self) -> int:
        return sum(len(v) for v in self.latencies.values()) + len(self.errors)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def one_client(base: str, token: str, until: float, poll: float, tally: Tally) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as http:
        while time.perf_counter() < until:
            job_id = await _request(http, "submit", tally, json={"job_type": "debug.noop"})
            if job_id is None:
                continue
            tally.submitted += 1
            while time.perf_counter() < until + 10:
                await asyncio.sleep(poll)
                status = await _request(http, "poll", tally, job_id=job_id)
                if status in ("completed", "failed", "cancelled"):
                    tally.completed += status == "completed"
                    break


async def _request(
    http: httpx.AsyncClient, kind: str, tally: Tally, *, json: dict | None = None, job_id=None
):  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    try:
        if kind == "submit":
            r = await http.post("/v1/jobs", json=json)
        else:
            r = await http.get(f"/v1/jobs/{job_id}")
    except httpx.HTTPError as exc:
        tally.errors.append(f"{kind}: {type(exc).__name__}")
        return None
    tally.latencies[kind].append(time.perf_counter() - t0)
    if r.status_code >= 300:
        tally.errors.append(f"{kind}: HTTP {r.status_code} {r.text[:100]}")
        tally.latencies[kind].pop()
        return None
    body = r.json()
    return body["job_id"] if kind == "submit" else body["status"]


def tokens_for(url: str, home: Path, n: int) -> list[str]:
    svc = Services.from_settings(Settings(home=home, database_url=url))
    return [svc.tokens.create("bench", ["jobs:read", "jobs:write"])[1] for _ in range(n)]


def run_target(name: str, url: str, args: argparse.Namespace) -> tuple[list[object], list[str]]:
    home = Path(tempfile.mkdtemp(prefix=f"hm-api-{name}-"))
    upgrade(url)
    tokens = tokens_for(url, home, args.clients)
    port = free_port()
    env = C.worker_env(url, home, HYPERMEDIA_API_RATE_PER_SECOND="0")
    cmd = [str(C.HYPERMEDIA_BIN), "serve", "--port", str(port), "-c", str(args.concurrency)]
    proc = C.Proc(cmd, env, home / "serve.log").start()
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(base, proc)
        tally = Tally()
        start = time.perf_counter()
        until = start + args.seconds
        asyncio.run(_all(base, tokens, until, args.poll_ms / 1000, tally))
        elapsed = time.perf_counter() - start
    finally:
        proc.stop()
    lat = tally.latencies
    ms = [x * 1000 for x in lat["submit"] + lat["poll"]]
    return [
        name,
        tally.requests,
        round(tally.requests / elapsed),
        round(C.percentile(ms, 50), 1),
        round(C.percentile(ms, 99), 1),
        round(C.percentile([x * 1000 for x in lat["submit"]], 99), 1),
        tally.submitted,
        tally.completed,
        round(tally.completed / elapsed, 1),
        f"{len(tally.errors) / max(1, tally.requests):.4%}",
    ], tally.errors


async def _all(base: str, tokens: list[str], until: float, poll: float, tally: Tally) -> None:
    await asyncio.gather(*(one_client(base, t, until, poll, tally) for t in tokens))


def _wait_ready(base: str, proc: C.Proc, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited: {proc.tail()}")
        try:
            if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"serve not ready in {timeout} s: {proc.tail()}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--poll-ms", type=float, default=100)
    p.add_argument("--concurrency", type=int, default=2, help="serve's worker concurrency")
    p.add_argument("--targets", default="sqlite,postgresql")
    p.add_argument("--pg-admin", default=C.DEFAULT_PG_ADMIN)
    args = p.parse_args()
    C.note_code_version()
    C.set_time_limit(args.seconds * 4 + 300)
    rows, errors = [], []
    for target in args.targets.split(","):
        if target == "sqlite":
            home = Path(tempfile.mkdtemp(prefix="hm-api-db-"))
            row, errs = run_target("embedded (SQLite)", f"sqlite:///{home / 'hm.db'}", args)
            rows.append(row)
            errors += errs
        else:
            name = f"{C.PREFIX}api_{int(time.time())}"
            with C.pg_database(args.pg_admin, name) as url:
                row, errs = run_target("PostgreSQL", url, args)
                rows.append(row)
                errors += errs
    print(C.command_line())
    print(C.machine_line())
    print(f"{args.clients} clients, {args.seconds:g} s, poll every {args.poll_ms:g} ms")
    print(
        C.table(
            [
                "target",
                "requests",
                "req/s",
                "p50 ms",
                "p99 ms",
                "submit p99 ms",
                "jobs submitted",
                "jobs completed",
                "jobs/s",
                "error rate",
            ],
            rows,
        )
    )
    for e in errors[:10]:
        print("error:", e)


if __name__ == "__main__":
    main()

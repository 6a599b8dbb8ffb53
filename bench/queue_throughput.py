"""debug.noop throughput: hypermedia (PostgreSQL, SQLite) beside pgqueuer and procrastinate.

For every batch size B (``--batches``) and every system, in one invocation:

* enqueue ``--jobs`` no-op jobs from this process in chunks of B, one transaction
  per chunk (pgqueuer ``Queries.enqueue`` with lists, procrastinate
  ``batch_defer_async``, hypermedia ``Engine.enqueue_many``) -> enqueue jobs/s;
* drain them with ONE consumer process started as a subprocess (pgqueuer
  ``QueueManager.run(batch_size=B, mode=drain)``, procrastinate
  ``run_worker_async(concurrency=C, wait=False)``, ``hypermedia worker --queues bulk
  --concurrency C --batch B --burst``), timed from the first claim seen in the
  database to the moment no job is left (process start-up excluded) -> drain jobs/s.

Each system gets a fresh database (``hm_bench_qt_*``; SQLite files in a temporary
folder), dropped afterwards.  Run from the repository root:

    .venv/bin/python bench/queue_throughput.py --jobs 20000 --batches 10,100
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sqlite3
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import _common as C

SYSTEMS = ("pgqueuer", "procrastinate", "hypermedia-pg", "hypermedia-sqlite")
TARGET_VS_PGQUEUER = 1.0
TARGET_VS_PROCRASTINATE = 10.0
TARGET_SQLITE = 2000.0


@dataclass
class Result:
    system: str
    batch: int
    jobs: int
    enqueue_rate: float | None = None
    drain: C.Drain | None = None
    loop_rate: float | None = None  # hypermedia in-process claim+flush loop (reference)
    load: float | None = None  # 1-min load average when this run started
    notes: list[str] = field(default_factory=list)

    @property
    def drain_rate(self) -> float | None:
        return self.drain.rate if self.drain else None


# -- peers: consumers run in a child process (this same script, --consume) ----------------


def procrastinate_app(dsn: str) -> Any:
    from procrastinate import App, PsycopgConnector

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        app = App(connector=PsycopgConnector(conninfo=dsn))

    @app.task(name="noop", queue="bulk")
    async def noop() -> None:
        return None

    return app


async def consume_pgqueuer(dsn: str, batch: int, concurrency: int) -> None:
    import asyncpg
    from pgqueuer import QueueManager
    from pgqueuer.models import Job
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    conn = await asyncpg.connect(dsn)
    qm = QueueManager(Queries.from_asyncpg_connection(conn))

    @qm.entrypoint("noop")
    async def noop(job: Job) -> None:
        return None

    # pgqueuer refuses max_concurrent_tasks < 2 * batch_size.
    await qm.run(
        batch_size=batch,
        mode=QueueExecutionMode.drain,
        max_concurrent_tasks=max(concurrency, 2 * batch),
    )
    await conn.close()


async def consume_procrastinate(dsn: str, concurrency: int) -> None:
    app = procrastinate_app(dsn)
    async with app.open_async():
        await app.run_worker_async(
            queues=["bulk"], concurrency=concurrency, wait=False, install_signal_handlers=False
        )


def consumer_cmd(system: str, dsn: str, batch: int, concurrency: int) -> list[str]:
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        "--consume",
        system,
        "--dsn",
        dsn,
        "--batches",
        str(batch),
        "--concurrency",
        str(concurrency),
    ]


# -- probes: cheap index-backed queries polled while a consumer drains -----------------------


def pg_probe(url: str, sql_text: str) -> Callable[[], bool]:
    conn = psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)

    def probe() -> bool:
        row = conn.execute(sql_text).fetchone()
        return bool(row and row[0])

    probe.close = conn.close  # type: ignore[attr-defined]
    return probe


def sqlite_probe(path: Path, sql_text: str) -> Callable[[], bool]:
    conn = sqlite3.connect(
        f"file:{path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False
    )
    conn.execute("PRAGMA busy_timeout=30000")

    def probe() -> bool:
        row = conn.execute(sql_text).fetchone()
        return bool(row and row[0])

    probe.close = conn.close  # type: ignore[attr-defined]
    return probe


HM_STARTED = "SELECT EXISTS (SELECT 1 FROM job_attempts)"
HM_DONE = (
    "SELECT NOT EXISTS (SELECT 1 FROM processing_jobs "
    "WHERE status IN ('queued', 'claimed', 'processing'))"
)


def close_all(*probes: Any) -> None:
    for p in probes:
        with contextlib.suppress(Exception):
            p.close()


# -- one system at one batch size ---------------------------------------------------------


def pg_analyze(url: str) -> None:
    """ANALYZE after the fill, as autovacuum would have by then in a running system.

    Without it the planner still believes the freshly created tables are empty,
    and a peer's dequeue query can pick a plan that reads the whole queue for
    every job (procrastinate's fetch went from ~5 ms to ~60 ms per job that way).
    """
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE")


def chunks(n: int, size: int) -> list[int]:
    return [min(size, n - i) for i in range(0, n, size)]


def run_pgqueuer(args: argparse.Namespace, batch: int, work: Path) -> Result:
    res = Result("pgqueuer", batch, args.jobs)
    name = f"hm_bench_qt_pgqueuer_b{batch}"
    with C.pg_database(args.pg_admin, name) as url:

        async def fill() -> float:
            import asyncpg
            from pgqueuer.queries import Queries

            conn = await asyncpg.connect(url)
            try:
                q = Queries.from_asyncpg_connection(conn)
                await q.install()
                sizes = chunks(args.jobs, batch)
                t = time.perf_counter()
                for k in sizes:
                    await q.enqueue(["noop"] * k, [None] * k, [0] * k)
                return time.perf_counter() - t
            finally:
                await conn.close()

        res.enqueue_rate = args.jobs / asyncio.run(fill())
        pg_analyze(url)
        base = psycopg.connect(url, autocommit=True)
        log_max = base.execute("SELECT coalesce(max(id), 0) FROM pgqueuer_log").fetchone()[0]
        base.close()
        started = pg_probe(
            url,
            "SELECT EXISTS (SELECT 1 FROM pgqueuer WHERE status = 'picked') "
            f"OR (SELECT coalesce(max(id), 0) FROM pgqueuer_log) > {log_max}",
        )
        done = pg_probe(url, "SELECT NOT EXISTS (SELECT 1 FROM pgqueuer)")
        try:
            proc = C.Proc(
                consumer_cmd("pgqueuer", url, batch, args.concurrency),
                C.worker_env(url, work),
                work / f"pgqueuer_b{batch}.log",
            )
            res.drain = C.timed_drain(
                proc, jobs=args.jobs, started=started, done=done, timeout=args.drain_timeout
            )
        finally:
            close_all(started, done)
        with psycopg.connect(url, autocommit=True) as conn:
            bad = conn.execute(
                "SELECT count(*) FROM pgqueuer_log "
                "WHERE status NOT IN ('queued', 'picked', 'successful')"
            ).fetchone()[0]
        if bad:
            res.notes.append(f"{bad} jobs did not succeed")
    return res


def run_procrastinate(args: argparse.Namespace, batch: int, work: Path) -> Result:
    res = Result("procrastinate", batch, args.jobs)
    name = f"hm_bench_qt_procrastinate_b{batch}"
    with C.pg_database(args.pg_admin, name) as url:

        async def fill() -> float:
            app = procrastinate_app(url)
            async with app.open_async():
                await app.schema_manager.apply_schema_async()
                task = app.tasks["noop"]
                sizes = chunks(args.jobs, batch)
                t = time.perf_counter()
                for k in sizes:
                    await task.batch_defer_async(*({} for _ in range(k)))
                return time.perf_counter() - t

        res.enqueue_rate = args.jobs / asyncio.run(fill())
        pg_analyze(url)
        with psycopg.connect(url, autocommit=True) as conn:
            ev_max = conn.execute(
                "SELECT coalesce(max(id), 0) FROM procrastinate_events"
            ).fetchone()[0]
        started = pg_probe(url, f"SELECT (SELECT max(id) FROM procrastinate_events) > {ev_max}")
        done = pg_probe(
            url,
            "SELECT NOT EXISTS (SELECT 1 FROM procrastinate_jobs "
            "WHERE status IN ('todo', 'doing'))",
        )
        try:
            proc = C.Proc(
                consumer_cmd("procrastinate", url, batch, args.concurrency),
                C.worker_env(url, work),
                work / f"procrastinate_b{batch}.log",
            )
            res.drain = C.timed_drain(
                proc, jobs=args.jobs, started=started, done=done, timeout=args.drain_timeout
            )
        finally:
            close_all(started, done)
        with psycopg.connect(url, autocommit=True) as conn:
            ok = conn.execute(
                "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
            ).fetchone()[0]
        if ok != args.jobs:
            res.notes.append(f"only {ok} of {args.jobs} jobs succeeded")
    return res


def hm_fill(url: str, jobs: int, batch: int) -> float:
    """Enqueue ``jobs`` debug.noop jobs with Engine.enqueue_many in chunks; return jobs/s."""
    from hypermedia.queue.models import NewJob

    eng = C.hm_engine(url)
    try:
        sizes = chunks(jobs, batch)
        work = [[NewJob("debug.noop") for _ in range(k)] for k in sizes]
        t = time.perf_counter()
        for chunk in work:
            eng.enqueue_many(chunk)
        return jobs / (time.perf_counter() - t)
    finally:
        eng.db.dispose()


def hm_loop_drain(url: str, batch: int) -> tuple[int, float]:
    """Reference, not the product: claim + flush in this process, no worker, no
    children.  Like the worker: a tiny attempt's start is folded into its
    result, and results are decided from the claimed jobs (the held view)."""
    from hypermedia.queue.engine import held_row
    from hypermedia.queue.models import AttemptResult

    eng = C.hm_engine(url)
    worker = "bench-loop"
    n = 0
    try:
        t = time.perf_counter()
        while True:
            got = eng.claim(worker, ["bulk"], batch)
            if not got:
                break
            eng.flush(
                worker,
                [],
                [
                    AttemptResult(job_id=c.job_id, attempt=c.attempt, status="completed")
                    for c in got
                ],
                {c.job_id: held_row(c, worker, False) for c in got},
            )
            n += len(got)
        return n, time.perf_counter() - t
    finally:
        eng.db.dispose()


def hm_worker_drain(
    url: str,
    jobs: int,
    batch: int,
    concurrency: int,
    work: Path,
    timeout: float,
    tag: str,
    py_spy: Path | None = None,
    extra_env: dict[str, str] | None = None,
) -> C.Drain:
    """Drain the queue with one ``hypermedia worker --burst`` subprocess and time it.

    The clock runs from the first job_attempts row (the worker's first claim) to
    the first poll that finds no job queued, claimed or processing.
    """
    if url.startswith("sqlite"):
        path = Path(url.split("sqlite:///", 1)[1])
        started, done = sqlite_probe(path, HM_STARTED), sqlite_probe(path, HM_DONE)
    else:
        started, done = pg_probe(url, HM_STARTED), pg_probe(url, HM_DONE)
    cmd = C.worker_command(concurrency=concurrency, batch=batch, burst=True)
    if py_spy is not None:
        py_spy.mkdir(parents=True, exist_ok=True)
        cmd = [
            str(C.VENV_BIN / "py-spy"),
            "record",
            "--subprocesses",
            "--idle",
            "--rate",
            "200",
            "--format",
            "raw",
            "-o",
            str(py_spy / f"worker_{tag}.txt"),
            "--",
            *cmd,
        ]
    env = C.worker_env(
        url, work / f"home_{tag}", HYPERMEDIA_CLAIM_BATCH=str(batch), **(extra_env or {})
    )
    try:
        proc = C.Proc(cmd, env, work / f"worker_{tag}.log")
        res = C.timed_drain(proc, jobs=jobs, started=started, done=done, timeout=timeout)
    finally:
        close_all(started, done)
    counts = hm_counts(url)
    if res.error is None and counts.get("completed", 0) != jobs:
        res.notes.append(f"statuses after drain: {counts}")
    if res.cut_after:
        n = counts.get("completed", 0)
        res.notes.append(
            f"timed out: {n:,} of {jobs:,} completed in {res.cut_after:.0f} s "
            f"after the first claim = {n / res.cut_after:,.0f} jobs/s"
        )
    return res


def hm_counts(url: str) -> dict[str, int]:
    import sqlalchemy as sa

    from hypermedia.db.driver import Driver

    drv = Driver(url)
    try:
        with drv.engine.connect() as conn:
            return {
                s: n
                for s, n in conn.execute(
                    sa.text("SELECT status, count(*) FROM processing_jobs GROUP BY status")
                )
            }
    finally:
        drv.dispose()


def run_hypermedia(
    args: argparse.Namespace, batch: int, work: Path, backend: str, worker_ok: bool, worker_msg: str
) -> Result:
    res = Result(f"hypermedia-{backend}", batch, args.jobs)
    tag = f"{backend}_b{batch}"

    @contextlib.contextmanager
    def database(suffix: str):  # type: ignore[no-untyped-def]
        if backend == "pg":
            with C.pg_database(args.pg_admin, f"hm_bench_qt_hm{suffix}_b{batch}") as url:
                yield url
        else:
            path = work / f"hm_bench_qt_hm{suffix}_b{batch}.db"
            try:
                yield f"sqlite:///{path}"
            finally:
                for p in path.parent.glob(path.name + "*"):
                    p.unlink()

    with database("") as url:
        res.enqueue_rate = hm_fill(url, args.jobs, batch)
        if backend == "pg":
            pg_analyze(url)
        if worker_ok:
            spy = Path(args.py_spy) if args.py_spy else None
            extra = dict(kv.split("=", 1) for kv in args.worker_env)
            res.drain = hm_worker_drain(
                url, args.jobs, batch, args.concurrency, work, args.drain_timeout, tag, spy, extra
            )
        else:
            res.notes.append(f"worker drain not run: {worker_msg}")
    if args.engine_loop:
        with database("loop") as url:
            hm_fill(url, args.jobs, batch)
            if backend == "pg":
                pg_analyze(url)
            n, secs = hm_loop_drain(url, batch)
            res.loop_rate = n / secs if secs else None
    return res


# -- report -------------------------------------------------------------------------------


def report(args: argparse.Namespace, results: list[Result]) -> str:
    out = [
        f"command: {C.command_line()}",
        f"machine: {C.machine_line()}",
        f"jobs per run: {args.jobs:,}; consumer concurrency C={args.concurrency} "
        "(pgqueuer: max_concurrent_tasks=max(C, 2*B), its minimum); PostgreSQL databases "
        "ANALYZEd after the fill",
        f"load average (1 min) at start {args.load_start:.2f}, at end {os.getloadavg()[0]:.2f}",
    ]
    if args.worker_env:
        out.append(f"hypermedia worker extra environment: {' '.join(args.worker_env)}")
    out.append("")
    rows = []
    for r in results:
        d = r.drain
        status = ""
        if d is not None:
            status = "ok" if d.error is None else "FAILED"
            if d.error is None and not d.exited_by_itself:
                status = "ok (did not exit)"
        rows.append(
            [
                r.system,
                r.batch,
                r.enqueue_rate,
                r.drain_rate,
                d.startup if d and d.startup is not None else None,
                status,
                r.loop_rate,
                r.load,
            ]
        )
    out.append(
        C.table(
            [
                "system",
                "batch",
                "enqueue jobs/s",
                "drain jobs/s",
                "worker start-up s",
                "drain",
                "ref: in-process claim+flush jobs/s",
                "load at start",
            ],
            rows,
        )
    )
    out.append("")
    by = {(r.system, r.batch): r for r in results}
    ratio_rows = []
    for b in args.batch_list:
        hm = by.get(("hypermedia-pg", b))
        hs = by.get(("hypermedia-sqlite", b))
        pq = by.get(("pgqueuer", b))
        pc = by.get(("procrastinate", b))

        def ratio(a: Result | None, z: Result | None, what: str) -> float | None:
            if a is None or z is None:
                return None
            return C.fmt_ratio(getattr(a, what), getattr(z, what))

        for label, a in (("hypermedia-pg", hm), ("hypermedia-sqlite", hs)):
            if a is None:
                continue
            ratio_rows.append(
                [
                    label,
                    b,
                    _mark(ratio(a, pq, "drain_rate"), TARGET_VS_PGQUEUER, label == "hypermedia-pg"),
                    _mark(
                        ratio(a, pc, "drain_rate"),
                        TARGET_VS_PROCRASTINATE,
                        label == "hypermedia-pg",
                    ),
                    _x(ratio(a, pq, "enqueue_rate")),
                    _x(ratio(a, pc, "enqueue_rate")),
                    _mark_abs(a.drain_rate, TARGET_SQLITE) if label == "hypermedia-sqlite" else "",
                ]
            )
    out.append(
        C.table(
            [
                "hypermedia on",
                "batch",
                "drain / pgqueuer (target >= 1.0x)",
                "drain / procrastinate (target >= 10x)",
                "enqueue / pgqueuer",
                "enqueue / procrastinate",
                "SQLite drain (target >= 2,000/s)",
            ],
            ratio_rows,
        )
    )
    notes = []
    for r in results:
        for n in r.notes:
            notes.append(f"- {r.system} B={r.batch}: {n}")
        if r.drain is not None:
            for n in r.drain.notes:
                notes.append(f"- {r.system} B={r.batch}: {n}")
            if r.drain.error:
                notes.append(f"- {r.system} B={r.batch}: drain failed: {r.drain.error}")
    if notes:
        out += ["", "notes:", *notes]
    return "\n".join(out)


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _mark(v: float | None, target: float, judged: bool) -> str:
    if v is None:
        return "-"
    if not judged:
        return f"{v:.2f}x"
    return f"{v:.2f}x {'met' if v >= target else 'MISSED'}"


def _mark_abs(v: float | None, target: float) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}/s {'met' if v >= target else 'MISSED'}"


def run_one(
    args: argparse.Namespace, system: str, b: int, work: Path, worker_ok: bool, worker_msg: str
) -> Result:
    """Run one system at one batch size; once more if the database server went away."""
    import sqlalchemy as sa

    for attempt in (1, 2):
        try:
            if system == "pgqueuer":
                r = run_pgqueuer(args, b, work)
            elif system == "procrastinate":
                r = run_procrastinate(args, b, work)
            else:
                backend = system.split("-")[1]
                r = run_hypermedia(args, b, work, backend, worker_ok, worker_msg)
            if attempt == 2:
                r.notes.append("second try: the first was cut by a database error")
            return r
        except (psycopg.Error, sa.exc.DBAPIError) as exc:
            first = str(exc).strip().splitlines()[0]
            print(f" [database error: {first}]", end="", flush=True)
            if attempt == 2:
                return Result(system, b, args.jobs, notes=[f"failed twice: {first}"])
            wait_for_server(args.pg_admin, 120)
    raise AssertionError("unreachable")


def wait_for_server(admin_url: str, limit: float) -> None:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        try:
            with psycopg.connect(admin_url, connect_timeout=5) as conn:
                conn.execute("SELECT 1")
            time.sleep(2)
            return
        except psycopg.Error:
            time.sleep(2)


def wait_quiet(limit: float, below: float = 0.7) -> float:
    """Wait up to ``limit`` s for the 1-min load average to fall below ``below``; return it."""
    end = time.monotonic() + limit
    while os.getloadavg()[0] >= below and time.monotonic() < end:
        time.sleep(5)
    return os.getloadavg()[0]


# -- main ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--batches", default="10,100", help="comma-separated batch sizes")
    p.add_argument(
        "--concurrency",
        type=int,
        default=4,
        help="consumer concurrency (hypermedia child processes, procrastinate "
        "sub-workers, pgqueuer task cap floor)",
    )
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"subset of {SYSTEMS}")
    p.add_argument(
        "--pg-admin",
        default=C.DEFAULT_PG_ADMIN,
        help="where to CREATE/DROP the hm_bench_* databases (default template1)",
    )
    p.add_argument("--drain-timeout", type=float, default=600.0)
    p.add_argument("--time-limit", type=float, default=3600.0, help="bound on the whole run, s")
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=0.0,
        help="before each run, wait up to this many s for the machine to be idle "
        "(1-min load average < 0.7); the load is printed either way",
    )
    p.add_argument(
        "--engine-loop",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time hypermedia's claim+flush loop in-process (reference row)",
    )
    p.add_argument(
        "--py-spy",
        default="",
        help="folder: run the hypermedia worker under `py-spy record` (raw stacks)",
    )
    p.add_argument(
        "--worker-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment for the hypermedia worker (diagnostics), repeatable",
    )
    p.add_argument("--consume", choices=("pgqueuer", "procrastinate"), help=argparse.SUPPRESS)
    p.add_argument("--dsn", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.batch_list = [int(x) for x in a.batches.split(",") if x]
    a.system_list = [s for s in a.systems.split(",") if s]
    unknown = set(a.system_list) - set(SYSTEMS)
    if unknown:
        p.error(f"unknown systems: {', '.join(sorted(unknown))}")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.consume:  # child process: drain one peer's queue, then exit
        logging.basicConfig(level=logging.WARNING)
        logging.getLogger("procrastinate.blueprints").setLevel(logging.ERROR)
        if args.consume == "pgqueuer":
            asyncio.run(consume_pgqueuer(args.dsn, args.batch_list[0], args.concurrency))
        else:
            asyncio.run(consume_procrastinate(args.dsn, args.concurrency))
        return 0

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("procrastinate.blueprints").setLevel(logging.ERROR)  # "App in __main__"
    C.set_time_limit(args.time_limit)
    C.note_code_version()
    args.load_start = os.getloadavg()[0]
    print(f"command: {C.command_line()}", flush=True)
    worker_ok, worker_msg = C.worker_available()
    if not worker_ok:
        print(f"hypermedia worker drain skipped: {worker_msg}", flush=True)
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="hm_bench_qt_") as tmp:
        work = Path(tmp)
        try:
            for b in args.batch_list:
                for system in args.system_list:
                    load = wait_quiet(args.quiet_wait)
                    t = time.perf_counter()
                    print(f"... {system} B={b} (load {load:.2f})", end="", flush=True)
                    r = run_one(args, system, b, work, worker_ok, worker_msg)
                    r.load = load
                    results.append(r)
                    print(f" {time.perf_counter() - t:.1f} s", flush=True)
        except C.BenchTimeout as exc:
            print(f"\nstopped: {exc}; partial results follow", flush=True)
        print()
        print(report(args, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Shared plumbing for the benchmark scripts in this folder (not a benchmark itself).

* throw-away PostgreSQL databases named ``hm_bench_*`` (created from template0,
  dropped afterwards; ``test``, ``postgres``, ``root`` and the templates are refused);
* a hard wall-clock bound for a whole script;
* the ``hypermedia worker`` subprocess the queue benchmarks drive;
* percentiles and plain-text tables.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
HYPERMEDIA_BIN = VENV_BIN / "hypermedia"

# Admin connections go to template1: we never connect to, create or drop the
# databases other people use.  New databases are copied from template0, which
# accepts no connections, so a concurrent session on template1 cannot block us.
DEFAULT_PG_ADMIN = os.environ.get(
    "HM_BENCH_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/template1"
)
PREFIX = "hm_bench_"
FORBIDDEN = {"test", "postgres", "root", "template0", "template1"}


class BenchTimeout(Exception):
    """The script ran past its --time-limit."""


# -- run bounds and reporting ---------------------------------------------------


def command_line() -> str:
    """The exact command that produced this output, to paste back into a shell."""
    argv = getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv]
    return shlex.join(argv)  # run from the repository root


_CODE_AT_START: str | None = None


def note_code_version() -> str:
    """Remember the code version at the start; machine_line() reports a change since."""
    global _CODE_AT_START
    _CODE_AT_START = code_version()
    return _CODE_AT_START


def machine_line() -> str:
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        cpu = "unknown cpu"
    now = code_version()
    code = f"hypermedia code {now}"
    if _CODE_AT_START is not None and not _same_code(now, _CODE_AT_START):
        code = f"hypermedia code CHANGED DURING THE RUN: {_CODE_AT_START} at start, {now} at end"
    return f"{os.cpu_count()} cores ({cpu}), Python {sys.version.split()[0]}; {code}"


def code_version() -> str:
    """Commit, tree of hypermedia/ at that commit, and a digest of local edits to it."""

    def git(*a: str) -> bytes:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, timeout=10).stdout

    try:
        head = git("rev-parse", "--short", "HEAD").decode().strip()
        tree = git("rev-parse", "HEAD:hypermedia").decode().strip()[:10]
        diff = git("diff", "HEAD", "--", "hypermedia")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    import hashlib

    out = f"{head} (hypermedia/ tree {tree})"
    if diff.strip():
        out += (
            f" + uncommitted edits to hypermedia/ (diff sha1 {hashlib.sha1(diff).hexdigest()[:10]})"
        )
    return out


def _same_code(a: str, b: str) -> bool:
    """Same hypermedia/ content, whatever the commit (a bench-only commit changes nothing)."""
    return a.split(" ", 1)[-1] == b.split(" ", 1)[-1]


def set_time_limit(seconds: float) -> None:
    """Raise BenchTimeout in the main thread after ``seconds``; ``finally`` blocks still run."""

    def _expired(_sig: int, _frame: Any) -> None:
        raise BenchTimeout(f"time limit of {seconds:.0f} s reached")

    signal.signal(signal.SIGALRM, _expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    # SIGTERM (e.g. `timeout`) should also clean up databases and children.
    signal.signal(signal.SIGTERM, _expired)


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100)."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(p / 100 * len(s) + 0.5) - 1))
    return s[k]


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    out = []
    for n, r in enumerate(cells):
        out.append(
            "  ".join(
                c.rjust(w) if n and _numeric(c) else c.ljust(w)
                for c, w in zip(r, widths, strict=True)
            ).rstrip()
        )
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def _fmt(c: Any) -> str:
    if c is None:
        return "-"
    if isinstance(c, float):
        if c != c:  # nan
            return "-"
        return f"{c:,.0f}" if abs(c) >= 100 else f"{c:,.2f}"
    if isinstance(c, int):
        return f"{c:,}"
    return str(c)


def _numeric(s: str) -> bool:
    return bool(re.fullmatch(r"[-+]?[\d,.]+[x%]?( ms)?", s))


# -- PostgreSQL databases ---------------------------------------------------------


def check_name(name: str) -> None:
    if not re.fullmatch(r"hm_bench_[a-z0-9_]+", name) or name in FORBIDDEN:
        raise ValueError(f"refusing to touch database {name!r}: bench databases are hm_bench_*")


def _admin(admin_url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(admin_url, autocommit=True, connect_timeout=10)


def db_url(admin_url: str, name: str, driver: str = "postgresql") -> str:
    """URL of database ``name`` on the server behind ``admin_url``."""
    check_name(name)
    info = psycopg.conninfo.conninfo_to_dict(admin_url)
    user = info.get("user", "postgres")
    host = info.get("host", "127.0.0.1")
    port = info.get("port", "5432")
    pw = info.get("password")
    cred = f"{user}:{pw}" if pw else user
    return f"{driver}://{cred}@{host}:{port}/{name}"


def create_db(admin_url: str, name: str) -> str:
    check_name(name)
    with _admin(admin_url) as conn:
        _drop(conn, name)
        conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(name)))
    return db_url(admin_url, name)


def drop_db(admin_url: str, name: str) -> None:
    check_name(name)
    with _admin(admin_url) as conn:
        _drop(conn, name)


def _drop(conn: psycopg.Connection[Any], name: str) -> None:
    check_name(name)
    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@contextlib.contextmanager
def pg_database(admin_url: str, name: str, keep: bool = False) -> Iterator[str]:
    """A fresh database for the block; dropped afterwards (even on error or timeout)."""
    url = create_db(admin_url, name)
    try:
        yield url
    finally:
        if not keep:
            with contextlib.suppress(Exception):
                drop_db(admin_url, name)


# -- the hypermedia worker subprocess -------------------------------------------------


def worker_command(*, queues: str = "bulk", concurrency: int, batch: int, burst: bool) -> list[str]:
    cmd = [
        str(HYPERMEDIA_BIN),
        "worker",
        "--queues",
        queues,
        "--concurrency",
        str(concurrency),
        "--batch",
        str(batch),
    ]
    if burst:
        cmd.append("--burst")
    return cmd


def worker_env(url: str, home: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["HYPERMEDIA_DATABASE_URL"] = url
    env["HYPERMEDIA_HOME"] = str(home)
    env.update(extra)
    return env


def worker_available(need: Sequence[str] = ("--burst",)) -> tuple[bool, str]:
    """Does ``hypermedia worker --help`` run and list the options we pass?"""
    if not HYPERMEDIA_BIN.exists():
        return False, f"{HYPERMEDIA_BIN} does not exist"
    try:
        p = subprocess.run(
            [str(HYPERMEDIA_BIN), "worker", "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"},
        )
    except subprocess.TimeoutExpired:
        return False, "`hypermedia worker --help` did not answer within 60 s"
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["?"])[-1]
        return False, f"`hypermedia worker --help` failed (rc={p.returncode}): {last}"
    text = p.stdout + p.stderr
    missing = [o for o in ("--queues", "--concurrency", "--batch", *need) if o not in text]
    if missing:
        return False, f"`hypermedia worker` has no {', '.join(missing)} option yet"
    return True, "ok"


@dataclass
class Proc:
    """A child process whose output goes to a log file; always reaped."""

    cmd: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    started: float = 0.0

    def start(self) -> Proc:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        fh = self.log.open("wb")
        self.started = time.perf_counter()
        self.popen = subprocess.Popen(
            self.cmd,
            env=self.env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            cwd=str(self.log.parent),
            start_new_session=True,
        )
        fh.close()
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def poll(self) -> int | None:
        assert self.popen is not None
        return self.popen.poll()

    def wait(self, timeout: float) -> int | None:
        assert self.popen is not None
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, grace: float = 15.0) -> int | None:
        """SIGTERM the process group we started, then SIGKILL it after ``grace``."""
        if self.popen is None or self.popen.poll() is not None:
            return None if self.popen is None else self.popen.returncode
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        rc = self.wait(grace)
        if rc is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            rc = self.wait(10)
        return rc

    def tail(self, n: int = 15) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])


@dataclass
class Drain:
    """What one timed drain measured (wall clock of the bench process)."""

    jobs: int
    seconds: float | None = None  # first claim seen → all done seen
    startup: float | None = None  # process start → first claim seen
    cut_after: float | None = None  # first claim seen → the timeout, when it ran out
    exit_code: int | None = None
    exited_by_itself: bool = False
    error: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float | None:
        return self.jobs / self.seconds if self.seconds else None


def timed_drain(
    proc: Proc,
    *,
    jobs: int,
    started: Callable[[], bool],
    done: Callable[[], bool],
    timeout: float,
    exit_timeout: float = 60.0,
    start_poll: float = 0.005,
    done_poll: float = 0.02,
) -> Drain:
    """Start ``proc`` and time it from its first claim to the last completion.

    Both instants are found by polling the database: ``started()`` must turn
    true as soon as any job is taken, ``done()`` once none is left.  The start
    is taken as the moment of the last poll that still saw nothing (earliest
    possible start) and the end as the return of the first poll that saw all
    done (latest possible end): resolution is a few tens of milliseconds and
    errs against the system being measured.
    """
    res = Drain(jobs=jobs)
    proc.start()
    deadline = proc.started + timeout
    try:
        last_false = proc.started
        while True:
            t = time.perf_counter()
            if started():
                t0 = last_false
                break
            last_false = t
            if proc.poll() is not None:
                res.error = f"exited (rc={proc.poll()}) before claiming a job:\n{proc.tail()}"
                return res
            if t > deadline:
                res.error = f"no job claimed within {timeout:.0f} s:\n{proc.tail()}"
                return res
            time.sleep(start_poll)
        res.startup = t0 - proc.started
        while True:
            if done():
                t1 = time.perf_counter()
                break
            if proc.poll() is not None and not done():
                res.error = f"exited (rc={proc.poll()}) with jobs left:\n{proc.tail()}"
                return res
            if time.perf_counter() > deadline:
                res.cut_after = time.perf_counter() - t0
                res.error = f"not drained within {timeout:.0f} s:\n{proc.tail()}"
                return res
            time.sleep(done_poll)
        res.seconds = t1 - t0
        rc = proc.wait(exit_timeout)
        if rc is None:
            res.notes.append(f"did not exit {exit_timeout:.0f} s after the queue was empty")
        else:
            res.exited_by_itself = True
        res.exit_code = rc
        return res
    finally:
        rc = proc.stop()
        if res.exit_code is None:
            res.exit_code = rc


def fmt_ratio(x: float | None, y: float | None) -> float | None:
    if not x or not y:
        return None
    return x / y


# -- hypermedia in this process ----------------------------------------------------------


def hm_engine(url: str) -> Any:
    """Migrate ``url`` to head and return an Engine on it (imports kept local)."""
    import logging

    from hypermedia.config import Settings
    from hypermedia.db.driver import Driver
    from hypermedia.db.migrate import upgrade
    from hypermedia.queue.engine import Engine

    logging.getLogger("alembic").setLevel(logging.WARNING)
    upgrade(url)
    return Engine(Driver(url), Settings(database_url=url))

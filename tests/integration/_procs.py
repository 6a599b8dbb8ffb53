"""Real ``hypermedia worker`` / ``scheduler`` processes for integration tests.

``Procs`` starts processes with the harness's FAST timing environment, waits
for a worker to register, and on teardown kills everything it started: the
worker's own process group and the process group of every attempt child
(children run in sessions of their own, so killing the worker's group alone
would leave them behind).  Logs are printed on teardown, so a failing test
shows what the processes said.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from hypermedia.db.driver import Driver
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import NewJob
from hypermedia.queue.states import TERMINAL
from tests.harness import attempts as attempts  # re-exported for the tests
from tests.harness import cli_env, hypermedia, wait_for
from tests.harness import events as events

Row = dict[str, Any]
CHILD_MODULE = "hypermedia.worker.child"

# Tests of a mechanism of the worker itself (not of the database) run on SQLite
# only, to keep the suite fast.  Used as a decorator.
sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


def eventually(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1):
    return wait_for(predicate, timeout, interval, what)


@dataclass
class WorkerProc:
    proc: subprocess.Popen[bytes]
    worker_id: str
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def children(self) -> list[psutil.Process]:
        """The worker's attempt children (warm or running)."""
        try:
            kids = psutil.Process(self.pid).children(recursive=False)
        except psutil.NoSuchProcess:
            return []
        return [k for k in kids if _is_child(k)]


class Procs:
    def __init__(self, driver: Driver, home: Path) -> None:
        self.driver = driver
        self.url = driver.url
        self.home = home
        self._procs: list[tuple[subprocess.Popen[bytes], Path]] = []
        self._children: set[int] = set()

    # -- starting ---------------------------------------------------------------

    def spawn(
        self,
        *args: str,
        name: str = "proc",
        entry: tuple[str, ...] = ("-m", "hypermedia"),
        **env: str,
    ) -> subprocess.Popen[bytes]:
        """``python ENTRY ARGS`` (the CLI unless ``entry`` says otherwise), its
        output in a log of its own, killed with its group at teardown."""
        log = self.home / f"{name}-{len(self._procs)}.log"
        self.home.mkdir(parents=True, exist_ok=True)
        # Like harness.spawn, but the log file is closed here (Popen keeps its
        # own descriptor), so no ResourceWarning trips filterwarnings=error.
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, *entry, *args],
                env=cli_env(self.url, self.home, **env),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._procs.append((proc, log))
        return proc

    def worker(self, *args: str, queues: str = "bulk", timeout: float = 30, **env: str):
        """Start ``hypermedia worker --queues bulk ARGS`` and wait for its workers row."""
        proc = self.spawn("worker", "--queues", queues, *args, name="worker", **env)
        log = self._procs[-1][1]

        def registered() -> str | None:
            if proc.poll() is not None:
                raise AssertionError(f"worker exited with {proc.returncode}:\n{tail(log)}")
            rows = self.query("SELECT worker_id FROM workers WHERE pid = :pid", pid=proc.pid)
            return rows[0][0] if rows else None

        worker_id = eventually(registered, timeout, "the worker registers", interval=0.1)
        return WorkerProc(proc, worker_id, log)

    def cli(self, *args: str, timeout: float = 60) -> str:
        """Run a short CLI command; return its stdout, failing on a non-zero exit."""
        done = hypermedia(*args, url=self.url, home=self.home, timeout=timeout)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    # -- looking -----------------------------------------------------------------

    def query(self, sql: str, **params: Any) -> list[Any]:
        import sqlalchemy as sa

        with self.driver.read() as tx:
            return list(tx.conn.execute(sa.text(sql), params))

    def note_children(self, w: WorkerProc) -> list[psutil.Process]:
        """The worker's children now; remembered so teardown can kill them too."""
        kids = w.children()
        self._children.update(k.pid for k in kids)
        return kids

    def one_child(self, w: WorkerProc, timeout: float = 10) -> int:
        kids = eventually(lambda: self.note_children(w), timeout, "the worker has a child")
        assert len(kids) == 1, kids
        return kids[0].pid

    # -- stopping ----------------------------------------------------------------

    def close(self) -> None:
        for proc, _ in self._procs:
            if proc.poll() is None:
                with contextlib.suppress(psutil.NoSuchProcess):
                    kids = psutil.Process(proc.pid).children(recursive=True)
                    self._children.update(k.pid for k in kids)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for pid in self._children:
            _kill_child_group(pid)
        for proc, log in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
            print(f"--- {log.name} (exit {proc.returncode}) ---\n{tail(log)}")


def _is_child(p: psutil.Process) -> bool:
    try:
        return CHILD_MODULE in " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def _kill_child_group(pid: int) -> None:
    """SIGKILL an attempt child's process group, if that pid is still one of ours."""
    try:
        p = psutil.Process(pid)
        if not _is_child(p):
            return
        os.killpg(os.getpgid(pid), signal.SIGKILL)
    except (psutil.NoSuchProcess, ProcessLookupError, PermissionError):
        pass


def tail(log: Path, n: int = 4000) -> str:
    try:
        return log.read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"


def gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie counts: it no longer runs)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# -- jobs --------------------------------------------------------------------------


def submit(eng: Engine, params: dict[str, Any] | None = None, **kw: Any) -> int:
    return eng.enqueue(NewJob("debug.sleep", params or {}, **kw))


def job(driver: Driver, job_id: int) -> Row:
    with driver.read() as tx:
        row = tx.job(job_id)
    assert row is not None, f"job {job_id} vanished"
    return row


def wait_job(
    driver: Driver, job_id: int, statuses: Iterable[str] = TERMINAL, timeout: float = 30
) -> Row:
    wanted = set(statuses)
    last: dict[str, Any] = {}

    def reached() -> Row | None:
        row = job(driver, job_id)
        last["status"] = row["status"]
        return row if row["status"] in wanted else None

    try:
        return eventually(reached, timeout, f"job {job_id} reaches {sorted(wanted)}")
    except AssertionError as exc:
        raise AssertionError(f"{exc} (last status {last.get('status')})") from None


def run_one(driver: Driver, eng: Engine, params: dict[str, Any] | None = None) -> Row:
    """Submit one debug.sleep job, wait for it to complete, return its result."""
    job_id = submit(eng, params)
    row = wait_job(driver, job_id, TERMINAL, 30)
    assert row["status"] == "completed", (row["status"], row["error_code"], row["safe_reason"])
    return row["result"]

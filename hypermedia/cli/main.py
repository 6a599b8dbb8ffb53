"""``hypermedia``: the command line entry point."""

from __future__ import annotations

import logging
import os
import shlex
import sys
import threading
from pathlib import Path

import typer
from rich.markup import escape

from hypermedia.cli import (
    credits,
    jobs,
    objects,
    photos,
    process,
    profiles,
    queues,
    tokens,
    workers,
)
from hypermedia.cli.common import (
    EXIT_FAILED,
    OutputFailed,
    console,
    drop_stdout,
    engine,
    err_console,
    flush_stdout,
    ignore_stop_signals,
    make_home,
    require_database,
    settings,
    setup_logging,
    user_errors,
    wait_for_database,
    whole_stdout_writes,
)
from hypermedia.db.ready import not_ready
from hypermedia.errors import InvalidRequest
from hypermedia.pipelines import registry
from hypermedia.queue.models import EVERY_QUEUE, check_queue_name

# Help texts are plain text: "[:PORT][/PATH]" in one is not markup to parse.
app = typer.Typer(
    help="hypermedia: durable media processing jobs.", no_args_is_help=True, rich_markup_mode=None
)


@app.callback()
def _root(ctx: typer.Context) -> None:
    whole_stdout_writes()
    ctx.call_on_close(flush_stdout)


def main() -> None:
    """The ``hypermedia`` command: ``app``, and stdout refusing what a command
    printed outside ``user_errors`` (a listing to a full disk) said as one line."""
    try:
        app()
    except OutputFailed as exc:
        err_console.print(f"error: {exc.strerror}", markup=False, highlight=False)
        drop_stdout()
        sys.exit(EXIT_FAILED)


db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(jobs.app, name="jobs")
app.add_typer(objects.objects_app, name="objects")
app.add_typer(objects.pools_app, name="pools")
app.add_typer(objects.gc_app, name="gc")
app.add_typer(photos.app, name="photos")
app.add_typer(profiles.app, name="profiles")
app.add_typer(credits.app, name="credits")
app.add_typer(queues.app, name="queues")
app.add_typer(workers.app, name="workers")
app.add_typer(tokens.app, name="tokens")
app.add_typer(tokens.projects_app, name="projects")
app.command("process")(process.run)

ALL_QUEUES = EVERY_QUEUE
QUEUES_HELP = (
    "comma-separated queue names; * (the default): every queue, the built-in ones and "
    "any an active profile names (or a deactivated one whose jobs still wait), looked up "
    "again as profiles change"
)
log = logging.getLogger("hypermedia")


@db_app.command("upgrade")
def db_upgrade(
    revision: str = typer.Argument("head"),
    wait: float = typer.Option(
        0,
        "--wait",
        min=0,
        metavar="SECONDS",
        help="wait up to SECONDS for the database to answer (a deploy starting beside it)",
    ),
) -> None:
    """Apply migrations up to REVISION (default: the newest)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    # Each step as it starts ("Running upgrade 0008 -> 0009, …"): one may
    # take minutes, and the command said nothing until it ended.
    logging.getLogger("alembic.runtime.migration").setLevel(logging.INFO)
    with user_errors():
        s = settings()
        make_home(s.home)
        if wait and (why := wait_for_database(s.url, wait)) is not None:
            said = f"the database was not ready within {wait:g} s: {why}"
            err_console.print(f"[red]error:[/] {escape(said)}", markup=True, highlight=False)
            raise typer.Exit(1)
        from alembic.util import CommandError

        from hypermedia.db import migrate  # Alembic: only for the commands that need it

        try:
            migrate.upgrade(s.url, revision)
        except CommandError as exc:  # "Can't locate revision identified by 'x'"…: REVISION
            raise InvalidRequest(str(exc)) from None
        console.print(f"database at revision {migrate.current(s.url)}")


@db_app.command("stamp")
def db_stamp(revision: str = typer.Argument(..., help="e.g. 0015")) -> None:
    """Record REVISION as the database's, running nothing: for tables whose
    record of it was lost (`db upgrade` says when)."""
    with user_errors():
        from hypermedia.db import migrate

        url = settings().url
        require_database(url)  # a stamp makes no database
        migrate.stamp(url, revision)
        console.print(f"database stamped at revision {migrate.current(url)} (no step was run)")


@db_app.command("current")
def db_current() -> None:
    """Print the database's migration revision."""
    with user_errors():
        from hypermedia.db import migrate

        url = settings().url
        require_database(url)  # looking makes no database
        at = migrate.current(url)
        if at is None and migrate.has_job_tables(url):
            console.print(
                "none recorded, though hypermedia's tables are there: see `hypermedia db upgrade`"
            )
        else:
            console.print(at or "empty")


def _queues(value: str) -> list[str]:
    names = [q.strip() for q in value.split(",") if q.strip()]
    if not names:
        raise InvalidRequest("--queues names no queue")
    if EVERY_QUEUE in names:
        return [EVERY_QUEUE]
    return [check_queue_name(q) for q in names]


@app.command()
def worker(
    queues: str = typer.Option(ALL_QUEUES, "--queues", "-q", help=QUEUES_HELP),
    concurrency: int = typer.Option(2, "--concurrency", "-c", min=1, max=127),
    batch: int | None = typer.Option(
        None, "--batch", min=1, max=1000, help="jobs claimed per round trip"
    ),
    burst: bool = typer.Option(False, "--burst", help="exit when no job is left"),
    maintenance: bool = typer.Option(
        True,
        "--maintenance/--no-maintenance",
        help="stand for leader and run maintenance if elected (with none, jobs waiting "
        "to retry are never queued again, expired leases never released)",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Run a worker: claim jobs from QUEUES and run each attempt in a child process."""
    from hypermedia.worker.runner import Worker

    setup_logging(verbose)
    with user_errors():
        eng = engine(create=True)
        make_home(eng.settings.home)  # for scratch folders, on any database
        w = Worker(eng, _queues(queues), concurrency=concurrency, batch=batch, burst=burst)
        not_ready(eng.db)  # what no wait would end, said now (see scheduler)
    leader = _start_leader(eng, w.worker_id, w.stopped) if maintenance else None
    w.run()
    ignore_stop_signals()
    if leader:
        leader.join(5)


@app.command()
def scheduler(verbose: bool = typer.Option(False, "--verbose", "-v")) -> None:
    """Stand for leader and run maintenance (reaper, promoter, retention) until stopped."""
    import signal

    from hypermedia.worker.runner import new_worker_id

    setup_logging(verbose)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    node = "scheduler-" + new_worker_id()
    with user_errors():
        eng = engine(create=True)
        # A database error no wait would end (an unknown connection option)
        # said now, in one line: left to the leader's thread, it died with a
        # traceback and the command ran on, doing no maintenance.
        not_ready(eng.db)
        leader = _start_leader(eng, node, stop)
    logging.getLogger("hypermedia.scheduler").info("%s started: standing for leader", node)
    while not stop.wait(0.5):
        if not leader.is_alive():  # a failure its loop does not survive: said above it
            err_console.print("error: the scheduler's leader thread ended; stopping")
            raise typer.Exit(1)
    leader.join(5)
    logging.getLogger("hypermedia.scheduler").info("%s stopped", node)


def _base_url(host: str, port: int) -> str:
    """Where a person on this machine reaches a server bound to HOST."""
    shown = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    if ":" in shown:
        shown = f"[{shown}]"
    return f"http://{shown}:{port}"


def _print_where(base: str, token_file: str | None) -> None:
    console.print(f"API        {base}/v1", soft_wrap=True, highlight=False)
    console.print(f"API docs   {base}/docs", soft_wrap=True, highlight=False)
    console.print(f"dashboard  {base}/ui", soft_wrap=True, highlight=False)
    console.print(f"probes     {base}/healthz  {base}/readyz", soft_wrap=True, highlight=False)
    console.print("submit a job:", highlight=False)
    # No file to read the token from (one made with `tokens create`): $TOKEN.
    bearer = f"$(cat {shlex.quote(token_file)})" if token_file else "$TOKEN"
    console.print(
        f"  curl -sS -X POST {base}/v1/jobs "
        f'-H "Authorization: Bearer {bearer}" '
        "-H 'Content-Type: application/json' -d '{\"job_type\": \"debug.noop\"}'",
        soft_wrap=True,
        highlight=False,
        markup=False,
    )


def _say_serving(
    token: str | None, token_file: Path, home: Path, queues: str, served: list[str], base: str
) -> None:
    """What serve prints before it answers: the first admin token, where the data is, its URLs."""
    if token:
        # Shown before anything else can fail: it is never shown again.
        console.print(
            "[bold]first start: an admin token of project 'default' was created.[/] "
            "It is shown only this once:",
            markup=True,
            soft_wrap=True,
            highlight=False,
        )
        console.print(f"  {token}", soft_wrap=True, highlight=False, markup=False)
        console.print(f"and written to {token_file} (mode 0600)", soft_wrap=True, highlight=False)
    elif token_file.exists():
        console.print(f"admin token: in {token_file}", soft_wrap=True, highlight=False)
    else:
        console.print(
            "admin token: none kept in this home; make one with "
            "`hypermedia tokens create --project default --scopes admin`",
            soft_wrap=True,
            highlight=False,
        )
    # Said before the server answers: whoever waits for /readyz then finds it.
    console.print(
        f"hypermedia serving: data in {home}, queues {queues}, {_job_types_line(served)}",
        soft_wrap=True,
        highlight=False,
    )
    _print_where(base, str(token_file) if token_file.exists() else None)


def _broken_pipe() -> None:
    raise BrokenPipeError


def _stdout_gone(token_file: Path) -> None:
    console.quiet = True
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # later writes, and the flush at exit, go nowhere
    os.close(devnull)
    log.warning(
        "standard output was closed: serving on, saying nothing more there "
        "(the admin token, if one was made, is in %s)",
        token_file,
    )


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8000, "--port", min=1, max=65535),
    concurrency: int = typer.Option(2, "--concurrency", "-c", min=1, max=127),
    queues: str = typer.Option(ALL_QUEUES, "--queues", "-q", help=QUEUES_HELP),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """The embedded service: migrations, the API and dashboard, workers and maintenance."""
    from hypermedia.api import server
    from hypermedia.api.app import create_app
    from hypermedia.services import Services
    from hypermedia.worker.runner import Worker

    setup_logging(verbose)
    with user_errors():
        served = _queues(queues)  # a bad name: refused before anything is done
        s = settings()
        server.check_port(host, port)
        make_home(s.home)
        if wait_for_database(s.url, None) is not None:
            return  # stopped while waiting
        from hypermedia.db import migrate

        try:
            migrate.upgrade(s.url)
        except migrate.NewerSchema as exc:
            # A rolling deploy: this replica is older than the one that
            # migrated.  It carries on, as `worker` and `api` do.
            log.warning("%s; carrying on", exc)
        svc = Services.from_settings(s)
        token = svc.tokens.first_admin(s.home)
    token_file = s.home.resolve() / "admin-token"
    base = _base_url(host, port)
    # Rich answers a closed pipe with SystemExit(1): for a command that
    # prints and ends, but this one serves on.
    console.on_broken_pipe = _broken_pipe  # type: ignore[method-assign]
    try:
        _say_serving(token, token_file, s.home.resolve(), queues, served, base)
        sys.stdout.flush()  # now: a closed pipe is found here, not at exit
    except BrokenPipeError:
        # `serve | head -3`: the reader went, the server goes on (QA: it
        # exited 1, silently, right after its banner).
        _stdout_gone(token_file)
    with user_errors():
        w = Worker(svc.engine, served, concurrency=concurrency)
        app = create_app(svc)
        app.state.draining = w.stop_claiming.is_set  # /readyz: 503 from the SIGTERM on
        w.install_signals()  # before anything can see it ready
        http = server.start_in_thread(app, host, port, access_log=verbose)
    leader = _start_leader(svc.engine, w.worker_id, w.stopped)
    try:
        w.run()
    finally:
        # The worker has drained: the rest of the stop is short, unless a
        # thread waits on a database that stopped answering.
        ignore_stop_signals()
        server.exit_within(server.EXIT_GRACE_SECONDS + 10)
        http.stop()
        leader.join(5)


def _job_types_line(queues: list[str]) -> str:
    """The job types the served queues run by default, as the worker counts
    them ("*": the built-in pipelines' queues): the banner listed every job
    type, pdf.preview too under `--queues images,bulk`."""
    every = EVERY_QUEUE in queues
    types = registry.job_types_for(registry.queues() if every else queues)
    if not types:  # queues only a profile names: its job type is the profile's
        return "job types: those of the profiles naming these queues"
    return f"job types {', '.join(types)}"


@app.command()
def api(
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8000, "--port", min=1, max=65535),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """The HTTP API and dashboard only: no workers, no maintenance (run those apart)."""
    from hypermedia.api import server
    from hypermedia.api.app import create_app
    from hypermedia.services import Services

    setup_logging(verbose)
    with user_errors():
        s = settings()
        server.check_port(host, port)
        # Its URL-signing key and uploads on their way go there: a read-only
        # one was "OSError: … Read-only file system: '[path]'", naming nothing.
        make_home(s.home)
        svc = Services.from_settings(s)
        if (reason := not_ready(svc.engine.db)) is not None:
            log.warning("%s; /readyz answers 503 until then", reason[1])
        app_ = create_app(svc)
        base = _base_url(host, port)
        console.print(
            f"hypermedia API at {base}/v1, docs {base}/docs, dashboard {base}/ui",
            soft_wrap=True,
            highlight=False,
        )
        server.run(app_, host, port, access_log=verbose)


def _start_leader(eng, node_id: str, stop: threading.Event):
    from hypermedia.scheduler.leader import Leader

    leader = Leader(eng, node_id, stop)
    leader.start()
    return leader


if __name__ == "__main__":
    app()

"""``hypermedia``: the command line entry point."""

from __future__ import annotations

import threading

import typer

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
from hypermedia.cli.common import console, engine, settings, setup_logging, user_errors
from hypermedia.db import migrate
from hypermedia.pipelines import registry

app = typer.Typer(help="hypermedia: durable media processing jobs.", no_args_is_help=True)
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
app.command("process")(process.run)

ALL_QUEUES = "images,documents,ocr,media,bulk"


@db_app.command("upgrade")
def db_upgrade(revision: str = typer.Argument("head")) -> None:
    """Apply migrations up to REVISION (default: the newest)."""
    with user_errors():
        s = settings()
        s.home.mkdir(parents=True, exist_ok=True)
        migrate.upgrade(s.url, revision)
        console.print(f"database at revision {migrate.current(s.url)}")


@db_app.command("current")
def db_current() -> None:
    """Print the database's migration revision."""
    with user_errors():
        console.print(migrate.current(settings().url) or "empty")


def _queues(value: str) -> list[str]:
    return [q.strip() for q in value.split(",") if q.strip()]


@app.command()
def worker(
    queues: str = typer.Option(ALL_QUEUES, "--queues", "-q", help="comma-separated queue names"),
    concurrency: int = typer.Option(2, "--concurrency", "-c", min=1, max=127),
    batch: int | None = typer.Option(
        None, "--batch", min=1, max=1000, help="jobs claimed per round trip"
    ),
    burst: bool = typer.Option(False, "--burst", help="exit when no job is left"),
    maintenance: bool = typer.Option(
        True,
        "--maintenance/--no-maintenance",
        help="stand for leader and run maintenance if elected",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Run a worker: claim jobs from QUEUES and run each attempt in a child process."""
    from hypermedia.worker.runner import Worker

    setup_logging(verbose)
    with user_errors():
        eng = engine()
        w = Worker(eng, _queues(queues), concurrency=concurrency, batch=batch, burst=burst)
    leader = _start_leader(eng, w.worker_id, w.stopped) if maintenance else None
    w.run()
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
    with user_errors():
        leader = _start_leader(engine(), "scheduler-" + new_worker_id(), stop)
    while not stop.wait(0.5):
        pass
    leader.join(5)


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8000, "--port"),
    concurrency: int = typer.Option(2, "--concurrency", "-c", min=1, max=127),
    queues: str = typer.Option(ALL_QUEUES, "--queues", "-q"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """The embedded service: migrations, workers and maintenance in one process."""
    from hypermedia import health
    from hypermedia.storage.ledger import Storage
    from hypermedia.worker.runner import Worker

    setup_logging(verbose)
    with user_errors():
        s = settings()
        s.home.mkdir(parents=True, exist_ok=True)
        migrate.upgrade(s.url)
        eng = engine(s)
        w = Worker(eng, _queues(queues), concurrency=concurrency)
        server = health.start(host, port, eng.db, Storage(eng.db, s))
    leader = _start_leader(eng, w.worker_id, w.stopped)
    console.print(
        f"hypermedia serving: data in {s.home.resolve()}, health at "
        f"http://{host}:{port}/healthz, queues {queues}, job types "
        f"{', '.join(registry.known())}"
    )
    console.print("try: hypermedia jobs submit debug.sleep --params '{\"ms\": 500}' --wait")
    try:
        w.run()
    finally:
        server.shutdown()
        leader.join(5)


def _start_leader(eng, node_id: str, stop: threading.Event):
    from hypermedia.scheduler.leader import Leader

    leader = Leader(eng, node_id, stop)
    leader.start()
    return leader


if __name__ == "__main__":
    app()

"""What every command shares: settings, the engine, output and error handling."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from hypermedia.config import Settings, load_settings
from hypermedia.db.dialects import is_schema_missing, is_transient
from hypermedia.db.driver import connect
from hypermedia.db.ready import wait_until_ready
from hypermedia.errors import HypermediaError, NotFound
from hypermedia.queue.clock import clock_for
from hypermedia.queue.engine import Engine
from hypermedia.redact import brief, redact

# Piped or redirected, a line is as long as it is: Rich's default of 80 columns
# there cut table cells ("comple…", so `| grep completed` found nothing) and
# split one-line errors in two.
UNWRAPPED = 100_000


def _console(stderr: bool = False) -> Console:
    # Markup off: what we print is full of other people's text (reasons, file
    # names), and redaction's own markers ("[path]", "[token]") read as tags:
    # they vanished.  Our few styled lines opt in with markup=True and escape()
    # the rest.
    c = Console(stderr=stderr, markup=False)
    if c.is_terminal or os.environ.get("COLUMNS"):
        return c
    return Console(stderr=stderr, markup=False, width=UNWRAPPED)


console = _console()
err_console = _console(stderr=True)
T = TypeVar("T")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def settings() -> Settings:
    return load_settings()


def engine(s: Settings | None = None) -> Engine:
    s = s or settings()
    db = connect(s.url)
    return Engine(db, s, clock=clock_for(db))


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # Alembic lists its plugins as it is imported: seven lines at every start.
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)


def _default(o: Any) -> Any:
    if isinstance(o, datetime):
        return o.isoformat()
    if isinstance(o, Decimal):
        return float(o)
    if isinstance(o, set | frozenset):
        return sorted(o)
    raise TypeError(type(o).__name__)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, default=_default, sort_keys=True) + "\n")


@contextmanager
def as_regular_files(paths: list[Path]) -> Iterator[list[Path]]:
    """``paths``, with each one that is not a regular file (``/dev/stdin``, a
    FIFO, ``<(cmd)``) read once into a temporary file of the same name: the
    ledger reads an input twice (its first bytes for the type, then all of
    it), and a stream would give it nothing the second time."""
    streams = [p for p in paths if not stat.S_ISREG(p.stat().st_mode)]
    if not streams:
        yield paths
        return
    with tempfile.TemporaryDirectory(prefix="hypermedia-stdin-") as tmp:
        copies: dict[Path, Path] = {}
        for i, p in enumerate(streams):
            copy = Path(tmp) / str(i) / (p.name or "stdin")
            copy.parent.mkdir()
            with open(p, "rb") as src, open(copy, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            copies[p] = copy
        yield [copies.get(p, p) for p in paths]


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn our errors into a short red line and an exit code; never a traceback."""
    try:
        yield
    except typer.Exit:
        raise
    except NotFound as exc:
        err_console.print(f"[red]not found:[/] {escape(redact(exc))}", markup=True)
        raise typer.Exit(2) from None
    except HypermediaError as exc:
        err_console.print(f"[red]error:[/] {escape(redact(exc))}", markup=True)
        raise typer.Exit(1) from None
    except Exception as exc:  # database down, bad URL…: say what kind, not the internals
        said = brief(exc)
        if is_schema_missing(exc):
            said = f"{said}: is the database migrated? run `hypermedia db upgrade`"
        err_console.print(f"[red]error:[/] {escape(said)}", markup=True, highlight=False)
        raise typer.Exit(1) from None


def wait_for_database(url: str, seconds: float | None) -> bool:
    """Whether the database at ``url`` answers within ``seconds`` (None: as
    long as it takes); SIGTERM and Ctrl-C end the wait.  For commands a
    deploy starts beside the database (``serve``, ``db upgrade --wait``)."""
    stop = threading.Event()
    handlers = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in STOP_SIGNALS}
    db = connect(url)
    try:
        deadline = None if seconds is None else time.monotonic() + seconds
        return wait_until_ready(db, stop, schema=False, deadline=deadline)
    finally:
        db.dispose()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def through_outages(read: Callable[[], T], deadline: float | None = None) -> T:
    """``read()``, tried again while the database is away (a restart, a
    failover, a full disk), as the workers do: a command that waits for jobs
    outlives the outage instead of leaving the user without their results.
    Past ``deadline`` (time.monotonic()), or for an error the database would
    give every time, the error is raised."""
    delay, said = 0.5, False
    while True:
        try:
            return read()
        except Exception as exc:
            if not is_transient(exc) or (deadline is not None and time.monotonic() > deadline):
                raise
            if not said:
                why = escape(brief(exc))
                err_console.print(f"[yellow]database unavailable ({why}); waiting[/]", markup=True)
                said = True
        time.sleep(delay)
        delay = min(delay * 2, 5.0)

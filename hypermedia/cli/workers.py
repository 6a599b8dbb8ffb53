"""``hypermedia workers ls|drain``."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Column, Table

from hypermedia.cli.common import console, engine, print_json, user_errors
from hypermedia.services import Services

app = typer.Typer(help="See workers; drain one.", no_args_is_help=True)

COLUMNS = ("worker_id", "status", "healthy", "queues", "jobs", "last_heartbeat", "cpu", "mem")


def _cells(w: dict[str, Any]) -> list[str]:
    m = w["last_metrics"] or {}
    return [
        w["worker_id"],
        w["status"],
        "yes" if w["healthy"] else "no",
        ",".join(w["queues"] or []),
        f"{w['current_jobs']}/{w['max_concurrency']}",
        f"{w['last_heartbeat']:%Y-%m-%d %H:%M:%S}",
        f"{m['cpu_percent']}%" if m else "",
        f"{m['memory_percent']}%" if m else "",
    ]


@app.command("ls")
def ls(
    as_json: bool = typer.Option(False, "--json"),
    all_: bool = typer.Option(False, "--all", help="terminated workers too"),
) -> None:
    """Workers, newest first, with health and their latest metrics."""
    with user_errors():
        fleet = Services.from_engine(engine()).fleet
        rows = fleet.list(include_terminated=all_)
        leader = fleet.leader() if not as_json else None
    if as_json:
        print_json(rows)
        return
    # No wrapping of ids: they are copied from here into `workers drain`.
    table = Table(Column(COLUMNS[0], no_wrap=True), *COLUMNS[1:])
    for w in rows:
        table.add_row(*_cells(w))
    console.print(table)
    # Schedulers lead too and are no workers: named here, from the lease.
    said = leader or "none (no scheduler, serve or worker with maintenance runs)"
    console.print(f"maintenance leader: {said}", markup=False, highlight=False)


@app.command()
def drain(
    worker_id: str = typer.Argument(..., help="from `hypermedia workers ls`"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Ask a worker to stop claiming, finish its running jobs and exit."""
    with user_errors():
        row = Services.from_engine(engine()).fleet.drain(worker_id)
    if as_json:
        print_json(row)
    else:
        console.print(f"worker {worker_id} draining")

"""``hypermedia queues ls|pause|resume``."""

from __future__ import annotations

import typer
from rich.table import Table

from hypermedia.cli.common import console, engine, err_console, print_json, user_errors
from hypermedia.pipelines import registry
from hypermedia.queue.models import check_queue_name
from hypermedia.queue.queues import Queues
from hypermedia.services import Services

app = typer.Typer(help="See queues; pause and resume them.", no_args_is_help=True)

COLUMNS = (
    "queue_name",
    "paused",
    "served",
    "queued",
    "running",
    "retry_wait",
    "completed_1h",
    "failed_1h",
)


@app.command("ls")
def ls(as_json: bool = typer.Option(False, "--json")) -> None:
    """Every known queue with its switch and job counts."""
    with user_errors():
        rows = Services.from_engine(engine()).queues.summary()
    if as_json:
        print_json(rows)
        return
    table = Table(*COLUMNS)
    for r in rows:
        table.add_row(*(_cell(c, r[c]) for c in COLUMNS))
    console.print(table)
    idle = [r["queue_name"] for r in rows if r["queued"] and not r["served"] and not r["paused"]]
    if idle:
        err_console.print(
            f"note: no live worker claims from {', '.join(idle)}: their queued jobs wait "
            "until one does (`hypermedia worker --queues NAME`)",
            markup=False,
            highlight=False,
        )


def _cell(column: str, value: object) -> str:
    if column == "served":  # said outright: a blank read as "not applicable"
        return "yes" if value else "NO"
    return "yes" if value is True else "" if value is False else str(value)


@app.command()
def pause(
    name: str = typer.Argument(..., help="the queue, e.g. images"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Stop workers claiming from NAME; jobs already running finish."""
    with user_errors():
        queues = Services.from_engine(engine()).queues
        known = known_queues(queues)
        row = queues.pause(name)
    if name not in known:  # paused all the same: a profile may name it next
        warn_unknown_queue(name)
    if as_json:
        print_json(row)
    else:
        console.print(f"queue {name} paused")


@app.command()
def resume(
    name: str = typer.Argument(..., help="the queue, e.g. images"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Let workers claim from NAME again."""
    with user_errors():
        check_queue_name(name)
        queues = Services.from_engine(engine()).queues
        rows = {r["queue_name"]: r for r in queues.summary()}
        row = queues.resume(name)
    if name not in rows and name not in registry.queues():
        warn_unknown_queue(name)
    if as_json:
        print_json(row)
    elif name in rows and rows[name]["paused"]:
        console.print(f"queue {name} resumed")
    else:
        console.print(f"queue {name} was not paused", highlight=False)


def known_queues(queues: Queues) -> set[str]:
    """The queue names a pipeline, a profile, a job or an earlier switch uses."""
    return {r["queue_name"] for r in queues.summary()} | registry.queues()


def warn_unknown_queue(name: str) -> None:
    err_console.print(
        f"warning: no pipeline, profile or job uses queue {name} (a typo?); "
        f"`hypermedia queues ls` lists those that do",
        markup=False,
        highlight=False,
    )

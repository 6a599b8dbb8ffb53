"""hypermedia credits show|set-budget: project budgets and credit use."""

from __future__ import annotations

import typer
from rich.table import Table

from hypermedia.cli.common import console, engine, err_console, print_json, user_errors
from hypermedia.errors import InvalidRequest
from hypermedia.parse import ascii_int
from hypermedia.queue.profiles import Credits

app = typer.Typer(help="Credits: project budgets and what projects used.", no_args_is_help=True)

UNLIMITED = ("none", "unlimited")


def _cell(value: int | None) -> str:
    return "unlimited" if value is None else str(value)


@app.command("show")
def show(
    project: str | None = typer.Option(None, "--project", help="default: every known project"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Budget, used and remaining credits (used = completed jobs + jobs under way)."""
    with user_errors():
        credits_ = Credits(engine())
        if project is not None and not credits_.is_known(project):
            _unknown(project)  # "unlimited, 0 used" of a typo looked like an answer
        rows = credits_.show(project)
        if as_json:
            print_json(rows[0] if project is not None else rows)
            return
        table = Table("project", "budget", "used", "remaining")
        for r in rows:
            table.add_row(
                r["project_id"], _cell(r["budget"]), str(r["used"]), _cell(r["remaining"])
            )
        console.print(table)


def _unknown(project: str) -> None:
    err_console.print(
        f"warning: no token, job, budget or object names project {project} (a typo?); "
        "`hypermedia projects ls` lists those with tokens",
        markup=False,
        highlight=False,
    )


# A negative budget reaches the value check (a clear message) instead of
# being read as an unknown option "-5".
@app.command("set-budget", context_settings={"ignore_unknown_options": True})
def set_budget(
    project: str = typer.Argument(...),
    credits: str = typer.Argument(..., help="whole credits, or 'none' for no limit"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Set PROJECT's credit budget; enqueueing past it is refused."""
    with user_errors():
        if credits.strip().lower() in UNLIMITED:
            limit = None
        else:
            # ASCII digits only: int() also reads Arabic-Indic digits and '1_000'.
            limit = ascii_int(credits.strip(), max_digits=40)
            if limit is None:
                raise InvalidRequest("the budget is a whole number of credits, or 'none'")
        credits_ = Credits(engine())
        if not credits_.is_known(project):
            _unknown(project)
        row = credits_.set_budget(project, limit)
        if as_json:
            print_json(row)
        else:
            console.print(
                f"project {row['project_id']}: budget {_cell(row['budget'])}, "
                f"used {row['used']}, remaining {_cell(row['remaining'])}"
            )

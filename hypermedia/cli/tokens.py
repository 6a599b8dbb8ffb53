"""hypermedia tokens create|ls|revoke and hypermedia projects ls.

A token is shown once, when it is created; afterwards only its public prefix
(``hm_xxxxxxxxxx``) is ever printed.  The database keeps only its hash.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import typer
from rich.table import Table

from hypermedia.auth.tokens import SCOPES, Tokens
from hypermedia.cli.common import (
    MAX_ID,
    OutputFailed,
    console,
    engine,
    err_console,
    print_json,
    user_errors,
)

app = typer.Typer(help="API tokens: create (shown once), list, revoke.", no_args_is_help=True)
projects_app = typer.Typer(
    help="Projects: what tokens and resources belong to.", no_args_is_help=True
)

# (row key, header) of the human table.
TOKEN_COLUMNS = (
    ("token_id", "id"),
    ("project_id", "project"),
    ("name", "name"),
    ("prefix", "prefix"),
    ("scopes", "scopes"),
    ("status", "status"),
    ("expires_at", "expires"),
)
# Whatever a row holds, only these leave the CLI: never a hash, never a secret.
PUBLIC_FIELDS = (
    "token_id",
    "project_id",
    "name",
    "prefix",
    "scopes",
    "created_by",
    "created_at",
    "expires_at",
    "last_used_at",
    "revoked_at",
)


def tokens() -> Tokens:
    eng = engine()
    return Tokens(eng.db, clock=eng.clock)


def _status(row: dict[str, Any], now: datetime) -> str:
    if row.get("revoked_at") is not None:
        return "revoked"
    expires = row.get("expires_at")
    if expires is not None and expires <= now:
        return "expired"
    return "active"


def _public(row: dict[str, Any], now: datetime) -> dict[str, Any]:
    out = {k: row.get(k) for k in PUBLIC_FIELDS}
    out["status"] = _status(row, now)
    return out


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    if isinstance(value, datetime):
        return value.isoformat(sep=" ", timespec="seconds")
    return str(value)


@app.command()
def create(
    project: str = typer.Option(..., "--project", "-p", help="created if it does not exist"),
    scopes: str = typer.Option(..., "--scopes", "-s", help=f"comma-separated: {', '.join(SCOPES)}"),
    name: str = typer.Option("", "--name", help="a label to recognise it by"),
    expires_days: int | None = typer.Option(
        None, "--expires-days", min=1, max=36500, help="default: never expires"
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Create a token for PROJECT; it is printed this once and never again."""
    with user_errors():
        t = tokens()
        expires_in = timedelta(days=expires_days) if expires_days else None
        row, token = t.create(project, scopes, name=name, expires_in=expires_in, created_by="cli")
        try:
            _show_new(row, token, _public(row, t.clock()), as_json)
        except (OutputFailed, BrokenPipeError):
            # Shown only this once, and not shown: nobody holds its secret,
            # yet it stayed active (an admin token, say).  Revoked, and said.
            t.revoke(row["token_id"])
            err_console.print(
                f"token {row['token_id']} revoked: its secret could not be shown",
                highlight=False,
            )
            raise


def _show_new(row: dict[str, Any], token: str, public: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json({**public, "token": token})
        return
    console.print(
        f"token {row['token_id']} for project {row['project_id']} "
        f"({', '.join(row['scopes'])}), shown only this once:",
        highlight=False,
    )
    console.print(token, soft_wrap=True, highlight=False, markup=False)
    if row["expires_at"] is not None:
        console.print(f"expires {_cell(row['expires_at'])} UTC", highlight=False)


@app.command("ls")
def list_tokens(
    project: str | None = typer.Option(None, "--project", "-p"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """List tokens (public prefix only: never the secret)."""
    with user_errors():
        t = tokens()
        now = t.clock()
        rows = [_public(r, now) for r in t.list(project)]
        if as_json:
            print_json(rows)
            return
        table = Table()
        for key, header in TOKEN_COLUMNS:
            # The prefix is how a token is recognised: never cut short.
            table.add_column(header, no_wrap=key in ("prefix", "token_id", "status"))
        for r in rows:
            table.add_row(*(_cell(r[key]) for key, _ in TOKEN_COLUMNS))
        console.print(table)


@app.command()
def revoke(
    token_id: int = typer.Argument(..., min=1, max=MAX_ID, help="the token_id from `tokens ls`"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Revoke a token: it stops authenticating at once."""
    with user_errors():
        t = tokens()
        row = _public(t.revoke(token_id), t.clock())
        if as_json:
            print_json(row)
        else:
            console.print(f"token {token_id} ({row['prefix']}) revoked", highlight=False)


@projects_app.command("ls")
def list_projects(as_json: bool = typer.Option(False, "--json")) -> None:
    """List projects."""
    columns = ("project_id", "name", "owner_id", "created_at")
    with user_errors():
        rows = [{c: r.get(c) for c in columns} for r in tokens().projects()]
        if as_json:
            print_json(rows)
            return
        table = Table(*columns)
        for r in rows:
            table.add_row(*(_cell(r[c]) for c in columns))
        console.print(table)

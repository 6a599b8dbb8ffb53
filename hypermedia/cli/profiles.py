"""hypermedia profiles ls|show|create|deactivate: versioned settings per job type."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from hypermedia.cli.common import (
    console,
    engine,
    err_console,
    json_object,
    print_json,
    user_errors,
)
from hypermedia.cli.queues import known_queues, warn_unknown_queue
from hypermedia.errors import InvalidRequest, JobError
from hypermedia.pipelines import registry, schema
from hypermedia.queue.profiles import MAX_PRICE, Profiles, price_text
from hypermedia.queue.queues import Queues

app = typer.Typer(
    help="Profiles: versioned settings, limits and prices per job type.", no_args_is_help=True
)

COLUMNS = ("ref", "job_type", "queue", "active", "credits", "timeout")


def profiles() -> Profiles:
    return Profiles(engine())


def _cells(p: dict[str, Any]) -> list[str]:
    return [
        p["ref"],
        p["job_type"],
        p["queue_name"],
        "yes" if p["is_active"] else "no",
        price_text(p),
        f"{p['timeout_seconds']}s",
    ]


def _settings_schema(job_type: str) -> dict[str, Any] | None:
    try:
        pipeline = registry.get(job_type)
    except JobError:
        return None
    return schema.describe(pipeline.schema) if pipeline.schema is not None else None


def _allowed(field: dict[str, Any]) -> str:
    if "choices" in field:
        return ", ".join(str(c) for c in field["choices"])
    low, high = field.get("min"), field.get("max")
    if low is not None and high is not None:
        return f"{low}..{high}"
    if low is not None:
        return f">= {low}"
    return "" if high is None else f"<= {high}"


@app.command("ls")
def ls(
    job_type: str | None = typer.Option(None, "--type", help="only this job type"),
    key: str | None = typer.Option(None, "--key", help="only this profile key's versions"),
    include_inactive: bool = typer.Option(False, "--all", help="deactivated versions too"),
    limit: int = typer.Option(500, "--limit", min=1, max=10_000),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """List profile versions by key, oldest first (active ones unless --all)."""
    with user_errors():
        rows = profiles().list(job_type, include_inactive, key=key, limit=limit + 1)
        if len(rows) > limit:
            # By key: what is cut is whole keys, not the oldest rows; say so.
            rows = rows[:limit]
            err_console.print(
                f"note: the first {limit} versions are shown; "
                "narrow with --key or --type, or raise --limit",
                markup=False,
                highlight=False,
            )
        if as_json:
            print_json(rows)
            return
        table = Table(*COLUMNS)
        for col in table.columns[:2]:
            col.no_wrap = True  # copied whole into other commands
        for p in rows:
            table.add_row(*_cells(p))
        console.print(table)


@app.command("show")
def show(
    ref: str = typer.Argument(..., help="KEY (newest active version) or KEY:vN"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """One profile version, with the settings schema of its job type."""
    with user_errors():
        p = profiles().show(ref)
        p["settings_schema"] = _settings_schema(p["job_type"])
        if as_json:
            print_json(p)
            return
        state = "active" if p["is_active"] else "deactivated"
        head = f"[bold]{escape(p['ref'])}[/] {escape(p['job_type'])} ({state})"
        console.print(f"{head}  queue {escape(p['queue_name'])}", markup=True)
        console.print(
            f"credits: {price_text(p)}  timeout {p['timeout_seconds']}s  "
            f"max input {p['max_input_bytes']} bytes  created {p['created_at']}"
        )
        console.print(f"settings: {json.dumps(p['settings'], sort_keys=True)}", soft_wrap=True)
        if p["settings_schema"]:
            table = Table("setting", "type", "default", "allowed", "job may override")
            for name, f in p["settings_schema"].items():
                allowed = _allowed(f)
                table.add_row(
                    name,
                    f["type"],
                    json.dumps(f["default"]),
                    allowed,
                    "yes" if f["overridable"] else "no",
                )
            console.print(table)


def _type_of(key: str) -> str:
    """KEY's job type, carried over like every option left out (a key keeps
    its type, all its versions deactivated too)."""
    job_type = profiles().job_type_of(key)
    if job_type is None:
        raise InvalidRequest(f"give --type: {key!r} is a new key")
    return job_type


@app.command("create")
def create(
    key: str = typer.Argument(..., help="e.g. image-thumbnail"),
    job_type: str | None = typer.Option(
        None, "--type", help="the job type, e.g. image.thumbnail (default: KEY's own)"
    ),
    settings: str | None = typer.Option(
        None, "--settings", help="JSON object of settings (default: KEY's newest version's)"
    ),
    queue: str | None = typer.Option(None, "--queue", help="default: the job type's queue"),
    base: int | None = typer.Option(None, "--credits-base", min=0, max=MAX_PRICE),
    per_mb: int | None = typer.Option(None, "--credits-per-mb", min=0, max=MAX_PRICE),
    per_page: int | None = typer.Option(None, "--credits-per-page", min=0, max=MAX_PRICE),
    per_minute: int | None = typer.Option(None, "--credits-per-minute", min=0, max=MAX_PRICE),
    timeout: int | None = typer.Option(None, "--timeout", help="seconds per attempt"),
    max_input_bytes: int | None = typer.Option(None, "--max-input-bytes"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Create the next version of KEY (v1 for a new key), its settings checked first.

    The settings given are the version's whole settings (the job type's
    defaults fill in the rest).  Settings, queue, prices, timeout and input
    limit not given carry over from KEY's newest version (new keys: the job
    type's defaults and queue, 3600 s, 5 GiB, free).
    """
    with user_errors():
        parsed = None if settings is None else json_object(settings, "--settings")
        if queue is not None and queue not in known_queues(Queues(engine())):
            warn_unknown_queue(queue)  # its jobs would wait for a worker that lists it
        p = profiles().create(
            key,
            job_type or _type_of(key),
            parsed,
            queue=queue,
            credits={
                "base": base,
                "per_mb": per_mb,
                "per_page": per_page,
                "per_minute": per_minute,
            },
            timeout_seconds=timeout,
            max_input_bytes=max_input_bytes,
        )
        if as_json:
            print_json(p)
        else:
            console.print(f"profile {p['ref']} created ({p['job_type']}, queue {p['queue_name']})")


@app.command("deactivate")
def deactivate(
    ref: str = typer.Argument(..., help="KEY:vN, the version to deactivate"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Stop new jobs from using a version; it is kept, with the outputs it made."""
    with user_errors():
        p = profiles().deactivate(ref)
        if as_json:
            print_json(p)
        else:
            console.print(f"profile {p['ref']} deactivated")

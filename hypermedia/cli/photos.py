"""hypermedia photos add|ls|show|copy|move|rm: the photo domain of seed 002."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from hypermedia.cli.common import (
    as_regular_files,
    console,
    engine,
    existing_inputs,
    print_json,
    settings,
    sigterm_as_ctrl_c,
    user_errors,
)
from hypermedia.parse import base_url
from hypermedia.photos.service import Photos
from hypermedia.storage.ledger import Storage

app = typer.Typer(
    help="Photos: images with an album and a title, bound to stored objects.",
    no_args_is_help=True,
)

COLUMNS = ("id", "album", "title", "mime_type", "size", "width", "height", "created_at")


def photos() -> Photos:
    s = settings()
    eng = engine(s)
    return Photos(eng, Storage(eng.db, s, clock=eng.clock))


def _say(row: dict[str, Any], what: str) -> None:
    variants = ", ".join(f"{k} {v['status']}" for k, v in row["variants"].items() if v["status"])
    console.print(
        f"photo {row['id']} {what}: {row['mime_type']} {row['width']}x{row['height']}, "
        f"{row['size']} bytes, album {row['album']!r}" + (f"; {variants}" if variants else "")
    )


@app.command("add")
def add(
    file: Path = typer.Argument(..., dir_okay=False, readable=True, callback=existing_inputs),
    album: str = typer.Option("", "--album"),
    title: str = typer.Option("", "--title"),
    project: str = typer.Option("default", "--project"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Upload an image FILE as a new photo; its thumbnail and preview are made by workers."""
    sigterm_as_ctrl_c()
    with user_errors():
        with as_regular_files([file]) as (path,):
            row = photos().add(path, album=album, title=title, project_id=project)
        if as_json:
            print_json(row)
        else:
            _say(row, "added")


@app.command("ls")
def ls(
    album: str | None = typer.Option(None, "--album"),
    project: str = typer.Option("default", "--project"),
    limit: int = typer.Option(50, "--limit", min=1, max=1000),
    cursor: str | None = typer.Option(None, "--cursor", help="next_cursor of the previous page"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Photos of a project, newest first."""
    with user_errors():
        page = photos().list(project, album=album, limit=limit, cursor=cursor)
        if as_json:  # the API's page: items, next_cursor
            print_json({"items": page["photos"], "next_cursor": page["next_cursor"]})
            return
        table = Table(*COLUMNS)
        for r in page["photos"]:
            table.add_row(*("" if r[c] is None else str(r[c]) for c in COLUMNS))
        console.print(table)
        if page["next_cursor"]:
            console.print(f"more: --cursor '{page['next_cursor']}'")


@app.command("show")
def show(
    photo_id: str = typer.Argument(...),
    base: str = typer.Option(
        "",
        "--base-url",
        help="http(s)://HOST[:PORT][/PATH] of the server: prefix of the URLs "
        "(default: HYPERMEDIA_PUBLIC_URL)",
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """A photo with its objects, signed URLs and the status of its variants."""
    with user_errors():
        # Before the database: a bad value is refused as it is.
        prefix = base_url(base) or settings().public_url
        row = photos().get(photo_id, base_url=prefix)
        if as_json:
            print_json(row)
            return
        for k in ("id", "album", "title", "mime_type", "size", "width", "height", "created_at"):
            console.print(f"{k:>10}: {'' if row[k] is None else row[k]}")  # no original: ""
        for role, obj in row["objects"].items():
            console.print(
                f"{role:>10}: object {obj['object_id']} {obj['url'] or ''}", soft_wrap=True
            )
        for role, v in row["variants"].items():
            if v["status"]:
                job = f" (job {v['job_id']})" if v["job_id"] else ""
                why = f": {v['error']}" if v.get("error") else ""  # failed, or waiting, and why
                console.print(f"{role:>10}: {v['status']}{job}{why}", soft_wrap=True)


@app.command("copy")
def copy(
    photo_id: str = typer.Argument(...),
    album: str | None = typer.Option(None, "--album", help="default: the same album"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """A new photo sharing the same objects (no file is copied)."""
    with user_errors():
        row = photos().copy(photo_id, album=album)
        if as_json:
            print_json(row)
        else:
            _say(row, "copied")


@app.command("move")
def move(
    photo_id: str = typer.Argument(...),
    album: str = typer.Option(..., "--album"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Put a photo in another album (metadata only)."""
    with user_errors():
        row = photos().move(photo_id, album)
        if as_json:
            print_json(row)
        else:
            _say(row, "moved")


@app.command("rm")
def rm(photo_id: str = typer.Argument(...)) -> None:
    """Delete a photo; its files go with GC once no other photo uses them."""
    with user_errors():
        photos().delete(photo_id)
        console.print(f"photo {photo_id} deleted")

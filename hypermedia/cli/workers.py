"""`hypermedia workers` (being written)."""

from __future__ import annotations

import typer

app = typer.Typer(help="workers", no_args_is_help=True)

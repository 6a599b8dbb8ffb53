"""`hypermedia queues` (being written)."""

from __future__ import annotations

import typer

app = typer.Typer(help="queues", no_args_is_help=True)

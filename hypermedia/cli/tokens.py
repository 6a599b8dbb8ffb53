"""`hypermedia tokens` (being written)."""

from __future__ import annotations

import typer

app = typer.Typer(help="tokens", no_args_is_help=True)

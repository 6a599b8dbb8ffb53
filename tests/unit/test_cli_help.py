"""Every command's --help prints its page: help texts are plain text, not markup."""

from __future__ import annotations

from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from hypermedia.cli.main import app


def _commands(group: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    # Typer 0.29 carries its own click: a group is whatever has subcommands.
    found = [path]
    for name, command in group.commands.items():
        if getattr(command, "commands", None):
            found += _commands(command, (*path, name))
        else:
            found.append((*path, name))
    return found


COMMANDS = _commands(typer.main.get_group(app))


def test_the_walk_finds_the_commands() -> None:
    assert ("objects", "url") in COMMANDS and ("photos", "show") in COMMANDS
    assert len(COMMANDS) > 40


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "hypermedia")
def test_help_prints_and_exits_0(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output
    assert result.exception is None


def test_brackets_in_a_help_text_are_printed_as_written() -> None:
    result = CliRunner().invoke(app, ["objects", "url", "--help"])
    assert "http(s)://HOST[:PORT][/PATH]" in result.output

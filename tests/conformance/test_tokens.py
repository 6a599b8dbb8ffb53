"""Tokens on every database: the first tokens of a new project, made at once."""

from __future__ import annotations

import uuid

import pytest

from hypermedia.auth.tokens import Tokens
from hypermedia.queue.engine import Engine
from tests.conformance._helpers import race


def test_first_tokens_of_a_new_project_made_at_once_all_succeed(
    engine: Engine, database_url: str
) -> None:
    """Each read "no such project" and inserted it: all but one failed with
    the unique key's raw error (`tokens create --project NEW` run in parallel)."""
    project = f"race-{uuid.uuid4().hex[:8]}"
    got = race(database_url, 8, lambda drv, i: Tokens(drv).create(project, "jobs:read"))
    assert all(isinstance(g, tuple) for g in got), got
    assert len({row["token_id"] for row, _ in got}) == 8
    projects = [p for p in Tokens(engine.db).projects() if p["project_id"] == project]
    assert len(projects) == 1


def test_a_token_name_is_printable_and_at_most_100_characters(driver) -> None:  # type: ignore[no-untyped-def]
    """An escape code in a name reached the operator's terminal through
    `tokens ls`; a long name was cut to 100 without a word."""
    from hypermedia.errors import InvalidRequest

    tokens = Tokens(driver)
    for bad in ("evil\x1b[31mred", "n" * 101, "tab\there"):
        with pytest.raises(InvalidRequest, match="at most 100 printable characters"):
            tokens.create("names", ["jobs:read"], name=bad)
    row, _ = tokens.create(
        f"names-{uuid.uuid4().hex[:8]}", ["jobs:read"], name="ci déploiement " + "n" * 85
    )
    assert len(row["name"]) == 100

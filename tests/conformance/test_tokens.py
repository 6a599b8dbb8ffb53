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


def test_replicas_started_at_once_make_one_first_admin_token(
    engine: Engine, database_url: str, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """Each read "no tokens" and made one: two admin tokens, each printed once
    and written to another machine's home."""
    import sqlalchemy as sa

    for round_ in range(4):
        with engine.db.tx() as tx:
            tx.conn.execute(sa.text("DELETE FROM dashboard_sessions"))
            tx.conn.execute(sa.text("DELETE FROM api_tokens"))
        homes = [tmp_path / f"{round_}-{i}" for i in range(6)]
        for home in homes:
            home.mkdir()
        got = race(database_url, 6, lambda drv, i, h=homes: Tokens(drv).first_admin(h[i]))
        made = [g for g in got if g is not None]
        assert len(made) == 1 and all(isinstance(g, str) for g in made), got
        assert len(Tokens(engine.db).list()) == 1
        assert sum((home / "admin-token").exists() for home in homes) == 1

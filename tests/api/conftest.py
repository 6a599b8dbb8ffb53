"""The API over every database: an app on the test database, two projects'
tokens, and a client per token.

Project A and project B each have an admin token; A also has one token per
scope, for the scope matrix.  Rate limiting is off unless a test turns it on.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient

from hypermedia.api.app import create_app
from hypermedia.auth.tokens import SCOPES
from hypermedia.config import Settings
from hypermedia.queue.engine import Engine
from hypermedia.services import Services


@dataclass
class Project:
    id: str
    admin: str  # token with the admin scope
    scoped: dict[str, str]  # scope -> a token holding only that scope


@pytest.fixture
def svc(driver, settings: Settings) -> Services:  # type: ignore[no-untyped-def]
    return Services.from_engine(Engine(driver, settings.with_(api_rate_per_second=0.0)))


@pytest.fixture
def client(svc: Services) -> Iterator[TestClient]:
    with TestClient(create_app(svc), raise_server_exceptions=False) as c:
        yield c


def _project(svc: Services, name: str) -> Project:
    _, admin = svc.tokens.create(name, ["admin"], name=f"{name} admin")
    scoped = {s: svc.tokens.create(name, [s])[1] for s in SCOPES if s != "admin"}
    return Project(name, admin, scoped)


@pytest.fixture
def a(svc: Services) -> Project:
    return _project(svc, "proj-a")


@pytest.fixture
def b(svc: Services) -> Project:
    return _project(svc, "proj-b")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}

"""The database going away under the API: a 503 the client may retry, never a
500, and the API answers again once it is back (a real PostgreSQL database
that refuses connections for a while)."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from fastapi.testclient import TestClient

from hypermedia.api.app import create_app
from hypermedia.config import Settings
from hypermedia.db.driver import Driver
from hypermedia.db.migrate import upgrade
from hypermedia.queue.engine import Engine
from hypermedia.services import Services
from tests.conftest import drop_database, make_database
from tests.harness import pg_accepting

from .conftest import bearer


def test_requests_get_503_while_the_database_is_away(tmp_path: Path) -> None:
    url = make_database("postgresql", tmp_path)
    name = sa.engine.make_url(url).database
    assert name
    try:
        upgrade(url)
        driver = Driver(url)
        svc = Services.from_engine(Engine(driver, Settings(home=tmp_path, database_url=url)))
        _, token = svc.tokens.create("p", ["admin"])
        with TestClient(create_app(svc), raise_server_exceptions=False) as client:
            assert client.get("/v1/jobs", headers=bearer(token)).status_code == 200
            pg_accepting(name, False)
            for _ in range(3):
                r = client.get("/v1/jobs", headers=bearer(token))
                assert r.status_code == 503, r.text
                body = r.json()
                assert body["code"] == "database_unavailable"
                assert r.headers["Retry-After"] == "2"
                assert name not in r.text and "127.0.0.1" not in r.text  # said in the log only
            pg_accepting(name, True)
            answers = [client.get("/v1/jobs", headers=bearer(token)).status_code for _ in range(3)]
            assert answers[-1] == 200 and set(answers) <= {200, 503}, answers
        driver.dispose()
    finally:
        pg_accepting(name, True)
        drop_database("postgresql", url)

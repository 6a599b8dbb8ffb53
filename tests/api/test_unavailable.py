"""What passes, under the API: the database going away (a real PostgreSQL
database that refuses connections for a while) is a 503, a full disk (a real
small tmpfs) a 507, both with Retry-After, never a 500; and the API answers
again once it is back."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
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
from tests.harness import fill_disk, pg_accepting, small_tmpfs

from .conftest import bearer


@contextlib.contextmanager
def _on_its_own_database(tmp_path: Path) -> Iterator[tuple[Services, str, str]]:
    """Services on a PostgreSQL database of their own (that the test may make
    refuse connections), an admin token, and the database's name."""
    url = make_database("postgresql", tmp_path)
    name = sa.engine.make_url(url).database
    assert name
    try:
        upgrade(url)
        driver = Driver(url)
        svc = Services.from_engine(Engine(driver, Settings(home=tmp_path, database_url=url)))
        _, token = svc.tokens.create("p", ["admin"])
        try:
            yield svc, token, name
        finally:
            driver.dispose()
    finally:
        pg_accepting(name, True)
        drop_database("postgresql", url)


def test_requests_get_503_while_the_database_is_away(tmp_path: Path) -> None:
    # Raised to the server (it logged a traceback with the statement for
    # every request), the error would be raised here too.
    with (
        _on_its_own_database(tmp_path) as (svc, token, name),
        TestClient(create_app(svc)) as client,
    ):
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


def test_an_upload_to_a_full_disk_is_507_and_leaves_nothing(driver, settings, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with small_tmpfs(tmp_path / "disk", 16) as disk:
        home = settings.with_(home=disk, api_rate_per_second=0.0)
        svc = Services.from_engine(Engine(driver, home))
        _, token = svc.tokens.create("p", ["admin"])
        with TestClient(create_app(svc), raise_server_exceptions=False) as client:
            filler = fill_disk(disk, leave=256 << 10)
            data = os.urandom(1 << 20)
            r = client.post("/v1/objects", content=data, headers=bearer(token))
            assert r.status_code == 507, r.text
            assert r.json()["code"] == "insufficient_storage"
            assert r.headers["Retry-After"] == "2"
            assert str(disk) not in r.text
            filler.unlink()
            r = client.post("/v1/objects", content=data, headers=bearer(token))
            assert r.status_code == 201, r.text
            with driver.read() as tx:  # only the upload that went through is ready
                rows = tx.objects(project_id="p", reserved=True)
            assert [o["size"] for o in rows if o["state"] == "ready"] == [len(data)]
            blobs = [p for p in (disk / "storage").rglob("*") if p.is_file()]
            assert [p.stat().st_size for p in blobs] == [len(data)]  # no partial file


def test_the_dashboard_is_503_and_an_open_stream_rides_the_outage_out(tmp_path: Path) -> None:
    """The dashboard's pages were a 500 with a traceback (and the SQL) per
    request while the database was away, where the API said 503; an open
    event stream broke mid-body with two tracebacks, and its page stopped
    updating for good."""
    from hypermedia.queue.models import NewJob
    from tests.api.test_ui_pages import login

    with _on_its_own_database(tmp_path) as (svc, token, name):
        job_id = svc.engine.enqueue(NewJob("debug.noop", project_id="p"))
        with TestClient(create_app(svc)) as client:
            login(client, token)
            events = f"/v1/jobs/{job_id}/events"
            sse = {**bearer(token), "Accept": "text/event-stream"}
            with client.stream("GET", events, headers=sse) as stream:
                lines = stream.iter_lines()
                assert next(lines).startswith("retry:")
                assert next(line for line in lines if line.startswith("data:"))  # queued
                pg_accepting(name, False)
                page = client.get("/ui/jobs")
                assert page.status_code == 503, page.text
                assert "Unavailable" in page.text and page.headers["Retry-After"] == "2"
                assert name not in page.text
                time.sleep(1.5)  # the stream polls the database away a few times
                pg_accepting(name, True)
                svc.engine.cancel(job_id, "test")
                said = [line for line in lines if line.startswith("data:")]
            assert said[-1] == 'data: {"status": "cancelled"}', said
            assert client.get("/ui/jobs").status_code == 200


def test_healthz_needs_no_thread() -> None:
    """A sync route waits for a thread of the pool the streams' and the other
    routes' database reads hold: blocked on a frozen database, /healthz hung
    (59 s with 50 open streams) and a liveness probe would restart the API."""
    import asyncio

    from hypermedia.api.routes import ops

    assert asyncio.iscoroutinefunction(ops.healthz)

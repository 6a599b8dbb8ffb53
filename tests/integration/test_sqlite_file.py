"""The embedded SQLite file deleted (or restored over) while `serve` runs: the
old file stayed open, /readyz said ok, and jobs were accepted with a 201 into
the deleted file, gone at the next start.  Now every transaction checks that
the file at the path is the one opened.  A real `serve` process."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from hypermedia.db.dialects import is_transient
from hypermedia.db.driver import Driver
from hypermedia.db.migrate import upgrade
from tests.harness import http_json, start_serve, stop


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_sqlite_file_gone_under_serve_is_refused_not_written(tmp_path: Path, how: str) -> None:
    home = tmp_path / "home"
    server, base = start_serve(tmp_path, home)
    try:
        token = (home / "admin-token").read_text().strip()
        db = home / "hypermedia.db"
        for name in ("hypermedia.db", "hypermedia.db-wal", "hypermedia.db-shm"):
            (home / name).unlink(missing_ok=True)
        if how == "replaced":
            db.write_bytes(b"")  # another file at the path: a restore, say
        status, body = http_json(f"{base}/readyz")
        assert (status, body["database"]) == (503, "unreachable"), body
        status, body = http_json(f"{base}/v1/jobs", {"job_type": "debug.noop"}, token=token)
        assert (status, body["code"]) == (503, "database_unavailable"), body
        # No new empty database made in its place by a fresh connection.
        assert db.exists() == (how == "replaced")
        assert db.exists() is False or db.stat().st_size == 0
        log = (tmp_path / "serve.log").read_text()
        assert f"was {how} while this process had it open" in log, log[-3000:]
        assert server.poll() is None
    finally:
        assert stop(server) == 0


def test_the_driver_refuses_a_file_gone_until_disposed(tmp_path: Path) -> None:
    db = tmp_path / "hm.db"
    url = f"sqlite:///{db}"
    upgrade(url)
    driver = Driver(url)
    try:
        with driver.read() as tx:
            tx.ping()
        db.unlink()
        for enter in (driver.read, driver.tx):
            with pytest.raises(sa.exc.OperationalError, match="was deleted") as got, enter():
                pass
            assert is_transient(got.value)  # the API's 503, a worker's wait
        assert not db.exists()  # no new empty database made in its place
        driver.dispose()  # its connections to the old file are closed
        upgrade(url)
        with driver.read() as tx:
            tx.ping()
    finally:
        driver.dispose()

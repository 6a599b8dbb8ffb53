"""Text compares exactly on every database: case and trailing spaces count.

Project isolation is partly SQL (``WHERE project_id = :p``): on MariaDB's
default collation (utf8mb4_general_ci, PAD SPACE) a token of project "Alpha"
listed project "alpha"'s photos, objects and jobs.  Migration 0012 makes
MariaDB compare as PostgreSQL and SQLite do; these tests hold every backend
to it through the query functions the API and the CLI call.
"""

from __future__ import annotations

import io
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from hypermedia.auth.tokens import Tokens
from hypermedia.db.driver import Driver
from hypermedia.db.migrate import current, downgrade, head, upgrade
from hypermedia.db.schema_auth import api_tokens
from hypermedia.db.schema_storage import objects, photo_objects, pools, variant_jobs
from hypermedia.db.schema_storage import photos as photo_rows
from hypermedia.errors import NotFound
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import NewJob
from hypermedia.storage.ledger import Storage
from tests.conftest import drop_database, make_database

# One project under utf8mb4_general_ci; "alpha" and "alpha " are one under
# utf8mb4_bin too: MariaDB's _bin collations still ignore trailing spaces.
PROJECTS = ("alpha", "Alpha", "alpha ")
NOPAD_BIN = "utf8mb4_nopad_bin"


def _photo(driver: Driver, project_id: str, album: str = "") -> str:
    photo_id = str(uuid.uuid4())
    with driver.tx() as tx:
        tx.insert_photo({"photo_id": photo_id, "project_id": project_id, "album": album})
    return photo_id


def test_projects_differing_in_case_or_trailing_space_stay_apart(
    driver: Driver, engine: Engine, storage: Storage
) -> None:
    tokens = Tokens(driver)
    mine = {}
    for project in PROJECTS:
        tokens.ensure_project(project, name=f"project {project!r}")
        obj = storage.put(io.BytesIO(b"hello"), project_id=project)
        job = engine.enqueue(NewJob("debug.noop", project_id=project))
        mine[project] = (obj["object_id"], _photo(driver, project), job)
    assert len(tokens.projects()) == len(PROJECTS)
    with driver.read() as tx:
        for project, (object_id, photo_id, job_id) in mine.items():
            assert tx.project(project)["name"] == f"project {project!r}"
            assert [r["object_id"] for r in tx.objects(project_id=project)] == [object_id]
            assert [r["photo_id"] for r in tx.photos([project])] == [photo_id]
            assert [r["job_id"] for r in tx.jobs(project_id=project)] == [job_id]
            assert [r["job_id"] for r in tx.jobs_in(project)] == [job_id]


def test_pools_differing_in_case_are_two_pools(storage: Storage) -> None:
    full = storage.add_pool("full", "file:", check=False)
    other = storage.add_pool("Full", "file:", check=False)
    assert other["pool_id"] != full["pool_id"]
    assert storage.pool("Full")["pool_id"] == other["pool_id"]
    assert storage.put(io.BytesIO(b"x"), pool="full")["pool_id"] == full["pool_id"]
    for name in ("FULL", "full "):
        with pytest.raises(NotFound):
            storage.pool(name)


def test_the_album_filter_is_exact(driver: Driver) -> None:
    shared = _photo(driver, "p", album="share")
    _photo(driver, "p", album="Share")
    with driver.read() as tx:
        assert [r["photo_id"] for r in tx.photos(["p"], album="share")] == [shared]
        assert tx.photos(["p"], album="SHARE") == []
        assert tx.photos(["p"], album="share ") == []


def test_a_photo_id_in_other_case_or_padded_is_not_found(driver: Driver) -> None:
    photo_id = _photo(driver, "p")
    with driver.read() as tx:
        assert tx.photo(photo_id) is not None
        assert tx.photo(photo_id.upper()) is None
        assert tx.photo(photo_id + " ") is None


def test_every_text_column_of_mariadb_compares_exactly(database_url: str) -> None:
    """A migration that adds a table or column inherits the database's
    collation; one that names another collation is caught here."""
    if Driver(database_url).name != "mysql":
        pytest.skip("collations are MariaDB's: text compares exactly elsewhere")
    columns, default = _collations(database_url)
    assert columns
    assert [c for c in columns if c[2] != NOPAD_BIN] == []
    assert default == NOPAD_BIN


def test_0012_keeps_rows_keys_checks_and_json(database_url: str, tmp_path: Path) -> None:
    """A database with rows at 0011 goes to 0012 (MariaDB rebuilds every
    table, the photo_id foreign keys dropped and made again), down again and
    up once more: the rows, cascades, CHECKs and JSON come through."""
    backend = Driver(database_url).name
    backend = "mariadb" if backend == "mysql" else backend
    url = make_database(backend, tmp_path)
    try:
        upgrade(url, "0011")
        drv = Driver(url)  # SQLite's foreign keys are on in its connections
        try:
            with drv.engine.begin() as conn:
                _photo_with_bindings(conn)
            upgrade(url)
            downgrade(url, "0011")
            upgrade(url)
            assert current(url) == head()
            _check_rows_keys_and_checks(drv.engine, backend)
        finally:
            drv.dispose()
        if backend == "mariadb":
            columns, default = _collations(url)
            assert {c[2] for c in columns} == {default} == {NOPAD_BIN}
    finally:
        drop_database(backend, url)


def _photo_with_bindings(conn: sa.Connection) -> None:
    pool_id = conn.execute(sa.insert(pools).values(name="Local", backend_url="file:"))
    pool_id = pool_id.inserted_primary_key[0]
    object_id = conn.execute(sa.insert(objects).values(pool_id=pool_id, storage_key="k"))
    conn.execute(sa.insert(photo_rows).values(photo_id="p1", project_id="Alpha", album="A "))
    conn.execute(
        sa.insert(photo_objects).values(
            photo_id="p1", object_id=object_id.inserted_primary_key[0], role="original"
        )
    )
    # general_ci let a row spell its photo's id in another case: 0012 keeps it
    # bound to its photo.  Elsewhere the foreign key never allowed that.
    spelt = "P1" if conn.dialect.name == "mysql" else "p1"
    conn.execute(sa.insert(variant_jobs).values(photo_id=spelt))
    conn.execute(
        sa.insert(api_tokens).values(
            project_id="Alpha", prefix="hm_x", token_hash="h", scopes=["admin"]
        )
    )


def _check_rows_keys_and_checks(engine: sa.Engine, backend: str) -> None:
    with engine.begin() as conn:
        photo = conn.execute(sa.select(photo_rows)).one()
        assert (photo.photo_id, photo.project_id, photo.album) == ("p1", "Alpha", "A ")
        assert conn.execute(sa.select(api_tokens.c.scopes)).scalar_one() == ["admin"]
        assert conn.execute(sa.select(photo_objects.c.role)).scalar_one() == "original"
        assert conn.execute(sa.select(variant_jobs.c.photo_id)).scalar_one() == "p1"
    # MariaDB reports a failed CHECK as an OperationalError.
    refused = (sa.exc.IntegrityError, sa.exc.OperationalError)
    with engine.begin() as conn, pytest.raises(refused):
        conn.execute(sa.update(photo_objects).values(role="bogus"))
    if backend == "mariadb":  # JSON is LONGTEXT there, held to json_valid()
        with engine.begin() as conn, pytest.raises(refused):
            conn.exec_driver_sql("UPDATE api_tokens SET scopes = 'not json'")
    with engine.begin() as conn, pytest.raises(sa.exc.IntegrityError):
        conn.execute(sa.insert(photo_objects).values(photo_id="P1", object_id=1, role="thumb"))
    with engine.begin() as conn:  # the foreign keys cascade again
        conn.execute(sa.delete(photo_rows))
        for table in (photo_objects, variant_jobs):
            count = sa.select(sa.func.count()).select_from(table)
            assert conn.execute(count).scalar_one() == 0


def _collations(url: str) -> tuple[list[sa.Row[Any]], str]:
    """Each text column's collation, and the database's default."""
    engine = sa.create_engine(Driver(url).url)
    try:
        with engine.connect() as conn:
            columns = conn.exec_driver_sql(
                "SELECT TABLE_NAME, COLUMN_NAME, COLLATION_NAME FROM information_schema.COLUMNS"
                " WHERE TABLE_SCHEMA = DATABASE() AND COLLATION_NAME IS NOT NULL"
            ).all()
            default = conn.exec_driver_sql(
                "SELECT DEFAULT_COLLATION_NAME FROM information_schema.SCHEMATA"
                " WHERE SCHEMA_NAME = DATABASE()"
            ).scalar_one()
    finally:
        engine.dispose()
    return list(columns), str(default)

"""Schemathesis against the OpenAPI document: no generated request gets a 500.

Every operation is called with an admin token of a project that has a job,
an object and a photo, so generated ids sometimes hit real rows.  Beyond "no
5xx", every error answer must carry the one error shape.
"""

from __future__ import annotations

import io

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from hypermedia.api.app import create_app
from hypermedia.queue.models import NewJob
from hypermedia.services import Services

# Every database: a value one of them cannot store (a NUL for PostgreSQL, a
# string over a column's length for MariaDB) must be a 4xx there too.  Fewer
# examples on the servers, where each request costs more.
EXAMPLES = {"sqlite": 60, "postgresql": 25, "mariadb": 25}
EVERY_DATABASE = pytest.mark.parametrize("database_url", list(EXAMPLES), indirect=True)


@pytest.fixture
def api_schema(svc: Services):  # type: ignore[no-untyped-def]
    return schemathesis.openapi.from_asgi("/openapi.json", create_app(svc))


@pytest.fixture
def admin(svc: Services) -> str:
    _, token = svc.tokens.create("fuzz", ["admin"])
    obj = svc.storage.put(io.BytesIO(b"hello"), filename="a.txt", project_id="fuzz")
    svc.engine.enqueue(NewJob("debug.noop", project_id="fuzz"))
    svc.engine.enqueue(NewJob("debug.noop", project_id="fuzz", object_id=obj["object_id"]))
    return token


def _check(case, token: str) -> int:  # type: ignore[no-untyped-def]
    if case.path.endswith("/events") or case.path.endswith("/stream"):
        # A stream of a live job only ends with the job; it has its own tests.
        case.headers = {**(case.headers or {}), "Accept": "application/json"}
    response = case.call(headers={"Authorization": f"Bearer {token}"})
    assert response.status_code < 500, f"{case.method} {case.path}: {response.text[:300]}"
    if response.status_code >= 400 and "json" in response.headers.get("content-type", ""):
        assert {"code", "message", "request_id"} <= set(response.json())
    return int(response.status_code)


@EVERY_DATABASE
def test_no_request_gets_a_server_error(api_schema, admin: str, driver) -> None:  # type: ignore[no-untyped-def]
    examples = EXAMPLES["mariadb" if driver.name == "mysql" else driver.name]
    operations = [r.ok() for r in api_schema.get_all_operations()]
    assert len(operations) >= 30
    statuses: dict[int, int] = {}
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=examples,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        def run(case) -> None:  # type: ignore[no-untyped-def]
            code = _check(case, admin)
            statuses[code] = statuses.get(code, 0) + 1

        run()
    # Not only refusals: generated requests got through to the use cases.
    assert sum(n for code, n in statuses.items() if code < 300) >= examples * 5 // 6, statuses

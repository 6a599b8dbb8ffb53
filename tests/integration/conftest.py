"""Fixtures for tests that run real worker and scheduler processes."""

from __future__ import annotations

import pytest

from hypermedia.config import Settings
from hypermedia.db.driver import Driver
from hypermedia.queue.engine import Engine


@pytest.fixture
def live(driver: Driver, settings: Settings) -> Engine:
    """An engine on the test database with the real clock (the ``engine`` fixture's
    clock stands still, which real workers' timestamps would not match)."""
    return Engine(driver, settings)

"""Fixtures for tests that run real worker and scheduler processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hypermedia.config import Settings
from hypermedia.db.driver import Driver
from hypermedia.queue.engine import Engine
from tests.integration._procs import Procs


@pytest.fixture
def procs(driver: Driver, tmp_path: Path) -> Iterator[Procs]:
    """Processes started by a test; all of them (and their children) die at teardown."""
    p = Procs(driver, tmp_path)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
def live(driver: Driver, settings: Settings) -> Engine:
    """An engine on the test database with the real clock (the ``engine`` fixture's
    clock stands still, which real workers' timestamps would not match)."""
    return Engine(driver, settings)

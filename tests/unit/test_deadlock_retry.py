"""Which errors make Driver.tx_retrying run a transaction again (the races
themselves run against every database in tests/conformance)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from hypermedia.db import dialects
from hypermedia.db.driver import Driver


class _PgError(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__("boom")
        self.sqlstate = sqlstate


def _wrapped(orig: Exception) -> sa.exc.OperationalError:
    return sa.exc.OperationalError("UPDATE …", {}, orig)


def test_deadlock_victims_are_recognised() -> None:
    assert dialects.is_deadlock(_wrapped(_PgError("40P01")))
    assert dialects.is_deadlock(_wrapped(Exception(1213, "Deadlock found")))
    assert not dialects.is_deadlock(_wrapped(_PgError("57P01")))  # admin shutdown
    assert not dialects.is_deadlock(_wrapped(Exception(2013, "Lost connection")))
    assert not dialects.is_deadlock(ValueError("no orig"))


def test_a_victim_is_run_again_and_other_errors_are_not(tmp_path: Path) -> None:
    drv = Driver(f"sqlite:///{tmp_path / 'x.db'}")
    calls: list[int] = []

    def twice_a_victim(tx: Any) -> str:
        calls.append(1)
        if len(calls) < 3:
            raise _wrapped(Exception(1213, "Deadlock found"))
        return "done"

    assert drv.tx_retrying(twice_a_victim) == "done" and len(calls) == 3
    calls.clear()

    def always_a_victim(tx: Any) -> None:
        calls.append(1)
        raise _wrapped(Exception(1213, "Deadlock found"))

    with pytest.raises(sa.exc.OperationalError):
        drv.tx_retrying(always_a_victim, attempts=2)
    assert len(calls) == 2
    calls.clear()

    def gone(tx: Any) -> None:
        calls.append(1)
        raise _wrapped(Exception(2013, "Lost connection"))

    with pytest.raises(sa.exc.OperationalError):
        drv.tx_retrying(gone)
    assert len(calls) == 1
    drv.dispose()

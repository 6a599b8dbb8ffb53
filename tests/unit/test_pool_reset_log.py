"""A connection the database dropped fails its pool reset: SQLAlchemy's
ERROR and traceback for it are one warning line; other failures stay loud."""

from __future__ import annotations

import logging

import pymysql
import pytest

import hypermedia.db.driver  # noqa: F401  (installs the filter)

POOL = logging.getLogger("sqlalchemy.pool.impl.QueuePool")


def _reset_fails(exc: Exception) -> None:
    try:
        raise exc
    except Exception:
        POOL.error("Exception during reset or similar", exc_info=True)


def test_a_dropped_connection_is_one_warning_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        _reset_fails(pymysql.err.OperationalError(2013, "Lost connection to MySQL server"))
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and record.exc_info is None
    assert record.getMessage() == (
        "a connection the database dropped was discarded "
        "(OperationalError: (2013, 'Lost connection to MySQL server'))"
    )


def test_anything_else_keeps_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        _reset_fails(ValueError("a bug"))
    (record,) = caplog.records
    assert record.levelno == logging.ERROR and record.exc_info is not None

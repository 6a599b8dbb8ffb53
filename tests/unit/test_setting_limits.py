"""Settings read out of range are refused when the settings are read:
HYPERMEDIA_SIGNED_URL_SECONDS past S3's 7-day presign limit (it was cut to 7
days on S3 pools only), a dashboard session that would end as it began."""

from __future__ import annotations

from pathlib import Path

import pytest

from hypermedia.config import MAX_SIGNED_URL_SECONDS, load_settings
from hypermedia.errors import InvalidRequest
from tests.harness import hypermedia


def test_the_limit_is_seven_days(monkeypatch: pytest.MonkeyPatch) -> None:
    assert MAX_SIGNED_URL_SECONDS == 604800
    monkeypatch.setenv("HYPERMEDIA_SIGNED_URL_SECONDS", "604800")
    assert load_settings().signed_url_seconds == 604800
    for bad in ("604801", "0", "-5"):
        monkeypatch.setenv("HYPERMEDIA_SIGNED_URL_SECONDS", bad)
        with pytest.raises(InvalidRequest, match="must be 1 to 604800") as info:
            load_settings()
        assert f"it is {bad}" in str(info.value)


def test_a_command_refuses_to_start_with_it(tmp_path: Path) -> None:
    done = hypermedia("pools", "ls", url="", home=tmp_path, HYPERMEDIA_SIGNED_URL_SECONDS="2592000")
    assert done.returncode != 0
    assert "HYPERMEDIA_SIGNED_URL_SECONDS must be 1 to 604800" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_session_length_of_nothing_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    for bad in ("0", "-1"):
        monkeypatch.setenv("HYPERMEDIA_SESSION_HOURS", bad)
        with pytest.raises(InvalidRequest, match="HYPERMEDIA_SESSION_HOURS must be more than 0"):
            load_settings()
    monkeypatch.setenv("HYPERMEDIA_SESSION_HOURS", "0.5")
    assert load_settings().session_hours == 0.5


def test_an_s3_timeout_of_nothing_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYPERMEDIA_S3_TIMEOUT_SECONDS", "0")
    with pytest.raises(InvalidRequest, match="HYPERMEDIA_S3_TIMEOUT_SECONDS must be more than 0"):
        load_settings()
    monkeypatch.setenv("HYPERMEDIA_S3_TIMEOUT_SECONDS", "2.5")
    assert load_settings().s3_timeout_seconds == 2.5


def test_the_mariadb_watch_is_a_wait_not_a_spin(monkeypatch: pytest.MonkeyPatch) -> None:
    for bad in ("-0.01", "nan", "3601"):
        monkeypatch.setenv("HYPERMEDIA_WATCH_INTERVAL_SECONDS", bad)
        with pytest.raises(InvalidRequest, match="WATCH_INTERVAL_SECONDS must be from 0 to 3600"):
            load_settings()
    for good, value in (("0", 0.0), ("0.2", 0.2)):
        monkeypatch.setenv("HYPERMEDIA_WATCH_INTERVAL_SECONDS", good)
        assert load_settings().watch_interval_seconds == value


def test_the_memory_ceiling_is_four_times_the_memory_unless_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HYPERMEDIA_CHILD_MEMORY_MB", "1024")
    assert load_settings().memory_ceiling_mb == 4096
    monkeypatch.setenv("HYPERMEDIA_CHILD_MEMORY_MAX_MB", "1536")
    assert load_settings().memory_ceiling_mb == 1536
    monkeypatch.setenv("HYPERMEDIA_CHILD_MEMORY_MAX_MB", "512")  # under the memory: no growth
    assert load_settings().memory_ceiling_mb == 1024
    monkeypatch.setenv("HYPERMEDIA_CHILD_MEMORY_MAX_MB", "-1")
    with pytest.raises(InvalidRequest, match="CHILD_MEMORY_MAX_MB must be 0"):
        load_settings()

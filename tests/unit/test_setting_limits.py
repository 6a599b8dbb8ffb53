"""Settings read out of range are refused when the settings are read:
HYPERMEDIA_SIGNED_URL_SECONDS past S3's 7-day presign limit (it was cut to 7
days on S3 pools only), a dashboard session that would end as it began."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hypermedia import config
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


@pytest.mark.parametrize("name", ["S3_ACCESS_KEY_ID", "S3_SECRET_ACCESS_KEY"])
def test_s3_credentials_with_a_line_end_are_refused_unquoted(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """A CRLF env file's "\r" reached the signed header, whose error quoted the key."""
    monkeypatch.setenv("HYPERMEDIA_S3_ACCESS_KEY_ID", "AKIAQA1234567")
    monkeypatch.setenv("HYPERMEDIA_S3_SECRET_ACCESS_KEY", "secret1234567")
    for bad in ("AKIAQA1234567\r", "AKIA QA", "AK\x1bIA"):
        monkeypatch.setenv(f"HYPERMEDIA_{name}", bad)
        with pytest.raises(InvalidRequest, match="a space or a control character") as info:
            load_settings()
        assert "AKIA" not in str(info.value)
    monkeypatch.setenv(f"HYPERMEDIA_{name}", "AKIAQA1234567/+=")
    assert load_settings()


def test_the_mariadb_watch_is_a_wait_not_a_spin(monkeypatch: pytest.MonkeyPatch) -> None:
    for bad in ("-0.01", "nan", "3601"):
        monkeypatch.setenv("HYPERMEDIA_WATCH_INTERVAL_SECONDS", bad)
        with pytest.raises(InvalidRequest, match="WATCH_INTERVAL_SECONDS must be from 0 to 3600"):
            load_settings()
    for good, value in (("0", 0.0), ("0.2", 0.2)):
        monkeypatch.setenv("HYPERMEDIA_WATCH_INTERVAL_SECONDS", good)
        assert load_settings().watch_interval_seconds == value


def test_the_machines_memory_is_read_and_bounded_by_its_ram() -> None:
    import psutil

    assert 0 < config.machine_memory_mb() <= psutil.virtual_memory().total // 1_048_576


def test_the_memory_ceiling_is_four_times_the_memory_unless_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(config, "machine_memory_mb", lambda: 24_000)
    monkeypatch.setenv("HYPERMEDIA_CHILD_MEMORY_MB", "1024")
    assert load_settings().memory_ceiling_mb == 4096
    # ... but no more than half the machine, and never under the memory itself.
    monkeypatch.setattr(config, "machine_memory_mb", lambda: 6_000)
    assert load_settings().memory_ceiling_mb == 3000
    monkeypatch.setattr(config, "machine_memory_mb", lambda: 1_000)
    assert load_settings().memory_ceiling_mb == 1024
    monkeypatch.setenv("HYPERMEDIA_CHILD_MEMORY_MAX_MB", "1536")
    assert load_settings().memory_ceiling_mb == 1536
    monkeypatch.setenv("HYPERMEDIA_CHILD_MEMORY_MAX_MB", "512")  # under the memory: no growth
    assert load_settings().memory_ceiling_mb == 1024
    monkeypatch.setenv("HYPERMEDIA_CHILD_MEMORY_MAX_MB", "-1")
    with pytest.raises(InvalidRequest, match="CHILD_MEMORY_MAX_MB must be 0"):
        load_settings()


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("HYPERMEDIA_JOB_RETENTION_DAYS", "inf"),
        ("HYPERMEDIA_JOB_RETENTION_DAYS", "nan"),
        ("HYPERMEDIA_JOB_RETENTION_DAYS", "-1"),
        ("HYPERMEDIA_JOB_RETENTION_DAYS", "36501"),
        ("HYPERMEDIA_LEASE_SECONDS", "1e300"),
        ("HYPERMEDIA_GC_PENDING_SECONDS", "-1"),
        ("HYPERMEDIA_BACKOFF_MAX_SECONDS", "inf"),
        ("HYPERMEDIA_METRICS_RAW_DAYS", "99999999"),
    ],
)
def test_a_duration_is_a_finite_age(monkeypatch: pytest.MonkeyPatch, name: str, bad: str) -> None:
    """ "inf" and 1e300 parse as floats: as a lease or a retention they
    overflowed the date arithmetic inside a running worker; a negative
    pending age swept uploads in flight."""
    monkeypatch.setenv(name, bad)
    with pytest.raises(InvalidRequest, match=rf"{name} must be (a number of|more than 0)"):
        load_settings()


def test_a_century_is_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYPERMEDIA_JOB_RETENTION_DAYS", "36500")
    monkeypatch.setenv("HYPERMEDIA_GC_PENDING_SECONDS", str(100 * 365 * 86400))
    s = load_settings()
    assert (s.job_retention_days, s.gc_pending_seconds) == (36500, 100 * 365 * 86400)


@pytest.mark.parametrize(
    ("name", "bad", "said"),
    [
        ("MAX_UPLOAD_BYTES", "-1", "must be more than 0"),
        ("API_MAX_BODY_BYTES", "0", "must be more than 0"),
        ("API_RATE_BURST", "-1", "must be more than 0"),
        ("API_RATE_PER_SECOND", "-1", "must be 0 (no limit) or from 0.001"),
        ("API_RATE_PER_SECOND", "nan", "must be 0 (no limit) or from 0.001"),
        # A wait for the next request past any Retry-After: every 429 a 500.
        ("API_RATE_PER_SECOND", "1e-320", "must be 0 (no limit) or from 0.001"),
        ("API_AUTH_FAILURES_PER_MINUTE", "-1", "must be 0 (no limit) or more"),
    ],
)
def test_api_limits_below_one_are_refused_at_start(
    monkeypatch: pytest.MonkeyPatch, name: str, bad: str, said: str
) -> None:
    """The API started with them and refused every upload, body or request."""
    monkeypatch.setenv(f"HYPERMEDIA_{name}", bad)
    with pytest.raises(InvalidRequest, match=re.escape(f"HYPERMEDIA_{name} {said}")):
        load_settings()


def test_a_yes_or_no_setting_takes_only_yes_or_no(monkeypatch: pytest.MonkeyPatch) -> None:
    """HYPERMEDIA_S3_PRESIGN=on or =enabled used to mean false, silently."""
    for word, meant in [("1", True), ("TRUE", True), ("yes", True), (" on ", True)]:
        monkeypatch.setenv("HYPERMEDIA_S3_PRESIGN", word)
        assert load_settings().s3_presign is meant
    for word in ("0", "False", "no", "off"):
        monkeypatch.setenv("HYPERMEDIA_S3_PRESIGN", word)
        assert load_settings().s3_presign is False
    for bad in ("enabled", "maybe", "", "2"):
        monkeypatch.setenv("HYPERMEDIA_S3_PRESIGN", bad)
        with pytest.raises(InvalidRequest, match="HYPERMEDIA_S3_PRESIGN must be true or false"):
            load_settings()


@pytest.mark.parametrize("name", ["HYPERMEDIA_SECRET_KEY", "HYPERMEDIA_PREVIOUS_SECRET_KEY"])
def test_a_guessable_url_signing_key_is_refused(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """An empty file, " " or "a" signed links anyone could forge: one key for
    every object, any expiry."""
    for bad, said in (
        (" ", "at least 32 characters"),
        ("a", "at least 32 characters"),
        ("k" * 31, "at least 32 characters"),
        ("k" * 40 + "\r", "control character"),
        (" " + "k" * 40, "space at an end"),
    ):
        monkeypatch.setenv(name, bad)
        with pytest.raises(InvalidRequest, match=said):
            load_settings()
    monkeypatch.setenv(name, "correct horse battery staple, 32+")
    assert len(getattr(load_settings(), name.removeprefix("HYPERMEDIA_").lower())) > 32


def test_an_emptied_secret_file_stops_the_start(tmp_path: Path) -> None:
    (tmp_path / "secret.key").write_bytes(b"\n")
    done = hypermedia("api", "--port", "1", url="", home=tmp_path, timeout=30)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "holds no usable URL-signing key" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("heartbeat", "stale"), [("25", "3"), ("150", None), ("120", "120")])
def test_a_heartbeat_not_shorter_than_the_stale_time_is_refused(
    monkeypatch: pytest.MonkeyPatch, heartbeat: str, stale: str | None
) -> None:
    """The reaper took the live worker for dead between two heartbeats: its
    jobs ORPHANED and run again until out of attempts."""
    monkeypatch.setenv("HYPERMEDIA_HEARTBEAT_SECONDS", heartbeat)
    if stale is not None:
        monkeypatch.setenv("HYPERMEDIA_WORKER_STALE_SECONDS", stale)
    with pytest.raises(InvalidRequest, match="must be less than HYPERMEDIA_WORKER_STALE_SECONDS"):
        load_settings()
    monkeypatch.setenv("HYPERMEDIA_WORKER_STALE_SECONDS", str(float(heartbeat) + 1))
    assert load_settings().worker_heartbeat_seconds == float(heartbeat)


def test_an_empty_home_is_refused_not_taken_for_the_working_folder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`HYPERMEDIA_HOME=` (an empty line of an env file) put the database and
    the pool's files straight into the working folder."""
    for empty in ("", "  "):
        monkeypatch.setenv("HYPERMEDIA_HOME", empty)
        with pytest.raises(InvalidRequest, match="HYPERMEDIA_HOME is empty"):
            load_settings()


@pytest.mark.parametrize("raw", ["1_0", " 5", "5 ", "\u0661\u0662", "\uff15"])
@pytest.mark.parametrize("name", ["HYPERMEDIA_CLAIM_BATCH", "HYPERMEDIA_LEASE_SECONDS"])
def test_numbers_are_ascii_digits_as_the_api_reads_them(
    monkeypatch: pytest.MonkeyPatch, name: str, raw: str
) -> None:
    """int() and float() read "1_0" as 10, " 5" as 5 and Arabic-Indic digits
    as 12: a setting took a value the API refuses as a number."""
    monkeypatch.setenv(name, raw)
    with pytest.raises(InvalidRequest, match=f"{name} must be an? (integer|number)"):
        load_settings()
    monkeypatch.setenv(name, "12")
    load_settings()


@pytest.mark.parametrize(
    "name",
    [
        "HYPERMEDIA_CHILD_MEMORY_MB",
        "HYPERMEDIA_CHILD_MAX_FILE_MB",
        "HYPERMEDIA_CHILD_MAX_SCRATCH_MB",
        "HYPERMEDIA_CHILD_MEMORY_MAX_MB",
        "HYPERMEDIA_CHILD_RECYCLE_RSS_MB",
    ],
)
def test_a_size_in_mb_past_what_setrlimit_takes_is_refused(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """99999999999999999999999 MB started, then every attempt crashed in the
    child's setrlimit (OverflowError) until it ran out of attempts."""
    monkeypatch.setenv(name, str(config.MAX_MB + 1))
    with pytest.raises(InvalidRequest, match=f"{name} must be at most {config.MAX_MB}"):
        load_settings()
    monkeypatch.setenv(name, str(config.MAX_MB))
    load_settings()


def test_the_public_url_is_a_base_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYPERMEDIA_PUBLIC_URL", "https://media.example.com:8443/hm/")
    assert load_settings().public_url == "https://media.example.com:8443/hm"  # no "//v1"
    monkeypatch.setenv("HYPERMEDIA_PUBLIC_URL", "")
    assert load_settings().public_url == ""  # unset: the request's own address
    for bad in ("media.example.com", "javascript:alert(1)", "https://u:p@h", "https://h/?a=1"):
        monkeypatch.setenv("HYPERMEDIA_PUBLIC_URL", bad)
        with pytest.raises(InvalidRequest, match="HYPERMEDIA_PUBLIC_URL takes http"):
            load_settings()

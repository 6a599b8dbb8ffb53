"""Settings read from ``HYPERMEDIA_*`` environment variables.

Defaults follow seed 000: worker heartbeat every 30 s, metrics every 60 s,
a worker silent for more than 2 minutes is unhealthy.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from hypermedia.errors import InvalidRequest
from hypermedia.parse import ascii_int, base_url

# The project of everything made without naming one (CLI, embedded default).
DEFAULT_PROJECT = "default"
# HYPERMEDIA_HOME when hypermedia makes it: its user's only (the database,
# every project's files, the signing key are under it).
HOME_MODE = 0o700


@functools.cache
def machine_memory_mb() -> int:
    """The RAM this process may use: the machine's, or its container's
    (cgroup v2, then v1) when that is less."""
    import psutil

    total = psutil.virtual_memory().total
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit).read_text().strip()
        except OSError:
            continue
        if text.isdigit():  # "max" (v2) or a huge number (v1) means none
            total = min(total, int(text))
    return total // 1_048_576


@dataclass(frozen=True)
class Settings:
    home: Path = Path("hypermedia-data")
    database_url: str = ""
    lease_seconds: float = 60.0
    worker_heartbeat_seconds: float = 30.0
    worker_metrics_seconds: float = 60.0
    worker_stale_seconds: float = 120.0
    # An unhealthy worker silent this long is taken for gone (kill -9, a lost
    # machine): terminated, so `workers ls` lists only what may come back.
    worker_gone_seconds: float = 3600.0
    reaper_interval_seconds: float = 5.0
    promoter_interval_seconds: float = 1.0
    retention_interval_seconds: float = 3600.0
    metrics_raw_days: int = 7
    # Finished jobs are deleted with their history this long after they
    # ended (scheduler/retention.py); 0 keeps them for ever.
    job_retention_days: float = 30.0
    # How often the leader folds finished work into counters, so a budget
    # check and a /metrics scrape read only recent rows (scheduler/credits.py,
    # scheduler/attempt_fold.py).
    fold_interval_seconds: float = 60.0
    leader_lease_seconds: float = 15.0
    poll_interval_seconds: float = 1.0
    # MariaDB: how often a worker reads the newest job id to hear of jobs
    # queued by other processes (db/wakeups.py); 0 turns it off (poll only).
    watch_interval_seconds: float = 0.05
    cancel_poll_seconds: float = 1.0
    claim_batch: int = 10
    # A warm child is replaced after this many attempts, or at once when it
    # still holds more than child_recycle_rss_mb after one (a leak, a heap
    # that never shrinks back).
    child_max_attempts: int = 10000
    child_recycle_rss_mb: int = 512
    child_memory_mb: int = 2048
    # The most an OOM's retries may double an attempt's memory to (0: four
    # times child_memory_mb, at most half the machine's RAM): a render bomb
    # must not take the machine's RAM.
    child_memory_max_mb: int = 0
    # The largest file an attempt may write (RLIMIT_FSIZE): a hostile input
    # must not fill the disk the database and the blobs live on.
    child_max_file_mb: int = 4096
    # The most an attempt may keep in its scratch folder at once, all files
    # together (checked every second): the file limit alone let it write
    # file after file until the attempt's timeout.
    child_max_scratch_mb: int = 8192
    # Confinement of attempt children (Landlock and seccomp: worker/sandbox.py,
    # worker/seccomp.py): auto, required or off; and the TCP ports a child of
    # a networked pipeline may connect to (comma-separated; empty: any).
    child_sandbox: str = "auto"
    child_connect_ports: str = ""
    backoff_base_seconds: float = 2.0
    backoff_max_seconds: float = 600.0
    # Storage (seed 002): S3 credentials for s3:// pools, the key that signs
    # local download URLs (default: made once, kept in HOME/secret.key), how
    # long signed URLs live, and when GC may collect what nothing references.
    s3_access_key_id: str = ""
    s3_secret_access_key: str = ""
    # How long an S3 request waits for an answer (twice, with one retry): a
    # store that hangs (stopped, overloaded) holds a job or an upload that long.
    s3_timeout_seconds: float = 60.0
    # Download links of S3 objects: presigned, straight to the store (nothing
    # checks the bytes on the way), or false: the service's own signed link,
    # streamed through it and checked against the object's checksum.
    s3_presign: bool = True
    # The pool an upload goes into when it names none (the API, the dashboard,
    # photos, process, objects put without --pool, outputs of jobs with no
    # input): `local` is HOME/storage of each process, so a deployment whose
    # API and workers run on different machines names a shared one (S3).
    default_pool: str = "local"
    secret_key: str = ""
    # The key before a rotation: links it signed stay good until they expire.
    previous_secret_key: str = ""
    signed_url_seconds: int = 900
    # The address clients reach this service at (http(s)://HOST[:PORT][/PATH]):
    # the prefix of the download links it signs.  Unset, a link takes the
    # request's own Host, which any client may write.
    public_url: str = ""
    gc_interval_seconds: float = 60.0
    gc_unreferenced_seconds: float = 86400.0
    gc_pending_seconds: float = 21600.0
    photo_bridge_interval_seconds: float = 2.0
    # HTTP API: requests per second per token (0: no limit) and the bucket's
    # burst; uploads larger than max_upload_bytes are refused with 413, and
    # so is any other request body (JSON) larger than api_max_body_bytes.
    api_rate_per_second: float = 100.0
    api_rate_burst: int = 200
    # Failed authentications a client address may make in a burst, refilled
    # at this many a minute; past them its credentials are not checked (0: no
    # limit).
    api_auth_failures_per_minute: int = 30
    # Event streams (SSE) a token may hold open at once, in one API process:
    # each polls the database four times a second, and 300 of one token's
    # made every other caller's answers forty times slower.
    api_max_streams: int = 20
    max_upload_bytes: int = 2 * 1024**3
    api_max_body_bytes: int = 1024 * 1024
    # An upload's body that sends nothing for this long is dropped (408): a
    # client gone quiet held its connection and temp file for ever.
    upload_idle_seconds: float = 60.0
    # A download whose client takes nothing for this long is dropped: each
    # held an open blob and a few MB of buffers for as long as it stalled.
    download_idle_seconds: float = 60.0
    # A request's line and headers must be in this long after the connection
    # opened (or the previous answer): one that sent nothing, or half its
    # headers, was held open for ever (api/deadline.py).
    header_seconds: float = 30.0
    # A dashboard login (session cookie) ends this long after it began.
    session_hours: float = 12.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.home / 'hypermedia.db').resolve()}"

    @property
    def memory_ceiling_mb(self) -> int:
        """The most memory an attempt may get on this machine, after OOM retries."""
        if self.child_memory_max_mb:
            return max(self.child_memory_mb, self.child_memory_max_mb)
        # Four times 2 GB is a third of a 24 GB machine but all of an 8 GB
        # one: a render bomb's last retry swapped the machine out or woke the
        # kernel's OOM killer, which may pick the database.
        half = machine_memory_mb() // 2
        return max(self.child_memory_mb, min(4 * self.child_memory_mb, half))

    def with_(self, **changes: Any) -> Settings:
        return replace(self, **changes)


_ENV_NAMES = {
    "home": "HOME",
    "database_url": "DATABASE_URL",
    "lease_seconds": "LEASE_SECONDS",
    "worker_heartbeat_seconds": "HEARTBEAT_SECONDS",
    "worker_metrics_seconds": "METRICS_SECONDS",
    "worker_stale_seconds": "WORKER_STALE_SECONDS",
    "worker_gone_seconds": "WORKER_GONE_SECONDS",
    "reaper_interval_seconds": "REAPER_INTERVAL_SECONDS",
    "promoter_interval_seconds": "PROMOTER_INTERVAL_SECONDS",
    "retention_interval_seconds": "RETENTION_INTERVAL_SECONDS",
    "metrics_raw_days": "METRICS_RAW_DAYS",
    "job_retention_days": "JOB_RETENTION_DAYS",
    "fold_interval_seconds": "FOLD_INTERVAL_SECONDS",
    "leader_lease_seconds": "LEADER_LEASE_SECONDS",
    "poll_interval_seconds": "POLL_INTERVAL_SECONDS",
    "watch_interval_seconds": "WATCH_INTERVAL_SECONDS",
    "cancel_poll_seconds": "CANCEL_POLL_SECONDS",
    "claim_batch": "CLAIM_BATCH",
    "child_max_attempts": "CHILD_MAX_ATTEMPTS",
    "child_recycle_rss_mb": "CHILD_RECYCLE_RSS_MB",
    "child_memory_mb": "CHILD_MEMORY_MB",
    "child_memory_max_mb": "CHILD_MEMORY_MAX_MB",
    "child_max_file_mb": "CHILD_MAX_FILE_MB",
    "child_max_scratch_mb": "CHILD_MAX_SCRATCH_MB",
    "child_sandbox": "CHILD_SANDBOX",
    "child_connect_ports": "CHILD_CONNECT_PORTS",
    "backoff_base_seconds": "BACKOFF_BASE_SECONDS",
    "backoff_max_seconds": "BACKOFF_MAX_SECONDS",
    "s3_access_key_id": "S3_ACCESS_KEY_ID",
    "s3_secret_access_key": "S3_SECRET_ACCESS_KEY",
    "s3_timeout_seconds": "S3_TIMEOUT_SECONDS",
    "s3_presign": "S3_PRESIGN",
    "default_pool": "DEFAULT_POOL",
    "secret_key": "SECRET_KEY",
    "previous_secret_key": "PREVIOUS_SECRET_KEY",
    "signed_url_seconds": "SIGNED_URL_SECONDS",
    "public_url": "PUBLIC_URL",
    "gc_interval_seconds": "GC_INTERVAL_SECONDS",
    "gc_unreferenced_seconds": "GC_UNREFERENCED_SECONDS",
    "gc_pending_seconds": "GC_PENDING_SECONDS",
    "photo_bridge_interval_seconds": "PHOTO_BRIDGE_INTERVAL_SECONDS",
    "api_rate_per_second": "API_RATE_PER_SECOND",
    "api_rate_burst": "API_RATE_BURST",
    "api_auth_failures_per_minute": "API_AUTH_FAILURES_PER_MINUTE",
    "api_max_streams": "API_MAX_STREAMS",
    "max_upload_bytes": "MAX_UPLOAD_BYTES",
    "upload_idle_seconds": "UPLOAD_IDLE_SECONDS",
    "download_idle_seconds": "DOWNLOAD_IDLE_SECONDS",
    "header_seconds": "HEADER_SECONDS",
    "session_hours": "SESSION_HOURS",
    "api_max_body_bytes": "API_MAX_BODY_BYTES",
}


# Intervals and sizes that 0 or less breaks: a lease that expires as it is
# taken ran every job again and again; a zero interval spins; a batch of 0
# claims nothing.
_ABOVE_ZERO = (
    "lease_seconds",
    "worker_heartbeat_seconds",
    "worker_metrics_seconds",
    "worker_stale_seconds",
    "worker_gone_seconds",
    "reaper_interval_seconds",
    "promoter_interval_seconds",
    "retention_interval_seconds",
    "fold_interval_seconds",
    "leader_lease_seconds",
    "poll_interval_seconds",
    "cancel_poll_seconds",
    "claim_batch",
    "child_max_attempts",
    "child_memory_mb",
    "child_max_file_mb",
    "child_max_scratch_mb",
    "gc_interval_seconds",
    "photo_bridge_interval_seconds",
    # Below 1 the API started and refused every upload (a 413 "larger than
    # the -1-byte limit"), every JSON body, or every request past a burst.
    "max_upload_bytes",
    "api_max_body_bytes",
    "api_rate_burst",
    "api_max_streams",
    "child_recycle_rss_mb",
    # 0 dropped every request body, and every download, at once.
    "upload_idle_seconds",
    "download_idle_seconds",
    "header_seconds",
)


def sandbox_mode(settings: Settings) -> str:
    if settings.child_sandbox not in ("auto", "required", "off"):
        raise InvalidRequest("HYPERMEDIA_CHILD_SANDBOX is one of auto, required, off")
    return settings.child_sandbox


def connect_ports(settings: Settings) -> list[int] | None:
    """HYPERMEDIA_CHILD_CONNECT_PORTS as ports; None when empty (any port)."""
    raw = [p.strip() for p in settings.child_connect_ports.split(",") if p.strip()]
    ports = [ascii_int(p, 5) or 0 for p in raw] or None
    if not all(0 < p < 65536 for p in ports or ()):
        raise InvalidRequest("HYPERMEDIA_CHILD_CONNECT_PORTS is a comma-separated list of ports")
    return ports


MAX_MB = 2**30  # a pebibyte: any memory or file size a machine has, in MB


def _number(env_name: str, raw: str, kind: type) -> Any:
    """``raw`` as an int or a float, in ASCII only: int() and float() read
    "1_0" as 10, " 5 " as 5 and Arabic-Indic "١٢" as 12, which the API refuses."""
    try:
        if not raw.isascii() or "_" in raw or raw != raw.strip():
            raise ValueError
        return kind(raw)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise InvalidRequest(f"HYPERMEDIA_{env_name} must be {what}, in ASCII digits") from None


def load_settings() -> Settings:
    """Build settings from the environment, converting each value to its field's type."""
    defaults = Settings()
    values: dict[str, Any] = {}
    for f in fields(Settings):
        env_name = _ENV_NAMES.get(f.name)
        if env_name is None:
            continue
        raw = os.environ.get(f"HYPERMEDIA_{env_name}")
        if raw is None:
            continue
        current = getattr(defaults, f.name)
        if isinstance(current, Path):
            if not raw.strip():  # Path("") is ".": the data went into the working folder
                raise InvalidRequest(f"HYPERMEDIA_{env_name} is empty: name a folder, or unset it")
            values[f.name] = Path(raw)
        elif isinstance(current, bool):
            values[f.name] = _boolean(env_name, raw)
        elif isinstance(current, int | float):
            values[f.name] = _number(env_name, raw, type(current))
        else:
            values[f.name] = raw
    settings = replace(defaults, **values)
    for name in (f.name for f in fields(Settings) if f.name.endswith("_mb")):
        # In bytes, a C long in setrlimit: past it every attempt crashed (OverflowError).
        if getattr(settings, name) > MAX_MB:
            raise InvalidRequest(f"HYPERMEDIA_{_ENV_NAMES[name]} must be at most {MAX_MB} (MB)")
    _check_signed_url_seconds(settings.signed_url_seconds)
    settings = replace(settings, public_url=base_url(settings.public_url, "HYPERMEDIA_PUBLIC_URL"))
    for name in _ABOVE_ZERO:
        if not getattr(settings, name) > 0:
            raise InvalidRequest(f"HYPERMEDIA_{_ENV_NAMES[name]} must be more than 0")
    if not settings.session_hours > 0:  # a login would end as it began
        raise InvalidRequest("HYPERMEDIA_SESSION_HOURS must be more than 0")
    rate = settings.api_rate_per_second
    # 0: no limit; NaN fails too.  Under MIN_RATE the wait for the next
    # request overflowed Retry-After (1e-320: every 429 a 500).
    if not (rate == 0 or MIN_RATE <= rate < float("inf")):
        raise InvalidRequest(
            f"HYPERMEDIA_API_RATE_PER_SECOND must be 0 (no limit) or from {MIN_RATE:g}"
        )
    if settings.worker_heartbeat_seconds >= settings.worker_stale_seconds:
        # The reaper took a live worker for dead between two of its
        # heartbeats: its jobs ORPHANED, run again, until out of attempts.
        raise InvalidRequest(
            "HYPERMEDIA_HEARTBEAT_SECONDS must be less than HYPERMEDIA_WORKER_STALE_SECONDS "
            f"({settings.worker_heartbeat_seconds:g} is not less than "
            f"{settings.worker_stale_seconds:g}): a live worker would be taken for dead"
        )
    if settings.api_auth_failures_per_minute < 0:
        raise InvalidRequest("HYPERMEDIA_API_AUTH_FAILURES_PER_MINUTE must be 0 (no limit) or more")
    if not settings.s3_timeout_seconds > 0:
        raise InvalidRequest("HYPERMEDIA_S3_TIMEOUT_SECONDS must be more than 0")
    if settings.child_memory_max_mb < 0:
        raise InvalidRequest(
            "HYPERMEDIA_CHILD_MEMORY_MAX_MB must be 0 (four times the memory) or more"
        )
    if not 0 <= settings.watch_interval_seconds <= 3600:  # a negative wait spins
        raise InvalidRequest("HYPERMEDIA_WATCH_INTERVAL_SECONDS must be from 0 to 3600")
    if not 1 <= len(settings.default_pool) <= 64:
        raise InvalidRequest("HYPERMEDIA_DEFAULT_POOL must name a pool (1 to 64 characters)")
    _check_durations(settings)
    _check_gc_pending_seconds(settings.gc_pending_seconds)
    # Here, not when a worker is built: `process` and `serve` had uploaded,
    # queued or migrated by then, and a refusal (exit 2) says nothing was done.
    sandbox_mode(settings)
    connect_ports(settings)
    for name in ("secret_key", "previous_secret_key"):
        if getattr(settings, name):
            check_secret_key(getattr(settings, name), f"HYPERMEDIA_{_ENV_NAMES[name]}")
    for name in ("s3_access_key_id", "s3_secret_access_key"):
        # A CRLF env file's "\r" went into the signed header, and the header
        # library's error quoted it, key id and signature and all.
        value = getattr(settings, name)
        if any(c.isspace() or not c.isprintable() for c in value):
            raise InvalidRequest(
                f"HYPERMEDIA_{_ENV_NAMES[name]} has a space or a control character "
                "(a line end from a CRLF file?)"
            )
    return settings


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def _boolean(env_name: str, raw: str) -> bool:
    """A yes or a no; anything else (``enabled``, a typo) is refused, not read as no."""
    word = raw.strip().lower()
    if word not in _TRUE | _FALSE:
        raise InvalidRequest(f"HYPERMEDIA_{env_name} must be true or false (1/0, yes/no, on/off)")
    return word in _TRUE


# A century in each unit a duration setting is given in.  "inf", "nan" and
# 1e300 parse as floats; as a lease or a retention they overflowed the
# date arithmetic deep inside a running worker instead of failing at start.
# A negative age is never meant: GC_PENDING_SECONDS=-1 swept uploads in flight.
_CENTURY = {"_seconds": 100 * 365 * 86400, "_hours": 100 * 365 * 24, "_days": 100 * 365}


def _check_durations(settings: Settings) -> None:
    for f in fields(Settings):
        unit = next((u for u in _CENTURY if f.name.endswith(u)), None)
        value = getattr(settings, f.name)
        if unit and isinstance(value, int | float) and not 0 <= value <= _CENTURY[unit]:
            raise InvalidRequest(
                f"HYPERMEDIA_{_ENV_NAMES[f.name]} must be a number of {unit[1:]} "
                f"from 0 to {_CENTURY[unit]:,} (a century)"
            )


# SigV4 presigned URLs live at most 7 days.  A longer TTL was silently cut
# to that on S3 pools (and not on local ones): refused when read instead.
MAX_SIGNED_URL_SECONDS = 7 * 24 * 3600


def _check_signed_url_seconds(seconds: int) -> None:
    if not 1 <= seconds <= MAX_SIGNED_URL_SECONDS:
        raise InvalidRequest(
            f"HYPERMEDIA_SIGNED_URL_SECONDS must be 1 to {MAX_SIGNED_URL_SECONDS} "
            f"(7 days, the longest an S3 presigned URL lives); it is {seconds}"
        )


MIN_RATE = 0.001  # a request every 1,000 s


# The shortest URL-signing key taken: a key anyone can guess (empty, "a",
# what `touch secret.key` leaves) let anyone sign a link to any object.
MIN_SECRET_KEY = 32


def check_secret_key(key: str, where: str) -> None:
    """Refuse a URL-signing key that is short, or that has a line end or a
    space at either end (a CRLF env file on one node only: every link it signs
    is a 403 at the others)."""
    if len(key) < MIN_SECRET_KEY:
        raise InvalidRequest(
            f"{where} must be at least {MIN_SECRET_KEY} characters "
            "(make one with `openssl rand -hex 32`)"
        )
    if key != key.strip() or not key.isprintable():
        raise InvalidRequest(
            f"{where} has a control character or a space at an end (a line end from a CRLF file?)"
        )


# The pending sweep takes ``pending`` rows older than this: uploads still on
# their way, and the rows a worker reserves for outputs (storage/reserve.py:
# used within RESERVE_TTL, 60 s, then filled by an upload that against a slow
# store takes minutes).  What it takes is not lost for good (the upload fails,
# the attempt is retried, Engine._lost_outputs), but a short age makes that
# routine, and throws finished work away.  An hour is sixty reservation
# lives, and a 2 GiB upload (HYPERMEDIA_MAX_UPLOAD_BYTES) at 0.6 MB/s.
MIN_GC_PENDING_SECONDS = 3600


def _check_gc_pending_seconds(seconds: float) -> None:
    if not seconds >= MIN_GC_PENDING_SECONDS:
        raise InvalidRequest(
            f"HYPERMEDIA_GC_PENDING_SECONDS must be at least {MIN_GC_PENDING_SECONDS} "
            "(an hour): the pending sweep would take uploads and outputs still on their way"
        )


ENV_DOC = {f"HYPERMEDIA_{v}": k for k, v in _ENV_NAMES.items()}

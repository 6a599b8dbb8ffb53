"""The command line, run as a real subprocess against each database."""

from __future__ import annotations

import json
import re
import signal
import uuid
from pathlib import Path

import pytest

from hypermedia.db.driver import Driver
from tests.harness import hypermedia, spawn, start_serve, stop


def _run(*args: str, url: str, home: Path):
    return hypermedia(*args, url=url, home=home)


def _json(proc) -> object:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_submit_ls_show_cancel_retry(driver: Driver, tmp_path: Path) -> None:
    url = driver.url
    ids = _json(
        _run(
            "jobs",
            "submit",
            "debug.sleep",
            "--params",
            '{"ms": 5}',
            "--count",
            "3",
            "--priority",
            "2",
            "--json",
            url=url,
            home=tmp_path,
        )
    )["job_ids"]
    assert len(ids) == 3

    listed = _json(_run("jobs", "ls", "--status", "queued", "--json", url=url, home=tmp_path))
    assert sorted(r["job_id"] for r in listed) == sorted(ids)
    assert {r["priority"] for r in listed} == {2}

    cancelled = _json(_run("jobs", "cancel", str(ids[0]), "--json", url=url, home=tmp_path))
    assert cancelled == {"job_id": ids[0], "status": "cancelled"}

    shown = _json(_run("jobs", "show", str(ids[0]), "--json", url=url, home=tmp_path))
    assert shown["status"] == "cancelled" and shown["legacy_status"] == "cancelled"
    assert [(e["from_status"], e["to_status"]) for e in shown["events"]] == [
        (None, "queued"),
        ("queued", "cancelled"),
    ]

    retried = _json(_run("jobs", "retry", str(ids[0]), "--json", url=url, home=tmp_path))
    assert retried["status"] == "queued"

    # Cancelling twice is refused with a clear message and a non-zero exit.
    _run("jobs", "cancel", str(ids[1]), url=url, home=tmp_path)
    again = _run("jobs", "cancel", str(ids[1]), url=url, home=tmp_path)
    assert again.returncode == 1 and "cannot cancel" in again.stderr
    assert "Traceback" not in again.stderr
    human = _run("jobs", "show", str(ids[1]), url=url, home=tmp_path).stdout
    assert "reason: cancelled by request\n" in human  # no code to name ("None: …")


def test_jobs_prune_deletes_jobs_that_ended_long_ago(driver: Driver, tmp_path: Path) -> None:
    from datetime import timedelta

    from hypermedia.queue.clock import utcnow
    from tests.conformance._helpers import set_columns

    url = driver.url
    ids = _json(
        _run("jobs", "submit", "debug.noop", "--count", "3", "--json", url=url, home=tmp_path)
    )
    old, young, live = ids["job_ids"]
    for job_id in (old, young):
        _json(_run("jobs", "cancel", str(job_id), "--json", url=url, home=tmp_path))
    ago = utcnow() - timedelta(days=40)
    set_columns(driver, old, {"created_at": ago, "updated_at": ago})
    set_columns(driver, live, {"created_at": ago, "updated_at": ago})  # queued: stays

    off = hypermedia("jobs", "prune", url=url, home=tmp_path, HYPERMEDIA_JOB_RETENTION_DAYS="0")
    assert off.returncode != 0 and "job retention is off" in off.stderr
    assert _json(_run("jobs", "prune", "--json", url=url, home=tmp_path)) == {"deleted": 1}
    gone = _run("jobs", "show", str(old), url=url, home=tmp_path)
    assert gone.returncode != 0 and gone.stderr == f"not found: job {old}\n"  # said once
    listed = _json(_run("jobs", "ls", "--json", url=url, home=tmp_path))
    assert sorted(r["job_id"] for r in listed) == sorted([young, live])
    # A shorter age, given on the command line, takes the younger one too.
    pruned = _run("jobs", "prune", "--older-than-days", "0.00001", url=url, home=tmp_path)
    assert pruned.returncode == 0 and "deleted 1 finished job(s)" in pruned.stdout


def test_worker_burst_drains_and_wait_reports(driver: Driver, tmp_path: Path) -> None:
    url = driver.url
    _json(_run("jobs", "submit", "debug.noop", "--count", "20", "--json", url=url, home=tmp_path))
    done = hypermedia(
        "worker",
        "--burst",
        "--concurrency",
        "2",
        "--queues",
        "bulk",
        url=url,
        home=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    listed = _json(_run("jobs", "ls", "--json", "--limit", "100", url=url, home=tmp_path))
    assert len(listed) == 20 and {r["status"] for r in listed} == {"completed"}


def test_submit_wait_with_a_running_worker(driver: Driver, tmp_path: Path) -> None:
    url = driver.url
    w = spawn(
        "worker",
        "--queues",
        "bulk",
        "--concurrency",
        "1",
        url=url,
        home=tmp_path,
        log=tmp_path / "worker.log",
    )
    try:
        failing = ("jobs", "submit", "debug.sleep", "--params", '{"fail": "CORRUPT_INPUT"}')
        proc = _run(*failing, "--wait", "--json", url=url, home=tmp_path)
        # A job that failed is not a success: exit 1, as jobs tail and process.
        assert proc.returncode == 1, proc.stderr
        (job,) = json.loads(proc.stdout)["jobs"]
        assert job["status"] == "failed" and job["error_code"] == "CORRUPT_INPUT"
        assert job["safe_reason"] and "/" not in job["safe_reason"]
        # In words: the job's end, and (on stderr, before the wait) its id.
        text = _run(*failing, "--count", "2", "--wait", url=url, home=tmp_path)
        assert text.returncode == 1
        assert re.search(r"2 jobs: \d+ … \d+ queued; waiting", text.stderr), text.stderr
        assert text.stdout.count("failed CORRUPT_INPUT: ") == 2
        assert text.stdout.rstrip().endswith("2 failed")
        ok = _run("jobs", "submit", "debug.noop", "--wait", url=url, home=tmp_path)
        assert ok.returncode == 0 and ok.stdout.strip() == "1 completed"
    finally:
        assert stop(w, signal.SIGTERM) == 0


@pytest.fixture(scope="module")
def embedded_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated embedded (SQLite) home: input validation does not vary by backend."""
    home = tmp_path_factory.mktemp("embedded")
    assert hypermedia("db", "upgrade", url="", home=home).returncode == 0
    return home


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["jobs", "submit", "nope.nothing"], "unknown job type"),
        (["jobs", "submit", "debug.sleep", "--params", "{bad"], "not valid JSON"),
        (["jobs", "submit", "debug.sleep", "--params", '{"ms": -1}'], "ms must be"),
        (
            ["jobs", "submit", "debug.noop", "--profile", "missing-profile"],
            "no profile missing-profile",
        ),
        (["jobs", "show", "999999"], "not found"),
        # Filters that match nothing by their spelling: said, not an empty table.
        (["jobs", "ls", "--status", "bogus"], "status must be one of created, queued"),
        (["objects", "ls", "--state", "bogus"], "state must be one of pending, ready"),
    ],
)
def test_bad_requests_exit_nonzero_with_a_clear_message(
    embedded_home: Path, args: list[str], message: str
) -> None:
    """Wrong in itself, refused before anything is done: exit 2 (docs/cli.md,
    "Exit codes"); an unknown profile exited 1 here and 2 from `process`."""
    proc = _run(*args, url="", home=embedded_home)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_db_upgrade_on_a_fresh_sqlite_home(tmp_path: Path) -> None:
    env_home = tmp_path / "fresh"
    proc = hypermedia("db", "upgrade", url="", home=env_home)
    assert proc.returncode == 0, proc.stderr
    assert (env_home / "hypermedia.db").exists()
    from hypermedia.db.migrate import head

    assert head() in proc.stdout


def test_serve_runs_jobs_and_answers_health(tmp_path: Path) -> None:
    home = tmp_path / "embedded"
    server, _ = start_serve(tmp_path, home)
    try:
        out = _json(
            hypermedia(
                "jobs",
                "submit",
                "debug.sleep",
                "--params",
                '{"ms": 50}',
                "--wait",
                "--json",
                url="",
                home=home,
                timeout=60,
            )
        )
        assert out["jobs"][0]["status"] == "completed"
    finally:
        assert stop(server, signal.SIGTERM) == 0, (tmp_path / "serve.log").read_text()[-2000:]


def test_the_default_worker_serves_a_queue_a_profile_names_later(
    driver: Driver, tmp_path: Path
) -> None:
    """`hypermedia worker` is documented to serve every queue: it served five
    fixed names, and a job on a queue a new profile names waited for ever."""
    url = driver.url
    name = f"later-{uuid.uuid4().hex[:8]}"
    w = spawn("worker", "--concurrency", "1", url=url, home=tmp_path, log=tmp_path / "w.log")
    try:
        made = _run(
            "profiles", "create", name, "--type", "debug.sleep", "--queue", name,
            url=url, home=tmp_path,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        done = _run(  # the job type left out: the profile's (as POST /v1/jobs takes it)
            "jobs", "submit", "--profile", name, "--wait", "--json", url=url, home=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        (job,) = json.loads(done.stdout)["jobs"]
        assert job["status"] == "completed"
        assert (
            _json(_run("jobs", "show", str(job["job_id"]), "--json", url=url, home=tmp_path))[
                "queue_name"
            ]
            == name
        )
    finally:
        assert stop(w, signal.SIGTERM) == 0, (tmp_path / "w.log").read_text()[-6000:]
    # A list that names no queue, or a bad name, is refused before anything starts.
    for bad in ("", " , ", "Bad Q"):
        refused = _run("worker", "--burst", "--queues", bad, url=url, home=tmp_path)
        assert refused.returncode == 2 and "queue" in refused.stderr, refused.stderr


@pytest.mark.parametrize(
    ("url", "env", "said"),
    [
        ("garbage", {}, "the database URL is not a URL: sqlite:///PATH"),
        ("foo://bar", {}, "names no database hypermedia runs on"),
        # ValueError and ModuleNotFoundError (exit 1, a traceback's words) before:
        ("postgresql://s3cret@localhost:notaport/db", {}, "the database URL is not a URL"),
        ("postgresql://[::1/db", {}, "the database URL is not a URL"),
        ("postgresql+asyncpg://localhost/db", {}, "a driver hypermedia does not ship (asyncpg)"),
        # SQLAlchemy's "Invalid SQLite URL" and a host that "failed to resolve" (exit 1):
        ("sqlite://relative.db", {}, "a SQLite database URL is sqlite:///PATH"),
        ("sqlite://", {}, "or sqlite:////ABSOLUTE/PATH"),
        ("sqlite://u:s3cret@host/x.db", {}, "a SQLite database URL is sqlite:///PATH"),
        ("postgresql://u:s3cret@h:99999/db", {}, "port must be from 1 to 65535"),
        ("mariadb://u:s3cret@h:0/db", {}, "port must be from 1 to 65535"),
        ("mariadb://u:s3cret@h/db?connect_timeout=abc", {}, "connect_timeout must be a whole"),
        ("mariadb://u:s3cret@h/db?charset=bogus", {}, "charset is not one MariaDB knows"),
        # Refused by the driver at every connection: a database "away" for
        # ever (a mistyped sslmode), or a traceback.
        ("postgresql://u:s3cret@h/db?sslmode=requre", {}, "sslmode is one of disable, allow"),
        ("postgresql://u:s3cret@h/db?bogus_opt=1", {}, "'bogus_opt' is not one PostgreSQL"),
        ("mariadb://u:s3cret@h/db?bogus=1", {}, "'bogus' is not one MariaDB's driver knows"),
        # SQLAlchemy's SAWarning (a traceback line), then ran on without it:
        ("sqlite:////nonexistent/x.db?bogus=1", {}, "option 'bogus' is not taken: a SQLite"),
        # uri=true opened a new, empty file named "x.db?mode=ro"; timeout=abc a ValueError:
        ("sqlite:////nonexistent/x.db?uri=true&mode=ro", {}, "option 'uri' is not taken"),
        ("sqlite:////nonexistent/x.db?timeout=abc", {}, "URL is sqlite:///PATH alone"),
        # Read as the host "cret@127.0.0.1", named in every connection error:
        ("postgresql://u:s3@cret@127.0.0.1/db", {}, "user name or password (write it as %40)"),
        ("", {"HYPERMEDIA_JOB_RETENTION_DAYS": "abc"}, "HYPERMEDIA_JOB_RETENTION_DAYS must be a"),
        ("", {"HYPERMEDIA_CLAIM_BATCH": "1.5"}, "HYPERMEDIA_CLAIM_BATCH must be an integer"),
        # A lease of 0 expired as it was taken: every job ran again and again.
        ("", {"HYPERMEDIA_LEASE_SECONDS": "0"}, "HYPERMEDIA_LEASE_SECONDS must be more than 0"),
        ("", {"HYPERMEDIA_HEARTBEAT_SECONDS": "-5"}, "HEARTBEAT_SECONDS must be more than 0"),
        ("", {"HYPERMEDIA_CLAIM_BATCH": "0"}, "HYPERMEDIA_CLAIM_BATCH must be more than 0"),
    ],
)
def test_bad_settings_are_named(tmp_path: Path, url: str, env: dict[str, str], said: str) -> None:
    """They said `ValueError: could not convert string to float: 'abc'`, or
    SQLAlchemy's words with the URL quoted in them."""
    proc = hypermedia("jobs", "ls", url=url, home=tmp_path, **env)
    assert proc.returncode == 2 and said in proc.stderr, proc.stderr  # a bad setting: usage
    assert proc.stderr.count("\n") == 1 and "cret" not in proc.stderr  # s3cret, s3@cret


def test_a_job_filter_no_job_could_match_is_refused(embedded_home: Path) -> None:
    for flag, value, said in (
        ("--queue", "Bad Q", "a queue name has 1 to 50 characters"),
        ("--type", "Image Thumbnail", "a job type has 1 to 50 characters"),
    ):
        proc = _run("jobs", "ls", flag, value, url="", home=embedded_home)
        assert proc.returncode == 2 and said in proc.stderr, proc.stderr
    assert _run("jobs", "ls", "--type", "no.such", url="", home=embedded_home).returncode == 0


def test_submit_wait_gives_up_after_its_timeout(embedded_home: Path) -> None:
    """No worker serves this queue: --wait alone would wait for ever."""
    proc = _run(
        "jobs", "submit", "debug.noop", "--queue", "nobody-serves", "--wait",
        "--wait-timeout", "0.5", url="", home=embedded_home,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "not ended within 0.5 s; the jobs go on" in proc.stderr
    assert "no pipeline, profile or job uses queue nobody-serves (a typo?)" in proc.stderr
    waiting = next(line for line in proc.stderr.splitlines() if "waiting until" in line)
    job_id = waiting.split()[1]  # "job N queued; waiting until they end"
    assert proc.stdout.splitlines() == [f"job {job_id} queued", "1 queued"]


@pytest.mark.parametrize("command", [["worker"], ["db", "upgrade"], ["serve"]])
def test_a_home_that_cannot_be_made_is_named_in_one_line(
    tmp_path: Path, command: list[str]
) -> None:
    """`worker` printed a 47-line traceback, the others "OSError: ... '[path]'":
    the path, the user's own setting, redacted."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    proc = hypermedia(*command, url=url, home=Path("/proc/hypermedia-no-home"), timeout=60)
    said = "HYPERMEDIA_HOME=/proc/hypermedia-no-home cannot be made: No such file or directory"
    assert proc.returncode == 1 and said in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr

"""What every command shares, run as real ``hypermedia`` processes:

* one exit-code policy (docs/cli.md, "Exit codes"): 2 when the command as
  given is wrong and nothing was done, 1 when it ran and failed.  An unknown
  profile exited 1 from `jobs submit` and 2 from `process`;
* the commands that only read create no database: on a fresh
  HYPERMEDIA_HOME they made the folder and an empty SQLite file;
* `objects put --mime` takes a media type, and nothing else.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hypermedia.db.driver import Driver
from tests.harness import cli_env, hypermedia
from tests.ports import free_port

USAGE, FAILED = 2, 1


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated embedded home with a priced profile and a project whose
    budget it does not fit in, and one stored object."""
    home = tmp_path_factory.mktemp("policy")
    for args in (
        ("db", "upgrade"),
        ("profiles", "create", "priced", "--type", "debug.noop", "--credits-base", "5"),
        ("credits", "set-budget", "broke", "4"),
        ("jobs", "submit", "debug.noop", "--idempotency-key", "once"),
    ):
        done = hypermedia(*args, url="", home=home)
        assert done.returncode == 0, done.stderr
    (home / "in.bin").write_bytes(b"some bytes")
    put = hypermedia("objects", "put", str(home / "in.bin"), url="", home=home)
    assert put.returncode == 0, put.stderr
    return home


def _case(args: list[str], code: int, said: str, **env: str) -> object:
    named = " ".join([*args, *(f"{k}={v}" for k, v in env.items())])
    return pytest.param(args, code, said, env, id=named[:80])


@pytest.mark.parametrize(
    ("args", "code", "said", "env"),
    [
        # Wrong in itself: refused before anything is done.
        _case(
            ["jobs", "submit", "debug.noop", "--profile", "nope"], USAGE, "error: no profile nope"
        ),
        _case(["process", "{in}", "--profile", "nope"], USAGE, "error: no profile nope"),
        _case(["jobs", "submit", "--profile", "nope"], USAGE, "error: no profile nope"),
        _case(["jobs", "submit"], USAGE, "give JOB_TYPE, --profile, or both"),
        _case(["jobs", "submit", "nope.nothing"], USAGE, "unknown job type"),
        _case(
            ["jobs", "submit", "debug.sleep", "--idempotency-key", "once"],
            USAGE,
            "already used for a different request",
        ),
        _case(["jobs", "submit", "debug.noop", "--queue", "Bad Q"], USAGE, "queue name"),
        _case(["worker", "--burst", "--queues", "Bad Q"], USAGE, "queue name"),
        _case(["queues", "pause", "Bad Q"], USAGE, "queue name"),
        _case(["jobs", "submit", "debug.noop", "--params", "[1]"], USAGE, "JSON object"),
        _case(
            [
                "profiles",
                "create",
                "t",
                "--type",
                "image.thumbnail",
                "--settings",
                '{"width": 1, "width": 2}',
            ],
            USAGE,
            '--settings: the key "width" appears twice in one object',
        ),
        _case(["jobs", "submit", "debug.noop", "--priority", "11"], USAGE, "--priority"),
        _case(
            ["jobs", "submit", "debug.noop", "--object", "99999"],
            USAGE,
            "error: object 99999 does not exist",
        ),
        _case(["jobs", "show", "99999"], USAGE, "not found: job 99999"),
        _case(["jobs", "submit", "debug.noop", "--wait-timeout", "2"], USAGE, "needs --wait"),
        # Ids past 64 bits: Typer's words on every backend (they differed by backend).
        _case(["jobs", "show", "9" * 20], USAGE, "less than or equal to"),
        _case(["objects", "get", "9" * 20], USAGE, "less than or equal to"),
        _case(["jobs", "cancel", "0"], USAGE, "greater than or equal to 1"),
        _case(["jobs", "submit", "debug.noop", "--object", "9" * 20], USAGE, "less than"),
        _case(["objects", "put", "{home}/missing.bin"], USAGE, "does not exist"),
        _case(["objects", "put", "{home}/in.bin", "--project", ""], USAGE, "a project id is"),
        _case(["objects", "put", "{home}/in.bin", "--project", "p" * 65], USAGE, "a project id"),
        _case(["pools", "add", "pq", "file:///tmp/pq", "--project", "a\nb"], USAGE, "project id"),
        _case(["pools", "add", "p\x1bq", "file:///tmp/pq"], USAGE, "printable characters"),
        _case(["objects", "get", "1", "-o", "{home}"], USAGE, "names a folder"),
        _case(["credits", "set-budget", "p", "lots"], USAGE, "whole number"),
        _case(["credits", "set-budget", "p", "\u0661\u0660"], USAGE, "whole number"),
        _case(["credits", "set-budget", "p", "1_000"], USAGE, "whole number"),
        _case(["credits", "set-budget", "p", "-5"], USAGE, "whole number"),
        _case(
            ["jobs", "submit", "debug.noop", "--params", '{"a":' + "[" * 5000 + "]" * 5000 + "}"],
            USAGE,
            "nests too deep",
        ),
        _case(["jobs", "submit", "debug.noop", "--params", '{"a":"\\ud800"}'], USAGE, "surrogates"),
        _case(["photos", "ls", "--album", "\udcff"], USAGE, "valid UTF-8"),
        _case(["tokens", "create", "-p", "p", "--scopes", "root"], USAGE, "scopes must be"),
        _case(["db", "upgrade", "nope"], USAGE, "Can't locate revision"),
        _case(["jobs", "prune", "--older-than-days", "0"], USAGE, "must be above 0"),
        _case(["jobs", "prune", "--older-than-days", "nan"], USAGE, "must be above 0"),
        _case(["jobs", "ls"], USAGE, "HYPERMEDIA_CLAIM_BATCH", HYPERMEDIA_CLAIM_BATCH="1.5"),
        # The path is the user's own setting: named (it was a redacted NotADirectoryError).
        _case(["db", "upgrade"], USAGE, "/in.bin is a file", HYPERMEDIA_HOME="{in}/x"),
        _case(["jobs", "ls"], USAGE, "cannot be a folder", HYPERMEDIA_HOME="{in}"),
        # Well-formed; it ran, or tried to, and failed.
        _case(
            ["jobs", "submit", "debug.noop", "--profile", "priced", "--project", "broke"],
            FAILED,
            "credit budget exceeded",
        ),
        _case(
            ["jobs", "submit", "debug.noop", "--queue", "idle", "--wait", "--wait-timeout", "0"],
            FAILED,
            "not ended within",
        ),
        _case(
            ["jobs", "ls"],
            FAILED,
            "no database at",
            HYPERMEDIA_DATABASE_URL="sqlite:///{none}/none.db",
        ),
    ],
)
def test_one_exit_code_policy(
    home: Path, tmp_path: Path, args: list[str], code: int, said: str, env: dict[str, str]
) -> None:
    def fill(text: str) -> str:
        for name, value in (("{in}", home / "in.bin"), ("{home}", home), ("{none}", tmp_path)):
            text = text.replace(name, str(value))
        return text

    extra = {k: fill(v) for k, v in env.items()}
    url = extra.pop("HYPERMEDIA_DATABASE_URL", "")
    proc = hypermedia(*(fill(a) for a in args), url=url, home=home, **extra)
    assert proc.returncode == code, proc.stderr
    # Typer's usage box is 80 columns wide: a long path wraps inside its borders.
    assert said in " ".join(proc.stderr.replace("\u2502", " ").split()), proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_policy_on_every_backend(driver: Driver, tmp_path: Path) -> None:
    """The same mapping on PostgreSQL and MariaDB: an unknown profile is a
    usage error from both commands that take one; a budget refusal is not."""
    url, home = driver.url, tmp_path / "home"
    src = tmp_path / "in.bin"
    src.write_bytes(b"x" * 10)
    for args in (
        ("jobs", "submit", "debug.noop", "--profile", "nope"),
        ("process", str(src), "--profile", "nope"),
    ):
        proc = hypermedia(*args, url=url, home=home)
        assert proc.returncode == USAGE, proc.stderr
    key, project = f"priced-{uuid.uuid4().hex[:8]}", f"broke-{uuid.uuid4().hex[:8]}"
    for args in (
        ("profiles", "create", key, "--type", "debug.noop", "--credits-base", "5"),
        ("credits", "set-budget", project, "4"),
    ):
        assert hypermedia(*args, url=url, home=home).returncode == 0
    broke = hypermedia(
        "jobs", "submit", "debug.noop", "--profile", key, "--project", project,
        url=url, home=home,
    )  # fmt: skip
    assert broke.returncode == FAILED and "credit budget exceeded" in broke.stderr


def test_a_count_past_the_budget_queues_nothing(driver: Driver, tmp_path: Path) -> None:
    """`jobs submit --count` is one enqueue, refused whole past the budget. It
    was one transaction per 1000 jobs: the first 1000 stayed queued (and
    held their credits) while the command said the budget refused it."""
    url, home = driver.url, tmp_path / "home"
    key, project = f"priced-{uuid.uuid4().hex[:8]}", f"batch-{uuid.uuid4().hex[:8]}"
    for args in (
        ("profiles", "create", key, "--type", "debug.noop", "--credits-base", "1"),
        ("credits", "set-budget", project, "1200"),
    ):
        assert hypermedia(*args, url=url, home=home).returncode == 0
    submit = ("jobs", "submit", "debug.noop", "--profile", key, "--project", project)
    proc = hypermedia(*submit, "--count", "1500", url=url, home=home)
    assert proc.returncode == FAILED, proc.stderr
    assert " ".join(proc.stderr.split()).endswith("this request needs 1500")  # all of it
    shown = hypermedia("credits", "show", "--project", project, "--json", url=url, home=home)
    assert json.loads(shown.stdout)["used"] == 0
    proc = hypermedia(*submit, "--count", "1200", "--json", url=url, home=home)
    assert proc.returncode == 0 and len(json.loads(proc.stdout)["job_ids"]) == 1200


# Every command but the ones that create, migrate or wait for the database
# (`db upgrade`, `serve`, `worker`, `scheduler`, `process`): a command that
# writes would only fail on an empty file ("no such table") it had made.
NEEDS_A_DATABASE = [
    ["jobs", "submit", "debug.noop"],
    ["jobs", "cancel", "1"],
    ["jobs", "retry", "1"],
    ["objects", "put", "{file}"],
    ["photos", "add", "{file}"],
    ["profiles", "deactivate", "image-thumbnail:v1"],
    ["credits", "set-budget", "p", "10"],
    ["tokens", "create", "-p", "p", "--scopes", "read"],
    ["pools", "add", "more", "file:///tmp/more"],
    ["jobs", "ls"],
    ["jobs", "show", "1"],
    ["jobs", "tail", "1"],
    ["objects", "ls"],
    ["objects", "show", "1"],
    ["objects", "get", "1"],
    ["objects", "url", "1"],
    ["objects", "verify"],
    ["photos", "ls"],
    ["photos", "show", "x"],
    ["profiles", "ls"],
    ["profiles", "show", "image-thumbnail"],
    ["credits", "show"],
    ["queues", "ls"],
    ["workers", "ls"],
    ["tokens", "ls"],
    ["projects", "ls"],
    ["db", "current"],
    ["db", "stamp", "0015"],
    ["pools", "ls"],
    ["jobs", "prune", "--older-than-days", "30"],
    ["pools", "rm", "more"],
    ["pools", "set-url", "more", "file:///tmp/more"],
    ["gc", "run-once"],
    ["gc", "orphans"],
    ["photos", "copy", "x"],
    ["photos", "move", "x", "--album", "a"],
    ["photos", "rm", "x"],
    ["profiles", "create", "k", "--type", "debug.noop"],
    ["queues", "pause", "images"],  # they made an empty database, then failed on it
    ["queues", "resume", "images"],
    ["workers", "drain", "w1"],
    ["tokens", "revoke", "1"],
]
# The commands that make the embedded database: they migrate it.
CREATE_ONE = {"db upgrade", "serve", "api", "worker", "scheduler", "process"}


def test_a_repeated_key_says_what_became_of_the_first_job(home: Path) -> None:
    """QA: a repeat of a completed job's key said "job 24 queued": nothing was."""
    submit = ("jobs", "submit", "debug.noop", "--idempotency-key", "twice-said")
    first = hypermedia(*submit, url="", home=home)
    assert first.returncode == 0 and first.stdout.strip().endswith("queued"), first.stdout
    job_id = first.stdout.split()[1]
    again = hypermedia(*submit, url="", home=home)  # still queued: said as it is
    assert again.returncode == 0 and again.stdout.strip() == f"job {job_id} queued"
    assert hypermedia("jobs", "cancel", job_id, url="", home=home).returncode == 0
    late = hypermedia(*submit, url="", home=home)
    assert late.returncode == 0
    assert late.stdout.strip() == f"job {job_id} (submitted before with this key: cancelled)"
    ids = json.loads(hypermedia(*submit, "--json", url="", home=home).stdout)
    assert ids == {"job_ids": [int(job_id)]}


def test_every_command_is_checked_for_making_no_database() -> None:
    """A command added later is on one list or the other."""
    import typer

    from hypermedia.cli.main import app

    def walk(command: Any, path: tuple[str, ...]) -> Iterator[str]:
        subs = getattr(command, "commands", None)
        if not subs:
            yield " ".join(path)
            return
        for name, sub in subs.items():
            yield from walk(sub, (*path, name))

    commands = set(walk(typer.main.get_command(app), ()))
    checked = {" ".join(a for a in args if not a.startswith(("-", "{")))
               for args in NEEDS_A_DATABASE}  # fmt: skip
    unchecked = {c for c in commands - CREATE_ONE if not any(k.startswith(c) for k in checked)}
    assert unchecked == set()


@pytest.mark.parametrize("args", NEEDS_A_DATABASE, ids=" ".join)
def test_a_command_creates_no_database(tmp_path: Path, args: list[str]) -> None:
    fresh = tmp_path / "fresh"
    (file := tmp_path / "in.txt").write_text("x")
    proc = hypermedia(*(a.replace("{file}", str(file)) for a in args), url="", home=fresh)
    assert proc.returncode == FAILED, proc.stderr
    said = " ".join(proc.stderr.split())
    assert f"no database at {fresh.resolve() / 'hypermedia.db'} yet" in said, said
    assert "`hypermedia db upgrade`" in said and "`hypermedia serve`" in said
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert not fresh.exists()  # neither the folder nor the file


def test_an_existing_home_without_a_database_stays_empty(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    elsewhere = tmp_path / "db" / "x.db"
    assert hypermedia("jobs", "ls", url="", home=home).returncode == FAILED
    url = f"sqlite:///{elsewhere}"
    named = hypermedia("profiles", "ls", url=url, home=home)
    assert named.returncode == FAILED and str(elsewhere) in named.stderr
    assert list(home.iterdir()) == [] and not elsewhere.parent.exists()


def test_a_database_never_migrated_is_said_at_once(tmp_path: Path) -> None:
    """`jobs tail` waited for ever on it, as if the database were away."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "hypermedia.db").touch()
    proc = hypermedia("jobs", "tail", "1", url="", home=home, timeout=30)
    assert proc.returncode == FAILED, proc.stderr
    said = " ".join(proc.stderr.split())  # rich wraps long lines
    assert "the database has no hypermedia schema: run `hypermedia db upgrade`" in said


def test_stdout_still_tells_a_terminal_from_a_pipe() -> None:
    """Behind the whole-writes wrapper stdout said it was no terminal, and
    `jobs tail` never drew its progress bar."""
    from hypermedia.cli.common import _WholeWrites

    main, tty = os.openpty()
    read, pipe = os.pipe()
    try:
        assert _WholeWrites(tty).isatty() is True
        assert _WholeWrites(pipe).isatty() is False
    finally:
        for fd in (main, tty, read, pipe):
            os.close(fd)


def test_a_database_behind_this_code_is_refused_before_anything_is_done(tmp_path: Path) -> None:
    """After `db upgrade 0004`, `jobs submit` wrote a job a worker then would
    not serve, and only commands that reached a missing table failed."""
    from hypermedia.db import revisions

    home = tmp_path / "home"
    assert hypermedia("db", "upgrade", "0004", url="", home=home).returncode == 0
    for args in (["jobs", "submit", "debug.noop"], ["jobs", "ls"], ["objects", "ls"]):
        proc = hypermedia(*args, url="", home=home)
        assert proc.returncode == FAILED, (args, proc.stdout)
        said = " ".join(proc.stderr.split())
        assert (
            f"the database schema is at revision 0004, this hypermedia needs {revisions.head()}"
            in said
        ), said
    assert hypermedia("db", "upgrade", url="", home=home).returncode == 0
    assert hypermedia("jobs", "submit", "debug.noop", url="", home=home).returncode == 0


def test_a_newer_database_and_a_revision_below_it_are_said_plainly(tmp_path: Path) -> None:
    """A database a newer hypermedia migrated: `db upgrade` said "Can't
    locate revision" with exit 2 (the command line blamed) and `serve`
    stopped, where `worker` and `api` carry on.  A revision below the
    database's did nothing and said "database at revision 0014"."""
    import sqlite3

    from hypermedia.db import revisions

    home = tmp_path / "home"
    assert hypermedia("db", "upgrade", url="", home=home).returncode == 0
    for below in ("0004", "base"):
        proc = hypermedia("db", "upgrade", below, url="", home=home)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "does not downgrade" in " ".join(proc.stderr.split())
    with sqlite3.connect(home / "hypermedia.db") as conn:
        conn.execute("UPDATE alembic_version SET version_num = '9999'")
    proc = hypermedia("db", "upgrade", url="", home=home)
    assert proc.returncode == FAILED, proc.stdout + proc.stderr
    said = " ".join(proc.stderr.split())
    assert f"(revision 9999) is newer than this hypermedia (revision {revisions.head()})" in said
    serve = subprocess.Popen(
        [sys.executable, "-m", "hypermedia", "serve", "--port", str(free_port())],
        env=cli_env("", home),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert serve.stdout is not None
        lines = []
        for line in serve.stdout:
            lines.append(line)
            if "hypermedia serving" in line:
                break
        assert serve.poll() is None, "".join(lines)
        assert any("is newer than this hypermedia" in ln for ln in lines), "".join(lines)
    finally:
        serve.terminate()
        serve.communicate(timeout=30)


def test_db_upgrade_creates_it(tmp_path: Path) -> None:
    """`db upgrade` makes the home and the database; then the others work."""
    home = tmp_path / "fresh"
    assert hypermedia("db", "upgrade", url="", home=home).returncode == 0
    assert (home / "hypermedia.db").exists()
    listed = hypermedia("jobs", "ls", "--json", url="", home=home)
    assert listed.returncode == 0 and json.loads(listed.stdout) == []
    current = hypermedia("db", "current", url="", home=home)
    assert current.returncode == 0 and current.stdout.strip() not in ("", "empty")
    submitted = hypermedia("jobs", "submit", "debug.noop", url="", home=home)
    assert submitted.returncode == 0, submitted.stderr


@pytest.mark.parametrize(
    ("mime", "said"),
    [
        ("garbage", "is not a media type"),
        ("image/", "is not a media type"),
        ("/png", "is not a media type"),
        ("image/png/x", "is not a media type"),
        ("image /png", "is not a media type"),
        ("-image/png", "is not a media type"),
        ("image/p*ng", "is not a media type"),
        ("image/" + "x" * 128, "is not a media type"),
        ("text/plain; charset=utf-8", "without parameters"),
        ("", "is not a media type"),
    ],
)
def test_mime_must_be_a_media_type(home: Path, mime: str, said: str) -> None:
    before = hypermedia("objects", "ls", "--json", url="", home=home)
    proc = hypermedia("objects", "put", str(home / "in.bin"), "--mime", mime, url="", home=home)
    assert proc.returncode == USAGE, proc.stderr
    assert f"--mime {said}" in proc.stderr or said in proc.stderr, proc.stderr
    assert proc.stderr.startswith("error: --mime")
    assert hypermedia("objects", "ls", "--json", url="", home=home).stdout == before.stdout


@pytest.mark.parametrize(
    ("mime", "stored"),
    [
        ("Image/PNG", "image/png"),
        (" text/plain ", "text/plain"),
        ("application/vnd.api+json", "application/vnd.api+json"),
        ("application/x-7z-compressed", "application/x-7z-compressed"),
        ("a/" + "b" * 127, "a/" + "b" * 127),
    ],
)
def test_a_media_type_is_stored_lower_cased(home: Path, mime: str, stored: str) -> None:
    proc = hypermedia(
        "objects", "put", str(home / "in.bin"), "--mime", mime, "--json", url="", home=home
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["mime_type"] == stored


@pytest.mark.parametrize("scheme", ["postgresql", "mariadb"])
def test_a_server_that_takes_connections_but_never_answers_is_given_up(
    tmp_path: Path, scheme: str
) -> None:
    """A stopped server (SIGSTOP, a frozen VM) still takes TCP connections:
    every command waited on its handshake for as long as it stayed so.  Here
    a real socket listens and never answers."""
    import socket
    import time

    from hypermedia.db.driver import CONNECT_SECONDS

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    try:
        url = f"{scheme}://root@127.0.0.1:{silent.getsockname()[1]}/nothing"
        started = time.monotonic()
        proc = hypermedia(
            "jobs", "ls", url=url, home=tmp_path / "home", timeout=CONNECT_SECONDS * 6
        )
        took = time.monotonic() - started
    finally:
        silent.close()
    assert proc.returncode == FAILED, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert took < CONNECT_SECONDS * 4, took


def test_a_read_only_data_folder_is_named_and_not_waited_for() -> None:
    """In a folder its user cannot write (SQLite's -wal and -shm go beside the
    database), every command said "attempt to write a readonly database",
    naming nothing, and `serve` waited for it for ever."""
    import shutil
    import tempfile

    if not shutil.which("setpriv") or os.geteuid() != 0:
        pytest.skip("needs root and setpriv, to run as another user")
    root = Path(tempfile.mkdtemp(prefix="hm-ro-", dir="/tmp"))  # pytest's is root's only
    try:
        home = root / "home"
        assert hypermedia("db", "upgrade", url="", home=home).returncode == 0
        for path in (root, home, *home.iterdir()):
            os.chown(path, 65534, 65534)
        home.chmod(0o555)
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        for args in (
            ["jobs", "ls"],
            ["serve", "--port", str(free_port())],
            ["api", "--port", str(free_port())],
        ):
            done = subprocess.run(
                [*nobody, sys.executable, "-m", "hypermedia", *args],
                env=cli_env("", home),
                capture_output=True,
                text=True,
                timeout=60,
            )
            said = " ".join(done.stderr.split())
            assert done.returncode == FAILED, (args, said)
            if args[0] in ("serve", "api"):  # scratch, uploads, its key: named first
                assert f"HYPERMEDIA_HOME={home} is not writable" in said
            else:
                assert f"the SQLite database {home / 'hypermedia.db'} cannot be written" in said
            assert "Traceback" not in said
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_db_upgrade_says_each_step_as_it_starts(tmp_path: Path) -> None:
    """Its log was set to warnings only: a long step said nothing until the end."""
    proc = hypermedia("db", "upgrade", "0002", url="", home=tmp_path / "home")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        "INFO: Running upgrade  -> 0001, initial schema",
        "INFO: Running upgrade 0001 -> 0002, built-in profiles for the debug job types",
    ]
    assert proc.stdout.strip() == "database at revision 0002"

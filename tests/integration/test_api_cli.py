"""The API's command line, as real processes: tokens, ``serve``, ``api`` and ``jobs tail``.

Everything here runs on an embedded SQLite home (a plain tmp HYPERMEDIA_HOME):
what is tested is the processes and the HTTP surface, not the database.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.harness import cli_env, hypermedia, wait_for
from tests.integration._procs import _kill_child_group, tail
from tests.ports import free_port

TOKEN = re.compile(r"hm_[a-z2-7]{10}_[A-Za-z0-9_-]{20,}")

Spawn = Callable[..., tuple[subprocess.Popen[bytes], Path]]


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawn]:
    """Start ``hypermedia ARGS`` in the background (own session, output to a log).

    Teardown SIGKILLs whatever is still running: each process group, and the
    groups of the attempt children (they run in sessions of their own).
    """
    started: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(*args: str, home: Path, name: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = tmp_path / f"{name}-{len(started)}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "hypermedia", *args],
                env=cli_env("", home),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started.append((proc, log))
        return proc, log

    yield start
    for proc, log in started:
        if proc.poll() is None:
            kids: list[psutil.Process] = []
            with contextlib.suppress(psutil.NoSuchProcess):
                kids = psutil.Process(proc.pid).children(recursive=True)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            for kid in kids:
                _kill_child_group(kid.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        print(f"--- {log.name} (exit {proc.returncode}) ---\n{tail(log)}")


def _wait_http(proc: subprocess.Popen[bytes], log: Path, url: str, timeout: float = 30) -> None:
    def answers() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"exited with {proc.returncode}:\n{tail(log)}")
        try:
            return httpx.get(url, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(answers, timeout, interval=0.1, what=f"{url} answers 200")


def _stop(proc: subprocess.Popen[bytes], log: Path, timeout: float = 20) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"did not stop on SIGTERM:\n{tail(log)}") from None


def _ok(*args: str, home: Path, timeout: float = 60) -> str:
    done = hypermedia(*args, url="", home=home, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    return done.stdout


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# -- tokens and ``api`` --------------------------------------------------------------


def test_tokens_create_ls_revoke_and_the_api_command(tmp_path: Path, spawn: Spawn) -> None:
    home = tmp_path / "home"
    _ok("db", "upgrade", home=home)

    created = json.loads(
        _ok(
            "tokens",
            "create",
            "--project",
            "p1",
            "--scopes",
            "jobs:read,jobs:write",
            "--name",
            "ci",
            "--json",
            home=home,
        )
    )
    token = created["token"]
    assert TOKEN.fullmatch(token)
    assert created["project_id"] == "p1" and created["scopes"] == ["jobs:read", "jobs:write"]
    assert created["prefix"] == token[:13] and created["status"] == "active"
    assert "token_hash" not in created

    human = _ok("tokens", "create", "--project", "p1", "--scopes", "jobs:read", home=home)
    assert TOKEN.search(human), human  # shown once, in the human form too

    raw = _ok("tokens", "ls", "--json", home=home)
    listed = json.loads(raw)
    assert [t["token_id"] for t in listed] == [created["token_id"], created["token_id"] + 1]
    mine = listed[0]
    assert mine["prefix"] == created["prefix"] and mine["name"] == "ci"
    assert "token" not in mine and "token_hash" not in mine
    # Neither the secret nor anything shaped like a whole token is ever listed.
    assert token not in raw and not TOKEN.search(raw)
    assert not TOKEN.search(_ok("tokens", "ls", home=home))
    assert json.loads(_ok("tokens", "ls", "--project", "nope", "--json", home=home)) == []
    assert "p1" in {p["project_id"] for p in json.loads(_ok("projects", "ls", "--json", home=home))}

    bad = hypermedia("tokens", "create", "--project", "p1", "--scopes", "root", url="", home=home)
    assert bad.returncode == 2 and "scopes must be" in bad.stderr

    # ``api``: the HTTP API only; the token authenticates until it is revoked.
    port = free_port()
    proc, log = spawn("api", "--port", str(port), home=home, name="api")
    base = f"http://127.0.0.1:{port}"
    _wait_http(proc, log, f"{base}/healthz")
    auth = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base, timeout=10) as http:
        assert http.get("/healthz").json() == {"status": "ok"}
        assert http.get("/v1/jobs", headers=auth).status_code == 200

        revoked = json.loads(_ok("tokens", "revoke", str(created["token_id"]), "--json", home=home))
        assert revoked["revoked_at"] is not None and revoked["status"] == "revoked"
        refused = http.get("/v1/jobs", headers=auth)
        assert refused.status_code == 401, refused.text
        assert refused.json()["code"]

    listed = json.loads(_ok("tokens", "ls", "--project", "p1", "--json", home=home))
    assert [t["status"] for t in listed] == ["revoked", "active"]
    missing = hypermedia("tokens", "revoke", "999", url="", home=home)
    assert missing.returncode == 2 and "not found" in missing.stderr

    assert _stop(proc, log) == 0, tail(log)


# -- serve ---------------------------------------------------------------------------


def test_serve_first_start_token_runs_jobs_and_restarts_quietly(
    tmp_path: Path, spawn: Spawn
) -> None:
    home = tmp_path / "home"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc, log = spawn("serve", "--port", str(port), home=home, name="serve")
    _wait_http(proc, log, f"{base}/readyz")

    printed = TOKEN.findall(log.read_text())
    assert len(printed) == 1, tail(log)
    token = printed[0]
    token_file = home / "admin-token"
    assert token_file.read_text().strip() == token
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    text = log.read_text()
    assert str(token_file.resolve()) in text and "0600" in text
    assert "Running upgrade 0008 -> 0009" in text and "setup plugin" not in text
    for where in (f"{base}/v1", f"{base}/docs", f"{base}/ui", "curl "):
        assert where in text, text

    auth = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base, timeout=10) as http:
        assert http.get("/healthz").status_code == 200
        assert http.get("/readyz").status_code == 200
        assert http.post("/v1/jobs", json={"job_type": "debug.noop"}).status_code == 401
        created = http.post("/v1/jobs", json={"job_type": "debug.noop"}, headers=auth)
        assert created.status_code == 201, created.text
        job_id = created.json()["job_id"]

        def completed() -> bool:
            job = http.get(f"/v1/jobs/{job_id}", headers=auth)
            assert job.status_code == 200, job.text
            assert job.json()["status"] not in ("failed", "cancelled"), job.text
            return job.json()["status"] == "completed"

        wait_for(completed, 15, interval=0.2, what="the embedded workers complete the job")

    assert _stop(proc, log) == 0, tail(log)

    # A second start: the same token file, and no token printed.
    proc, log = spawn("serve", "--port", str(port), home=home, name="serve")
    _wait_http(proc, log, f"{base}/readyz")
    text = log.read_text()
    assert not TOKEN.search(text), text
    assert "alembic" not in text, text  # nothing to migrate, nothing said of it
    assert str(token_file.resolve()) in text
    assert token_file.read_text().strip() == token
    with httpx.Client(base_url=base, timeout=10) as http:
        assert http.get(f"/v1/jobs/{job_id}", headers=auth).json()["status"] == "completed"
    assert _stop(proc, log) == 0, tail(log)

    # No token file kept (the admin token made with `tokens create` before the
    # first start, or the file removed): the example no longer reads it.
    token_file.unlink()
    proc, log = spawn("serve", "--port", str(port), home=home, name="serve")
    _wait_http(proc, log, f"{base}/readyz")
    text = log.read_text()
    assert "admin token: none kept in this home" in text
    assert 'Bearer $TOKEN"' in text and "cat " not in text, text
    assert _stop(proc, log) == 0, tail(log)


# -- jobs tail -----------------------------------------------------------------------


def _submit(home: Path, params: dict[str, Any]) -> int:
    out = _ok("jobs", "submit", "debug.sleep", "--params", json.dumps(params), "--json", home=home)
    return int(json.loads(out)["job_ids"][0])


def _tail(home: Path, job_id: int, *more: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "hypermedia", "jobs", "tail", str(job_id), *more],
        env=cli_env("", home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"tail did not end:\n{out}\n{err}") from None
    assert "Traceback" not in err, err
    return proc.returncode, out, err


def test_jobs_tail_follows_to_the_end(tmp_path: Path, spawn: Spawn) -> None:
    home = tmp_path / "home"
    _ok("db", "upgrade", home=home)
    sleeper = _submit(home, {"ms": 1500})
    stepper = _submit(home, {"ms": 1500, "steps": 3})
    failing = _submit(home, {"fail": "CORRUPT_INPUT"})

    # The tails start while the jobs are still queued, so what they print
    # comes live: they must keep following until a worker has finished.
    human = _tail(home, sleeper)
    as_json = _tail(home, stepper, "--json")
    time.sleep(1.0)
    assert human.poll() is None and as_json.poll() is None
    # Live into a pipe too: the queued event's line is there before the job
    # ends (stdout to a pipe is block-buffered, and every line came at the end).
    assert as_json.stdout is not None
    ready, _, _ = select.select([as_json.stdout], [], [], 10)
    assert ready, "no line from `jobs tail --json` while the job waits"
    first = as_json.stdout.readline()
    assert json.loads(first)["to_status"] == "queued"
    spawn("worker", "--queues", "bulk", "--concurrency", "2", home=home, name="worker")

    started = time.monotonic()
    code, out, _ = _finish(human)
    assert code == 0, out
    assert "queued -> claimed" in out and "processing -> completed" in out
    assert f"job {sleeper} completed" in out
    assert time.monotonic() - started > 0.5  # it waited for the 1.5 s sleep

    code, out, _ = _finish(as_json)
    assert code == 0, out
    lines = _json_lines(first + out)
    events, end = lines[:-1], lines[-1]
    assert end["kind"] == "end" and end["status"] == "completed" and end["job_id"] == stepper
    ids = [e["event_id"] for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert events[0]["to_status"] == "queued" and events[-1]["to_status"] == "completed"
    assert [e["message"].split("%")[0] for e in events if e["kind"] == "progress"]

    code, out, _ = _finish(_tail(home, failing))
    assert code == 1, out
    assert f"job {failing} failed" in out and "CORRUPT_INPUT" in out
    code, out, _ = _finish(_tail(home, failing, "--json"))
    assert code == 1
    lines = _json_lines(out)
    assert lines[-1]["status"] == "failed" and lines[-1]["error_code"] == "CORRUPT_INPUT"
    assert any(e.get("to_status") == "failed" for e in lines[:-1])

    missing = hypermedia("jobs", "tail", "999999", url="", home=home)
    assert missing.returncode == 2 and "not found" in missing.stderr


def test_every_jobs_and_tokens_command_takes_json() -> None:
    import typer.core
    import typer.main

    from hypermedia.cli.main import app

    root = typer.main.get_command(app)
    assert isinstance(root, typer.core.TyperGroup)
    for group_name in ("jobs", "tokens", "projects"):
        group = root.commands[group_name]
        assert isinstance(group, typer.core.TyperGroup)
        for name, command in group.commands.items():
            opts = {o for p in command.params for o in p.opts}
            assert "--json" in opts, f"{group_name} {name}"


@pytest.mark.parametrize("command", ["serve", "api"])
def test_a_taken_port_is_refused_with_its_reason_before_the_banner(
    tmp_path: Path, command: str
) -> None:
    """`serve` printed its whole banner, a first admin token included, and
    then "could not start on 127.0.0.1:P", the reason left in uvicorn's log."""
    import socket

    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        home = tmp_path / "home"
        proc = hypermedia(command, "--port", str(port), url="", home=home, timeout=60)
    assert proc.returncode != 0, proc.stdout
    said = f"cannot listen on 127.0.0.1:{port}: Address already in use"
    assert said in proc.stderr, proc.stderr
    assert "hypermedia serving" not in proc.stdout and not TOKEN.search(proc.stdout), proc.stdout
    assert not (home / "admin-token").exists()

"""Findings of a QA pass over the CLI, each run as real ``hypermedia`` processes
on an embedded SQLite home:

* `queues resume imagse` said "resumed", made a row for the typo, and warned
  about nothing;
* `--base-url http://host/` made "…//v1/objects/…" (a 404), and any text
  ("javascript:alert(1)") was used as given;
* `jobs show` (text) never showed the job's outputs;
* `pools add` with a name in use exited 1, as if it might work later;
* `objects put <(cat a.jpg)` stored the file name "63";
* `process` copied a stream (`/dev/zero`) without limit before checking its size;
* `process` printed input names raw: ESC sequences, newlines, bidi overrides;
* docs/cli.md quoted a `db upgrade --wait` message the code never says;
* `serve --queues images,bulk` listed job types of queues it does not serve.
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.harness import answers_ready, cli_env, hypermedia, spawn, stop, wait_for
from tests.media import png
from tests.ports import free_port

pytestmark = pytest.mark.timeout(180)
USAGE, FAILED = 2, 1
DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated embedded home with one photo (its original object is ready)."""
    home = tmp_path_factory.mktemp("qa")
    assert hypermedia("db", "upgrade", url="", home=home).returncode == 0
    (home / "in.png").write_bytes(png(40, 30))
    return home


def _ok(*args: str, home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    done = hypermedia(*args, url="", home=home, timeout=120, **env)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def _json(*args: str, home: Path) -> Any:
    return json.loads(_ok(*args, "--json", home=home).stdout)


# -- queues resume ---------------------------------------------------------------


def test_resume_warns_about_a_name_nothing_knows_and_writes_nothing(home: Path) -> None:
    typo = hypermedia("queues", "resume", "imagse", url="", home=home)
    assert typo.returncode == 0, typo.stderr
    assert "warning: no pipeline, profile or job uses queue imagse (a typo?)" in typo.stderr
    assert typo.stdout.strip() == "queue imagse was not paused"
    listed = {r["queue_name"] for r in _json("queues", "ls", home=home)}
    assert "imagse" not in listed and "images" in listed  # no row for the typo
    row = _json("queues", "resume", "imagse", home=home)
    assert row == {"queue_name": "imagse", "paused": False, "updated_at": None}


def test_an_empty_job_listing_for_an_unknown_type_or_queue_says_so(home: Path) -> None:
    """`jobs ls --type image.thumb` listed nothing, as for a type with no jobs yet."""
    typo = _ok("jobs", "ls", "--type", "image.thumb", "--json", home=home)
    assert json.loads(typo.stdout) == []
    assert "warning: no pipeline runs job type image.thumb (a typo?); known: " in typo.stderr
    assert "image.thumbnail" in typo.stderr
    queue = _ok("jobs", "ls", "--queue", "imagse", home=home)
    assert "warning: no pipeline, profile or job uses queue imagse (a typo?)" in queue.stderr
    # A known name with no jobs yet, or a listing with rows: nothing said.
    assert (
        _ok("jobs", "ls", "--type", "pdf.preview", "--queue", "documents", home=home).stderr == ""
    )


def test_a_job_submitted_to_a_queue_nothing_uses_is_warned_of(home: Path) -> None:
    """`jobs submit --queue imagse` queued a job no worker would ever claim,
    and said nothing."""
    typo = _ok("jobs", "submit", "debug.noop", "--queue", "imagse", home=home)
    assert "warning: no pipeline, profile or job uses queue imagse (a typo?)" in typo.stderr
    assert typo.stdout.strip().endswith("queued")
    known = _ok("jobs", "submit", "debug.noop", "--queue", "images", home=home)
    assert known.stderr == ""
    again = _ok("jobs", "submit", "debug.noop", "--queue", "imagse", home=home)
    assert again.stderr == ""  # a job uses it now: said once
    bad = hypermedia("jobs", "submit", "debug.noop", "--queue", "BULK", url="", home=home)
    assert bad.returncode == 2 and "warning" not in bad.stderr  # refused, not warned of
    assert "a queue name has 1 to 50 characters" in bad.stderr


def test_resume_says_whether_the_queue_was_paused(home: Path) -> None:
    _ok("queues", "pause", "bulk", home=home)
    resumed = _ok("queues", "resume", "bulk", home=home)
    assert resumed.stdout.strip() == "queue bulk resumed" and resumed.stderr == ""
    again = _ok("queues", "resume", "bulk", home=home)
    assert again.stdout.strip() == "queue bulk was not paused" and again.stderr == ""
    bad = hypermedia("queues", "resume", "Bad Q", url="", home=home)
    assert bad.returncode == USAGE and "queue name" in bad.stderr


# -- --base-url ------------------------------------------------------------------


@pytest.fixture(scope="module")
def photo(home: Path) -> dict[str, Any]:
    return dict(_json("photos", "add", str(home / "in.png"), home=home))


@pytest.mark.parametrize(
    ("given", "prefix"),
    [
        ("http://127.0.0.1:18137/", "http://127.0.0.1:18137/v1/objects/"),
        ("https://media.example.com/hm//", "https://media.example.com/hm/v1/objects/"),
        ("http://[::1]:8000", "http://[::1]:8000/v1/objects/"),
    ],
)
def test_base_url_loses_its_trailing_slash(
    home: Path, photo: dict[str, Any], given: str, prefix: str
) -> None:
    link = _ok("objects", "url", str(photo["object_id"]), "--base-url", given, home=home)
    assert link.stdout.startswith(prefix), link.stdout
    shown = _json("photos", "show", photo["id"], "--base-url", given, home=home)
    urls = [shown["url"], *(o["url"] for o in shown["objects"].values())]
    assert urls and all(u.startswith(prefix) for u in urls), urls


def test_links_default_to_the_public_url(home: Path, photo: dict[str, Any]) -> None:
    public = {"HYPERMEDIA_PUBLIC_URL": "https://media.example.com/hm/"}
    link = _ok("objects", "url", str(photo["object_id"]), home=home, **public)
    assert link.stdout.startswith("https://media.example.com/hm/v1/objects/"), link.stdout
    assert "--base-url" not in link.stderr  # no "relative to the server" note
    args = ("objects", "url", str(photo["object_id"]), "--base-url", "http://h")
    given = _ok(*args, home=home, **public)
    assert given.stdout.startswith("http://h/v1/objects/")  # the option still wins


@pytest.mark.parametrize(
    "given",
    [
        "not a url",
        "javascript:alert(1)",
        "127.0.0.1:8000",
        "ftp://host",
        "http://",
        "http://host:99999",
        "http://host:0",
        "http://user:pw@host",
        "http://host/?q=1",
        "http://host/#top",
        "http://host/a b",
        "http://host/\x1b[31m",
    ],
)
def test_a_base_url_that_is_not_one_is_refused(
    home: Path, photo: dict[str, Any], given: str
) -> None:
    for args in (
        ("objects", "url", str(photo["object_id"])),
        ("photos", "show", photo["id"], "--json"),
    ):
        proc = hypermedia(*args, "--base-url", given, url="", home=home)
        assert proc.returncode == USAGE, proc.stdout + proc.stderr
        assert "error: --base-url takes http(s)://HOST[:PORT][/PATH]: " in proc.stderr
        assert proc.stdout == "" and "pw" not in proc.stderr


# -- jobs show -------------------------------------------------------------------


def test_jobs_show_lists_the_outputs(home: Path, tmp_path: Path) -> None:
    done = _ok(
        "process", str(home / "in.png"), "--profile", "image-thumbnail", "--out",
        str(tmp_path), "--json", home=home,
    )  # fmt: skip
    job_id = json.loads(done.stdout)["job_id"]
    (output,) = _json("jobs", "show", str(job_id), home=home)["outputs"]
    text = _ok("jobs", "show", str(job_id), home=home).stdout
    assert "outputs" in text
    row = next(line for line in text.splitlines() if "\u2502 thumb " in line)  # "│ thumb"
    cells = [c.strip() for c in row.split("\u2502")]
    expected = [str(output[k]) for k in ("object_id", "mime_type", "output_size_bytes")]
    assert cells[2:5] == expected, text


# -- pools add -------------------------------------------------------------------


def test_a_pool_name_in_use_is_a_usage_error(home: Path, tmp_path: Path) -> None:
    _ok("pools", "add", "archive", f"file://{tmp_path}/a", home=home)
    pool_id = next(p["pool_id"] for p in _json("pools", "ls", home=home) if p["name"] == "archive")
    for extra in ((), ("--no-check",)):
        again = hypermedia(
            "pools", "add", "archive", f"file://{tmp_path}/b", *extra, url="", home=home
        )
        assert again.returncode == USAGE, again.stderr
        assert f"error: pool {pool_id} 'archive' exists already" in again.stderr


# -- descriptor inputs -------------------------------------------------------------


def _through_descriptor(home: Path, args: list[str], fd: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hypermedia", *args],
        env=cli_env("", home),
        pass_fds=(fd,),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_descriptor_gives_no_file_name(home: Path, tmp_path: Path) -> None:
    """`<(cat a.jpg)` is /dev/fd/63: its object was named "63"."""
    read, write = os.pipe()
    os.write(write, b"from a pipe")
    os.close(write)
    try:
        piped = _through_descriptor(home, ["objects", "put", f"/dev/fd/{read}", "--json"], read)
    finally:
        os.close(read)
    assert piped.returncode == 0, piped.stderr
    row = json.loads(piped.stdout)
    assert (row["filename"], row["size"]) == ("stdin", len(b"from a pipe"))
    # A redirected regular file (`3< a.bin`) is read in place, and named alike.
    src = tmp_path / "a.bin"
    src.write_bytes(b"a regular file")
    with open(src, "rb") as f:
        args = ["objects", "put", f"/proc/self/fd/{f.fileno()}", "--json"]
        regular = _through_descriptor(home, args, f.fileno())
    assert regular.returncode == 0, regular.stderr
    row = json.loads(regular.stdout)
    assert (row["filename"], row["size"]) == ("stdin", src.stat().st_size)


def test_process_names_a_descriptor_input_stdin(home: Path, tmp_path: Path) -> None:
    read, write = os.pipe()
    os.write(write, b"copy me")
    os.close(write)
    out = tmp_path / "out"
    args = ["process", f"/dev/fd/{read}", "--profile", "debug-copy", "--out", str(out), "--json"]
    try:
        done = _through_descriptor(home, args, read)
    finally:
        os.close(read)
    assert done.returncode == 0, done.stderr
    (written,) = json.loads(done.stdout)["outputs"]
    assert Path(written).name == "stdin.copy.bin" and Path(written).read_bytes() == b"copy me"


def test_a_dash_reads_stdin(home: Path, tmp_path: Path) -> None:
    """`cat a.jpg | hypermedia objects put -`, as documented: Typer refused
    `-` as a file that does not exist."""
    image = tmp_path / "a.png"
    image.write_bytes(png(40, 30))

    def piped(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "hypermedia", *args],
            env=cli_env("", home),
            input=image.read_bytes().decode("latin-1"),
            encoding="latin-1",
            capture_output=True,
            timeout=120,
        )

    put = piped("objects", "put", "-", "--json")
    assert put.returncode == 0, put.stderr
    assert (json.loads(put.stdout)["filename"], json.loads(put.stdout)["size"]) == (
        "stdin",
        image.stat().st_size,
    )
    photo = piped("photos", "add", "-", "--json")
    assert photo.returncode == 0, photo.stderr
    assert (json.loads(photo.stdout)["width"], json.loads(photo.stdout)["height"]) == (40, 30)
    out = tmp_path / "out"
    done = piped("process", "-", "--profile", "debug-copy", "--out", str(out), "--json")
    assert done.returncode == 0, done.stderr
    (written,) = json.loads(done.stdout)["outputs"]
    assert Path(written).read_bytes() == image.read_bytes()
    twice = piped("objects", "put", "-", "-")  # the second would be an empty stdin
    assert twice.returncode == USAGE and "can be given once" in twice.stderr, twice.stderr
    twice = piped("objects", "put", "-", "/dev/stdin")  # stdin by another name
    assert twice.returncode == USAGE and "can be given once" in twice.stderr, twice.stderr
    # A file that is not there is still refused before anything is done.
    gone = hypermedia("objects", "put", str(tmp_path / "gone.bin"), url="", home=home)
    assert gone.returncode == USAGE and "does not" in gone.stderr, gone.stderr  # rich wraps


# -- process: a stream past max_input_bytes ---------------------------------------------


def _small_profile(home: Path) -> str:
    key = "small-copy"
    if hypermedia("profiles", "show", key, url="", home=home).returncode != 0:
        _ok(
            "profiles", "create", key, "--type", "debug.copy", "--max-input-bytes", "1000000",
            home=home,
        )  # fmt: skip
    return key


def _limit_file_size() -> None:
    # Without the limit on the copy, /dev/zero fills the disk: the child stops at 64 MB.
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 20, 64 << 20))


def test_process_reads_a_device_no_further_than_the_profile_takes(
    home: Path, tmp_path: Path
) -> None:
    zero = tmp_path / "zero.png"
    zero.symlink_to("/dev/zero")
    key = _small_profile(home)
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "hypermedia", "process", str(zero), "--profile", key,
         "--out", str(tmp_path / "out")],
        env=cli_env("", home),
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_limit_file_size,
    )  # fmt: skip
    assert proc.returncode == USAGE, proc.stderr
    said = f"error: zero.png is larger than profile {key}:v1 accepts (more than 1000000 bytes"
    assert said in proc.stderr and time.monotonic() - started < 60


def test_process_stops_reading_a_fifo_past_the_limit(home: Path, tmp_path: Path) -> None:
    """The writer of a FIFO sees the read end close once the limit is passed."""
    fifo = tmp_path / "big.bin"
    os.mkfifo(fifo)
    written = [0]

    def feed() -> None:
        chunk = b"\0" * 65536
        try:
            with open(fifo, "wb") as f:
                while written[0] < 50_000_000:
                    f.write(chunk)
                    written[0] += len(chunk)
        except BrokenPipeError:
            pass

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    key = _small_profile(home)
    proc = hypermedia("process", str(fifo), "--profile", key, url="", home=home)
    writer.join(30)
    assert proc.returncode == USAGE and "is larger than profile" in proc.stderr, proc.stderr
    assert written[0] < 5_000_000  # about the limit: the rest was never read


# -- process: input names, escaped --------------------------------------------------


def test_process_escapes_the_input_names_it_prints(home: Path, tmp_path: Path) -> None:
    names = ["nl\nfake: completed.bin", "e\x1b[31mred\u202egnp.bin"]
    for n in names:
        (tmp_path / n).write_bytes(b"x")
    args = ["process", *(str(tmp_path / n) for n in names), "--profile", "debug-copy"]
    # FORCE_COLOR: Rich takes stderr for a terminal, and draws the progress bars.
    done = _ok(*args, "--out", str(tmp_path / "out"), home=home, FORCE_COLOR="1")
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith(str(tmp_path)) for line in lines), lines
    assert "nl\\nfake: completed.bin: completed (job" in lines[0]
    assert "e\\x1b[31mred\\u202egnp.bin: completed (job" in lines[1]
    for stream in (done.stdout, done.stderr):
        assert "\u202e" not in stream and "\x1b[31mred" not in stream
        assert "\nfake: completed" not in stream
    assert "e\\x1b[31mred\\u202egnp.bin" in done.stderr  # the progress bar's label


# -- db upgrade --wait: the documented message ---------------------------------------


def test_db_upgrade_wait_says_what_the_docs_quote(tmp_path: Path) -> None:
    url = f"postgresql://nobody@127.0.0.1:{free_port()}/none"
    proc = hypermedia("db", "upgrade", "--wait", "0.5", url=url, home=tmp_path)
    assert proc.returncode == FAILED
    said = "error: the database was not ready within 0.5 s: "
    assert proc.stderr.splitlines()[-1].startswith(said), proc.stderr
    docs = " ".join(DOCS.read_text().split())
    assert "`error: the database was not ready within 60 s:" in docs
    assert "did not answer within" not in docs


# -- serve: the banner's job types ----------------------------------------------------


def test_serve_lists_the_job_types_of_its_queues_only(tmp_path: Path) -> None:
    home, log, port = tmp_path / "home", tmp_path / "serve.log", free_port()
    args = ("serve", "--port", str(port), "--queues", "images,bulk", "-c", "1")
    server = spawn(*args, url="", home=home, log=log)
    try:  # ready: the banner is out, and SIGTERM is the drain (not death) by then
        wait_for(lambda: answers_ready(f"http://127.0.0.1:{port}"), 30, what="serve is ready")
    finally:
        assert stop(server) == 0, log.read_text()[-2000:]
    banner = re.search(r"hypermedia serving: .*", log.read_text())
    assert banner is not None, log.read_text()[-2000:]
    assert "queues images,bulk" in banner[0] and "image.thumbnail" in banner[0], banner[0]
    assert "debug.noop" in banner[0] and "pdf.preview" not in banner[0], banner[0]


def test_serve_refuses_a_bad_queue_before_doing_anything(tmp_path: Path) -> None:
    home = tmp_path / "home"
    proc = hypermedia("serve", "--queues", "Bad Q", url="", home=home)
    assert proc.returncode == USAGE and "queue name" in proc.stderr, proc.stderr
    assert not home.exists() and proc.stdout == ""


def test_a_stream_staged_by_a_killed_command_is_removed_by_the_next(
    home: Path, tmp_path: Path
) -> None:
    """`… | objects put -` killed with -9 left its staged copy in TMPDIR for
    good (48 MB each in the report): held now, and swept by the next stager."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = cli_env("", home, TMPDIR=str(tmpdir))
    proc = subprocess.Popen(
        [sys.executable, "-m", "hypermedia", "objects", "put", "-"],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stdin is not None
    proc.stdin.write(b"x" * (1 << 20))  # and the stream stays open
    proc.stdin.flush()
    parent = tmpdir / f"hypermedia-stdin-{os.getuid()}"

    def staged() -> list[Path]:
        return [p for p in parent.glob("*/*/stdin") if p.stat().st_size >= 1 << 20]

    try:
        assert wait_for(lambda: bool(staged()), 30), "nothing staged"
    finally:
        proc.kill()
        proc.wait()
        proc.stdin.close()
    (left,) = [p.parents[1] for p in staged()]
    os.utime(left / ".owner", (time.time() - 60,) * 2)  # past the age a sweep needs
    put = subprocess.run(
        [sys.executable, "-m", "hypermedia", "objects", "put", "-", "--json"],
        env=env, input=b"y" * 100, capture_output=True, timeout=120,
    )  # fmt: skip
    assert put.returncode == 0, put.stderr
    assert json.loads(put.stdout)["size"] == 100
    assert not left.exists()
    assert list(parent.iterdir()) == []  # its own staging went with it


# -- serve and worker: signals once the stop is under way --------------------------


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_signals_after_the_drain_do_not_kill_the_stopping_process(
    tmp_path: Path, command: str
) -> None:
    """Python puts the default handlers back as it finalizes: a second
    SIGTERM in the last half second of a stop killed `serve` by the signal
    (-15) where the docs promise exit 0."""
    home, log, port = tmp_path / "home", tmp_path / f"{command}.log", free_port()
    args = ["serve", "--port", str(port)] if command == "serve" else ["worker"]
    if command == "worker":  # (serve migrates the embedded database itself)
        assert hypermedia("db", "upgrade", url="", home=home).returncode == 0
    proc = spawn(*args, "-c", "1", url="", home=home, log=log)
    try:
        if command == "serve":
            wait_for(lambda: answers_ready(f"http://127.0.0.1:{port}"), 30, what="serve is ready")
        else:
            wait_for(lambda: "concurrency 1" in log.read_text(), 30, what="the worker runs")
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: " stopped" in log.read_text(), 20, what="the worker drained")
        while proc.poll() is None:  # every moment of the rest of the stop
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.01)
    finally:
        code = stop(proc)
    assert code == 0, log.read_text()[-2000:]


def test_serve_takes_the_stop_signals_before_it_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGTERM just after the first ready answer, before the worker had
    started, killed `serve` by the signal (-15) where the docs promise a drain
    and exit 0: the worker's handlers are in place before the server starts."""
    from typer.testing import CliRunner

    from hypermedia.api import server
    from hypermedia.cli import main
    from hypermedia.errors import HypermediaError
    from hypermedia.worker.runner import Worker

    seen: list[Any] = []

    def start_in_thread(*_args: Any, **_kwargs: Any) -> None:
        seen.append(signal.getsignal(signal.SIGTERM))
        raise HypermediaError("not started: the test had its look")

    monkeypatch.setattr(server, "start_in_thread", start_in_thread)
    monkeypatch.setattr(main, "setup_logging", lambda _verbose: None)  # (needs a real stderr)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    env = {"HYPERMEDIA_HOME": str(tmp_path / "home"), "HYPERMEDIA_DATABASE_URL": ""}
    try:
        result = CliRunner().invoke(main.app, ["serve", "--port", str(free_port())], env=env)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    assert result.exit_code == 1 and "the test had its look" in result.output, result.output
    assert [getattr(h, "__func__", None) for h in seen] == [Worker._on_signal]


def test_a_worker_stopped_before_it_registers_says_so(tmp_path: Path) -> None:
    """A SIGTERM while the worker waited for its database ended it with no
    line: whoever waits for "stopped" in the log waited in vain."""
    home, log = tmp_path / "home", tmp_path / "worker.log"
    # A database that never answers: the worker waits for it until told to stop.
    proc = spawn("worker", url=f"postgresql://127.0.0.1:{free_port()}/none", home=home, log=log)
    try:
        wait_for(lambda: "waiting for it" in log.read_text(), 30, what="the worker waits")
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: proc.poll() is not None, 20, what="the worker ended")
    finally:
        code = stop(proc)
    assert code == 0 and "stopped before it started" in log.read_text(), log.read_text()

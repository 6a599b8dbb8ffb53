"""What the CLI prints is printed as it is: brackets in reasons, errors and
names are text, not Rich markup.  Redaction's own markers ("[path]",
"[token]") used to vanish from every line, and a name like "a [red]b" took
a colour instead of its characters.  Real CLI processes, the embedded default."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import sqlalchemy as sa

from hypermedia.db.driver import Driver
from tests.harness import cli_env, fill_disk, hypermedia, small_tmpfs


def _stored(tmp_path: Path, size: int) -> tuple[Path, Path, str]:
    """A migrated embedded home holding one object of ``size`` random bytes:
    the home, the file it was stored from, and the object's id."""
    home = tmp_path / "home"
    blob = tmp_path / "blob.bin"
    blob.write_bytes(os.urandom(size))
    assert hypermedia("db", "upgrade", url="", home=home).returncode == 0
    put = hypermedia("objects", "put", str(blob), "--json", url="", home=home)
    assert put.returncode == 0, put.stderr
    return home, blob, str(json.loads(put.stdout)["object_id"])


def _run_into(out: IO[bytes], home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A CLI command run to its end with its stdout on ``out``."""
    return subprocess.run(
        [sys.executable, "-m", "hypermedia", *args],
        env=cli_env("", home),
        stdout=out,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
    )


def test_a_reason_keeps_its_brackets(tmp_path: Path) -> None:
    home = tmp_path / "home"
    url = f"sqlite:///{home / 'hypermedia.db'}"
    assert hypermedia("db", "upgrade", url=url, home=home).returncode == 0
    done = hypermedia("jobs", "submit", "debug.noop", "--queue", "idle", url=url, home=home)
    assert done.returncode == 0, done.stderr
    assert hypermedia("jobs", "cancel", "1", url=url, home=home).returncode == 0
    reason = "could not read [path]: [token] refused [red]x[/]"
    driver = Driver(url)
    try:
        with driver.tx() as tx:
            q = sa.text("UPDATE processing_jobs SET safe_reason = :r, error_code = 'CANCELLED'")
            tx.conn.execute(q, {"r": reason})
    finally:
        driver.dispose()
    shown = hypermedia("jobs", "show", "1", url=url, home=home)
    assert shown.returncode == 0, shown.stderr
    assert reason in " ".join(shown.stdout.split()), shown.stdout


def test_an_error_line_keeps_the_redacted_path(tmp_path: Path) -> None:
    # A command that makes the database, in a folder no folder can be made in
    # (a HYPERMEDIA_HOME that cannot be made is named, before).
    url = "sqlite:////proc/hm-no-such/home/hypermedia.db"
    done = hypermedia("db", "upgrade", url=url, home=tmp_path)
    assert done.returncode == 1
    said = " ".join(done.stderr.split())
    assert said.startswith("error: ") and "[path]" in said, said
    assert "/proc/hm-no-such" not in said


def test_piped_tables_are_not_cut_to_80_columns(tmp_path: Path) -> None:
    """Captured (not a terminal), a table cell is whole: `jobs ls | grep completed`
    found nothing when cells were cut to "comple…"."""
    home = tmp_path / "home"
    assert hypermedia("db", "upgrade", url="", home=home).returncode == 0
    for _ in range(3):
        assert hypermedia("jobs", "submit", "debug.sleep", url="", home=home).returncode == 0
    listed = hypermedia("jobs", "ls", url="", home=home)
    assert listed.returncode == 0
    rows = [line for line in listed.stdout.splitlines() if "debug.sleep" in line]
    assert len(rows) == 3 and all("queued" in r for r in rows), listed.stdout
    error = hypermedia("jobs", "show", "999999", url="", home=home)
    assert error.stderr.count("\n") == 1, error.stderr  # one line, as the docs say


def test_a_stream_is_stored_whole(tmp_path: Path) -> None:
    """`cat x | hypermedia objects put /dev/stdin` stored an empty object (the
    ledger reads its input twice) and said nothing: now the bytes, all of them."""
    home = tmp_path / "home"
    assert hypermedia("db", "upgrade", url="", home=home).returncode == 0
    data = bytes(range(256)) * 1000
    env = cli_env("", home)
    put = subprocess.run(
        [sys.executable, "-m", "hypermedia", "objects", "put", "/dev/stdin", "--json"],
        env=env,
        input=data,
        capture_output=True,
        timeout=60,
    )
    assert put.returncode == 0, put.stderr
    row = json.loads(put.stdout)
    assert row["size"] == len(data) and row["filename"] == "stdin"
    back = subprocess.run(
        [sys.executable, "-m", "hypermedia", "objects", "get", str(row["object_id"])],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert back.returncode == 0 and back.stdout == data


def test_get_writes_into_a_pipe_or_through_a_symlink(tmp_path: Path) -> None:
    """Renaming the checked download over -o replaced a FIFO, /dev/full or a
    symlink with a plain file."""
    home = tmp_path / "home"
    assert hypermedia("db", "upgrade", url="", home=home).returncode == 0
    src = tmp_path / "in.bin"
    src.write_bytes(b"the object's bytes")
    put = hypermedia("objects", "put", str(src), "--json", url="", home=home)
    oid = str(json.loads(put.stdout)["object_id"])
    # Through a symlink: the file it points to gets the bytes, the link stays.
    target, link = tmp_path / "target.bin", tmp_path / "link.bin"
    target.write_bytes(b"old")
    link.symlink_to(target)
    assert hypermedia("objects", "get", oid, "-o", str(link), url="", home=home).returncode == 0
    assert link.is_symlink() and target.read_bytes() == b"the object's bytes"
    # Into a FIFO: a reader gets the bytes, and the FIFO is still one.
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    done = hypermedia("objects", "get", oid, "-o", str(fifo), url="", home=home)
    reader.join(10)
    assert done.returncode == 0, done.stderr
    assert got == [b"the object's bytes"] and stat.S_ISFIFO(fifo.stat().st_mode)
    # A folder, or a folder that is not there: a clear refusal.
    for bad, said in ((tmp_path, "names a folder"), (tmp_path / "no" / "x", "does not exist")):
        refused = hypermedia("objects", "get", oid, "-o", str(bad), url="", home=home)
        assert refused.returncode == 2 and said in refused.stderr, refused.stderr
    # A folder no file can be made in: exit 2 in words, not a PermissionError.
    refused = hypermedia("objects", "get", oid, "-o", "/proc/x.bin", url="", home=home)
    said = " ".join(refused.stderr.split())
    assert refused.returncode == 2, said
    assert "error: -o cannot be written to: No such file or directory" in said


def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(tmp_path: Path) -> None:
    """`jobs ls --json | head -1`: the reader gone, the command said
    "error: BrokenPipeError" instead of ending as other tools do."""
    home = tmp_path / "home"
    assert hypermedia("db", "upgrade", url="", home=home).returncode == 0
    read, write = os.pipe()
    os.close(read)  # every write to stdout fails with EPIPE
    try:
        done = subprocess.run(
            [sys.executable, "-m", "hypermedia", "profiles", "ls", "--json"],
            env=cli_env("", home),
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write)
    assert done.returncode == 1
    assert "BrokenPipe" not in done.stderr and "error" not in done.stderr, done.stderr


def test_a_reader_that_leaves_mid_output_ends_the_command_with_1(tmp_path: Path) -> None:
    """`jobs ls | head -2`: CPython hands a large write to the pipe in one
    call and drops what the departed reader did not take, without an error:
    the command exited 0, its output cut short."""
    home = tmp_path / "home"
    assert hypermedia("db", "upgrade", url="", home=home).returncode == 0
    made = hypermedia("jobs", "submit", "debug.noop", "--count", "300", url="", home=home)
    assert made.returncode == 0, made.stderr
    for args in (["jobs", "ls", "--limit", "300", "--json"], ["jobs", "ls", "--limit", "300"]):
        read, write = os.pipe()
        fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, 4096)  # the output is ten times that
        proc = subprocess.Popen(
            [sys.executable, "-m", "hypermedia", *args],
            env=cli_env("", home),
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
        )
        os.close(write)
        assert os.read(read, 1)
        os.close(read)  # the reader leaves while the command still writes
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 1, (args, err)
        assert err == "", err


def test_stdout_on_a_full_disk_is_an_error_not_a_short_file(tmp_path: Path) -> None:
    """`objects get ID > file` on a disk that fills: CPython's buffered writer
    dropped what the kernel did not take of a large write, without an error,
    and the command exited 0 with the file cut short."""
    home, _, object_id = _stored(tmp_path, 600_000)
    assert (
        hypermedia("jobs", "submit", "debug.noop", "--count", "2000", url="", home=home).returncode
        == 0
    )
    with small_tmpfs(tmp_path / "disk", 1) as disk:
        fill_disk(disk, 300_000)  # room for half the blob
        for args in (["objects", "get", object_id], ["jobs", "ls", "--limit", "2000", "--json"]):
            target = disk / "out"
            with open(target, "wb") as out:
                done = _run_into(out, home, *args)
            assert done.returncode == 1, (args, done.stderr)
            assert "the output could not be written: No space left on device" in done.stderr
            assert "Traceback" not in done.stderr
            target.unlink()
        # -o: named, and no file under the name (it was "OSError: [Errno 28]"; a
        # buffered write could also drop a last chunk's rest and leave it cut short).
        got = hypermedia("objects", "get", object_id, "-o", str(disk / "o.bin"), url="", home=home)
        assert got.returncode == 1, got.stderr
        assert "-o could not be written: No space left on device" in got.stderr, got.stderr
        assert not (disk / "o.bin").exists()
        assert not [p for p in disk.iterdir() if p.name.endswith(".part")]


def test_sigterm_during_a_download_leaves_no_part_file(tmp_path: Path) -> None:
    """`timeout 2 hypermedia objects get 1 -o big.bin`: SIGTERM at its default
    left a ".hypermedia-get-….part" of half a gigabyte in the user's folder."""
    home, blob, object_id = _stored(tmp_path, 96 << 20)
    blob.unlink()
    for attempt in range(5):  # a download that ended between two looks: again
        out = tmp_path / f"got{attempt}"
        out.mkdir()
        proc = subprocess.Popen(
            [sys.executable, "-m", "hypermedia", "objects", "get", object_id, "-o", str(out / "b")],
            env=cli_env("", home),
            stderr=subprocess.PIPE,
            text=True,
        )
        while proc.poll() is None and not any(p.suffix == ".part" for p in out.iterdir()):
            time.sleep(0.002)
        if proc.poll() is None:
            break
        proc.communicate()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert list(out.iterdir()) == [], "no part file, no file under the name"


def test_sigterm_as_the_part_file_is_made_leaves_none(tmp_path: Path) -> None:
    """The signal landing just after the part was made, before its name was
    kept for the clean-up (the test above, now and then, in CI): held until
    the part is named, then taken, and the part removed."""
    home, _, object_id = _stored(tmp_path, 4096)
    out = tmp_path / "got"
    out.mkdir()
    code = (
        "import os, signal, sys, tempfile\n"
        "real = tempfile.mkstemp\n"
        "def made(*a, **k):\n"
        "    got = real(*a, **k)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return got\n"
        "tempfile.mkstemp = made\n"
        "sys.argv = ['hypermedia', *sys.argv[1:]]\n"
        "from hypermedia.cli.main import main\n"
        "main()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "objects", "get", object_id, "-o", str(out / "b")],
        env=cli_env("", home),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 130, done.stderr
    assert list(out.iterdir()) == [], "no part file, no file under the name"


def test_a_small_output_refused_by_stdout_is_one_line_and_exit_1(tmp_path: Path) -> None:
    """`objects get ID > /dev/full` of a blob smaller than the write buffer:
    refused at the flush as the command ended, then again at the interpreter's
    exit, with "Exception ignored … OutputFailed" and exit 120."""
    home, _, object_id = _stored(tmp_path, 5000)
    for args in (["objects", "get", object_id], ["jobs", "ls"], ["objects", "ls", "--json"]):
        with open("/dev/full", "wb") as full:
            done = _run_into(full, home, *args)
        assert done.returncode == 1, (args, done.stderr)
        assert done.stderr == "error: the output could not be written: No space left on device\n"


def test_a_part_file_left_by_a_killed_download_is_removed_by_the_next(tmp_path: Path) -> None:
    """kill -9 of `objects get -o` left its ".hypermedia-get-….part" (744 MB in
    the report) in the user's folder for good; a later get left it there too."""
    home, blob, object_id = _stored(tmp_path, 96 << 20)
    out = tmp_path / "out"
    out.mkdir()
    for _ in range(5):  # a download that ended between two looks: again
        proc = subprocess.Popen(
            [sys.executable, "-m", "hypermedia", "objects", "get", object_id, "-o", str(out / "b")],
            env=cli_env("", home),
        )
        while proc.poll() is None and not any(p.suffix == ".part" for p in out.iterdir()):
            time.sleep(0.002)
        proc.kill()
        proc.wait()
        parts = [p for p in out.iterdir() if p.suffix == ".part"]
        if parts:
            break
        for p in out.iterdir():
            p.unlink()
    assert parts, "no download was caught mid-way"
    for p in parts:
        os.utime(p, (time.time() - 60,) * 2)  # past the age a sweep needs
    again = hypermedia("objects", "get", object_id, "-o", str(out / "c"), url="", home=home)
    assert again.returncode == 0, again.stderr
    assert [p.name for p in out.iterdir() if p.suffix == ".part"] == []
    assert (out / "c").read_bytes() == blob.read_bytes()


def test_a_change_whose_output_cannot_be_written_is_said_or_undone(tmp_path: Path) -> None:
    """`tokens create > /dev/full` left an active admin token nobody ever saw;
    `jobs submit` and `objects put` said only that the output failed, and a
    user who ran them again (exit 1 invites it) queued and stored twice."""
    home, blob, _ = _stored(tmp_path, 64)
    with open("/dev/full", "wb") as full:
        made = _run_into(full, home, "tokens", "create", "-p", "p1", "-s", "admin", "--name", "x")
        queued = _run_into(full, home, "jobs", "submit", "debug.noop")
        stored = _run_into(full, home, "objects", "put", str(blob))
    for done in (made, queued, stored):
        assert done.returncode == 1 and "No space left on device" in done.stderr, done.stderr
    assert "token 1 revoked: its secret could not be shown" in made.stderr, made.stderr
    tokens = json.loads(hypermedia("tokens", "ls", "--json", url="", home=home).stdout)
    assert [t["status"] for t in tokens] == ["revoked"], tokens
    assert "(job 1 queued)" in queued.stderr, queued.stderr
    assert "(object 2 stored)" in stored.stderr, stored.stderr

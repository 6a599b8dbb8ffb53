"""``hypermedia process``, ``profiles`` and ``credits`` as real subprocesses, with a
real ``hypermedia worker --burst`` running the jobs, or the worker ``process``
runs itself when none serves their queue."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from hypermedia.db.driver import Driver
from hypermedia.pipelines import registry
from hypermedia.storage.ledger import Storage
from tests.harness import cli_env, hypermedia
from tests.integration._procs import Procs, eventually, sqlite_only, tail
from tests.media import png

pytestmark = pytest.mark.timeout(180)
IN_CI = os.environ.get("CI", "").lower() == "true"


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Run:
    """A ``hypermedia process`` running in the background, its stdout and stderr kept apart."""

    def __init__(self, procs: Procs, *args: str, **env: str) -> None:
        self.out = procs.home / f"process-{uuid.uuid4().hex[:6]}.out"
        self.err = self.out.with_suffix(".err")
        procs.home.mkdir(parents=True, exist_ok=True)
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "hypermedia", "process", *args],
                env=cli_env(procs.url, procs.home, **env),
                stdout=out,
                stderr=err,
                start_new_session=True,
                # As from a terminal: pytest-xdist's workers ignore SIGINT, a
                # child inherits that, and Python then installs no Ctrl-C handler.
                preexec_fn=_sigint_default,
            )

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise AssertionError(f"process did not finish:\n{tail(self.err)}") from None

    def records(self) -> list[dict[str, Any]]:
        lines = self.out.read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]


def _jobs(procs: Procs) -> int:
    return int(procs.query("SELECT COUNT(*) FROM processing_jobs")[0][0])


def _burst(procs: Procs, queues: str) -> None:
    """Run ``hypermedia worker --burst`` until it exits by itself."""
    proc = procs.spawn(
        "worker", "--queues", queues, "--concurrency", "2", "--no-maintenance", "--burst"
    )
    code = proc.wait(90)
    assert code == 0, f"the worker exited with {code}:\n{tail(procs._procs[-1][1])}"


def _run_with_worker(procs: Procs, n_jobs: int, queues: str, *args: str) -> Run:
    run = Run(procs, *args, "--no-run-here")  # the worker below runs the jobs
    eventually(lambda: _jobs(procs) >= n_jobs or run.proc.poll() is not None, 60, "jobs enqueued")
    assert run.proc.poll() is None, tail(run.err)
    _burst(procs, queues)
    return run


def _stored(storage: Storage, object_id: int) -> bytes:
    with storage.open(object_id) as f:
        return f.read()


def _has_schema(job_type: str) -> bool:
    return job_type in registry.known() and registry.get(job_type).schema is not None


def _outputs(driver: Driver, job_id: int) -> list[dict[str, Any]]:
    with driver.read() as tx:
        return tx.outputs(job_id)


def test_process_copies_files_through_a_worker(
    driver: Driver, storage: Storage, procs: Procs, tmp_path: Path
) -> None:
    inputs = []
    for i, size in enumerate((10, 70_000, 1_500_000)):
        inputs.append(tmp_path / "in" / f"file{i}.dat")
        inputs[-1].parent.mkdir(exist_ok=True)
        inputs[-1].write_bytes(os.urandom(size))
    out = tmp_path / "out"
    run = _run_with_worker(
        procs, 3, "bulk", *map(str, inputs), "--profile", "debug-copy", "--out", str(out), "--json"
    )
    assert run.wait() == 0, tail(run.err)
    records = run.records()
    assert [r["input"] for r in records] == [str(p) for p in inputs]
    for path, r in zip(inputs, records, strict=True):
        assert (r["status"], r["error_code"], r["safe_reason"]) == ("completed", None, None)
        assert r["outputs"] == [str(out / f"{path.stem}.copy.bin")]
        written = Path(r["outputs"][0]).read_bytes()
        assert written == path.read_bytes()
        [o] = _outputs(driver, r["job_id"])
        assert o["profile_version"] == "debug-copy:v1"
        assert written == _stored(storage, o["object_id"])
    assert not list(out.glob(".*"))  # no temporary files left behind


@sqlite_only
def test_a_failing_input_makes_exit_1_with_its_error_code(
    driver: Driver, storage: Storage, procs: Procs, tmp_path: Path
) -> None:
    try:
        import pyvips  # noqa: F401
    except Exception as exc:  # ImportError, or OSError without libvips
        if IN_CI:
            raise
        pytest.skip(f"pyvips/libvips is not available ({exc})")
    good, bad = tmp_path / "holiday.png", tmp_path / "notes.png"
    good.write_bytes(png(64, 48))
    bad.write_bytes(b"these are not pixels\n" * 20)
    out = tmp_path / "thumbs"
    args = (str(good), str(bad), "--profile", "image-thumbnail", "--out", str(out), "--json")
    run = _run_with_worker(procs, 2, "images", *args)
    assert run.wait() == 1, tail(run.err)
    ok, failed = run.records()
    assert (ok["input"], ok["status"], ok["error_code"]) == (str(good), "completed", None)
    [o] = _outputs(driver, ok["job_id"])
    ext = Path(o["output_key"]).suffix
    assert ok["outputs"] == [str(out / f"holiday.{o['output_type']}{ext}")]
    assert Path(ok["outputs"][0]).read_bytes() == _stored(storage, o["object_id"])
    assert (failed["input"], failed["status"]) == (str(bad), "failed")
    assert failed["error_code"] == "UNSUPPORTED_FORMAT" and failed["safe_reason"]
    assert failed["outputs"] == []
    assert str(tmp_path) not in json.dumps(failed["safe_reason"])


@sqlite_only
def test_the_timeout_stops_the_worker_process_ran_at_once(procs: Procs, tmp_path: Path) -> None:
    """The worker `process` runs itself was drained when --wait-timeout
    ended the wait: the command overran by up to 30 s, and reported a job
    that finished meanwhile as completed."""
    src = tmp_path / "a.bin"
    src.write_bytes(b"x" * 100)
    started = time.monotonic()
    done = hypermedia(
        "process", str(src), "--profile", "debug-sleep", "--params", '{"ms": 20000}',
        "--wait-timeout", "2", "--concurrency", "1", "--json",
        "--out", str(tmp_path / "out"), url=procs.url, home=procs.home, timeout=60,
    )  # fmt: skip
    took = time.monotonic() - started
    assert done.returncode == 1, done.stderr
    assert took < 15, took  # 2 s of wait, then a kill: not the 20 s sleep
    [r] = [json.loads(line) for line in done.stdout.splitlines()]
    assert r["status"] in ("retry_wait", "queued"), r
    assert "not finished within 2s; the job goes on" in r["safe_reason"]


@sqlite_only
def test_when_its_own_worker_ends_the_wait_ends_too(procs: Procs, tmp_path: Path) -> None:
    """Its worker drained (or dead of an error) with a job still queued:
    `process` waited out its whole --wait-timeout for a job nobody would run."""
    inputs = [tmp_path / f"{n}.bin" for n in "abc"]
    for path in inputs:
        path.write_bytes(path.stem.encode())
    # Three of 4 s on one lane: however late the drain comes in the first
    # job's run, at least the third is still queued when the worker ends.
    run = Run(
        procs, *map(str, inputs), "--profile", "debug-sleep", "--params", '{"ms": 4000}',
        "--concurrency", "1", "--wait-timeout", "300", "--json", "--out", str(tmp_path / "out"),
    )  # fmt: skip
    eventually(
        lambda: ("processing",) in procs.query("SELECT status FROM processing_jobs"),
        60,
        "a job running in process's own worker",
    )
    # Its one worker, whichever its last heartbeat said (CI: "idle", written
    # a moment before its slot took the job).
    live = "SELECT worker_id FROM workers WHERE status IN ('active', 'idle')"
    [(worker_id,)] = procs.query(live)
    procs.cli("workers", "drain", worker_id)
    started = time.monotonic()
    assert run.wait(60) == 1, tail(run.err)
    assert time.monotonic() - started < 30  # not the 300 s of --wait-timeout
    records = run.records()
    statuses = [r["status"] for r in records]  # a, b, c: run in that order
    assert statuses[0] == "completed" and statuses[-1] == "queued", records
    assert set(statuses) == {"completed", "queued"}, records
    for r in (r for r in records if r["status"] == "queued"):
        assert "the worker this command ran stopped; the job goes on" in r["safe_reason"]


@sqlite_only
def test_without_a_worker_the_timeout_ends_the_wait(procs: Procs, tmp_path: Path) -> None:
    src = tmp_path / "a.bin"
    src.write_bytes(b"x" * 100)
    started = time.monotonic()
    done = hypermedia(
        "process",
        str(src),
        "--profile",
        "debug-copy",
        "--timeout",
        "1.5",
        "--out",
        str(tmp_path / "out"),
        "--json",
        "--no-run-here",
        url=procs.url,
        home=procs.home,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert "no worker serves queue bulk: the jobs wait for one" in done.stderr
    assert time.monotonic() - started < 30
    [r] = [json.loads(line) for line in done.stdout.splitlines()]
    assert (r["status"], r["error_code"], r["outputs"]) == ("queued", None, [])
    assert "not finished within 1.5s" in r["safe_reason"]
    assert f"hypermedia jobs show {r['job_id']}" in r["safe_reason"]
    # Without --json: one line per input, the status in words.
    plain = hypermedia(
        "process", str(src), "--profile", "debug-copy", "--timeout", "0", "--no-run-here",
        "--out", str(tmp_path / "out"), url=procs.url, home=procs.home, timeout=60,
    )  # fmt: skip
    assert plain.returncode == 1 and "queued" in plain.stdout and "Traceback" not in plain.stderr


@sqlite_only
def test_a_profile_that_cannot_run_here_is_said_and_its_reason_kept(
    procs: Procs, tmp_path: Path
) -> None:
    """A virus scan naming a clamd that does not answer: warned up front (by
    the profile's own socket), and when the wait ends the job's own reason
    (why it waits in retry_wait) is kept beside the timeout's."""
    (src := tmp_path / "a.txt").write_bytes(b"hello")
    key = f"scan-{uuid.uuid4().hex[:8]}"
    procs.cli("profiles", "create", key, "--type", "security.virus_scan",
              "--settings", '{"clamd": "tcp://127.0.0.1:9"}')  # fmt: skip
    done = hypermedia(
        "process", str(src), "--profile", key, "--wait-timeout", "6", "--json",
        "--out", str(tmp_path / "out"), url=procs.url, home=procs.home, timeout=60,
        # The retry waits past the wait's end: with the default base, under
        # load, the job was promoted back to queued before the wait ended.
        HYPERMEDIA_BACKOFF_BASE_SECONDS="30", HYPERMEDIA_BACKOFF_MAX_SECONDS="60",
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert (
        f"warning: profile {key}:v1 cannot run on this machine: "
        "clamd does not answer on tcp://127.0.0.1:9"
    ) in done.stderr
    [r] = [json.loads(line) for line in done.stdout.splitlines()]
    assert (r["status"], r["error_code"]) == ("retry_wait", "PROVIDER_UNAVAILABLE"), r
    assert "not finished within 6s; the job goes on (its last attempt: " in r["safe_reason"]
    assert "clamd" in r["safe_reason"].partition("its last attempt: ")[2], r


@sqlite_only
def test_a_paused_queue_is_said_not_waited_on_silently(procs: Procs, tmp_path: Path) -> None:
    (src := tmp_path / "a.bin").write_bytes(b"x" * 100)
    assert "paused" in procs.cli("queues", "pause", "bulk")
    done = hypermedia(
        "process", str(src), "--profile", "debug-copy", "--timeout", "1", "--json",
        "--out", str(tmp_path / "out"), url=procs.url, home=procs.home, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    said = "queue bulk is paused: its jobs wait until `hypermedia queues resume bulk`"
    assert said in " ".join(done.stderr.split()), done.stderr
    [r] = [json.loads(line) for line in done.stdout.splitlines()]
    assert r["status"] == "queued"  # its own worker did not claim from the paused queue
    procs.cli("queues", "resume", "bulk")
    again = hypermedia(
        "process", str(src), "--profile", "debug-copy", "--timeout", "60", "--json",
        "--out", str(tmp_path / "out2"), url=procs.url, home=procs.home, timeout=90,
    )  # fmt: skip
    assert again.returncode == 0 and "paused" not in again.stderr, again.stderr


def test_on_a_fresh_home_process_migrates_and_runs_the_jobs_itself(tmp_path: Path) -> None:
    """The embedded default, one command: no `db upgrade`, no `serve` beside it."""
    home = tmp_path / "fresh"
    files = []
    for name in ("a.bin", "b.bin"):
        files.append(tmp_path / name)
        files[-1].write_bytes(name.encode() * 50)
    out = tmp_path / "out"
    done = hypermedia(
        "process", *map(str, files), "--profile", "debug-copy", "--out", str(out), "--json",
        url="", home=home, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["status"] for r in records] == ["completed", "completed"]
    for src, r in zip(files, records, strict=True):
        assert Path(r["outputs"][0]).read_bytes() == src.read_bytes()
    driver = Driver(f"sqlite:///{home / 'hypermedia.db'}")
    try:
        with driver.read() as tx:
            (worker,) = tx.workers(include_terminated=True)  # its own, ended with it
            assert worker["status"] == "terminated" and worker["pid"] != os.getpid()
            attempts = [a for r in records for a in tx.attempts(r["job_id"])]
        assert {a["worker_id"] for a in attempts} == {worker["worker_id"]}
    finally:
        driver.dispose()


def test_a_second_process_does_not_wait_on_the_first_ones_worker(tmp_path: Path) -> None:
    """The first command's worker stops when its own jobs end: the second saw
    it serving the queue, ran none of its own, and waited out its timeout."""
    home, a = tmp_path / "home", tmp_path / "a.bin"
    a.write_bytes(b"x")
    env = cli_env("", home)
    first = subprocess.Popen(
        [sys.executable, "-m", "hypermedia", "process", str(a), "--profile", "debug-sleep",
         "--params", '{"ms": 2500}', "-c", "1", "--out", str(tmp_path / "o1")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        db = home / "hypermedia.db"

        def first_worker_runs() -> bool:
            if not db.exists():
                return False
            driver = Driver(f"sqlite:///{db}")
            try:
                with driver.read() as tx:
                    return any(w["status"] in ("active", "idle") for w in tx.workers())
            except Exception:  # the first command is still migrating
                return False
            finally:
                driver.dispose()

        eventually(first_worker_runs, 60, "the first process's worker")
        second = hypermedia(
            "process", *[str(a)] * 4, "--profile", "debug-sleep", "--params", '{"ms": 600}',
            "--wait-timeout", "60", "--out", str(tmp_path / "o2"), "--json",
            url="", home=home, timeout=120,
        )  # fmt: skip
    finally:
        _, first_err = first.communicate(timeout=60)
    assert second.returncode == 0, second.stderr
    records = [json.loads(line) for line in second.stdout.splitlines()]
    assert [r["status"] for r in records] == ["completed"] * 4
    assert first.returncode == 0, first_err


def test_process_starts_no_other_job_once_its_own_are_claimed(tmp_path: Path) -> None:
    """A lane freed as the command's job ended took another job of the queue
    (2 ms later), which the command's stop then cut short at 30 s and charged:
    three `process` runs failed a stranger's long job for good."""
    home, a = tmp_path / "home", tmp_path / "a.bin"
    a.write_bytes(b"x")
    assert hypermedia("db", "upgrade", url="", home=home).returncode == 0
    sub = hypermedia(
        "jobs", "submit", "debug.sleep", "--params", '{"ms": 60000}', "--json",
        url="", home=home,
    )  # fmt: skip
    (stranger,) = json.loads(sub.stdout)["job_ids"]
    for lanes in ("1", "2"):  # its job first in the queue (priority 1), then the stranger's
        done = hypermedia(
            "process", str(a), "--profile", "debug-noop", "-c", lanes, "--priority", "1",
            "--out", str(tmp_path / f"o{lanes}"), url="", home=home, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        shown = json.loads(
            hypermedia("jobs", "show", str(stranger), "--json", url="", home=home).stdout
        )
        assert (shown["status"], shown["attempt_count"]) == ("queued", 0), shown


def test_process_leaves_a_stranger_queued_ahead_of_its_jobs(tmp_path: Path) -> None:
    """A stranger's job more urgent than the command's was claimed first (the
    claim counted the command's queued jobs, not which): run, then cut short
    at the command's stop and charged."""
    home, a = tmp_path / "home", tmp_path / "a.bin"
    a.write_bytes(b"x")
    assert hypermedia("db", "upgrade", url="", home=home).returncode == 0
    sub = hypermedia(
        "jobs", "submit", "debug.sleep", "--params", '{"ms": 60000}', "--priority", "1",
        "--json", url="", home=home,
    )  # fmt: skip
    (stranger,) = json.loads(sub.stdout)["job_ids"]
    started = time.monotonic()
    done = hypermedia(
        "process", str(a), "--profile", "debug-noop", "-c", "2", "--priority", "9",
        "--out", str(tmp_path / "o"), url="", home=home, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 25  # no stranger's attempt to drain
    shown = json.loads(
        hypermedia("jobs", "show", str(stranger), "--json", url="", home=home).stdout
    )
    assert (shown["status"], shown["attempt_count"]) == ("queued", 0), shown


def test_a_data_only_job_shows_its_result(tmp_path: Path) -> None:
    """A duplicate check writes no file: what it found is the record's result."""
    home, a, b = tmp_path / "home", tmp_path / "a.png", tmp_path / "b.png"
    a.write_bytes(png(40, 30))
    b.write_bytes(png(40, 30))  # the same bytes: an exact duplicate
    args = ("process", str(a), str(b), "--profile", "dedup-check", "--out", str(tmp_path / "o"))
    done = hypermedia(*args, "--json", url="", home=home, timeout=120)
    assert done.returncode == 0, done.stderr
    first, second = (json.loads(line) for line in done.stdout.splitlines())
    assert first["outputs"] == [] and second["outputs"] == []
    assert first["result"]["exact"] and second["result"]["exact"]  # each finds the other
    plain = hypermedia(*args, url="", home=home, timeout=120)
    assert plain.returncode == 0, plain.stderr
    assert '→ {"exact": [' in plain.stdout and "no output files" not in plain.stdout


def test_inputs_with_names_near_the_longest_get_their_outputs(tmp_path: Path) -> None:
    """A 250-byte file name is valid, but "<stem>.<type>.<ext>" (and its
    ".….part" while downloading) was not: OUTPUT_NOT_WRITTEN, exit 1.  The
    stem is shortened now, and two names alike in their first bytes stay apart."""
    home, out = tmp_path / "home", tmp_path / "out"
    files = [tmp_path / ("é" * 100 + "x" * 45 + end + ".bin") for end in ("a", "b")]
    for f in files:
        assert len(f.name.encode()) == 250
        f.write_bytes(f.name.encode())
    done = hypermedia(
        "process", *map(str, files), "--profile", "debug-copy", "--out", str(out), "--json",
        url="", home=home, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["error_code"] for r in records] == [None, None], records
    written = [Path(r["outputs"][0]) for r in records]
    assert len(set(written)) == 2
    for src, dst in zip(files, written, strict=True):
        assert dst.read_bytes() == src.read_bytes()
        assert dst.name.startswith("é" * 80) and len(dst.name.encode()) < 200


def test_inputs_whose_names_meet_get_outputs_of_their_own(tmp_path: Path) -> None:
    """x.bin, sub/x.bin and x-2.bin: the second became x-2, as the third was,
    and the third's output overwrote the second's (exit 0)."""
    home, out = tmp_path / "home", tmp_path / "out"
    (tmp_path / "sub").mkdir()
    files = [tmp_path / "x.bin", tmp_path / "sub" / "x.bin", tmp_path / "x-2.bin"]
    for i, f in enumerate(files):
        f.write_bytes(f"input {i}".encode())
    done = hypermedia(
        "process", *map(str, files), "--profile", "debug-copy", "--out", str(out), "--json",
        url="", home=home, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    written = [Path(json.loads(line)["outputs"][0]) for line in done.stdout.splitlines()]
    assert [p.name for p in written] == ["x.copy.bin", "x-2.copy.bin", "x-2-2.copy.bin"]
    assert [p.read_bytes() for p in written] == [f.read_bytes() for f in files]


def test_an_output_never_replaces_an_input(tmp_path: Path) -> None:
    """`process x.bin x.copy.bin --out .` replaced the second input with the
    first one's copy, exit 0."""
    home = tmp_path / "home"
    first, second = tmp_path / "x.bin", tmp_path / "x.copy.bin"
    first.write_bytes(b"first input")
    second.write_bytes(b"second input, the user's own file")
    done = hypermedia(
        "process", str(first), str(second), "--profile", "debug-copy", "--out", str(tmp_path),
        "--json", url="", home=home, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert records[0]["error_code"] == "OUTPUT_NOT_WRITTEN"
    assert "would replace the input x.copy.bin" in records[0]["safe_reason"]
    assert second.read_bytes() == b"second input, the user's own file"
    assert records[1]["error_code"] is None  # x.copy.copy.bin: no input's name
    assert Path(records[1]["outputs"][0]).read_bytes() == second.read_bytes()


def test_an_output_name_taken_by_a_folder_is_said_plainly(tmp_path: Path) -> None:
    """It said "[Errno 21] Is a directory" of a temporary name."""
    home, out = tmp_path / "home", tmp_path / "out"
    (out / "x.copy.bin").mkdir(parents=True)
    (tmp_path / "x.bin").write_bytes(b"x")
    done = hypermedia(
        "process", str(tmp_path / "x.bin"), "--profile", "debug-copy", "--out", str(out),
        "--json", url="", home=home, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    record = json.loads(done.stdout)
    assert record["error_code"] == "OUTPUT_NOT_WRITTEN"
    assert "x.copy.bin is taken by a folder" in record["safe_reason"], record
    assert (out / "x.copy.bin").is_dir()


def test_output_names_carry_no_control_characters(tmp_path: Path) -> None:
    """A right-to-left override would show "photo\u202egnp.exe.copy.bin" as
    a file of another type; a newline would break a listing."""
    home, out = tmp_path / "home", tmp_path / "out"
    files = [tmp_path / "photo\u202egnp.exe.bin", tmp_path / "two\nlines.bin"]
    for f in files:
        f.write_bytes(b"x")
    done = hypermedia(
        "process", *map(str, files), "--profile", "debug-copy", "--out", str(out), "--json",
        url="", home=home, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    names = sorted(Path(json.loads(line)["outputs"][0]).name for line in done.stdout.splitlines())
    assert [n.split(".")[0] for n in names] == ["photognp", "twolines"], names


@sqlite_only
def test_process_leaves_its_jobs_to_a_worker_that_serves_their_queue(
    procs: Procs, tmp_path: Path
) -> None:
    src = tmp_path / "a.bin"
    src.write_bytes(b"served elsewhere")
    procs.spawn("worker", "--queues", "bulk", "--concurrency", "1", "--no-maintenance")
    eventually(lambda: bool(procs.query("SELECT worker_id FROM workers")), 60, "the worker row")
    ((elsewhere,),) = procs.query("SELECT worker_id FROM workers")
    done = hypermedia(
        "process", str(src), "--profile", "debug-copy", "--out", str(tmp_path / "out"),
        "--json", url=procs.url, home=procs.home, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert procs.query("SELECT DISTINCT worker_id FROM job_attempts") == [(elsewhere,)]
    assert len(procs.query("SELECT worker_id FROM workers")) == 1  # none started here


@sqlite_only
def test_process_refusals_exit_nonzero_with_a_clear_message(procs: Procs, tmp_path: Path) -> None:
    src = tmp_path / "a.bin"
    src.write_bytes(b"x" * 100)

    def process(*args: str) -> subprocess.CompletedProcess[str]:
        return hypermedia("process", str(src), *args, url=procs.url, home=procs.home)

    def objects() -> list[dict[str, Any]]:
        return json.loads(procs.cli("objects", "ls", "--json"))

    before = objects()
    missing = process("--profile", "no-such-profile")
    assert missing.returncode == 2 and "no profile no-such-profile" in missing.stderr
    bad_params = process("--profile", "debug-copy", "--params", "[1]")
    assert bad_params.returncode == 2 and "JSON object" in bad_params.stderr
    wrong = process("--profile", "debug-copy", "--params", '{"bogus": 1}')
    assert wrong.returncode == 2 and "unknown parameters: bogus" in wrong.stderr
    small = f"small-{uuid.uuid4().hex[:8]}"
    procs.cli("profiles", "create", small, "--type", "debug.copy", "--max-input-bytes", "99")
    big = process("--profile", small)
    assert big.returncode == 2, big.stderr
    assert f"a.bin is larger than profile {small}:v1 accepts (100 bytes; at most 99)" in big.stderr
    # Refused before the upload: not an object more.
    assert objects() == before
    # A budget the request does not fit in: refused before any job exists.
    key = f"paid-{uuid.uuid4().hex[:8]}"
    procs.cli("profiles", "create", key, "--type", "debug.copy", "--credits-base", "5")
    procs.cli("credits", "set-budget", "tight", "4")
    out = src.parent / f"out-{uuid.uuid4().hex[:8]}"
    broke = process("--profile", key, "--project", "tight", "--out", str(out))
    assert broke.returncode == 1  # well-formed, refused by the state of the budget
    assert "credit budget exceeded: 0 of 4 used, this request needs 5" in broke.stderr
    assert _jobs(procs) == 0
    assert not out.exists()  # the --out folder it made goes with the refusal
    # Told only after the upload (the estimate needs it): handed to GC at once.
    (upload,) = json.loads(procs.cli("objects", "ls", "--state", "deleting", "--json"))
    assert (upload["filename"], upload["state"]) == ("a.bin", "deleting")
    assert "Traceback" not in missing.stderr + wrong.stderr + broke.stderr
    # An --out that cannot be written: said so, before anything is uploaded.
    listed = objects()
    unwritable = process("--profile", "debug-copy", "--out", str(src / "sub"))
    assert unwritable.returncode == 2, unwritable.stderr
    assert "--out cannot be written to: Not a directory" in unwritable.stderr
    assert objects() == listed and _jobs(procs) == 0


@sqlite_only
def test_profiles_and_credits_commands(procs: Procs) -> None:
    key = f"cli-{uuid.uuid4().hex[:8]}"

    def js(*args: str) -> Any:
        return json.loads(procs.cli(*args, "--json"))

    v1 = js("profiles", "create", key, "--type", "debug.sleep", "--settings", '{"max_ms": 50}')
    assert (v1["ref"], v1["settings"], v1["queue_name"]) == (f"{key}:v1", {"max_ms": 50}, "bulk")
    v2 = js(  # --type left out: it carries over, as every option does
        "profiles", "create", key, "--settings", '{"max_ms": 80}',
        "--queue", "images", "--credits-base", "2", "--credits-per-mb", "1",
        "--credits-per-page", "3", "--credits-per-minute", "4", "--timeout", "30",
    )  # fmt: skip
    assert v2["ref"] == f"{key}:v2" and v2["timeout_seconds"] == 30
    assert [v2[f"credit_cost_{u}"] for u in ("base", "per_mb", "per_page", "per_minute")] == [
        2,
        1,
        3,
        4,
    ]
    assert js("profiles", "show", key)["ref"] == f"{key}:v2"
    with_schema = [p["ref"] for p in js("profiles", "ls") if _has_schema(p["job_type"])]
    if with_schema:  # the settings schema is shown with the version
        assert js("profiles", "show", with_schema[0])["settings_schema"]
    assert js("profiles", "show", key)["settings_schema"] is None  # debug.sleep has none
    listed = [p["ref"] for p in js("profiles", "ls", "--type", "debug.sleep")]
    assert f"{key}:v1" in listed and f"{key}:v2" in listed
    assert [p["ref"] for p in js("profiles", "ls", "--key", key)] == [f"{key}:v1", f"{key}:v2"]
    cut = hypermedia("profiles", "ls", "--key", key, "--limit", "1", url=procs.url, home=procs.home)
    assert cut.returncode == 0 and f"{key}:v1" in cut.stdout and f"{key}:v2" not in cut.stdout
    assert "the first 1 versions are shown" in cut.stderr
    gone = js("profiles", "deactivate", f"{key}:v2")
    assert gone["is_active"] is False
    assert f"{key}:v2" not in [p["ref"] for p in js("profiles", "ls")]
    assert f"{key}:v2" in [p["ref"] for p in js("profiles", "ls", "--all")]
    assert "deactivated" in procs.cli("profiles", "deactivate", f"{key}:v1")
    human = procs.cli("profiles", "ls", "--all", "--type", "debug.sleep")
    assert f"{key}:v1" in human

    refused = hypermedia(
        "profiles", "create", key, "--type", "debug.sleep", "--settings", '{"max_ms": "x"}',
        url=procs.url, home=procs.home,
    )  # fmt: skip
    assert refused.returncode == 2 and "settings refused" in refused.stderr
    typo = hypermedia(
        "profiles", "create", f"{key}-q", "--type", "debug.noop", "--queue", "imagse",
        url=procs.url, home=procs.home,
    )  # fmt: skip
    assert typo.returncode == 0 and "no pipeline, profile or job uses queue imagse" in typo.stderr
    known = hypermedia(
        "profiles", "create", f"{key}-q", "--queue", "images", url=procs.url, home=procs.home
    )
    assert known.returncode == 0 and "warning" not in known.stderr, known.stderr
    new_key = hypermedia("profiles", "create", "no-such-key", url=procs.url, home=procs.home)
    assert new_key.returncode == 2 and "give --type" in new_key.stderr, new_key.stderr
    nothing = hypermedia("jobs", "submit", "debug.sleep", "--profile", key, url=procs.url,
                         home=procs.home)  # fmt: skip
    assert nothing.returncode == 2 and "has no active version" in nothing.stderr
    # Every version deactivated, the key still has its type: revived without --type.
    revived = json.loads(procs.cli("profiles", "create", key, "--json"))
    assert (revived["ref"], revived["job_type"]) == (f"{key}:v3", "debug.sleep")

    # A project nothing names yet is most likely a typo: said, and done; asked
    # about, it answered "unlimited, 0 used" as of any real project.
    shown = hypermedia("credits", "show", "--project", "acme", url=procs.url, home=procs.home)
    assert shown.returncode == 0 and "names project acme (a typo?)" in shown.stderr
    first = hypermedia("credits", "set-budget", "acme", "100", url=procs.url, home=procs.home)
    assert (
        first.returncode == 0
        and "no token, job, budget or object names project acme" in first.stderr
    )
    again = hypermedia("credits", "set-budget", "acme", "100", url=procs.url, home=procs.home)
    assert again.returncode == 0 and "warning" not in again.stderr
    assert js("credits", "set-budget", "acme", "100") == {
        "project_id": "acme",
        "budget": 100,
        "used": 0,
        "remaining": 100,
    }
    procs.cli("jobs", "submit", "debug.noop", "--project", "acme")
    assert js("credits", "show", "--project", "acme")["used"] == 0
    assert js("credits", "set-budget", "acme", "none")["budget"] is None
    assert {r["project_id"] for r in js("credits", "show")} >= {"acme"}
    assert "unlimited" in procs.cli("credits", "show", "--project", "acme")
    bad = hypermedia("credits", "set-budget", "acme", "lots", url=procs.url, home=procs.home)
    assert bad.returncode == 2 and "whole number" in bad.stderr


@sqlite_only
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_ends_the_wait_and_hands_its_jobs_back(
    procs: Procs, tmp_path: Path, sig: signal.Signals
) -> None:
    """SIGTERM (timeout(1), systemd) as Ctrl-C: the job its own worker runs goes
    back for retry and the input is reported.  At SIGTERM's default the process
    died at once, its job left `processing` and its worker row `active`."""
    procs.cli("profiles", "create", "nap", "--type", "debug.sleep", "--settings", "{}")
    src = tmp_path / "a.bin"
    src.write_bytes(b"some bytes")
    # The retry waits past the end: with the tests' quick backoff, its own
    # leader sometimes promoted the job to queued before it was reported.
    slow = {"HYPERMEDIA_BACKOFF_BASE_SECONDS": "30", "HYPERMEDIA_BACKOFF_MAX_SECONDS": "60"}
    run = Run(procs, str(src), "--profile", "nap", "--params", '{"ms": 60000}', "--json", **slow)
    eventually(
        lambda: procs.query("SELECT status FROM processing_jobs") == [("processing",)],
        60,
        "the job running in process's own worker",
    )
    run.proc.send_signal(sig)
    assert run.wait(30) == 1, tail(run.err)
    [record] = run.records()
    assert (record["status"], record["error_code"]) == ("retry_wait", "ORPHANED"), record
    assert "the wait was interrupted" in record["safe_reason"]
    assert procs.query("SELECT status FROM processing_jobs") == [("retry_wait",)]
    assert procs.query("SELECT status FROM workers") == [("terminated",)]


@sqlite_only
def test_a_double_ctrl_c_while_uploading_hands_every_upload_to_gc(
    procs: Procs, tmp_path: Path
) -> None:
    """The uploads were handed to GC one transaction each, and a second press
    20 ms after the first broke that loop: 247 of 250 stayed `pending` for
    GC_PENDING_SECONDS (6 h), their blobs with them."""
    files = [tmp_path / f"{n:03d}.bin" for n in range(250)]
    for f in files:
        f.write_bytes(os.urandom(256 << 10))
    for attempt in range(5):  # a run whose upload ended between two looks: again
        top = procs.query("SELECT COALESCE(MAX(object_id), 0) FROM objects")[0][0]
        out = tmp_path / f"made-{attempt}" / "out"
        run = Run(procs, *map(str, files), "--profile", "debug-noop", "--json", "--out", str(out))

        def uploading(run: Run = run) -> bool:
            if run.proc.poll() is not None:
                return True
            rows = procs.query("SELECT COUNT(*) FROM objects WHERE state = 'pending'")
            return bool(rows[0][0])

        eventually(uploading, 60, "the uploads under way", interval=0.005)
        if run.proc.poll() is None:
            break
    run.proc.send_signal(signal.SIGINT)
    time.sleep(0.02)
    run.proc.send_signal(signal.SIGINT)
    # Ended by Ctrl-C: 130, or killed by the second press past the clean-up
    # (Python's own end for an interrupt met while it handled one): 130 in a shell.
    assert run.wait(30) in (130, -signal.SIGINT), tail(run.err)
    mine = "FROM objects WHERE object_id > :top"
    states = dict(procs.query(f"SELECT state, COUNT(*) {mine} GROUP BY state", top=top))
    assert "pending" not in states and states.get("deleting") == len(files), states
    jobs = procs.query(
        f"SELECT COUNT(*) FROM processing_jobs WHERE object_id IN (SELECT object_id {mine})",
        top=top,
    )
    assert jobs == [(0,)]
    # Nothing was done: the --out folders it made are gone (they were left, empty).
    assert not out.parent.exists()


@sqlite_only
@pytest.mark.parametrize("gap", [0.02, 0.1, 0.3])
def test_a_quick_second_ctrl_c_still_reports_every_input(
    procs: Procs, tmp_path: Path, gap: float
) -> None:
    """A double press: the second SIGINT came while the first was being
    handled and killed it with 130, sometimes before a line of the report."""
    procs.cli("profiles", "create", "nap2", "--type", "debug.sleep", "--settings", "{}")
    srcs = [tmp_path / f"{n}.bin" for n in "ab"]
    for src in srcs:
        src.write_bytes(os.urandom(100))
    slow = {"HYPERMEDIA_BACKOFF_BASE_SECONDS": "30", "HYPERMEDIA_BACKOFF_MAX_SECONDS": "60"}
    args = ("--profile", "nap2", "--params", '{"ms": 60000}', "--json", "-c", "2")
    run = Run(procs, *map(str, srcs), *args, **slow)
    eventually(
        lambda: (
            procs.query("SELECT count(*) FROM processing_jobs WHERE status = 'processing'")
            == [(2,)]
        ),
        60,
        "both jobs running in process's own worker",
    )
    run.proc.send_signal(signal.SIGINT)
    time.sleep(gap)
    run.proc.send_signal(signal.SIGINT)
    assert run.wait(30) == 1, tail(run.err)
    assert [Path(r["input"]).name for r in run.records()] == ["a.bin", "b.bin"]


@sqlite_only
def test_ctrl_c_while_outputs_are_written_still_reports_every_input(
    procs: Procs, tmp_path: Path
) -> None:
    """The jobs had completed and Ctrl-C came while their outputs downloaded:
    the command ended with 130 and said nothing of its inputs."""
    files = []
    for name in ("a.bin", "b.bin", "c.bin"):
        files.append(tmp_path / name)
        files[-1].write_bytes(os.urandom(64 << 20))  # long enough to catch mid-write
    for attempt in range(5):  # a run whose writes all fell between two looks: again
        out = tmp_path / f"out{attempt}"
        run = Run(procs, *map(str, files), "--profile", "debug-copy", "--out", str(out), "--json")

        def writing(out: Path = out, run: Run = run) -> bool:
            if run.proc.poll() is not None:
                return True
            return out.is_dir() and any(p.name.endswith(".part") for p in out.iterdir())

        eventually(writing, 120, "the first output being written")
        if run.proc.poll() is None:
            break
    run.proc.send_signal(signal.SIGINT)
    assert run.wait(60) == 1, tail(run.err)
    records = run.records()
    assert [r["input"] for r in records] == [str(f) for f in files]
    assert all(r["status"] == "completed" for r in records), records
    unwritten = [r for r in records if r["error_code"] == "OUTPUT_NOT_WRITTEN"]
    assert unwritten and all("interrupted" in r["safe_reason"] for r in unwritten)
    assert not [p for p in out.iterdir() if p.name.endswith(".part")]


@sqlite_only
def test_an_older_job_left_by_an_earlier_run_waits_for_a_worker(
    procs: Procs, tmp_path: Path
) -> None:
    """The job of an earlier `process` that stopped waiting is a stranger's to
    this run: its worker ran it ahead of its own (FIFO), and Ctrl-C or the
    run's end cut it short.  It is left queued now, for a worker."""
    procs.cli("profiles", "create", "nap", "--type", "debug.sleep", "--settings", "{}")
    src = tmp_path / "a.bin"
    src.write_bytes(b"some bytes")
    left = hypermedia(
        "process", str(src), "--profile", "nap", "--params", '{"ms": 60000}',
        "--no-run-here", "--wait-timeout", "0", url=procs.url, home=procs.home,
    )  # fmt: skip
    assert left.returncode == 1, left.stderr
    out = tmp_path / "out"
    run = Run(procs, str(src), "--profile", "debug-copy", "--out", str(out), "-c", "2", "--json")
    assert run.wait(60) == 0, tail(run.err)
    [record] = run.records()
    assert record["status"] == "completed" and len(record["outputs"]) == 1
    assert (out / Path(record["outputs"][0]).name).read_bytes() == b"some bytes"
    assert sorted(procs.query("SELECT status, attempt_count FROM processing_jobs")) == [
        ("completed", 1),
        ("queued", 0),  # the older job, never taken
    ]


@sqlite_only
def test_result_lines_print_names_and_output_paths_as_written(procs: Procs, tmp_path: Path) -> None:
    """A name ending in a backslash printed it twice in a failure line (markup
    escaping), and the output paths of a completed line went out raw: an
    --out holding ESC or a newline coloured the terminal, or made a line."""
    bad = tmp_path / "bad\\"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 100)
    good = tmp_path / "good.png"
    good.write_bytes(png(4, 4))
    out = tmp_path / "o\x1b[31mRED\nfake"
    done = hypermedia(
        "process", str(bad), str(good), "--profile", "image-thumbnail", "--out", str(out),
        url=procs.url, home=procs.home,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2, lines  # no line made by a newline in --out
    assert lines[0].startswith(f"{tmp_path}/bad\\: failed CORRUPT_INPUT"), lines[0]
    assert "\x1b" not in done.stdout and "\\x1b[31mRED\\nfake" in lines[1]


@sqlite_only
def test_a_refused_run_leaves_no_out_folder_and_no_socket_is_read(
    procs: Procs, tmp_path: Path
) -> None:
    """Exit 2 is "nothing was done": the --out folders it made stayed; a socket
    given as input was a raw OSError, exit 1."""
    import socket

    src = tmp_path / "a.bin"
    src.write_bytes(b"x")
    out = tmp_path / "new" / "out"
    done = hypermedia(
        "process", str(src), "--profile", "debug-sleep", "--params", '{"ms": -1}',
        "--out", str(out), url=procs.url, home=procs.home,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert not (tmp_path / "new").exists()
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp_path / "sock"))
        done = hypermedia(
            "process", str(tmp_path / "sock"), "--profile", "debug-sleep",
            "--out", str(out), url=procs.url, home=procs.home,
        )  # fmt: skip
    assert done.returncode == 2 and "is a socket, not a file or a stream" in done.stderr
    assert not (tmp_path / "new").exists()


@sqlite_only
def test_ctrl_c_during_the_enqueue_hands_the_uploads_to_gc(
    storage: Storage, engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Uploaded, then interrupted before the jobs existed: the objects stayed
    `ready` and unreferenced for GC_UNREFERENCED_SECONDS (a day)."""
    from hypermedia.cli import process
    from hypermedia.queue.models import NewJob

    objs = [storage.put(io.BytesIO(b"input %d" % n)) for n in range(3)]
    new = [NewJob("debug.noop", object_id=o["object_id"]) for o in objs]
    deaf: list[bool] = []
    monkeypatch.setattr(
        process, "ignore_stop_signals", lambda: deaf.append(True)
    )  # not this test's signals

    def interrupted(jobs: list[NewJob]) -> list[int]:
        raise KeyboardInterrupt

    monkeypatch.setattr(engine, "enqueue_many", interrupted)
    with pytest.raises(KeyboardInterrupt):
        process._enqueue(engine, storage, new)
    assert deaf == [True]
    with storage.db.read() as tx:
        assert {tx.object(o["object_id"])["state"] for o in objs} == {"deleting"}

    # The interrupt cut SQLAlchemy's commit short, and its rollback asserted
    # (CI, `objects get`): that is the interrupt too, the uploads handed over.
    more = [storage.put(io.BytesIO(b"more %d" % n)) for n in range(2)]

    def cut_short(jobs: list[NewJob]) -> list[int]:
        try:
            raise KeyboardInterrupt
        finally:
            raise AssertionError  # the library's clean-up, failing

    monkeypatch.setattr(engine, "enqueue_many", cut_short)
    with pytest.raises(AssertionError):
        process._enqueue(
            engine, storage, [NewJob("debug.noop", object_id=o["object_id"]) for o in more]
        )
    assert deaf == [True, True]
    with storage.db.read() as tx:
        assert {tx.object(o["object_id"])["state"] for o in more} == {"deleting"}


@sqlite_only
def test_a_backslash_in_a_local_file_name_is_part_of_the_name(procs: Procs, tmp_path: Path) -> None:
    """Taken for a Windows folder separator: "a\\b.png" was stored as "b.png"
    and its output written as b.copy.bin (and "back\\.png" as file.copy.bin)."""
    src = tmp_path / "a\\b.png"
    src.write_bytes(b"some bytes")
    out = tmp_path / "out"
    done = hypermedia(
        "process", str(src), "--profile", "debug-copy", "--out", str(out), "--json",
        url=procs.url, home=procs.home,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["outputs"] == [str(out / "a\\b.copy.bin")]
    names = procs.query("SELECT filename FROM objects ORDER BY object_id")
    assert names[0] == ("a\\b.png",), names

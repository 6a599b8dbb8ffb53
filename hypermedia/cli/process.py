"""hypermedia process FILE… --profile KEY: upload, enqueue, wait, write the outputs.

One job per input, all enqueued in one transaction with the profile's job
type (the profile is resolved once, so every input runs with the same
version).  Waiting shows a progress bar per input on stderr; outputs are
downloaded (checksum verified) to ``DIR/<input stem>.<output type>[.<n>].<ext>``.
Exit 0 only when every job completed and its outputs were written.

When no worker serves the jobs' queue (no ``serve`` or ``worker`` running,
or only ones of other queues), the command runs one itself for as long as it
waits (``worker/local.py``), and on the embedded SQLite database it migrates
first, as ``serve`` does: one command does the whole round trip.
``--no-run-here`` only enqueues and waits; ``--wait-timeout`` ends the wait
(exit 1) and the jobs stay queued for a worker to come.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn
from rich.text import Text

from hypermedia.cli.common import (
    StreamTooLarge,
    as_regular_files,
    console,
    cut,
    engine,
    err_console,
    existing_inputs,
    ignore_stop_signals,
    input_name,
    json_object,
    make_home,
    print_json,
    printable,
    settings,
    sigterm_as_ctrl_c,
    through_outages,
    user_errors,
    wait_for_schema,
    while_interrupted,
)
from hypermedia.config import Settings
from hypermedia.errors import HypermediaError, InvalidRequest, JobError, NotFound
from hypermedia.pipelines import registry
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import NewJob, check_params
from hypermedia.queue.profiles import Profiles
from hypermedia.queue.queues import Queues
from hypermedia.queue.states import TERMINAL
from hypermedia.redact import redact
from hypermedia.storage.keys import display_name, extension_for
from hypermedia.storage.ledger import Storage
from hypermedia.worker.fleet import Fleet
from hypermedia.worker.local import LocalWorker

Row = dict[str, Any]
POLL_SECONDS = 0.25


def run(
    files: list[Path] = typer.Argument(
        ..., dir_okay=False, readable=True, callback=existing_inputs
    ),
    profile: str = typer.Option(..., "--profile", help="KEY (newest active version) or KEY:vN"),
    params: str = typer.Option("{}", "--params", help="JSON object: overrides the profile allows"),
    out: Path = typer.Option(Path("."), "--out", file_okay=False, help="where outputs go"),
    project: str = typer.Option("default", "--project"),
    priority: int = typer.Option(5, "--priority", min=1, max=10, help="1 highest … 10 lowest"),
    # --wait-timeout, as `jobs submit --wait` says it (whose --timeout is an
    # attempt's); --timeout, its first name, still works.
    timeout: float = typer.Option(
        600, "--wait-timeout", "--timeout", min=0, help="seconds to wait for the jobs"
    ),
    as_json: bool = typer.Option(False, "--json", help="one JSON record per input"),
    run_here: bool | None = typer.Option(
        None,
        "--run-here/--no-run-here",
        help="run the jobs in this process too (default: when no worker serves their queue)",
    ),
    concurrency: int = typer.Option(
        0, "--concurrency", "-c", min=0, max=127, help="lanes when run here (0: one per core)"
    ),
) -> None:
    """Process FILES with a profile: upload, run as jobs, wait, write the outputs."""
    # SIGTERM ends the wait as Ctrl-C does: the jobs its worker holds are
    # handed back for retry and every input is reported.  Left at its default,
    # the process died with its worker row active and its jobs `processing`
    # until the reaper found them minutes later.
    sigterm_as_ctrl_c()
    with user_errors():
        overrides = json_object(params, "--params")
        s = settings()
        _migrated(s)
        eng = engine(s, create=True)
        # A server database's: before anything is uploaded, waiting out one
        # that is away for as long as the jobs would be waited for.
        wait_for_schema(eng.db, time.monotonic() + timeout)
        prof = _active_profile(eng, profile)
        made = _writable(out)  # before anything is uploaded or run
        missing = registry.readiness([prof])[prof["ref"]]
        if missing is not None:  # a worker elsewhere may have what this machine lacks
            _warn(f"profile {prof['ref']} cannot run on this machine: {missing}")
        store = Storage(eng.db, s, clock=eng.clock)
        with _unmade_if_refused(made), _read_in(files, prof) as paths:
            _acceptable(prof, overrides, paths, files)  # before anything is uploaded
            if len(paths) == 1:
                objects = [store.put_file(paths[0], project_id=project)]
            else:
                objects = store.put_files(paths, project_id=project)
        new = [
            NewJob(
                prof["job_type"],
                dict(overrides),
                profile=prof["ref"],
                object_id=o["object_id"],
                project_id=project,
                priority=priority,
                created_by="cli",
            )
            for o in objects
        ]
        with _unmade_if_refused(made):  # a budget refuses them all: nothing runs
            ids = _enqueue(eng, store, new)
        local = _local_worker(eng, ids, run_here, concurrency or os.cpu_count() or 1)
        why = INTERRUPTED  # if the wait itself fails: the worker stops at once too
        try:
            died = local.died if local is not None else None
            jobs, why = _wait(eng, ids, [printable(f.name) for f in files], timeout, died)
        finally:
            # At once when the wait was cut short (Ctrl-C, --wait-timeout): what
            # it ran is retried.  A drain kept the command up to 30 s past its timeout.
            if why == INTERRUPTED:
                ignore_stop_signals()
            if local is not None:
                try:
                    local.stop(now=bool(why))
                except KeyboardInterrupt:
                    # Ctrl-C (or SIGTERM) while it drains an older job it took
                    # up: at once now.  This run's jobs are done: they are
                    # still reported and written (it exited 130, saying
                    # nothing, the older job left `processing` for minutes).
                    ignore_stop_signals()
                    local.stop(now=True)
        if local is not None:
            jobs = _rows(eng, ids)  # what its drain finished meanwhile
        out.mkdir(parents=True, exist_ok=True)
        records: list[Row] = []
        inputs = _resolved(files)
        each = list(zip(files, _stems(files), ids, strict=True))
        for n, (path, stem, job_id) in enumerate(each):
            try:
                records.append(_record(eng, store, path, stem, jobs[job_id], out, why, inputs))
            except KeyboardInterrupt:  # its jobs exist: every input is still reported
                ignore_stop_signals()
                records += [_unwritten(p, jobs[j]) for p, _, j in each[n:]]
                break
    for r in records:
        if as_json:
            print_json(r)
        else:
            _say(r)
    if not all(r["status"] == "completed" and r["error_code"] is None for r in records):
        raise typer.Exit(1)


INTERRUPTED = "the wait was interrupted"


def _active_profile(eng: Engine, ref: str) -> dict[str, Any]:
    try:
        prof = Profiles(eng).show(ref)
    except NotFound as exc:  # a bad argument, as `jobs submit --profile nope` says it
        raise InvalidRequest(str(exc)) from None
    if not prof["is_active"]:
        raise InvalidRequest(f"profile {prof['ref']} is deactivated: new jobs cannot use it")
    return prof


def _enqueue(eng: Engine, store: Storage, new: list[NewJob]) -> list[int]:
    try:
        return eng.enqueue_many(new)
    except HypermediaError:  # a budget, say: the uploads are of no use now
        store.discard([j.object_id for j in new if j.object_id is not None])
        raise
    except BaseException as exc:  # (SIGTERM too) they stayed ready, unreferenced, for a day
        # Also what SQLAlchemy raises when the interrupt cut its commit short.
        if not while_interrupted(exc):
            raise
        ignore_stop_signals()  # the rest is cleaning up: a second press would cut it short
        # Any that the enqueue took after all are referenced: discard keeps them.
        store.discard([j.object_id for j in new if j.object_id is not None])
        raise


def _acceptable(prof: Row, overrides: Row, paths: list[Path], names: list[Path]) -> None:
    """What enqueue would refuse that can be told before the upload: the
    params, and an input larger than the profile takes (named).  The rest
    (a budget, which needs the inputs' pages) is told after, and the uploads
    are then discarded."""
    check_params(overrides)
    try:
        registry.get(prof["job_type"]).validate(dict(overrides), dict(prof["settings"] or {}))
    except JobError as exc:
        raise InvalidRequest(exc.reason) from None
    for path, name in zip(paths, names, strict=True):
        size = path.stat().st_size
        if size > prof["max_input_bytes"]:
            raise InvalidRequest(_too_large(name, prof, f"{size} bytes"))


def _too_large(name: Path, prof: Row, size: str) -> str:
    return (
        f"{display_name(name.name)} is larger than profile {prof['ref']} accepts "
        f"({size}; at most {prof['max_input_bytes']})"
    )


@contextmanager
def _read_in(files: list[Path], prof: Row) -> Iterator[list[Path]]:
    """``as_regular_files`` reading a stream no further than the profile
    takes: ``/dev/zero`` was copied until the disk was full, and only then
    found too large."""
    try:
        with as_regular_files(list(files), prof["max_input_bytes"]) as paths:
            yield paths
    except StreamTooLarge as exc:  # as an input file that is too large says it
        size = f"more than {exc.limit} bytes"
        raise InvalidRequest(_too_large(exc.path, prof, size)) from None


def _migrated(s: Settings) -> None:
    """The embedded SQLite database at this code's schema, made if need be:
    the user's own file, as ``serve`` treats it.  A server database is left to
    its operator's ``hypermedia db upgrade``."""
    if not s.url.startswith("sqlite"):
        return
    from hypermedia.db import migrate, revisions

    make_home(s.home)
    if migrate.current(s.url) != revisions.head():
        migrate.upgrade(s.url)


def _local_worker(
    eng: Engine, ids: list[int], run_here: bool | None, concurrency: int
) -> LocalWorker | None:
    """A worker in this process for the jobs' queues that no worker serves
    (all of them with ``--run-here``), started; None when not needed."""
    queues = {r["queue_name"] for r in _rows(eng, ids).values()}
    for name in sorted(queues & Queues(eng).paused()):  # no worker claims from it
        _warn(f"queue {name} is paused: its jobs wait until `hypermedia queues resume {name}`")
    unserved = queues - Fleet(eng).serving(queues)
    if run_here is False:
        if unserved:
            _warn(
                f"no worker serves queue {', '.join(sorted(unserved))}: the jobs "
                "wait for one (`hypermedia serve` or `hypermedia worker`)"
            )
        return None
    chosen = queues if run_here else unserved
    if not chosen:
        return None
    local = LocalWorker(eng, sorted(chosen), concurrency, ids)
    local.start()
    return local


def _warn(text: str) -> None:
    err_console.print(f"warning: {text}", markup=False, highlight=False)


def _wait(
    eng: Engine,
    ids: list[int],
    names: list[str],
    timeout: float,
    died: Callable[[], str | None] | None = None,
) -> tuple[dict[int, Row], str]:
    """Poll the jobs until all are terminal or ``timeout`` passes, or the
    command's own worker (``died``) ends; a bar per job.

    Returns the last rows seen and, if the wait was cut short, why.
    """
    deadline = time.monotonic() + timeout
    bar = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}% {task.fields[status]}"),
        console=err_console,
        disable=not err_console.is_terminal,
    )
    jobs: dict[int, Row] = {}
    with bar:
        tasks = {
            i: bar.add_task(n, total=100, status="queued") for i, n in zip(ids, names, strict=True)
        }
        try:
            while True:
                jobs = through_outages(lambda: _rows(eng, ids), deadline)
                for job_id, task in tasks.items():
                    job = jobs[job_id]
                    bar.update(task, completed=_percent(job), status=job["status"])
                if all(j["status"] in TERMINAL for j in jobs.values()):
                    return jobs, ""
                if time.monotonic() >= deadline:
                    return jobs, f"not finished within {timeout:g}s"
                if died is not None and (why := died()):
                    return jobs, why
                time.sleep(POLL_SECONDS)
        except KeyboardInterrupt:
            ignore_stop_signals()  # the rest is reporting (a second press killed it before)
            if len(jobs) < len(ids):  # interrupted before the first look
                jobs = _rows(eng, ids)
            return jobs, INTERRUPTED


def _rows(eng: Engine, ids: list[int]) -> dict[int, Row]:
    with eng.db.read() as tx:
        return {r["job_id"]: r for r in tx.jobs_where(ids)}


def _percent(job: Row) -> float:
    if job["status"] == "completed":
        return 100.0
    snap = job.get("progress") or {}
    return float(snap.get("percent") or 0) if isinstance(snap, dict) else 0.0


# The most bytes of an input's stem an output's name keeps.  A file name is at
# most 255 bytes (NAME_MAX), and the output's is the stem plus
# ".<output type>[.<n>].<ext>" (".page_preview_50.webp"...), downloaded first
# as ".<name>.<8 hex>.part": a 250-byte input name, valid itself, made an
# output name too long to write (OUTPUT_NOT_WRITTEN, exit 1).
MAX_STEM_BYTES = 160


def _short(stem: str) -> str:
    """``stem`` cut to MAX_STEM_BYTES bytes of the file system's encoding, on a
    whole character."""
    while len(os.fsencode(stem)) > MAX_STEM_BYTES:
        stem = stem[:-1]
    return stem


def _stems(files: list[Path]) -> list[str]:
    """Input stems, shortened, made unique (a/x.png and b/x.png give x and x-2).

    Unique against every stem already given, not only its own kind: x.png,
    b/x.png and x-2.jpg gave x, x-2 and x-2, and the third job's outputs
    overwrote the second's."""
    taken: set[str] = set()
    out = []
    for f in files:
        # Without controls: a right-to-left override in "x\u202egnp.exe"
        # would show "<stem>.thumb.webp" as another type of file.
        stem = name = _short(display_name(Path(input_name(f)).stem, local=True) or "file")
        n = 1
        while name in taken:
            n += 1
            name = f"{stem}-{n}"
        taken.add(name)
        out.append(name)
    return out


def _resolved(files: list[Path]) -> set[Path]:
    """The inputs' real paths (streams have none worth keeping)."""
    return {f.resolve() for f in files if f.is_file()}


def _base(path: Path, job: Row) -> Row:
    return {
        "input": str(path),
        "job_id": job["job_id"],
        "status": job["status"],
        "error_code": job["error_code"],
        "safe_reason": job["safe_reason"],
        "outputs": [],
        # What a data-only job found (a virus verdict, a duplicate list): there
        # is no file to write for it, and a bare "completed" said nothing.
        "result": job.get("result"),
    }


def _unwritten(path: Path, job: Row) -> Row:
    """The record of an input whose outputs Ctrl-C stopped from being written."""
    if job["status"] != "completed":
        return _base(path, job)
    return {
        **_base(path, job),
        "error_code": "OUTPUT_NOT_WRITTEN",
        "safe_reason": "interrupted before its outputs were written "
        f"(`hypermedia jobs show {job['job_id']}`)",
    }


def _record(
    eng: Engine,
    store: Storage,
    path: Path,
    stem: str,
    job: Row,
    out: Path,
    why: str,
    inputs: set[Path],
) -> Row:
    record = _base(path, job)
    if job["status"] not in TERMINAL:
        # The last attempt's reason stays: "clamd is away" is why it waits.
        last = f" (its last attempt: {job['safe_reason']})" if job["safe_reason"] else ""
        record["safe_reason"] = (
            f"{why}; the job goes on{last} (hypermedia jobs show {job['job_id']})"
        )
        return record
    if job["status"] != "completed":
        return record
    rows = [o for o in eng.get(job["job_id"])["outputs"] if o["object_id"] is not None]
    counts: dict[str, int] = {}
    for o in rows:
        counts[o["output_type"]] = counts.get(o["output_type"], 0) + 1
    seen: dict[str, int] = {}
    for o in rows:
        kind = o["output_type"]
        n = seen[kind] = seen.get(kind, 0) + 1
        name = f"{stem}.{kind}" + (f".{n}" if counts[kind] > 1 else "")
        dst = out / f"{name}.{extension_for(o['mime_type'])}"
        if dst.resolve() in inputs:  # `process x.png x.thumb.webp --out .`
            record["error_code"] = "OUTPUT_NOT_WRITTEN"
            record["safe_reason"] = (
                f"an output would replace the input {printable(dst.name)}: give another --out"
            )
            continue
        if dst.is_dir():  # a rename onto it said "[Errno 21]" of a temporary name
            record["error_code"] = "OUTPUT_NOT_WRITTEN"
            record["safe_reason"] = (
                f"an output's name {printable(str(dst))} is taken by a folder: give another --out"
            )
            continue
        try:
            _download(store, o["object_id"], dst)
        except Exception as exc:  # one output that cannot be written fails this input only
            record["error_code"] = "OUTPUT_NOT_WRITTEN"
            record["safe_reason"] = f"an output could not be written: {redact(exc, 200)}"
            continue
        record["outputs"].append(str(dst))
    return record


def _writable(out: Path) -> list[Path]:
    """--out made if need be and written to once, or refused in its own words
    (a failure there read as "could not read local storage", after the jobs
    ran); the folders it made, deepest first."""
    if out.is_symlink() and not out.exists():
        raise InvalidRequest("--out cannot be written to: it is a symlink to nothing")
    made = [p for p in (out, *out.parents) if not p.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=out).close()
    except OSError as exc:
        raise InvalidRequest(f"--out cannot be written to: {exc.strerror}") from None
    return made


@contextmanager
def _unmade_if_refused(made: list[Path]) -> Iterator[None]:
    """Remove the --out folders this run made when it is refused before
    anything runs (exit 2 is "nothing was done"; they were left behind), or
    its jobs are (a credit budget: exit 1, the uploads handed to GC), or it
    is interrupted before its jobs exist (Ctrl-C, SIGTERM: exit 130)."""
    try:
        yield
    except (HypermediaError, KeyboardInterrupt):
        for folder in made:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only if still empty
        raise


def _download(store: Storage, object_id: int, dst: Path) -> None:
    """Download verified to a temporary name, then rename: never a half file under ``dst``."""
    tmp = dst.with_name(f".{dst.name}.{uuid.uuid4().hex[:8]}.part")
    try:
        store.download(store.get(object_id), tmp)
        tmp.replace(dst)
    finally:
        tmp.unlink(missing_ok=True)


def _brief_result(result: Any, limit: int = 300) -> str:
    """A job's result on one line (no output files to name): its JSON, cut."""
    if result in (None, {}):
        return "no output files"
    return cut(json.dumps(result, separators=(", ", ": "), ensure_ascii=False, default=str), limit)


def _say(r: Row) -> None:
    # The input as given, escaped: a name is anyone's text, and its newlines,
    # ESC sequences or bidi overrides printed raw made fake lines of output.
    shown = printable(r["input"])
    if r["status"] == "completed" and r["error_code"] is None:
        # The output paths too: --out is anyone's text as well.
        made = printable(", ".join(r["outputs"])) or printable(_brief_result(r["result"]))
        line = f"{shown}: completed (job {r['job_id']}) → {made}"
        console.print(line, soft_wrap=True, markup=False, highlight=False)
        return
    code = f" {r['error_code']}" if r["error_code"] else ""
    reason = f": {printable(r['safe_reason'])}" if r["safe_reason"] else ""
    # Text, not markup around it: rich's escape() doubles a trailing
    # backslash ("bad\\" printed for "bad\"), meant for a string that ends the markup.
    text = Text(shown)
    text.append(": ").append(r["status"], style="bold")
    text.append(f"{code} (job {r['job_id']}){reason}")
    console.print(text, soft_wrap=True, highlight=False)

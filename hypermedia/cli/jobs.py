"""hypermedia jobs submit|ls|show|cancel|retry|prune|tail."""

from __future__ import annotations

import json
import math
import re
import time
from collections import Counter
from functools import partial
from typing import Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from hypermedia.cli.common import (
    MAX_ID,
    an_id,
    console,
    cut,
    engine,
    err_console,
    flush_stdout,
    json_object,
    print_json,
    saying_done,
    through_outages,
    user_errors,
)
from hypermedia.cli.queues import known_queues, warn_unknown_queue
from hypermedia.errors import InvalidRequest, NotFound
from hypermedia.pipelines import registry
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import NewJob, check_queue_name
from hypermedia.queue.profiles import Profiles
from hypermedia.queue.queues import Queues
from hypermedia.queue.states import TERMINAL

app = typer.Typer(
    help="Submit, list, inspect, follow, cancel and retry jobs.", no_args_is_help=True
)

LIST_COLUMNS = (
    "job_id",
    "job_type",
    "queue_name",
    "priority",
    "status",
    "attempt_count",
    "error_code",
    "created_at",
)


@app.command()
def submit(
    job_type: str | None = typer.Argument(
        None, help="e.g. debug.noop, debug.sleep; left out: --profile's", show_default=False
    ),
    params: str = typer.Option("{}", "--params", help="JSON object of parameters"),
    priority: int = typer.Option(5, "--priority", min=1, max=10, help="1 highest … 10 lowest"),
    queue: str | None = typer.Option(None, "--queue", help="default: the profile's queue"),
    profile: str | None = typer.Option(None, "--profile", help="KEY or KEY:vN"),
    count: int = typer.Option(1, "--count", min=1, max=1_000_000),
    max_attempts: int = typer.Option(3, "--max-attempts", min=1, max=100),
    timeout: int | None = typer.Option(None, "--timeout", help="seconds per attempt"),
    project: str = typer.Option("default", "--project"),
    object_id: int | None = typer.Option(
        None, "--object", min=1, max=MAX_ID, help="input object id"
    ),
    idempotency_key: str | None = typer.Option(None, "--idempotency-key"),
    wait: bool = typer.Option(False, "--wait", help="wait until every job is terminal"),
    wait_timeout: float | None = typer.Option(
        None, "--wait-timeout", min=0, help="with --wait: give up after S seconds (exit 1)"
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Enqueue COUNT jobs of JOB_TYPE (or of --profile's job type)."""
    with user_errors():
        if job_type is None and profile is None:
            raise InvalidRequest("give JOB_TYPE, --profile, or both")
        parsed = json_object(params, "--params")
        if idempotency_key and count > 1:
            raise InvalidRequest("--idempotency-key needs --count 1")
        if wait_timeout is not None and not wait:  # it was ignored, and nothing said so
            raise InvalidRequest("--wait-timeout needs --wait")
        # --wait: a database away as it starts is waited for too (for as long
        # as the wait may take), then the jobs are submitted once.
        until = None
        if wait:
            until = math.inf if wait_timeout is None else time.monotonic() + wait_timeout
        eng = engine(wait_out=until)
        if queue is not None and queue not in known_queues(Queues(eng)):
            check_queue_name(queue)  # a name no job may have is refused, not warned of
            warn_unknown_queue(queue)  # queued for ever, most likely: said before it is
        if job_type is None:  # as POST /v1/jobs takes a profile alone
            try:
                job_type = str(Profiles(eng).show(str(profile))["job_type"])
            except NotFound as exc:  # said as with a job type given: "error: no profile …"
                raise InvalidRequest(str(exc)) from None
        job = NewJob(
            job_type,
            parsed,
            profile=profile,
            queue=queue,
            priority=priority,
            max_attempts=max_attempts,
            timeout_seconds=timeout,
            project_id=project,
            object_id=object_id,
            idempotency_key=idempotency_key,
            created_by="cli",
        )
        # One transaction, all or none: a budget refuses the whole count (it
        # was one per 1000 jobs, leaving the first thousands queued).
        ids = [eng.enqueue(job)] if idempotency_key else eng.enqueue_many([job] * count)
        queued = f"job {ids[0]}" if count == 1 else f"{len(ids)} jobs: {ids[0]} … {ids[-1]}"
        said = f"{queued} queued"
        if idempotency_key and (now := eng.get(ids[0])["status"]) != "queued":
            # The key's first job, which has moved on: nothing was queued now.
            said = f"{queued} (submitted before with this key: {now})"
        if not wait:
            with saying_done(said):
                if as_json:
                    print_json({"job_ids": ids})
                else:
                    console.print(said)
            return
        # Said before the wait: a Ctrl-C leaves the jobs running, and their ids known.
        err_console.print(f"{queued} queued; waiting until they end", highlight=False)
        if not _wait(eng, ids, wait_timeout):
            err_console.print(f"not ended within {wait_timeout:g} s; the jobs go on")
        jobs = [_brief(eng.get(i)) for i in ids]
        if as_json:
            print_json({"jobs": jobs})
        else:
            _say_ended(jobs)
        if any(j["status"] != "completed" for j in jobs):
            raise typer.Exit(1)  # as jobs tail and process: 0 only when every job completed


def _say_ended(jobs: list[dict[str, Any]]) -> None:
    """One line per job that did not complete (the first 20), then the tally."""
    unhappy = [j for j in jobs if j["status"] != "completed"]
    for j in unhappy[:20]:
        code = f" {j['error_code']}" if j["error_code"] else ""
        reason = f": {j['safe_reason']}" if j["safe_reason"] else ""
        console.print(f"job {j['job_id']} {j['status']}{code}{reason}", highlight=False)
    tally = Counter(j["status"] for j in jobs)
    console.print(", ".join(f"{n} {status}" for status, n in sorted(tally.items())))


def _wait(eng: Any, ids: list[int], timeout: float | None = None) -> bool:
    """Whether every job ended (within ``timeout`` seconds, if given)."""
    pending = set(ids)
    deadline = None if timeout is None else time.monotonic() + timeout
    while pending:
        for job_id in list(pending):
            if through_outages(partial(eng.get, job_id))["status"] in TERMINAL:
                pending.discard(job_id)
        if pending:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.2)
    return True


def _brief(job: dict[str, Any]) -> dict[str, Any]:
    return {
        k: job.get(k)
        for k in (
            "job_id",
            "job_uuid",
            "job_type",
            "status",
            "outcome",
            "error_code",
            "safe_reason",
            "result",
        )
    }


def _why_none(eng: Engine, job_type: str | None, queue: str | None) -> None:
    """An empty listing for a name nothing uses is most likely a typo: said."""
    if job_type is not None and job_type not in registry.known():
        err_console.print(
            f"warning: no pipeline runs job type {job_type} (a typo?); known: "
            + ", ".join(registry.known()),
            markup=False,
            highlight=False,
        )
    if queue is not None and queue not in known_queues(Queues(eng)):
        warn_unknown_queue(queue)


@app.command("ls")
def list_jobs(
    status: str | None = typer.Option(None, "--status"),
    job_type: str | None = typer.Option(None, "--type"),
    queue: str | None = typer.Option(None, "--queue"),
    limit: int = typer.Option(50, "--limit", min=1, max=10_000),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """List jobs, newest first."""
    with user_errors():
        eng = engine()
        rows = eng.list(status=status, job_type=job_type, queue=queue, limit=limit)
        if not rows:
            _why_none(eng, job_type, queue)
        if as_json:
            print_json([{k: r[k] for k in (*LIST_COLUMNS, "job_uuid", "outcome")} for r in rows])
            return
        table = Table(*LIST_COLUMNS)
        for r in rows:
            table.add_row(*("" if r[c] is None else str(r[c]) for c in LIST_COLUMNS))
        console.print(table)


@app.command()
def show(job_id: int = an_id("job"), as_json: bool = typer.Option(False, "--json")) -> None:
    """One job with its attempts, outputs and events."""
    with user_errors():
        job = engine().get(job_id)
        if as_json:
            print_json(job)
            return
        console.print(
            f"[bold]job {job['job_id']}[/] {escape(job['job_type'])}  status [bold]"
            f"{job['status']}[/] ({job['legacy_status']})  queue {escape(job['queue_name'])}"
            f"  priority {job['priority']}  attempts {job['attempt_count']}/"
            f"{job['max_attempts']}"
            + (f"  profile {escape(job['profile'])}" if job["profile"] else ""),
            markup=True,
        )
        if job["safe_reason"]:
            code = f"{job['error_code']}: " if job["error_code"] else ""  # none for a cancel
            console.print(f"reason: {code}{job['safe_reason']}", markup=False, highlight=False)
        if job["result"] is not None:
            console.print(f"result: {json.dumps(job['result'])}")
        attempts = Table(
            "attempt",
            "worker",
            "status",
            "code",
            "started",
            "ms",
            "cpu ms",
            "peak MB",
            title="attempts",
        )
        for a in job["attempts"]:
            attempts.add_row(
                *(
                    str(a[k]) if a[k] is not None else ""
                    for k in (
                        "attempt_number",
                        "worker_id",
                        "status",
                        "error_code",
                        "started_at",
                        "duration_ms",
                        "cpu_time_ms",
                        "peak_memory_mb",
                    )
                )
            )
        console.print(attempts)
        console.print(_outputs_table(job["outputs"]))
        events = Table("at", "from", "to", "kind", "message", title="events")
        for e in job["events"]:
            events.add_row(
                str(e["created_at"]),
                e["from_status"] or "",
                e["to_status"] or "",
                e["kind"],
                e["message"],
            )
        console.print(events)


def _outputs_table(outputs: list[dict[str, Any]]) -> Table:
    """What the job made, as ``--json`` has it: one row per output, its object
    (none for a data-only output: a verdict lives in ``metadata``)."""
    table = Table("output", "object", "mime", "bytes", "profile", "metadata", title="outputs")
    for o in outputs:
        table.add_row(
            o["output_type"],
            "" if o["object_id"] is None else str(o["object_id"]),
            o["mime_type"],
            str(o["output_size_bytes"]),
            o["profile_version"],
            # A long value (a duplicate check lists ids) is cut: --json has all of it.
            "" if o["metadata"] is None else cut(json.dumps(o["metadata"]), 200),
        )
    return table


@app.command()
def cancel(job_id: int = an_id("job"), as_json: bool = typer.Option(False, "--json")) -> None:
    """Cancel a job: waiting ones at once, running ones are stopped by their worker."""
    with user_errors():
        status = engine().cancel(job_id, actor="cli")
        if as_json:
            print_json({"job_id": job_id, "status": status})
        else:
            console.print(f"job {job_id}: {status}")


@app.command()
def retry(job_id: int = an_id("job"), as_json: bool = typer.Option(False, "--json")) -> None:
    """Queue a failed or cancelled job again, as a new attempt."""
    with user_errors():
        eng = engine()
        eng.retry(job_id, actor="cli")
        if as_json:
            print_json({"job_id": job_id, "status": "queued"})
        else:
            console.print(f"job {job_id}: queued again")


@app.command()
def prune(
    older_than_days: float | None = typer.Option(
        None,
        "--older-than-days",
        metavar="DAYS",  # above 0, checked below: Typer has no open minimum to show
        help="above 0; default: HYPERMEDIA_JOB_RETENTION_DAYS (the leader prunes every hour)",
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Delete jobs that ended (completed, failed, cancelled) more than N days ago, now.

    Their attempts, events and output rows go with them; outputs no photo or
    other job refers to are then left for GC.  Credit use is kept.
    """
    from hypermedia.scheduler.retention import JobRetention

    with user_errors():
        if older_than_days is not None and not 0 < older_than_days <= 36_500:
            raise InvalidRequest(
                "--older-than-days must be above 0 (0 would delete every ended job) "
                "and at most 36,500"
            )
        eng = engine()
        days = eng.settings.job_retention_days if older_than_days is None else older_than_days
        if days <= 0:
            raise InvalidRequest(
                "job retention is off (HYPERMEDIA_JOB_RETENTION_DAYS=0): "
                "give --older-than-days above 0"
            )
        deleted = JobRetention(eng, days=days).run_once()
        if as_json:
            print_json({"deleted": deleted})
        else:
            console.print(f"deleted {deleted} finished job(s)")


TAIL_POLL_SECONDS = 0.25
# A determinate progress event's message starts with its percent ("42.5% step").
_PERCENT = re.compile(r"^(\d{1,3}(?:\.\d+)?)%\s*(.*)$")


def _percent(row: dict[str, Any]) -> tuple[float, str] | None:
    if row["kind"] != "progress":
        return None
    match = _PERCENT.match(row["message"] or "")
    if match is None:
        return None
    return min(100.0, float(match.group(1))), match.group(2)


def _event_line(row: dict[str, Any]) -> str:
    at = row["created_at"]
    stamp = at.strftime("%H:%M:%S") if hasattr(at, "strftime") else str(at)
    attempt = f" [attempt {row['attempt_number']}]" if row["attempt_number"] else ""
    if row["to_status"]:
        line = f"{stamp}  {row['from_status'] or '-'} -> {row['to_status']}{attempt}"
    else:
        line = f"{stamp}  {row['kind']}{attempt}"
    if row["code"] and not (row["message"] or "").startswith(row["code"]):
        line += f"  {row['code']}"
    if row["message"]:
        line += f"  {row['message']}"
    return line


class _Follower:
    """Prints events as lines; determinate progress drives a bar on a terminal."""

    def __init__(self, job_id: int, as_json: bool) -> None:
        self.job_id = job_id
        self.as_json = as_json
        self.progress: Progress | None = None
        self.task: TaskID | None = None

    def event(self, row: dict[str, Any]) -> None:
        if self.as_json:
            # Flushed per line: to a pipe (`| jq`, `| head -1`) stdout is
            # block-buffered, and every line came at the job's end.
            print_json(row)
            flush_stdout()
            return
        pct = _percent(row)
        if pct is not None and console.is_terminal:
            self._bar(*pct)
            return
        if row["to_status"] and self.progress is not None and row["to_status"] != "processing":
            self.close()  # the attempt is over: the bar goes, the lines go on
        console.print(_event_line(row), highlight=False, markup=False, soft_wrap=True)

    def _bar(self, percent: float, step: str) -> None:
        if self.progress is None:
            self.progress = Progress(
                TextColumn(f"job {self.job_id}"),
                BarColumn(),
                TextColumn("{task.percentage:>5.1f}%"),
                TimeElapsedColumn(),
                TextColumn("{task.description}", markup=False),
                console=console,
                transient=False,
            )
            self.progress.start()
            self.task = self.progress.add_task(step, total=100)
        assert self.task is not None
        self.progress.update(self.task, completed=percent, description=step)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
            self.task = None


@app.command()
def tail(
    job_id: int = an_id("job"),
    as_json: bool = typer.Option(False, "--json", help="one JSON object per line"),
) -> None:
    """Follow a job live until it ends: its past events, then each new one as it happens.

    Exits 0 when the job completed, 1 when it failed or was cancelled.
    """
    follower = _Follower(job_id, as_json)
    try:
        with user_errors():
            eng = engine()
            after = 0
            while True:
                # Status first: if terminal, the events read with it include
                # the one that made it so, and the loop may stop.
                status, rows = through_outages(partial(eng.events_since, job_id, after))
                for row in rows:
                    follower.event(row)
                    after = max(after, int(row["event_id"]))
                if status in TERMINAL:
                    break
                time.sleep(TAIL_POLL_SECONDS)
            follower.close()
            job = eng.get(job_id)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    finally:
        follower.close()
    end = {
        "kind": "end",
        "job_id": job_id,
        "status": job["status"],
        "error_code": job["error_code"],
        "safe_reason": job["safe_reason"],
        "result": job["result"],
    }
    if as_json:
        print_json(end)
    elif job["status"] == "completed":
        result = "" if job["result"] is None else f": {json.dumps(job['result'])}"
        console.print(
            f"job {job_id} [green]completed[/]{escape(result)}", markup=True, highlight=False
        )
    else:
        reason = f": {job['error_code']}: {job['safe_reason']}" if job["error_code"] else ""
        line = f"job {job_id} [red]{job['status']}[/]{escape(reason)}"
        console.print(line, markup=True, highlight=False)
    raise typer.Exit(0 if job["status"] == "completed" else 1)

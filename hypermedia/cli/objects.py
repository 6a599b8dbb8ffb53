"""hypermedia objects put|get|ls|url|verify, hypermedia pools add|ls|rm, hypermedia gc run-once."""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from hypermedia import leftovers
from hypermedia.cli.common import (
    MAX_ID,
    an_id,
    as_regular_files,
    console,
    engine,
    err_console,
    existing_inputs,
    media_type,
    print_json,
    saying_done,
    settings,
    sigterm_as_ctrl_c,
    stop_signals_held,
    user_errors,
    write_whole,
)
from hypermedia.errors import Conflict, HypermediaError, InvalidRequest
from hypermedia.parse import base_url
from hypermedia.storage.base import StorageError
from hypermedia.storage.gc import GarbageCollector
from hypermedia.storage.ledger import POOL_RECHECK_SECONDS, Storage

objects_app = typer.Typer(help="Store and fetch objects (files).", no_args_is_help=True)
pools_app = typer.Typer(help="Storage pools: local folders and S3 buckets.", no_args_is_help=True)
gc_app = typer.Typer(help="Garbage collection of unreferenced objects.", no_args_is_help=True)

OBJECT_COLUMNS = ("object_id", "state", "mime_type", "size", "width", "height", "filename")


def storage() -> Storage:
    s = settings()
    eng = engine(s)
    return Storage(eng.db, s, clock=eng.clock)


def public(row: dict[str, Any]) -> dict[str, Any]:
    """An object as users see it: no internal key, the checksum as stored."""
    keep = (*OBJECT_COLUMNS, "pool_id", "checksum", "pages", "duration_ms", "created_at")
    return {k: row.get(k) for k in keep}


@objects_app.command("put")
def put(
    files: list[Path] = typer.Argument(
        ..., dir_okay=False, readable=True, callback=existing_inputs
    ),
    pool: str | None = typer.Option(
        None, "--pool", help="default: HYPERMEDIA_DEFAULT_POOL (local)"
    ),
    mime: str | None = typer.Option(
        None, "--mime", help="a media type, type/subtype (default: detected from the bytes)"
    ),
    project: str = typer.Option("default", "--project"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Upload FILES (streamed, checksummed); several files are registered and synced together."""
    sigterm_as_ctrl_c()
    with user_errors():  # before a stream is read in
        mime = None if mime is None else media_type(mime)
    with user_errors(), as_regular_files(files) as files:
        st = storage()
        if len(files) == 1:
            rows = [st.put_file(files[0], pool=pool, mime=mime, project_id=project)]
        else:
            if mime:
                raise InvalidRequest("--mime applies to a single file")
            rows = st.put_files(files, pool=pool, project_id=project)
        ids = ", ".join(str(r["object_id"]) for r in rows)
        with saying_done(f"object{'s' if len(rows) > 1 else ''} {ids} stored"):
            if as_json:
                print_json(public(rows[0]) if len(rows) == 1 else [public(r) for r in rows])
                return
            for row in rows:
                oid, mime_type, size = row["object_id"], row["mime_type"], row["size"]
                console.print(f"object {oid} ready: {mime_type}, {size} bytes")


@objects_app.command("get")
def get(
    object_id: int = an_id("object"),
    output: Path | None = typer.Option(None, "-o", "--output", help="default: stdout"),
) -> None:
    """Download an object, verifying its checksum."""
    sigterm_as_ctrl_c()
    with user_errors():
        st = storage()
        with _where_blob_failed(st, object_id):
            _get(st, object_id, output)


@contextlib.contextmanager
def _where_blob_failed(st: Any, object_id: int) -> Iterator[None]:
    """A blob missing or damaged, said with its object, pool and key (what a
    restore from backup needs, as ``objects verify`` says it): it was "no
    blob under this key", naming none."""
    from hypermedia.storage.base import BlobMissing, ChecksumMismatch, ChecksumMissing, UnsafeKey

    try:
        yield
    except (BlobMissing, ChecksumMismatch, UnsafeKey) as exc:
        if isinstance(exc, ChecksumMissing):
            raise
        row = st.get(object_id)
        where = (
            f"pool {_pool_names(st).get(row['pool_id'], row['pool_id'])}, key {row['storage_key']}"
        )
        what = "no blob under its key" if isinstance(exc, BlobMissing) else str(exc)
        raise type(exc)(
            f"object {object_id}: {what} ({where}); `hypermedia objects verify` checks them all"
        ) from None


def _get(st: Any, object_id: int, output: Path | None) -> None:
    if output is None:
        with st.open(object_id) as src:
            while chunk := src.read(1024 * 1024):
                sys.stdout.buffer.write(chunk)
        return
    target = download_target(output)
    # Unbuffered, each chunk written whole: a buffered file dropped the rest
    # of a chunk the disk took only part of, and the cut file looked done.
    if target is None:  # a pipe, a device, a symlink to one: written as it is
        with st.open(object_id) as src, open(output, "wb", buffering=0) as out:
            while chunk := src.read(1024 * 1024):
                write_whole(out.fileno(), chunk, "-o")
        return
    # A new file of our own beside it (made exclusively: ".NAME.part"
    # removed a file the user had by that name, or wrote through a
    # symlink someone left there), renamed over the target once checked.
    # A get killed on the spot left its part behind for good: each one
    # is held (flock) while written, and the next get here removes those
    # nobody holds.
    leftovers.sweep_files(target.parent, f"{PART_PREFIX}*.part")
    tmp: Path | None = None
    try:
        # A SIGTERM just after the part was made (before its name was
        # kept) left it behind: held until it is named.
        with stop_signals_held():
            fd, tmp = _part_file(target.parent)
        with os.fdopen(fd, "wb", buffering=0) as out, st.open(object_id) as src:
            os.fchmod(out.fileno(), 0o666 & ~_umask())  # as open() would have made it
            while chunk := src.read(1024 * 1024):
                write_whole(out.fileno(), chunk, "-o")
        tmp.replace(target)  # never leave a half or unverified file under the name
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)


def _part_file(folder: Path) -> tuple[int, Path]:
    try:
        fd, name = tempfile.mkstemp(".part", PART_PREFIX, folder)
    except OSError as exc:  # a folder we may not write in (/proc, read-only): -o's to fix
        raise InvalidRequest(f"-o cannot be written to: {exc.strerror}") from None
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # new and ours: never refused
    return fd, Path(name)


PART_PREFIX = ".hypermedia-get-"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def download_target(output: Path) -> Path | None:
    """Where ``objects get -o`` renames its checked download to: the file
    itself, or the regular file a symlink points to (as ``cp`` writes through
    one).  None for anything else (a FIFO, /dev/stdout, a device): the bytes
    are written into it, since renaming over it would replace the pipe or
    device with a plain file."""
    if not output.name:
        raise InvalidRequest("-o needs a file name")
    try:
        mode = output.stat().st_mode  # follows a symlink
    except FileNotFoundError:
        if output.is_symlink():
            raise InvalidRequest("-o names a symlink to nothing") from None
        if not output.parent.is_dir():
            raise InvalidRequest("-o's folder does not exist") from None
        return output
    if stat.S_ISDIR(mode):
        raise InvalidRequest("-o names a folder: give a file name")
    if not stat.S_ISREG(mode):
        return None
    return output.resolve() if output.is_symlink() else output


@objects_app.command("show")
def show(object_id: int = an_id("object"), as_json: bool = typer.Option(False, "--json")) -> None:
    with user_errors():
        row = public(storage().get(object_id))
        if as_json:
            print_json(row)
        else:
            for k, v in row.items():
                console.print(f"{k:>12}: {'-' if v is None else v}")  # not Python's None


@objects_app.command("url")
def url(
    object_id: int = an_id("object"),
    base: str = typer.Option(
        "",
        "--base-url",
        help="http(s)://HOST[:PORT][/PATH] of the server (default: HYPERMEDIA_PUBLIC_URL)",
    ),
) -> None:
    """A signed download URL that expires (HYPERMEDIA_SIGNED_URL_SECONDS)."""
    with user_errors():
        # Before the database: a bad value is refused as it is.
        prefix = base_url(base) or settings().public_url
        link = storage().signed_url(object_id, prefix)
        console.print(link, soft_wrap=True)
        if link.startswith("/"):  # a local pool's link, served by serve/api
            err_console.print(
                "relative to the server that serves it: give --base-url URL "
                "or set HYPERMEDIA_PUBLIC_URL"
            )


@objects_app.command("ls")
def ls(
    state: str | None = typer.Option(None, "--state"),
    limit: int = typer.Option(50, "--limit", min=1, max=1000),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    with user_errors():
        rows = [public(r) for r in storage().list(state=state, limit=limit)]
        if as_json:
            print_json(rows)
            return
        table = Table(*OBJECT_COLUMNS)
        for r in rows:
            table.add_row(*(str(r[c]) for c in OBJECT_COLUMNS))
        console.print(table)


@objects_app.command("verify")
def verify(
    pool: str | None = typer.Option(None, "--pool", help="only this pool's objects"),
    after: int = typer.Option(0, "--after", min=0, max=MAX_ID, help="start after this object id"),
    limit: int | None = typer.Option(None, "--limit", min=1, help="check at most N objects"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Read every ready object back and check its size and checksum (a scrub).

    Exits 1 if any blob is missing, truncated or corrupt, and names them; also
    when the store goes away meanwhile (with --json the report then says so)."""
    from hypermedia.storage import scrub
    from hypermedia.storage.base import StorageUnavailable

    with user_errors():
        st = storage()
        pool_id = st.pool(pool)["pool_id"] if pool else None
        try:
            report = scrub.scrub(st, pool_id=pool_id, after=after, limit=limit)
        except scrub.ScrubStopped as exc:
            # What was found before still counts: printed, then why it stopped.
            _print_scrub(exc.report, as_json, _pool_names(st))
            if as_json:  # the report's "error" says it; stdout stays one JSON document
                raise typer.Exit(1) from None
            last = exc.report.last_object_id
            raise StorageUnavailable(
                f"{exc}; checked up to object {last}: go on with --after {last}"
            ) from exc
        _print_scrub(report, as_json, _pool_names(st))
    if report.findings:
        raise typer.Exit(1)


def _pool_names(st: Any) -> dict[int, str]:
    return {p["pool_id"]: p["name"] for p in st.pools()}


def _print_scrub(report: Any, as_json: bool, pools: dict[int, str]) -> None:
    if as_json:
        print_json(report.as_json())
        return
    for f in report.findings:
        # The pool and key as --json gives them: what a restore from backup needs.
        where = f"pool {pools.get(f.pool_id, f.pool_id)}, key {f.storage_key}"
        console.print(f"object {f.object_id}: {f.problem}: {f.detail} ({where})", highlight=False)
    console.print(
        f"checked {report.checked} objects ({report.bytes:,} bytes) up to object "
        f"{report.last_object_id}: {len(report.findings)} with a problem",
        highlight=False,
    )


@pools_app.command("add")
def pools_add(
    name: str,
    url: str = typer.Argument(..., help="file:///path or s3://bucket?endpoint=…&region=…"),
    project: str | None = typer.Option(None, "--project", help="default: shared"),
    check: bool = typer.Option(
        True, "--check/--no-check", help="first store and delete a probe blob in the pool"
    ),
) -> None:
    """Add a pool, once its store answers and takes a write (unless --no-check)."""
    with user_errors():
        st = storage()
        try:
            row = st.add_pool(name, url, project, check=check)
        except StorageError as exc:  # a storage error still: exit 1, not a usage error
            raise StorageError(
                f"pool {name!r} not added: {exc} (--no-check adds it unchecked)"
            ) from None
        except Conflict:  # the name is taken: the same command can never work (exit 2)
            raise InvalidRequest(_name_taken(st, name)) from None
        console.print(f"pool {row['pool_id']} {row['name']} added")


def _name_taken(st: Storage, name: str) -> str:
    """Why ``pools add NAME`` is refused when a pool has that name: which pool."""
    taken = next((p for p in st.pools() if p["name"] == name), None)
    which = f"pool {taken['pool_id']} {name!r}" if taken else f"a pool {name!r}"
    return f"{which} exists already: choose another name (`hypermedia pools ls` lists them)"


@pools_app.command("set-url")
def pools_set_url(
    name: str,
    url: str = typer.Argument(..., help="file:///path or s3://bucket?endpoint=…&region=…"),
    check: bool = typer.Option(
        True, "--check/--no-check", help="first store and delete a probe blob there"
    ),
) -> None:
    """Point a pool at a new URL (its store moved); its objects' keys stay."""
    with user_errors():
        try:
            row = storage().set_pool_url(name, url, check=check)
        except StorageError as exc:  # exit 1, as `pools add`
            raise StorageError(f"pool {name!r} not changed: {exc}") from None
        console.print(
            f"pool {row['pool_id']} {row['name']} now at the new URL: running workers and "
            f"servers move to it within {POOL_RECHECK_SECONDS:.0f} s",
            highlight=False,
        )


@pools_app.command("rm")
def pools_rm(name: str) -> None:
    """Remove a pool that no object (in any state) and no unfinished job uses."""
    with user_errors():
        storage().remove_pool(name)
        console.print(f"pool {name} removed", highlight=False)


@pools_app.command("ls")
def pools_ls(as_json: bool = typer.Option(False, "--json")) -> None:
    with user_errors():
        rows = storage().pools()
        if as_json:
            print_json(rows)
            return
        table = Table("pool_id", "name", "backend_url", "project_id")
        for r in rows:
            owner = "(shared)" if r["project_id"] is None else r["project_id"]  # not "None"
            table.add_row(str(r["pool_id"]), r["name"], r["backend_url"], owner)
        console.print(table)


@gc_app.command("orphans")
def gc_orphans(
    pool: str | None = typer.Option(None, "--pool", help="one pool (default: every pool)"),
    older_than_hours: float = typer.Option(
        24.0, "--older-than-hours", help="leave alone blobs written more recently than this"
    ),
    delete: bool = typer.Option(False, "--delete", help="delete them (through GC)"),
    force: bool = typer.Option(
        False, "--force", help="delete even when orphans are more than half of a pool's blobs"
    ),
    as_json: bool = typer.Option(False, "--json", help="the report as JSON"),
) -> None:
    """List the blobs in a pool's store that no object row leads to (GC never
    finds them); with --delete, delete them."""
    from hypermedia.storage.orphans import find_orphans

    with user_errors():
        if pool == "":
            raise InvalidRequest("--pool needs a pool's name")
        if force and not delete:
            raise InvalidRequest("--force goes with --delete")
        if not 0 <= older_than_hours <= 100 * 365 * 24:
            raise InvalidRequest("--older-than-hours must be 0 or more (and under a century)")
        report = find_orphans(
            storage(),
            pool=pool,
            grace_seconds=older_than_hours * 3600,
            delete=delete,
            force=force,
        )
        if as_json:
            print_json(report.as_dict())
        else:
            for line in report.lines():
                console.print(line, highlight=False, markup=False)
            if delete:
                console.print(f"deleted: {report.deleted}", highlight=False)
        unlisted = [p.pool for p in report.pools if p.error]
        if unlisted:
            raise HypermediaError(f"pool(s) {', '.join(unlisted)} not listed to the end: see why")
        refused = [p.pool for p in report.pools if p.refused]
        if refused:
            raise HypermediaError(f"orphans not deleted in pool(s) {', '.join(refused)}: see why")
        if report.not_deleted:
            raise HypermediaError(
                f"{report.not_deleted} blob(s) not deleted; `hypermedia gc run-once` says why "
                "and tries again"
            )


@gc_app.command("run-once")
def gc_run_once(as_json: bool = typer.Option(False, "--json")) -> None:
    """Mark and sweep once, now (the leader also runs this every HYPERMEDIA_GC_INTERVAL_SECONDS)."""
    with user_errors():
        # Failures come back summed per pool and kind and are printed here,
        # not logged per object: a store that is away fails every object alike.
        report = GarbageCollector(storage(), log_failures=False).run_once()
        if as_json:
            print_json(report.as_dict())
        else:
            counts = report.counts().items()
            console.print(", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in counts))
            for line in report.lines():
                console.print(line, highlight=False)
        if report.failed:
            raise HypermediaError(f"{report.failed} blob(s) could not be deleted; will retry")
        if report.kept:
            raise HypermediaError(f"{report.kept} deleting object(s) kept: see why above")
        if report.uploads_not_swept:  # a store away or refusing: cron should hear of it
            n = len(report.uploads_not_swept)
            raise HypermediaError(f"{n} pool(s) not swept of unfinished uploads: see why above")

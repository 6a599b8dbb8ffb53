"""What every command shares: settings, the engine, output and error handling."""

from __future__ import annotations

import contextlib
import errno
import faulthandler
import io
import json
import logging
import math
import os
import re
import select
import shutil
import signal
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import click
import typer
from rich.console import Console
from rich.markup import escape
from sqlalchemy.engine import url as sa_url

from hypermedia import leftovers
from hypermedia.config import HOME_MODE, Settings, load_settings
from hypermedia.db.dialects import is_schema_missing, is_transient
from hypermedia.db.driver import connect, normalise_url
from hypermedia.db.ready import not_ready, wait_until_ready
from hypermedia.errors import (
    HypermediaError,
    IdempotencyConflict,
    InvalidRequest,
    NotFound,
    ReadOnlyDatabase,
    Refused,
)
from hypermedia.parse import DuplicateKey, json_unique
from hypermedia.queue.clock import clock_for
from hypermedia.queue.engine import Engine
from hypermedia.redact import brief, redact
from hypermedia.storage.keys import display_name

# Piped or redirected, a line is as long as it is: Rich's default of 80 columns
# there cut table cells ("comple…", so `| grep completed` found nothing) and
# split one-line errors in two.
UNWRAPPED = 100_000


def _console(stderr: bool = False) -> Console:
    # Markup off: what we print is full of other people's text (reasons, file
    # names), and redaction's own markers ("[path]", "[token]") read as tags:
    # they vanished.  Our few styled lines opt in with markup=True and escape()
    # the rest.
    c = Console(stderr=stderr, markup=False)
    if c.is_terminal or os.environ.get("COLUMNS"):
        return c
    return Console(stderr=stderr, markup=False, width=UNWRAPPED)


console = _console()
err_console = _console(stderr=True)
T = TypeVar("T")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def ignore_stop_signals() -> None:
    """SIGTERM and SIGINT ignored from now on: what is left is a stop or a
    report, and a signal would only cut it short.  `process` once interrupted
    (a quick double Ctrl-C killed it with 130, sometimes before a line of its
    report); `serve` and `worker` once drained (Python puts the default
    handlers back as it finalizes: a second SIGTERM in that last half second
    killed them by the signal instead of exit 0)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def settings() -> Settings:
    s = load_settings()
    check_home(s.home)
    check_database_url(s.url)
    return s


class BadHome(InvalidRequest):
    """HYPERMEDIA_HOME names something that is not, and cannot become, a folder."""


def check_home(home: Path) -> None:
    """Refuse (exit 2) a HYPERMEDIA_HOME that is a file, or under one: every
    command failed later on it with a bare NotADirectoryError or
    FileExistsError whose path, the one thing to fix, was redacted.  The
    path is the user's own setting: said, as NoDatabase says its file."""
    for place in (home, *home.parents):
        if place.exists():
            if not place.is_dir():
                raise BadHome(f"HYPERMEDIA_HOME={home} cannot be a folder: {place} is a file")
            return


class UnwritableHome(HypermediaError):
    """HYPERMEDIA_HOME cannot be made or written: a read-only mount, say."""


def make_home(home: Path) -> None:
    """Make HYPERMEDIA_HOME, writable, or say which folder and why: a
    read-only one was "OSError: ... '[path]'" (the path, the user's own
    setting, redacted), or from ``worker`` a whole traceback."""
    try:
        # An existing folder keeps its mode (config.HOME_MODE).
        home.mkdir(mode=HOME_MODE, parents=True, exist_ok=True)
    except OSError as exc:
        raise UnwritableHome(f"HYPERMEDIA_HOME={home} cannot be made: {exc.strerror}") from None
    if not os.access(home, os.W_OK | os.X_OK):
        raise UnwritableHome(f"HYPERMEDIA_HOME={home} is not writable (scratch folders go there)")


SQLITE_FORMS = "sqlite:///PATH (relative to here) or sqlite:////ABSOLUTE/PATH"


def check_database_url(url: str) -> None:
    """Refuse (InvalidRequest, exit 2) a database URL that connecting would
    only fail on later, in words that hid the cause: ``sqlite://x.db`` gave
    "ArgumentError: Invalid SQLite URL" (exit 1), and a port past 65535 a
    "failed to resolve host".  The messages never quote the URL: it may
    hold a password."""
    u = sa_url.make_url(normalise_url(url))  # not a URL at all: refused there
    if u.get_backend_name() == "sqlite":
        # sqlite://NAME reads NAME as a host; sqlite:// alone is a database
        # in memory, gone when the command ends.
        if u.host or u.port is not None or u.username or not u.database:
            raise InvalidRequest(f"a SQLite database URL is {SQLITE_FORMS}")
    elif u.port is not None and not 1 <= u.port <= 65535:
        raise InvalidRequest("the database URL's port must be from 1 to 65535")


class NoDatabase(HypermediaError):
    """A command that only reads found no database where the settings point."""


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite database URL; None for a server database, an
    in-memory one or a ``file:`` URI (sqlite3 reads those itself)."""
    u = sa_url.make_url(normalise_url(url))
    if u.get_backend_name() != "sqlite":
        return None
    name = u.database or ""
    if name in ("", ":memory:") or name.startswith("file:"):
        return None
    return Path(name)


def require_database(url: str) -> None:
    """Refuse, creating nothing, when ``url`` is a SQLite file that is not there:
    connecting would make the folder and an empty database file."""
    path = sqlite_file(url)
    if path is not None and not path.exists():
        raise NoDatabase(
            f"no database at {path.resolve()} yet: run `hypermedia db upgrade` (or "
            "`hypermedia serve`) to create it, or set HYPERMEDIA_HOME or "
            "HYPERMEDIA_DATABASE_URL to an existing one"
        )


def engine(
    s: Settings | None = None, *, create: bool = False, wait_out: float | None = None
) -> Engine:
    """The engine over the settings' database.  A SQLite database that does
    not exist is refused (NoDatabase, exit 1) instead of created empty, where
    the command would only fail on the empty file ("no such table").
    ``create``: for the commands that wait for a migration (``worker``,
    ``scheduler``) or run one (``process``).  ``wait_out``: a database that
    is away is waited for until then (time.monotonic(); ``math.inf``: as
    long as it takes), said once (the commands that wait for jobs)."""
    s = s or settings()
    if not create:
        require_database(s.url)
    db = connect(s.url)
    if wait_out is not None:
        wait_for_schema(db, wait_out)
    elif not create:
        require_schema(db)
    return Engine(db, s, clock=clock_for(db))


def wait_for_schema(db: Any, deadline: float) -> None:
    """require_schema, through an outage until ``deadline``: `jobs submit
    --wait` and `process` were said to wait out a database that is away when
    they start, and failed at once (only `jobs tail` did)."""

    def check() -> None:
        with db.read() as tx:
            why = tx.schema_behind()
        if why is not None:
            raise NotMigrated(why)

    through_outages(check, None if deadline == math.inf else deadline)


class NotMigrated(HypermediaError):
    """The database is behind this code's schema: a command on it would work
    on some tables and fail on others (exit 1, as a database that is away)."""


def require_schema(db: Any) -> None:
    """Refuse a database not migrated to this code (one query): after `db
    upgrade 0004`, `jobs submit` wrote rows a worker then refused to serve,
    and only commands that reached a missing table failed.  A database that
    is away is left to the command: `jobs tail` waits for it to come back."""
    try:
        with db.read() as tx:
            why = tx.schema_behind()
    except Exception as exc:
        if not is_transient(exc):
            raise
        return
    if why is not None:
        raise NotMigrated(why)


# RFC 6838 section 4.2: a type and a subtype are restricted names of 1 to
# 127 characters, starting with a letter or digit.
_RESTRICTED_NAME = r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}"
_MEDIA_TYPE = re.compile(rf"{_RESTRICTED_NAME}/{_RESTRICTED_NAME}")


def media_type(value: str, option: str = "--mime") -> str:
    """``value`` as a media type ``type/subtype``, lower-cased; parameters
    (``; charset=…``) and anything else are refused (InvalidRequest, exit 2)."""
    text = value.strip()
    if ";" in text:
        raise InvalidRequest(
            f"{option} takes a media type without parameters: type/subtype, e.g. text/plain"
        )
    if not _MEDIA_TYPE.fullmatch(text):
        raise InvalidRequest(
            f"{option} {text!r} is not a media type: type/subtype (e.g. image/png), each "
            "1 to 127 letters, digits and ! # $ & ^ _ . + - starting with a letter or digit"
        )
    return text.lower()


def cut(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters, an ellipsis saying it was cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


# Escapes of the characters a terminal would act on rather than show.
_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: str) -> str:
    """``text`` with control, format (bidi) and other unprintable characters
    escaped (``\\x1b``, ``\\u202e``, ``\\n``): a file name printed as it was
    could move the cursor, recolour the terminal, reverse what follows it or
    start a fake line of output."""
    return "".join(ch if ch.isprintable() else _escape_char(ch) for ch in text)


def _escape_char(ch: str) -> str:
    if ch in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[ch]
    n = ord(ch)
    if n < 0x100:
        return f"\\x{n:02x}"
    return f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


# Kept at INFO under -v (see setup_logging).
QUIET_LIBRARIES = ("botocore", "boto3", "s3transfer", "urllib3", "httpcore", "httpx", "multipart")


def setup_logging(verbose: bool = False) -> None:
    """Logging for the long-running commands; SIGUSR1 prints every thread's
    stack to stderr (a worker that will not stop can say where it waits)."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # Alembic lists its plugins as it is imported: seven lines at every start.
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    # -v is hypermedia's debug, not its libraries': botocore's logs every S3
    # request with its headers (the SigV4 Authorization among them), 1.5 MB
    # in minutes of light load.
    for library in QUIET_LIBRARIES:
        logging.getLogger(library).setLevel(logging.INFO)


def _default(o: Any) -> Any:
    if isinstance(o, datetime):
        return o.isoformat()
    if isinstance(o, Decimal):
        return float(o)
    if isinstance(o, set | frozenset):
        return sorted(o)
    raise TypeError(type(o).__name__)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, default=_default, sort_keys=True) + "\n")


def json_object(text: str, option: str) -> dict[str, Any]:
    """``text`` (the value of ``option``, say ``--params``) as a JSON object."""
    try:
        parsed = json_unique(text)
    except json.JSONDecodeError:
        raise InvalidRequest(f"{option} is not valid JSON") from None
    except DuplicateKey as exc:
        raise InvalidRequest(f"{option}: {exc}") from None
    except (ValueError, RecursionError):  # an integer of 4,300+ digits; nesting past the stack
        raise InvalidRequest(f"{option} nests too deep or holds too long a number") from None
    if not isinstance(parsed, dict):
        raise InvalidRequest(f"{option} must be a JSON object")
    return parsed


STDIN_NAME = "stdin"
# Where a shell's <(cmd), a redirection or a pipe shows up as a path: its
# name is a descriptor number ("63"), no name of the user's.
_DESCRIPTOR_DIRS = ("/dev/fd/", "/proc/self/fd/")


# Ids are 64-bit: one past that was "too large" on SQLite, "cannot be stored"
# on PostgreSQL and "not found" on MariaDB.  Typer now says it, alike.
MAX_ID = 2**63 - 1


def an_id(what: str) -> Any:
    """A positional id argument, 1 to MAX_ID (exit 2 outside it)."""
    return typer.Argument(..., min=1, max=MAX_ID, help=f"the {what}'s id")


STDIN = Path("/dev/stdin")  # what `-` names


def existing_inputs(value: Any) -> Any:
    """Typer's ``exists=True``, with ``-`` (stdin) let through: its
    ``allow_dash`` never matches a ``Path`` argument (typer 0.2x compares
    the Path to the string "-").  Folders and unreadable files are still
    refused by Typer itself (``dir_okay=False, readable=True``)."""
    paths = value if isinstance(value, list) else [value]
    if sum(_is_stdin(p) for p in paths) > 1:  # the second would read an empty stdin
        raise typer.BadParameter("'-' (stdin) can be given once")
    for p in paths:
        if str(p) != "-" and not os.path.exists(p):
            raise typer.BadParameter(f"file {str(p)!r} does not exist.")
    return value


def _is_stdin(path: Path) -> bool:
    """``-``, or a name of descriptor 0 (``/dev/stdin``, ``/dev/fd/0``)."""
    text = str(path)
    return text == "-" or os.path.abspath(text) in ("/dev/stdin", "/dev/fd/0", "/proc/self/fd/0")


def is_descriptor(path: Path) -> bool:
    """Whether ``path`` names an open descriptor (``/dev/stdin``, ``-``,
    ``/dev/fd/N``, ``/proc/self/fd/N``) rather than a file of the user's."""
    text = str(path)
    if text == "-":
        return True
    absolute = os.path.abspath(text)
    return absolute == "/dev/stdin" or absolute.startswith(_DESCRIPTOR_DIRS)


def input_name(path: Path) -> str:
    """The file name an input is stored under: its own, or ``stdin`` for a
    descriptor (``<(cat a.jpg)`` stored the name "63")."""
    return STDIN_NAME if is_descriptor(path) else path.name or STDIN_NAME


class StreamTooLarge(InvalidRequest):
    """A stream went on past the most bytes the command takes from it."""

    def __init__(self, path: Path, limit: int) -> None:
        super().__init__(f"{display_name(path.name)} is larger than {limit} bytes")
        self.path = path
        self.limit = limit


@contextmanager
def as_regular_files(paths: list[Path], max_bytes: int | None = None) -> Iterator[list[Path]]:
    """``paths``, with each one that is not a regular file (``/dev/stdin``, a
    FIFO, ``<(cmd)``) read once into a temporary file of the same name: the
    ledger reads an input twice (its first bytes for the type, then all of
    it), and a stream would give it nothing the second time.  A descriptor
    that is a regular file (``/dev/stdin < a.jpg``) is linked, not copied.
    Either way it is named ``stdin``, the ledger's file name for it.

    ``max_bytes``: a stream is read no further than that (StreamTooLarge):
    ``/dev/zero`` filled the disk before its size could be checked."""
    streams = [p for p in paths if is_descriptor(p) or not stat.S_ISREG(p.stat().st_mode)]
    if not streams:
        yield paths
        return
    with _staging() as tmp:
        copies: dict[Path, Path] = {}
        for i, p in enumerate(streams):
            copy = Path(tmp) / str(i) / input_name(p)
            copy.parent.mkdir()
            src = STDIN if str(p) == "-" else p
            mode = src.stat().st_mode
            copies[p] = copy
            if stat.S_ISREG(mode):  # read again from its start, as a file is
                copy.symlink_to(os.path.abspath(src))
                continue
            if stat.S_ISSOCK(mode) or stat.S_ISBLK(mode):
                # A socket cannot be opened; a disk is no input (it was a
                # raw OSError, exit 1).  Pipes, FIFOs and character devices
                # are read as streams.
                kind = "a socket" if stat.S_ISSOCK(mode) else "a block device"
                raise InvalidRequest(f"{printable(str(p))} is {kind}, not a file or a stream")
            try:
                whole = _copy_at_most(src, copy, max_bytes)
            except OSError as exc:
                if exc.errno == errno.ENOSPC:  # a stream is staged in TMPDIR first: exit 1
                    raise HypermediaError(
                        f"no room left in the temporary folder to stage {printable(str(p))} "
                        "(TMPDIR): a stream is copied there before it is stored"
                    ) from None
                raise
            if not whole:
                raise StreamTooLarge(p, max_bytes or 0)
        yield [copies.get(p, p) for p in paths]


@contextmanager
def _staging() -> Iterator[Path]:
    """A private folder for staged streams, held for this process's life
    (leftovers.py), in ``$TMPDIR/hypermedia-stdin-UID``: a command killed on
    the spot left its copy (of up to ``max_input_bytes``) in TMPDIR for good;
    the next command that stages a stream removes it."""
    parent = Path(tempfile.gettempdir()) / f"hypermedia-stdin-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        parent.mkdir(mode=0o700)
    st = parent.lstat()
    ours = stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077
    if not ours:  # another user's, or planted in a shared /tmp: not ours to sweep
        with tempfile.TemporaryDirectory(prefix="hypermedia-stdin-") as tmp:
            yield Path(tmp)
        return
    leftovers.sweep_folders(parent)
    folder = Path(tempfile.mkdtemp(dir=parent))
    held = leftovers.hold(folder / leftovers.OWNER)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        os.close(held)


def _copy_at_most(src: Path, dst: Path, limit: int | None) -> bool:
    """Copy ``src`` to ``dst``; False, the rest left unread, once more than
    ``limit`` bytes came."""
    copied = 0
    with open(src, "rb") as f, open(dst, "wb") as out:
        while chunk := f.read(1 << 20):
            copied += len(chunk)
            if limit is not None and copied > limit:
                return False
            out.write(chunk)
    return True


# Exit codes (docs/cli.md, "Exit codes"): 2 when what the command was given
# is wrong and nothing was done; 1 when it ran, or could not run here, and
# failed.  Typer's own usage errors exit 2 as well.
EXIT_FAILED = 1
EXIT_USAGE = 2


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn our errors into a short red line and an exit code; never a traceback.

    The one place errors map to exit codes: 2 for a request that is wrong in
    itself (InvalidRequest: a bad value, an unknown job type, profile or
    queue name, an unusable input, an idempotency key used for another
    request; NotFound: a job, object, profile… that
    does not exist), 1 for everything that went wrong while doing it or
    around it (a refused transition or budget, a conflict, storage, the
    database missing, unreachable or not migrated)."""
    try:
        yield
    except (typer.Exit, click.exceptions.ClickException):
        raise  # Typer's usage errors (exit 2) keep their own words
    except OutputFailed as exc:
        err_console.print(f"[red]error:[/] {escape(str(exc.strerror))}", markup=True)
        drop_stdout()
        raise typer.Exit(EXIT_FAILED) from None
    except BrokenPipeError as exc:
        if _stdout_gone():
            raise  # the reader went (`| head`): Typer ends us quietly (exit 1)
        err_console.print(f"[red]error:[/] {escape(brief(exc))}", markup=True, highlight=False)
        raise typer.Exit(EXIT_FAILED) from None
    except BadHome as exc:  # the path is the user's own: named, not redacted
        err_console.print(f"[red]error:[/] {escape(str(exc))}", markup=True, highlight=False)
        raise typer.Exit(EXIT_USAGE) from None
    except NotFound as exc:
        what = redact(exc).removesuffix(" not found")  # "not found: job 9", not "…9 not found"
        err_console.print(f"[red]not found:[/] {escape(what)}", markup=True)
        raise typer.Exit(EXIT_USAGE) from None
    except Refused as exc:  # well-formed, refused by the current state
        err_console.print(f"[red]error:[/] {escape(redact(exc))}", markup=True)
        raise typer.Exit(EXIT_FAILED) from None
    except (InvalidRequest, IdempotencyConflict) as exc:  # a key reused for another request
        err_console.print(f"[red]error:[/] {escape(redact(exc))}", markup=True)
        raise typer.Exit(EXIT_USAGE) from None
    except OverflowError:  # an id past 64 bits: the driver cannot even bind it
        err_console.print("[red]error:[/] a number given is too large", markup=True)
        raise typer.Exit(EXIT_USAGE) from None
    except (NoDatabase, ReadOnlyDatabase, UnwritableHome) as exc:  # the user's own: named
        err_console.print(f"[red]error:[/] {escape(str(exc))}", markup=True, highlight=False)
        raise typer.Exit(EXIT_FAILED) from None
    except HypermediaError as exc:
        err_console.print(f"[red]error:[/] {escape(redact(exc))}", markup=True)
        raise typer.Exit(EXIT_FAILED) from None
    except Exception as exc:  # database down, bad URL…: say what kind, not the internals
        if while_interrupted(exc):
            raise KeyboardInterrupt from None
        said = brief(exc)
        if is_schema_missing(exc):
            said = f"{said}: is the database migrated? run `hypermedia db upgrade`"
        err_console.print(f"[red]error:[/] {escape(said)}", markup=True, highlight=False)
        raise typer.Exit(EXIT_FAILED) from None


def while_interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` was raised while a Ctrl-C or SIGTERM was on its way
    out: SQLAlchemy cut mid-commit by it trips its own ``assert`` as the
    transaction is rolled back, and `objects get` said "error:
    AssertionError" and exit 1 for an interrupted download (CI).  Each link
    of the chain is looked at once: a chain can loop."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        if isinstance(link, KeyboardInterrupt):
            return True
        seen.add(id(link))
        link = link.__context__
    return False


def _stdout_gone() -> bool:
    """Whether our stdout is a pipe its reader closed (poll says POLLERR for
    it), rather than some other pipe or socket that broke under us."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & select.POLLERR for _, ev in poller.poll(0))
    except (OSError, ValueError):  # stdout closed or replaced: nobody reads it
        return True


def sigterm_as_ctrl_c() -> None:
    """SIGTERM (timeout(1), systemd, CI) does what Ctrl-C does: a command that
    moves files then cleans up after itself.  Left at its default, `objects
    get -o` left its ".part" file and `objects put` its row `pending` (and its
    bytes in the pool's .tmp) for GC's pending sweep, hours later.  Either
    signal is taken once: the next is ignored from that moment, so the
    clean-up is never cut short (a second press 20 ms after the first, on a
    busy machine, came before the clean-up had ignored it, and 250 uploads
    stayed `pending`)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _interrupted)


@contextmanager
def stop_signals_held() -> Iterator[None]:
    """SIGTERM and SIGINT wait (blocked, pending) until the block is left: for
    a file made and named in one step, so that a signal never lands between
    the making and the try that removes it.  Enclose this in that try: the
    held signal is raised as the block is left."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def _interrupted(_signum: int, _frame: Any) -> None:
    ignore_stop_signals()
    raise KeyboardInterrupt


class OutputFailed(OSError):
    """stdout refused what was written to it: a full disk, a quota, EIO."""


@contextmanager
def saying_done(done: str) -> Iterator[None]:
    """The output of a command that changed something: if stdout refuses it,
    the error still says what was done ("job 12 queued"): it said only that
    the output could not be written, and a user who ran the command again,
    as exit 1 invites, queued the jobs twice."""
    try:
        yield
    except OutputFailed as exc:
        raise OutputFailed(exc.errno, f"{exc.strerror} ({done})") from None


class _WholeWrites(io.RawIOBase):
    """stdout's descriptor, every write whole or an error.

    CPython's buffered writer, handed a large write that the kernel took only
    part of (a disk filling up under ``objects get > file``, a reader leaving
    ``| head``), drops the rest without an error: the command exited 0 with
    its output cut short.  Here the rest is written, or its error raised: a
    closed pipe's BrokenPipeError ends the command quietly with exit 1."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def isatty(self) -> bool:
        # Rich asks, through the wrappers: a terminal gets progress bars.
        return os.isatty(self.fd)

    def write(self, b: Any) -> int:
        return write_whole(self.fd, b, "the output")


def write_whole(fd: int, data: Any, what: str) -> int:
    """Write all of ``data`` to ``fd`` or raise OutputFailed naming ``what``
    (a BrokenPipeError stays one: the reader left)."""
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        try:
            done += os.write(fd, view[done:])
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OutputFailed(exc.errno, f"{what} could not be written: {exc.strerror}") from None
    return done


_ORIGINAL_STDOUT: list[Any] = []  # kept: collected, it would close descriptor 1


def whole_stdout_writes() -> None:
    """Make stdout write whole or fail (``_WholeWrites``); no-op when it has no
    descriptor (a test's capture) or is done already."""
    if _ORIGINAL_STDOUT:
        return
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError, AttributeError):
        return
    sys.stdout.flush()
    _ORIGINAL_STDOUT.append(sys.stdout)
    sys.stdout = io.TextIOWrapper(
        io.BufferedWriter(_WholeWrites(fd)),
        encoding=sys.stdout.encoding,
        errors=sys.stdout.errors,
        line_buffering=bool(sys.stdout.line_buffering),
    )


def flush_stdout() -> None:
    """Flush stdout as the command ends, inside it: left to the interpreter's
    exit, a closed pipe's error came out as "Exception ignored … BrokenPipeError"
    and exit 120.  A reader that left ends the command quietly with 1."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        drop_stdout()
        raise typer.Exit(EXIT_FAILED) from None


def drop_stdout() -> None:
    """Point stdout at /dev/null once it failed: what is still buffered
    would fail again at the interpreter's exit, loudly ("Exception ignored
    … OutputFailed", exit 120)."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def wait_for_database(url: str, seconds: float | None) -> str | None:
    """None once the database at ``url`` answers within ``seconds`` (None: as
    long as it takes), else why it did not (its last answer); SIGTERM and
    Ctrl-C end the wait.  For commands a deploy starts beside the database
    (``serve``, ``db upgrade --wait``)."""
    stop = threading.Event()
    handlers = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in STOP_SIGNALS}
    db = connect(url)
    try:
        deadline = None if seconds is None else time.monotonic() + seconds
        if wait_until_ready(db, stop, schema=False, deadline=deadline):
            return None
        if stop.is_set():
            return "the wait was interrupted"
        last = not_ready(db, schema=False)  # its answer now (ready just in time: go on)
        return None if last is None else last[1]
    finally:
        db.dispose()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def through_outages(read: Callable[[], T], deadline: float | None = None) -> T:
    """``read()``, tried again while the database is away (a restart, a
    failover, a full disk), as the workers do: a command that waits for jobs
    outlives the outage instead of leaving the user without their results.
    Past ``deadline`` (time.monotonic()), or for an error the database would
    give every time, the error is raised: a schema that is not there too
    (SQLite says so with an OperationalError, and `jobs tail` on a database
    never migrated waited for ever)."""
    delay, said = 0.5, False
    while True:
        try:
            return read()
        except Exception as exc:
            if not is_transient(exc) or is_schema_missing(exc):
                raise
            if deadline is not None and time.monotonic() > deadline:
                raise
            if not said:
                why = escape(brief(exc))
                err_console.print(f"[yellow]database unavailable ({why}); waiting[/]", markup=True)
                said = True
        time.sleep(delay)
        delay = min(delay * 2, 5.0)

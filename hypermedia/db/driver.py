"""Connecting to the database and opening transactions.

A ``Driver`` owns the SQLAlchemy engine(s) for one database URL and hands out
``Tx`` objects (see ``hypermedia.db.queries``) whose named methods are the only
SQL the rest of the code can reach.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import make_url

from hypermedia.db import dialects, wakeups
from hypermedia.db.queries import Tx
from hypermedia.errors import InvalidRequest, ReadOnlyDatabase, ValueRefused
from hypermedia.redact import brief

T = TypeVar("T")

# No pre-ping: it would add a round trip to every transaction. A connection
# that died with its server is detected on use, the pool is invalidated, and
# every caller (claim loop, flusher, monitor, maintenance) retries.
DEFAULT_POOL = {"pool_size": 10, "max_overflow": 20, "pool_pre_ping": False}
# A session left idle inside a transaction this long is ended by the server,
# its locks with it.  A worker or leader frozen mid-transaction (SIGSTOP, a
# paused VM) held its jobs' rows for as long as it stayed frozen: the reaper
# skips locked rows, and `jobs cancel` waited on them.  Five minutes is far
# past any transaction of ours, a store's slowest answer inside one included
# (HYPERMEDIA_S3_TIMEOUT_SECONDS, tried twice).  SQLite has no sessions.
IDLE_TRANSACTION_SECONDS = 300
# How long opening a connection may take, its handshake and login included:
# a server that accepts connections but does not answer (stopped, a frozen
# VM) held every command on it for as long as it stayed so.  A URL's own
# connect_timeout (read_timeout on MariaDB) is kept.
CONNECT_SECONDS = 10


class _QuietReset(logging.Filter):
    """SQLAlchemy logs an ERROR with a traceback when it cannot roll back a
    connection returned to the pool, and then discards that connection.  A
    connection the server dropped (a restart, a KILL) fails so every time:
    an outage the callers already retry and say once each, told again as
    tracebacks (148 in one MariaDB outage).  Said as one warning line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != "Exception during reset or similar" or not record.exc_info:
            return True
        exc = record.exc_info[1]
        if exc is None:
            return True
        if isinstance(exc, sa.exc.DBAPIError | OSError | EOFError) or _dropped(exc):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg = "a connection the database dropped was discarded (%s)"
            record.args = (brief(exc),)
            record.exc_info, record.exc_text = None, None
        return True


def _dropped(exc: BaseException) -> bool:
    """The DB-API's own errors (PyMySQL's, psycopg's), not wrapped by SQLAlchemy."""
    return type(exc).__name__ in ("OperationalError", "InterfaceError")


for _pool in ("QueuePool", "NullPool", "SingletonThreadPool", "StaticPool"):
    logging.getLogger(f"sqlalchemy.pool.impl.{_pool}").addFilter(_QuietReset())


def normalise_url(url: str) -> str:
    """Pick the drivers we ship: psycopg 3 for PostgreSQL, PyMySQL for MariaDB/MySQL."""
    try:
        u = make_url(url)
        u.port  # noqa: B018  (parsed lazily: "host:notaport" fails here)
    except (sa.exc.ArgumentError, ValueError):  # its message quotes the URL, password and all
        raise InvalidRequest(f"the database URL is not a URL: {BACKENDS}") from None
    if u.host and "@" in u.host:
        # Read as host "r1t@db" from "user:Sek@r1t@db": every connection error
        # then named that host, showing the password's tail.
        raise InvalidRequest(
            # Not "password: write…": redaction read that as a credential.
            "the database URL has an '@' in its user name or password (write it as %40)"
        )
    if u.get_backend_name() not in ("sqlite", "postgresql", "postgres", "mysql", "mariadb"):
        raise InvalidRequest(f"the database URL names no database hypermedia runs on: {BACKENDS}")
    driver = u.get_driver_name()
    if "+" in u.drivername and driver not in SHIPPED_DRIVERS:  # asyncpg: not installed
        raise InvalidRequest(
            f"the database URL names a driver hypermedia does not ship ({driver}): {BACKENDS}"
        )
    _check_options(u)
    if u.drivername in {"postgresql", "postgres"}:
        u = u.set(drivername="postgresql+psycopg")
    elif u.drivername in {"mysql", "mariadb"}:
        u = u.set(drivername="mysql+pymysql")
    return u.render_as_string(hide_password=False)


SHIPPED_DRIVERS = ("pysqlite", "psycopg", "pymysql")
# Options the drivers read as numbers: "abc" failed at the first connection
# with the driver's own words (ValueError: invalid literal for int()).
NUMERIC_OPTIONS = ("connect_timeout", "read_timeout", "write_timeout")


# libpq's options of a few values: a typo ("sslmode=requre") failed every
# connection as an OperationalError, and every command waited for a database
# that was there all along.
PG_CHOICES = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "gssencmode": ("disable", "prefer", "require"),
    "channel_binding": ("disable", "prefer", "require"),
    "target_session_attrs": (
        "any", "read-write", "read-only", "primary", "standby", "prefer-standby",
    ),
}  # fmt: skip
# What SQLAlchemy's MariaDB dialect gathers into PyMySQL's ``ssl`` itself.
_MYSQL_SSL_OPTIONS = frozenset({"ssl_capath", "ssl_cipher", "ssl_check_hostname"})


def _check_options(u: sa.URL) -> None:
    """Options the driver would refuse at every connection, refused once at
    start (exit 2) instead of as a database that is away or a traceback."""
    for name in NUMERIC_OPTIONS:
        value = u.query.get(name)
        if isinstance(value, str) and not (value.isascii() and value.isdigit()):
            raise InvalidRequest(f"the database URL's {name} must be a whole number of seconds")
    backend = u.get_backend_name()
    if backend == "postgresql":
        _check_pg_options(u)
    elif backend in ("mysql", "mariadb"):
        _check_mysql_options(u)
    elif backend == "sqlite":
        _check_sqlite_options(u)


def _check_sqlite_options(u: sa.URL) -> None:
    """None: the engine sets its own busy timeout, transactions and threads
    (``isolation_level`` or ``check_same_thread`` would undo them), and
    ``uri=true`` opened a new, empty file named ``hypermedia.db?mode=ro``
    (SQLAlchemy hands the path to sqlite3 as if it were a ``file:`` URI).
    An unknown one was a SAWarning, then ignored."""
    for name in u.query:
        raise InvalidRequest(
            f"the database URL's option {name[:50]!r} is not taken: a SQLite URL is "
            "sqlite:///PATH alone"
        )


def _check_pg_options(u: sa.URL) -> None:
    import psycopg.conninfo

    for name, allowed in PG_CHOICES.items():
        value = u.query.get(name)
        if isinstance(value, str) and value not in allowed:
            raise InvalidRequest(f"the database URL's {name} is one of {', '.join(allowed)}")
    for name in u.query:
        try:
            psycopg.conninfo.make_conninfo(**{name: "1"})  # libpq's own list of options
        except psycopg.ProgrammingError:
            raise InvalidRequest(
                f"the database URL's option {name[:50]!r} is not one PostgreSQL knows"
            ) from None


def _check_mysql_options(u: sa.URL) -> None:
    import inspect

    import pymysql
    from pymysql.charset import charset_by_name

    charset = u.query.get("charset")
    if isinstance(charset, str) and charset_by_name(charset) is None:
        # PyMySQL then failed on None.encoding
        raise InvalidRequest(f"the database URL's charset is not one MariaDB knows ({charset})")
    known = set(inspect.signature(pymysql.connections.Connection.__init__).parameters)
    for name in u.query:
        if name not in known | _MYSQL_SSL_OPTIONS or name == "self":
            raise InvalidRequest(
                f"the database URL's option {name[:50]!r} is not one MariaDB's driver knows"
            )


BACKENDS = "sqlite:///PATH, postgresql://USER@HOST/DB or mariadb://USER@HOST/DB"


def _check_writable(database: str) -> None:
    """Every process writes (a reader too: WAL's -shm file).  In a read-only
    folder each command said "attempt to write a readonly database", naming
    nothing, and `serve` waited for it as if the database were away."""
    path = Path(database)
    folder = path.parent
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ReadOnlyDatabase(
            f"the SQLite database {path} cannot be written by this user: it and its folder "
            f"{folder} must be writable (SQLite keeps its -wal and -shm files beside it)"
        )


def _connect_args(url: str, name: str) -> dict[str, Any]:
    """The timeouts of a new connection (see CONNECT_SECONDS)."""
    given = make_url(url).query
    if name == "postgresql":
        return {} if "connect_timeout" in given else {"connect_timeout": CONNECT_SECONDS}
    # PyMySQL's connect_timeout covers the TCP connect only; its read timeout
    # bounds the handshake's reads, and is lifted once the connection is open
    # (_reads_untimed): a long query is no hang.
    return {} if "read_timeout" in given else {"read_timeout": CONNECT_SECONDS}


def _reads_untimed(dbapi_conn: Any, _record: Any) -> None:
    dbapi_conn._read_timeout = None  # PyMySQL resets the socket's at its next read


def _idle_transaction_timeout(dbapi_conn: Any, _record: Any) -> None:
    """MariaDB's IDLE_TRANSACTION_SECONDS (its own variable, 10.3 and later:
    a server without it keeps its connections as they were)."""
    cursor = dbapi_conn.cursor()
    try:
        cursor.execute(f"SET SESSION idle_transaction_timeout = {IDLE_TRANSACTION_SECONDS}")
    except Exception:  # MySQL: no such variable
        pass
    finally:
        cursor.close()


class Driver:
    def __init__(self, url: str, *, echo: bool = False) -> None:
        self.url = normalise_url(url)
        self.name = make_url(self.url).get_backend_name()
        if self.name == "mariadb":
            self.name = "mysql"
        self._file: _SqliteFile | None = None  # set by _make_engines on SQLite
        self._engines = self._make_engines(echo)
        # SQLite allows one writer at a time. Threads of one process queue on
        # this lock (an instant hand-over) instead of on SQLite's busy handler,
        # which sleeps for up to 100 ms between retries. Other processes still
        # wait through busy_timeout.
        self._sqlite_writer: AbstractContextManager[Any] = (
            threading.RLock() if self.name == "sqlite" else nullcontext()
        )
        # A SQLite database is a file on this machine: its processes wake each
        # other through a file beside it (db/wakeups.py).
        database = make_url(self.url).database if self.name == "sqlite" else None
        self._wake_file = f"{database}-wake" if database and database != ":memory:" else None
        # MariaDB's listeners read the newest job id many times a second.
        self._job_watch = _JobWatch(self.url) if self.name == "mysql" else None
        _EVERY.add(self)

    def _forked(self) -> None:
        """In a child of fork(): let go of the parent's connections, unclosed
        (closing would end the parent's sessions too), and of locks another
        thread of the parent may have held.  Its pool carried on in the child:
        two processes then talked over one session, and one's transaction
        committed an event for a change the other rolled back."""
        for eng in {id(e): e for e in self._engines.values()}.values():
            eng.dispose(close=False)
        if self.name == "sqlite":
            self._sqlite_writer = threading.RLock()
        if self._job_watch is not None:
            self._job_watch.forked()

    # -- engines -------------------------------------------------------------

    def _make_engines(self, echo: bool) -> dict[str, sa.Engine]:
        if self.name != "sqlite":
            opts: dict[str, Any] = dict(DEFAULT_POOL)
            opts["connect_args"] = _connect_args(self.url, self.name)
            if self.name == "mysql":
                # READ COMMITTED: gap locks under REPEATABLE READ would make
                # SKIP LOCKED claims block each other on the index range.
                opts["isolation_level"] = "READ COMMITTED"
            else:
                timeout = f"-c idle_in_transaction_session_timeout={IDLE_TRANSACTION_SECONDS}s"
                opts["connect_args"]["options"] = timeout
            eng = sa.create_engine(self.url, echo=echo, **opts)
            if self.name == "mysql":
                sa.event.listen(eng, "connect", _idle_transaction_timeout)
                if "read_timeout" in opts["connect_args"]:
                    sa.event.listen(eng, "connect", _reads_untimed)
            # Same pool; snapshot() reads see one snapshot for all statements.
            engines = {
                "write": eng,
                "read": eng,
                "snapshot": eng.execution_options(isolation_level="REPEATABLE READ"),
            }
            if self.name == "postgresql":
                # Same pool, connections switched to autocommit while used.
                engines["auto"] = eng.execution_options(isolation_level="AUTOCOMMIT")
            return engines
        database = make_url(self.url).database
        if database and database != ":memory:":
            Path(database).parent.mkdir(parents=True, exist_ok=True)
            _check_writable(database)
        # Two engines on SQLite: writers take the database lock up front with
        # BEGIN IMMEDIATE (no deadlocked upgrades); readers stay deferred so
        # they never wait on writers under WAL.
        self._file = _SqliteFile(database) if database and database != ":memory:" else None
        opened = self._file.opened if self._file is not None else None
        return {
            "write": _sqlite_engine(self.url, "BEGIN IMMEDIATE", echo, opened),
            "read": _sqlite_engine(self.url, "BEGIN", echo, opened),
        }

    @property
    def engine(self) -> sa.Engine:
        return self._engines["write"]

    def dispose(self) -> None:
        if self._job_watch is not None:
            self._job_watch.close()
        for eng in {id(e): e for e in self._engines.values()}.values():
            eng.dispose()
        if self._file is not None:  # no connection holds the old file now
            self._file.identity = None

    # -- transactions ----------------------------------------------------------

    @contextmanager
    def tx(self) -> Iterator[Tx]:
        """A write transaction, committed on success, rolled back on error."""
        with self._refusals(), self._sqlite_writer, self._engines["write"].begin() as conn:
            tx = Tx(conn, self.name)
            yield tx
        if tx.woken:  # committed: idle workers may claim now
            wakeups.publish(self.url, tx.woken)
            if self._wake_file is not None:
                wakeups.touch(self._wake_file)

    def tx_retrying(self, work: Callable[[Tx], T], attempts: int = 3) -> T:
        """``work(tx)`` in a write transaction, run again (on a fresh one) when the
        database rolled it back as a deadlock's victim.

        For short upserts racing on one new key ("update, else insert, else
        update"), which InnoDB can deadlock; ``work`` must be safe to repeat.
        """
        for attempt in range(attempts):
            try:
                with self.tx() as tx:
                    return work(tx)
            except sa.exc.OperationalError as exc:
                if attempt == attempts - 1 or not dialects.is_deadlock(exc):
                    raise
                time.sleep(random.uniform(0, 0.02 * 2**attempt))
        raise AssertionError("unreachable")  # the last attempt returned or raised

    @property
    def autocommit(self) -> bool:
        """Whether ``auto()`` commits statement by statement (PostgreSQL)."""
        return "auto" in self._engines

    @property
    def single_writer(self) -> bool:
        """Whether write transactions take turns on one lock (SQLite)."""
        return self.name == "sqlite"

    @contextmanager
    def auto(self) -> Iterator[Tx]:
        """Each statement its own transaction on PostgreSQL; one write transaction elsewhere.

        For work that is consistent statement by statement (the claim, a
        worker's batch of transitions): no BEGIN and COMMIT round trips.
        """
        if not self.autocommit:
            with self.tx() as tx:
                yield tx
            return
        with self._refusals(), self._engines["auto"].connect() as conn:
            yield Tx(conn, self.name, autocommit=True)

    @contextmanager
    def read(self) -> Iterator[Tx]:
        with self._refusals(), self._engines["read"].begin() as conn:
            yield Tx(conn, self.name)

    @contextmanager
    def snapshot(self) -> Iterator[Tx]:
        """A read transaction whose statements all see the database as of its
        first one (REPEATABLE READ; on SQLite every read transaction does):
        for figures read in several statements that a concurrent commit must
        not split, such as a counter moved from one table to another."""
        with self._refusals(), self._engines.get("snapshot", self._engines["read"]).begin() as conn:
            yield Tx(conn, self.name)

    def _refusals(self) -> AbstractContextManager[None]:
        """Every transaction's entrance: the SQLite file is still the one
        opened, and a value the database refuses is told as the caller's."""
        if self._file is not None:
            self._file.check()
        return _refusals()

    def server_now(self) -> datetime:
        """The server's clock (PostgreSQL, MariaDB): one round trip, no BEGIN
        on PostgreSQL, so that half of it stands for when the server read it."""
        with self.auto() if self.autocommit else self.read() as tx:
            return tx.server_now()

    # -- wake-ups --------------------------------------------------------------

    def listen(
        self,
        on_wake: Callable[[str], None],
        stop: threading.Event,
        watch: float = wakeups.WATCH_SECONDS,
    ) -> None:
        """Block until ``stop``; call ``on_wake(queue)`` for each job notification.

        PostgreSQL pushes them from every process.  Elsewhere db/wakeups.py
        hears this process's commits and other processes' new jobs: on SQLite
        through the wake file, on MariaDB by reading the newest job id every
        ``watch`` seconds (0: not at all).
        """
        if self.name == "postgresql":
            dialects.pg_listen(self.url, on_wake, stop)
        elif self.name == "mysql":
            wakeups.listen(self.url, on_wake, stop, newest=self._newest_job_id, watch=watch)
        else:
            wakeups.listen(self.url, on_wake, stop, self._wake_file)

    def _newest_job_id(self) -> int:
        if self._job_watch is None:  # only MariaDB watches
            with self.read() as tx:
                return tx.newest_job_id()
        return self._job_watch.newest()


class _JobWatch:
    """The newest job id, read for MariaDB's job watch (db/wakeups.py) over
    one autocommit connection of its own, kept from read to read.

    An idle worker reads it 20 times a second at the default watch interval.
    Through a pooled transaction (``Driver.read``) each read was three
    statements, the SELECT, a COMMIT and the ROLLBACK of the pool's reset on
    return: 60 a second per idle worker process.  Here it is the SELECT
    alone.  A connection that failed is dropped and the next read opens
    another (the watch retries with backoff meanwhile).
    """

    SQL = "SELECT MAX(job_id) FROM processing_jobs"

    def __init__(self, url: str) -> None:
        self._engine = sa.create_engine(
            url,
            poolclass=sa.pool.NullPool,
            connect_args={"autocommit": True, **_connect_args(url, "mysql")},
        )
        self._lock = threading.Lock()  # one connection for the process's listeners
        self._conn: Any = None

    def newest(self) -> int:
        with self._lock:
            if self._conn is None:
                self._conn = self._engine.raw_connection()
            try:
                cur = self._conn.cursor()
                try:
                    cur.execute(self.SQL)
                    row = cur.fetchone()
                finally:
                    cur.close()
            except Exception:
                self._drop()
                raise
            return int(row[0] or 0) if row else 0

    def close(self) -> None:
        with self._lock:
            self._drop()
        self._engine.dispose()

    def forked(self) -> None:
        """See Driver._forked: the parent's connection is left alone."""
        self._lock = threading.Lock()
        self._conn = None

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            # Closed for good, never handed to anyone again (if already
            # broken, nothing is left to close).
            with contextlib.suppress(Exception):
                conn.invalidate()


@contextmanager
def _refusals() -> Iterator[None]:
    """A value the database refuses (it would every time) is the caller's
    mistake, told as one (a 422 at the API), not an internal error."""
    try:
        yield
    except sa.exc.DataError as exc:
        raise ValueRefused() from exc


class _SqliteFile:
    """The file a SQLite driver's connections opened, told apart from a file
    put at its path later.  Deleted (or replaced by a restore) under a running
    service, the open connections would go on reading and writing the old
    inode: jobs accepted with a 201 and lost at the next start, and a new
    connection would create an empty database in its place.  So every
    transaction first checks the path (one stat, ~2 us) and is refused as the
    database being unavailable: the API answers 503, /readyz too, workers wait.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.identity: tuple[int, int] | None = None

    def opened(self) -> None:
        """A connection opened the file: the first one says which file it is."""
        if self.identity is None:
            st = os.stat(self.path)
            self.identity = (st.st_dev, st.st_ino)

    def check(self) -> None:
        if self.identity is None:
            return
        try:
            st = os.stat(self.path)
            what = "replaced" if (st.st_dev, st.st_ino) != self.identity else None
        except FileNotFoundError:
            what = "deleted"
        if what is not None:
            why = (
                f"the database file {self.path} was {what} while this process had it "
                "open: restart hypermedia (what it wrote since went to the old file)"
            )
            raise sa.exc.OperationalError(
                "(database file check)", None, sqlite3.OperationalError(why)
            )


def _sqlite_engine(
    url: str, begin: str, echo: bool, opened: Callable[[], None] | None = None
) -> sa.Engine:
    eng = sa.create_engine(url, echo=echo, pool_size=5, max_overflow=10)

    @event.listens_for(eng, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy, not pysqlite, decide when transactions begin.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        # FULL: a commit is on disk before it returns (WAL + NORMAL can lose
        # the last transactions on power loss, and a job must never be lost).
        cur.execute("PRAGMA synchronous=FULL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()
        if opened is not None:
            opened()

    @event.listens_for(eng, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        # On the sqlite3 connection itself: every transaction starts here, and
        # a statement through SQLAlchemy costs ten times what sqlite3 takes.
        conn.connection.dbapi_connection.execute(begin)  # type: ignore[union-attr]

    return eng


_DRIVERS: dict[str, Driver] = {}
_LOCK = threading.Lock()
_EVERY: weakref.WeakSet[Driver] = weakref.WeakSet()  # this process's, for _after_fork


def _after_fork() -> None:
    global _LOCK
    _LOCK = threading.Lock()  # a thread of the parent may have held it
    for drv in list(_EVERY):
        drv._forked()


os.register_at_fork(after_in_child=_after_fork)


def connect(url: str) -> Driver:
    """One Driver (and pool) per URL per process."""
    with _LOCK:
        drv = _DRIVERS.get(url)
        if drv is None:
            drv = _DRIVERS[url] = Driver(url)
        return drv

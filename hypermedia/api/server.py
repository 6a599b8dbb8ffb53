"""Run the FastAPI application with uvicorn: in a thread (``serve``) or blocking (``api``).

``serve`` keeps the main thread for the worker, which owns the signal handlers
and drains on SIGTERM; the HTTP server then runs in a daemon thread and is
stopped after the drain.  ``api`` runs nothing else, so uvicorn takes the
main thread and handles the signals itself.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time

import uvicorn
from fastapi import FastAPI

from hypermedia import redact
from hypermedia.api.deadline import head_deadline
from hypermedia.errors import HypermediaError

STARTUP_TIMEOUT_SECONDS = 30.0
log = logging.getLogger(__name__)


class ServerHandle:
    """A uvicorn server running in a daemon thread."""

    def __init__(self, server: uvicorn.Server, thread: threading.Thread) -> None:
        self.server = server
        self.thread = thread

    @property
    def running(self) -> bool:
        return self.thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        """Ask uvicorn to finish (open requests get ``timeout`` seconds) and join."""
        _stopping(self.server.config.app)
        self.server.should_exit = True
        self.thread.join(timeout)
        if self.thread.is_alive():
            # Requests still open (an SSE stream, say): cut them.
            self.server.force_exit = True
            self.thread.join(5)


def _stopping(app: object) -> None:
    """Open event streams end at their next poll (api/routes/jobs.py), and
    their clients reconnect elsewhere: held open, they kept the shutdown
    waiting to its timeout, then were cancelled with a traceback."""
    state = getattr(app, "state", None)
    if state is not None:
        state.stopping = True


class _Server(uvicorn.Server):
    def handle_exit(self, sig: int, frame: object) -> None:
        _stopping(self.config.app)
        exit_within(EXIT_GRACE_SECONDS)
        super().handle_exit(sig, frame)  # type: ignore[arg-type]


# Past the graceful shutdown's 5 s: what still runs then is a thread blocked
# on a database that stopped answering (a frozen server), which the
# interpreter's exit would join for as long as it stays so.
EXIT_GRACE_SECONDS = 15.0


def exit_within(seconds: float) -> None:
    """End the process in ``seconds`` if it has not ended by then (a daemon
    timer: a process that ends first takes it along)."""

    def leave() -> None:
        log.warning(
            "still stopping after %g s (a database that does not answer?): exiting", seconds
        )
        logging.shutdown()
        os._exit(0)

    timer = threading.Timer(seconds, leave)
    timer.daemon = True
    timer.start()


class _NoTokens(logging.Filter):
    """A token put in a URL by mistake (``?access_token=hm_…``) is refused,
    but the access log wrote it out whole: replaced in the line's arguments."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact.tokens(a) if isinstance(a, str) else a for a in record.args)
        return True


logging.getLogger("uvicorn.access").addFilter(_NoTokens())


class _NoUnfinishedNotice(logging.Filter):
    """uvicorn says ERROR when an app returns with a body unfinished. Ours do
    only on purpose, and after saying why (a download dropped or cut short:
    returning early is how ASGI closes the connection); an app that fails
    mid-body raises instead, and that traceback still gets through."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != "ASGI callable returned without completing response."


logging.getLogger("uvicorn.error").addFilter(_NoUnfinishedNotice())


def _config(app: FastAPI, host: str, port: int, access_log: bool) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=head_deadline(app.state.services.settings.header_seconds),
        # Our own logging setup (``setup_logging``) stays: uvicorn's loggers
        # propagate to the root logger instead of getting a config of their own.
        log_config=None,
        access_log=access_log,
        timeout_graceful_shutdown=5,
        server_header=False,
    )


def check_port(host: str, port: int) -> None:
    """Refuse at once, with the reason, an address this process cannot listen
    on: ``serve`` printed its whole banner (and a first admin token) before
    "could not start", the reason left in uvicorn's log line.  A check, not
    the listening socket: another process may still take the port between."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            sock.bind(address)
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise HypermediaError(f"cannot listen on {host}:{port}: {why}") from None


def start_in_thread(
    app: FastAPI, host: str, port: int, *, access_log: bool = False
) -> ServerHandle:
    """Start serving ``app`` in a daemon thread; return once it listens.

    Raises HypermediaError if it cannot start (the port is taken, say).
    """
    server = _Server(_config(app, host, port, access_log))
    failed: list[BaseException] = []

    def target() -> None:
        try:
            server.run()
        except BaseException as exc:  # uvicorn exits with SystemExit on a bind error
            failed.append(exc)

    thread = threading.Thread(target=target, name="api", daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            thread.join(5)
            why = f": {failed[0]!r}" if failed and not isinstance(failed[0], SystemExit) else ""
            raise HypermediaError(f"the HTTP server could not start on {host}:{port}{why}")
        time.sleep(0.02)
    return ServerHandle(server, thread)


def run(app: FastAPI, host: str, port: int, *, access_log: bool = True) -> None:
    """Serve ``app`` until SIGTERM or SIGINT (uvicorn's own graceful shutdown)."""
    # uvicorn restores the handlers it found and re-raises the signal it caught
    # once it has shut down; with these no-op handlers in place that re-raise
    # is harmless and the process exits 0 instead of dying by the signal.
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
    server = _Server(_config(app, host, port, access_log))
    try:
        server.run()
    except SystemExit:  # uvicorn's answer to a bind error, already logged
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not server.started:
        raise HypermediaError(f"the HTTP server could not start on {host}:{port}")

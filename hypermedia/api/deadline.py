"""A deadline for a request's head: uvicorn's HTTP protocol with one more timer.

uvicorn times the idle gap between two requests of a kept-alive connection,
and our routes time a body that stalls (``BodyLimit``) or a download nobody
takes (``_Download``), but nothing timed the request line and headers: a
connection that sent nothing, or half its headers, was held for ever, with
its file descriptor, by a client that opened as many as it liked (slow
loris).  Here each request's head must be complete within ``seconds`` of the
connection opening, or of the previous response; the connection is closed
otherwise (no answer can be framed before a request is).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)


def head_deadline(seconds: float) -> type[H11Protocol]:
    """The protocol class for uvicorn's ``http`` setting."""

    class HeadDeadline(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            super().handle_events()
            if not self._waiting_for_head():
                self._disarm()  # a request under way: the body has its own timers
            elif self._head_timer is None:
                # The next request, after an answer given before its body was
                # in (a 401 to an upload): the cycle turned over here, not in
                # on_response_complete, and nothing was timed.
                self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self._waiting_for_head():
                self._arm()  # the next request's head, or the rest of an unwanted body

        def _waiting_for_head(self) -> bool:
            """No request is being served: the next one's head is awaited (or
            the tail of a body answered already)."""
            answered = self.cycle is None or self.cycle.response_complete
            return self.conn.their_state is h11.IDLE or answered

        def _arm(self) -> None:
            self._disarm()
            self._head_timer = self.loop.call_later(seconds, self._late)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _late(self) -> None:
            self._head_timer = None
            if self._waiting_for_head() and not self.transport.is_closing():
                log.info("closed a connection whose request head took over %g s", seconds)
                self.transport.close()

    return HeadDeadline

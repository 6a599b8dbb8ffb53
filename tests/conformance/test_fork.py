"""A Driver in a child of fork(): its own connections, the parent's untouched."""

from __future__ import annotations

import os
import threading

import sqlalchemy as sa

from hypermedia.db.driver import Driver

READS = 200


def _reads(drv: Driver) -> int:
    """How many of READS reads, each on a pooled connection, gave the right answer."""
    good = 0
    for i in range(READS):
        try:
            with drv.read() as tx:
                good += tx.conn.execute(sa.text(f"SELECT {i}")).scalar() == i
        except Exception:
            pass
    return good


def test_a_forked_child_gets_connections_of_its_own(driver: Driver) -> None:
    """The pool came along into the child: two processes spoke over one
    session (`received 0 results from command 'ROLLBACK'`), and one's
    transaction committed what the other had rolled back."""
    assert _reads(driver) == READS  # the parent's pool now holds a connection
    children = []
    for _ in range(3):
        pid = os.fork()
        if pid == 0:  # the child: reads at the same time as its siblings and parent
            code = 1
            try:
                code = 0 if _reads(driver) == READS else 1
            finally:
                os._exit(code)
        children.append(pid)
    parent = threading.Thread(target=lambda: results.append(_reads(driver)))
    results: list[int] = []
    parent.start()
    parent.join(120)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
    assert codes == [0, 0, 0]
    assert results == [READS]
    assert _reads(driver) == READS  # the parent's connections still work

"""Time budgets for maintenance runs that may have a backlog to work through.

The leader runs its services one after another in one thread, which also
renews its lease: a run that took minutes (the first pruning of years of jobs,
the GC of a month of outputs) would hold up the reaper and the promoter and
let the lease lapse.  Such a service stops its run when its budget is spent
and asks to run again soon (``Backlog.period``) until it has caught up.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

# A leader's run of a service with a backlog: what it may take, and when the
# next one comes while it is behind.
BUDGET_SECONDS = 2.0
CATCH_UP_SECONDS = 1.0


@dataclass
class Backlog:
    """``spent()`` once the budget is used up (never without one); ``behind``
    records that a run stopped on it, and shortens ``period`` until one ends
    on its own."""

    every: float
    budget_seconds: float | None = None
    behind: bool = False
    _until: float | None = None

    @property
    def period(self) -> float:
        return CATCH_UP_SECONDS if self.behind else self.every

    def start(self) -> None:
        self.behind = False
        self._until = (
            None if self.budget_seconds is None else time.monotonic() + self.budget_seconds
        )

    def spent(self) -> bool:
        if self._until is not None and time.monotonic() >= self._until:
            self.behind = True
        return self.behind


class Backlogged:
    """A service whose runs have a ``backlog``: it comes back as soon as that says."""

    backlog: Backlog

    @property
    def period(self) -> float:
        return self.backlog.period

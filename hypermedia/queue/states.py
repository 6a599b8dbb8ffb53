"""The job state machine, held as data.

Every status change the engine makes is one of the named actions below; the
driver turns an action into ``UPDATE … WHERE status IN (<from>)`` and treats
zero matched rows as a stale transition.  Seed 000 gives the stored statuses;
seed 004 adds ``cancel_requested`` and ``paused``.
"""

from __future__ import annotations

from typing import Final

STATUSES: Final = (
    "created",
    "queued",
    "claimed",
    "processing",
    "cancel_requested",
    "paused",
    "retry_wait",
    "completed",
    "failed",
    "cancelled",
)

TERMINAL: Final = frozenset({"completed", "failed", "cancelled"})
# Where a worker holds the job under a lease.
RUNNING_SIDE: Final = frozenset({"claimed", "processing", "cancel_requested"})
# Waiting states that a cancel ends at once.
QUEUED_SIDE: Final = frozenset({"created", "queued", "retry_wait", "paused"})

# action -> (statuses it may start from, status it leads to)
TRANSITIONS: Final[dict[str, tuple[frozenset[str], str]]] = {
    "release": (frozenset({"created"}), "queued"),
    "claim": (frozenset({"queued"}), "claimed"),
    "start": (frozenset({"claimed"}), "processing"),
    "complete": (RUNNING_SIDE, "completed"),
    "retry_later": (RUNNING_SIDE, "retry_wait"),
    "fail": (RUNNING_SIDE, "failed"),
    "promote": (frozenset({"retry_wait"}), "queued"),
    "cancel": (QUEUED_SIDE, "cancelled"),
    "request_cancel": (frozenset({"claimed", "processing"}), "cancel_requested"),
    "confirm_cancel": (frozenset({"cancel_requested"}), "cancelled"),
    "pause": (frozenset({"processing"}), "paused"),
    "resume": (frozenset({"paused"}), "queued"),
    "hand_back": (frozenset({"claimed"}), "queued"),
    "retry": (frozenset({"failed", "cancelled"}), "queued"),
}

ALLOWED: Final = frozenset((src, dst) for sources, dst in TRANSITIONS.values() for src in sources)

ATTEMPT_STATUSES: Final = (
    "started",
    "completed",
    "failed",
    "timeout",
    "crashed",
    "cancelled",
    "orphaned",
)

OUTCOMES: Final = (
    "completed",
    "cancelled",
    "failed",
    "timeout",
    "provider_unavailable",
    "orphaned",
)

# Seed 001 shows a coarser status; this is that view.
LEGACY_STATUS: Final = {
    "created": "pending",
    "queued": "pending",
    "retry_wait": "pending",
    "claimed": "pending",
    "paused": "pending",
    "processing": "running",
    "cancel_requested": "running",
    "completed": "completed",
    "failed": "failed",
    "cancelled": "cancelled",
}


def legacy_status(status: str, started_at: object) -> str:
    """Seed 001's status of a job: LEGACY_STATUS, except that the seed holds
    running ⇒ started_at, so a cancel asked of a job claimed but never
    started (cancel_requested, no started_at) is still pending there."""
    shown = LEGACY_STATUS[status]
    return "pending" if shown == "running" and started_at is None else shown


def sources(action: str) -> frozenset[str]:
    return TRANSITIONS[action][0]


def target(action: str) -> str:
    return TRANSITIONS[action][1]


def is_allowed(src: str, dst: str) -> bool:
    return (src, dst) in ALLOWED

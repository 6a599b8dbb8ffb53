"""Machine-readable error codes and what the engine does with each.

The policy is data: a code maps to whether a failed attempt may be retried,
the seed-004 category shown to people, and the terminal outcome it produces.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CodePolicy:
    retryable: bool
    category: str
    outcome: str = "failed"
    # OOM retries ask the next attempt for more memory (multiplier on the limit).
    memory_factor: float = 1.0
    # Multiplies the retry delay's base (HYPERMEDIA_BACKOFF_BASE_SECONDS; the
    # cap stays).  A store, a provider or a disk that is away is seldom back
    # within the seconds a crashed child needs: retried after 1-4 s, three
    # attempts were spent by a ten-second restart.
    backoff_factor: float = 1.0
    # A second attempt in a row ending with this code fails the job.  An
    # input that runs out of time does it again: retried to the last attempt,
    # a render bomb no pipeline budget catches cost max_attempts x timeout.
    # One retry still covers a machine that was slow for a while.
    retry_once: bool = False


# Something outside the job is away: first retry after 15-30 s at the default base.
AWAY = 15.0

ERROR_POLICY: dict[str, CodePolicy] = {
    "CORRUPT_INPUT": CodePolicy(False, "invalid_input"),
    "UNSUPPORTED_FORMAT": CodePolicy(False, "unsupported_operation"),
    "INPUT_TOO_LARGE": CodePolicy(False, "invalid_input"),
    "LIMIT_EXCEEDED": CodePolicy(False, "invalid_input"),
    "INVALID_PARAMS": CodePolicy(False, "invalid_input"),
    # A pipeline handed back something the worker refuses to store (a path
    # outside its scratch directory, a symlink): the same input does it again.
    "INVALID_OUTPUT": CodePolicy(False, "provider_failure"),
    # The attempt reached for a file or a socket outside its sandbox
    # (worker/sandbox.py, worker/seccomp.py):
    # what a hostile file makes a decoder do, and it would do it again.
    "PERMISSION_DENIED": CodePolicy(False, "permission_denied"),
    "OOM": CodePolicy(True, "provider_failure", memory_factor=2.0),
    "TIMEOUT": CodePolicy(True, "timeout", outcome="timeout", retry_once=True),
    "STORAGE_UNAVAILABLE": CodePolicy(True, "storage", backoff_factor=AWAY),
    "PROVIDER_UNAVAILABLE": CodePolicy(
        True, "provider_unavailable", "provider_unavailable", backoff_factor=AWAY
    ),
    "DEPENDENCY_FAILED": CodePolicy(True, "external_dependency", backoff_factor=AWAY),
    "CRASHED": CodePolicy(True, "provider_failure"),
    "ORPHANED": CodePolicy(True, "provider_failure", outcome="orphaned"),
    "INTERNAL": CodePolicy(True, "unknown"),
}

CATEGORIES = (
    "invalid_input",
    "permission_denied",
    "provider_unavailable",
    "unsupported_operation",
    "timeout",
    "cancellation",
    "external_dependency",
    "storage",
    "provider_failure",
    "unknown",
)


# The reason of an attempt that found no room to write (pipelines, the child).
SCRATCH_FULL = "the scratch space is full"
# A write past the attempt's file-size limit (RLIMIT_FSIZE: EFBIG, "File too
# large"); a decoder deletes its partial file, so only its error tells.
FILE_TOO_LARGE = "the attempt wrote a file over its size limit (HYPERMEDIA_CHILD_MAX_FILE_MB)"


def policy_for(code: str) -> CodePolicy:
    """Unknown codes are treated like INTERNAL: retried, category unknown."""
    return ERROR_POLICY.get(code, ERROR_POLICY["INTERNAL"])


class HypermediaError(Exception):
    """Base class; ``str()`` of every subclass is safe to show a user."""


class ReadOnlyDatabase(HypermediaError):
    """A SQLite database this user cannot write (it, or its folder, where
    SQLite keeps its -wal and -shm files): no wait will change that."""


class JobError(HypermediaError):
    """A pipeline failure with a machine-readable code and a user-safe reason."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


class StaleTransition(HypermediaError):
    """A guarded status change matched no row: the job was not where we thought."""

    def __init__(
        self, job_id: int, action: str, status: str | None, *, shown: str | None = None
    ) -> None:
        where = f"it is {status}" if status else "it does not exist"
        super().__init__(f"cannot {action} job {shown or job_id}: {where}")
        self.job_id = job_id
        self.action = action
        self.status = status


class StaleAttempt(HypermediaError):
    """A worker reported on an attempt that is no longer the job's current one."""


class NotFound(HypermediaError):
    pass


class InvalidRequest(HypermediaError):
    pass


# A listing's cursor that is not one of its own pages' (made up, or another's).
BAD_CURSOR = "cursor is not valid; use next_cursor from a previous page"


class Refused(InvalidRequest):
    """A well-formed request the current state refuses (a credit budget
    spent, a version taken by a concurrent change): the same request may
    pass later.  The API answers it as any InvalidRequest; the CLI exits 1
    for it, 2 for a request that is wrong in itself."""


class ValueRefused(InvalidRequest):
    """The database refused a value it was given, as it would every time (a
    NUL character on PostgreSQL, a number out of a column's range)."""

    def __init__(self) -> None:
        super().__init__(
            "a value given cannot be stored (NUL characters, or a number or text out of range)"
        )


class IdempotencyConflict(HypermediaError):
    """The idempotency key was used before for a different request."""


class Conflict(HypermediaError):
    """A unique key refused the write (the database said so, not our guess)."""


class Unauthorized(HypermediaError):
    """No token, or one that is unknown, expired or revoked (one answer for all four)."""


class Forbidden(HypermediaError):
    """The token is valid but lacks the scope this action needs."""

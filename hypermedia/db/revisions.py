"""Which schema revision this code needs, and whether a database has it,
without loading Alembic: workers and the API check at start and in /readyz;
Alembic itself is only for ``hypermedia db upgrade``.

Revision ids are the four-digit prefixes of the migration files
(``0009_job_ids_never_reused.py`` is revision ``"0009"``), so they sort in
the order they apply (tests/unit/test_revisions.py holds Alembic to it).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

VERSIONS = Path(__file__).with_name("migrations") / "versions"


@cache
def known() -> tuple[str, ...]:
    """Every revision this code ships, oldest first."""
    return tuple(sorted(p.name[:4] for p in VERSIONS.glob("[0-9][0-9][0-9][0-9]_*.py")))


def head() -> str:
    return known()[-1]


LOST = (
    "the database has hypermedia's tables but no record of their revision "
    "(its alembic_version table is missing or empty): see `hypermedia db upgrade`"
)


def behind(current: str | None, tables: bool = False) -> str | None:
    """Why a database at ``current`` cannot serve this code yet, or None;
    ``tables``: hypermedia's tables are there (read only when ``current`` is
    None: "run db upgrade" then sent people to a command that refuses).

    A revision this code does not know was made by a newer hypermedia (an
    upgrade that migrated before this process was replaced): waiting would
    not change it, so it is for ``newer`` to tell, not a reason to wait."""
    if current is None:
        if tables:
            return LOST
        return "the database has no hypermedia schema: run `hypermedia db upgrade`"
    if current in known() and current < head():
        return (
            f"the database schema is at revision {current}, this hypermedia needs "
            f"{head()}: run `hypermedia db upgrade`"
        )
    return None


def newer(current: str | None) -> bool:
    """Whether the database was migrated by a hypermedia newer than this one."""
    return current is not None and current not in known()

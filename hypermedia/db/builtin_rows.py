"""Built-in rows a migration installs, minus those a user made first."""

from __future__ import annotations

import logging
from typing import Any

import sqlalchemy as sa

log = logging.getLogger("hypermedia.db.migrations")


def new_profiles(conn: sa.Connection, table: sa.TableClause, rows: list[dict[str, Any]]) -> list:
    """The built-in profile versions no profile has taken yet.

    `profiles create pdf-preview` makes v1, so a user on an older revision
    could own the key and version a later revision ships: the upgrade stopped
    on the unique key (and, on MariaDB, whose DDL had committed, could not be
    run again).  The user's profile stays, and the upgrade says so."""
    q = sa.select(table.c.profile_key, table.c.profile_version)
    taken = {(k, v) for k, v in conn.execute(q)}
    for row in rows:
        if (row["profile_key"], row["profile_version"]) in taken:
            log.warning(
                "profile %s:%s exists already: the built-in one is not installed "
                "(its job type and settings may differ from the documented ones)",
                row["profile_key"],
                row["profile_version"],
            )
    return [r for r in rows if (r["profile_key"], r["profile_version"]) not in taken]

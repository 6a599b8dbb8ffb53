"""MariaDB: a migration step that stopped part-way can be run again.

MariaDB commits each DDL statement as it runs, so a `db upgrade` killed (or
failed) inside a step left that step's first tables, columns or indexes in
place under the previous revision's stamp, and every later upgrade, and
every `serve` start, stopped on "Table 'projects' already exists".  Run
again, such a statement finds its work done: here it is skipped, said in the
log, and the step goes on.  PostgreSQL and SQLite roll a failed step back
whole, and need none of this.
"""

from __future__ import annotations

import logging
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.ddl import ExecutableDDLElement

log = logging.getLogger("hypermedia.db.migrations")

# What a statement of a step run before says when run again.
DONE_DDL = {
    1050: "the table exists",
    1060: "the column exists",
    1061: "the index exists",
    1022: "the key exists",
    1826: "the foreign key exists",
    1091: "it was dropped already",  # DROP of an index, column or key
    1054: "the column was renamed already",  # ALTER ... CHANGE of the old name
}
DONE_INSERT = {1062: "the row exists"}  # a step's fixed rows (attempt_fold's)


def install(impl: Any) -> None:
    """Wrap ``impl._exec`` (each statement a step runs goes through it)."""
    run = impl._exec

    def _exec(construct: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return run(construct, *args, **kwargs)
        except (sa.exc.OperationalError, sa.exc.IntegrityError, sa.exc.ProgrammingError) as exc:
            why = _done(construct, exc)
            if why is None:
                raise
            said = " ".join(_text(construct).split())[:120]
            log.warning("skipped, %s (a step run before stopped part-way): %s", why, said)
            return None

    impl._exec = _exec


DDL = ("ALTER ", "CREATE ", "DROP ")


def _done(construct: Any, exc: sa.exc.DBAPIError) -> str | None:
    code = exc.orig.args[0] if exc.orig is not None and exc.orig.args else None
    if not isinstance(code, int):
        return None
    text = _text(construct).lstrip().upper()
    if isinstance(construct, ExecutableDDLElement) or text.startswith(DDL):
        return DONE_DDL.get(code)
    if text.startswith("INSERT "):
        return DONE_INSERT.get(code)
    return None


def _text(construct: Any) -> str:
    try:
        return str(construct)
    except Exception:  # a construct the default dialect cannot print
        return type(construct).__name__

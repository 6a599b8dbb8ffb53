"""The schema revision this code needs, as read without Alembic, is
Alembic's own head, and what a database at each revision is told."""

from __future__ import annotations

from alembic.script import ScriptDirectory

from hypermedia.db import migrate, revisions


def test_the_file_prefixes_are_alembics_revisions_in_order() -> None:
    script = ScriptDirectory.from_config(migrate.alembic_config("sqlite://"))
    oldest_first = [r.revision for r in reversed(list(script.walk_revisions()))]
    assert list(revisions.known()) == oldest_first
    assert revisions.head() == migrate.head() == oldest_first[-1]


def test_what_a_database_at_each_revision_is_told() -> None:
    head = revisions.head()
    assert "no hypermedia schema" in (revisions.behind(None) or "")
    older = revisions.known()[0]
    said = revisions.behind(older) or ""
    assert f"revision {older}" in said and head in said and "db upgrade" in said
    assert revisions.behind(head) is None
    assert not revisions.newer(head) and not revisions.newer(None)
    # A revision this code does not know was made by a newer hypermedia:
    # told (newer), not waited for (behind).
    assert revisions.behind("9999") is None and revisions.newer("9999")

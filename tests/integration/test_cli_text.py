"""What the CLI prints is printed as it is: brackets in reasons, errors and
names are text, not Rich markup.  Redaction's own markers ("[path]",
"[token]") used to vanish from every line, and a name like "a [red]b" took
a colour instead of its characters.  Real CLI processes, the embedded default."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from hypermedia.db.driver import Driver
from tests.harness import hypermedia


def test_a_reason_keeps_its_brackets(tmp_path: Path) -> None:
    home = tmp_path / "home"
    url = f"sqlite:///{home / 'hypermedia.db'}"
    assert hypermedia("db", "upgrade", url=url, home=home).returncode == 0
    done = hypermedia("jobs", "submit", "debug.noop", "--queue", "idle", url=url, home=home)
    assert done.returncode == 0, done.stderr
    assert hypermedia("jobs", "cancel", "1", url=url, home=home).returncode == 0
    reason = "could not read [path]: [token] refused [red]x[/]"
    driver = Driver(url)
    try:
        with driver.tx() as tx:
            q = sa.text("UPDATE processing_jobs SET safe_reason = :r, error_code = 'CANCELLED'")
            tx.conn.execute(q, {"r": reason})
    finally:
        driver.dispose()
    shown = hypermedia("jobs", "show", "1", url=url, home=home)
    assert shown.returncode == 0, shown.stderr
    assert reason in " ".join(shown.stdout.split()), shown.stdout


def test_an_error_line_keeps_the_redacted_path(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    done = hypermedia("jobs", "ls", url="", home=not_a_dir / "home")
    assert done.returncode == 1
    said = " ".join(done.stderr.split())
    assert said.startswith("error: ") and "[path]" in said, said
    assert str(tmp_path) not in said

"""HYPERMEDIA_HOME, made by hypermedia, is its user's only: the database,
every project's files and the signing key live under it (QA: 0755 folders
and 0644 blobs, readable by any local user)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hypermedia.cli.common import make_home
from hypermedia.storage.ledger import _home_secret


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_home_made_here_is_its_users_only(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        make_home(tmp_path / "a" / "home")
        _home_secret(tmp_path / "b")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "a" / "home") == 0o700
    assert _mode(tmp_path / "b") == 0o700
    assert _mode(tmp_path / "b" / "secret.key") == 0o600


def test_an_existing_home_keeps_its_mode(tmp_path: Path) -> None:
    home = tmp_path / "shared"
    home.mkdir()
    home.chmod(0o750)  # the operator's choice
    make_home(home)
    assert _mode(home) == 0o750

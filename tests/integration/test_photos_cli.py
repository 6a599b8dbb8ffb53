"""``hypermedia photos …`` run as real subprocesses against each database."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypermedia.db.driver import Driver
from tests.harness import hypermedia
from tests.media import png


def _run(*args: str, url: str, home: Path):  # type: ignore[no-untyped-def]
    return hypermedia(*args, url=url, home=home)


def _json(proc) -> Any:  # type: ignore[no-untyped-def]
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _blobs(home: Path) -> int:
    return sum(1 for p in (home / "storage" / "objects").rglob("*") if p.is_file())


def test_photos_add_ls_show_copy_move_rm(driver: Driver, tmp_path: Path) -> None:
    url, home = driver.url, tmp_path / "home"
    image = tmp_path / "beach day.png"
    image.write_bytes(png(40, 30))

    added = _json(
        _run(
            "photos", "add", str(image), "--album", "trip", "--title", "Sea", "--json",
            url=url, home=home,
        )
    )  # fmt: skip
    pid = added["id"]
    assert (added["album"], added["title"]) == ("trip", "Sea")
    assert (added["mime_type"], added["width"], added["height"]) == ("image/png", 40, 30)
    assert added["size"] == len(png(40, 30))
    assert f"/v1/objects/{added['object_id']}/content?" in added["url"]
    assert set(added["variants"]) == {"thumb", "preview"}

    shown = _json(_run("photos", "show", pid, "--json", url=url, home=home))
    assert shown["object_id"] == added["object_id"] and shown["album"] == "trip"
    text = _run("photos", "show", pid, url=url, home=home)
    assert text.returncode == 0 and "Sea" in text.stdout

    listed = _json(_run("photos", "ls", "--album", "trip", "--json", url=url, home=home))
    assert [p["id"] for p in listed["items"]] == [pid]

    blobs = _blobs(home)
    copied = _json(_run("photos", "copy", pid, "--album", "best", "--json", url=url, home=home))
    assert copied["id"] != pid and copied["album"] == "best"
    assert copied["object_id"] == added["object_id"]  # metadata only: the same object
    assert _blobs(home) == blobs

    moved = _run("photos", "move", copied["id"], "--album", "archive", url=url, home=home)
    assert moved.returncode == 0, moved.stderr
    archive = _json(_run("photos", "ls", "--album", "archive", "--json", url=url, home=home))
    assert [p["id"] for p in archive["items"]] == [copied["id"]]
    assert _json(_run("photos", "ls", "--album", "best", "--json", url=url, home=home)) == {
        "items": [],
        "next_cursor": None,
    }

    removed = _run("photos", "rm", pid, url=url, home=home)
    assert removed.returncode == 0, removed.stderr
    gone = _run("photos", "show", pid, url=url, home=home)
    assert gone.returncode == 2 and "not found" in gone.stderr
    # The copy still holds the original: it stays through GC.
    objects = _json(_run("objects", "ls", "--json", url=url, home=home))
    assert [o["object_id"] for o in objects] == [added["object_id"]]
    again = _json(_run("photos", "show", copied["id"], "--json", url=url, home=home))
    assert again["object_id"] == added["object_id"] and again["url"]


def test_photos_cli_refuses_bad_input_without_a_traceback(driver: Driver, tmp_path: Path) -> None:
    url, home = driver.url, tmp_path / "home"
    note = tmp_path / "note.txt"
    note.write_text("not an image")
    bad = _run("photos", "add", str(note), url=url, home=home)
    assert bad.returncode == 2 and "must be an image" in bad.stderr
    missing = _run("photos", "copy", "no-such-photo", url=url, home=home)
    assert missing.returncode == 2 and "not found" in missing.stderr
    no_album = _run("photos", "move", "no-such-photo", url=url, home=home)
    assert no_album.returncode != 0  # --album is required
    for proc in (bad, missing, no_album):
        assert "Traceback" not in proc.stderr

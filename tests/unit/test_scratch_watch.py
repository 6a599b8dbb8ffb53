"""The scratch folder's total, as a slot takes it while an attempt runs."""

from __future__ import annotations

import os
import time
from pathlib import Path

from hypermedia.worker import slot
from hypermedia.worker.slot import ScratchWatch, scratch_usage


def _write(path: Path, mb: int) -> None:
    path.write_bytes(os.urandom(mb << 20))


def test_files_in_nested_folders_add_up_and_links_are_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside.bin"
    _write(outside, 4)
    scratch = tmp_path / "scratch"
    (scratch / "a" / "b").mkdir(parents=True)
    _write(scratch / "one.bin", 1)
    _write(scratch / "a" / "b" / "two.bin", 2)
    (scratch / "link").symlink_to(outside)
    (scratch / "a" / "dirlink").symlink_to(tmp_path)
    used, entries = scratch_usage(str(scratch), 1000)
    assert 3 << 20 <= used < (3 << 20) + (1 << 20)  # the 4 MB behind the link not counted
    assert entries == 6  # one.bin, link, a, b, dirlink, two.bin


def test_a_sparse_file_costs_what_it_takes_on_disk(tmp_path: Path) -> None:
    with open(tmp_path / "sparse", "wb") as f:
        f.truncate(1 << 30)
    used, _ = scratch_usage(str(tmp_path), 1000)
    assert used < 1 << 20


def test_counting_stops_past_the_most_entries(tmp_path: Path) -> None:
    for i in range(50):
        (tmp_path / f"f{i}").touch()
    assert scratch_usage(str(tmp_path), 10)[1] == 11
    assert scratch_usage(str(tmp_path), 1000)[1] == 50


def test_the_watch_looks_once_a_check_and_says_which_limit(tmp_path: Path, monkeypatch) -> None:
    watch = ScratchWatch(str(tmp_path), 1, time.monotonic())
    _write(tmp_path / "big.bin", 2)
    assert watch.over() is None  # not before the first check is due
    watch._next = 0.0
    status, code, why = watch.over() or ("", "", "")
    assert (status, code) == ("failed", "LIMIT_EXCEEDED")
    assert "its 1 MB limit" in why
    (tmp_path / "big.bin").unlink()
    monkeypatch.setattr(slot, "MAX_SCRATCH_ENTRIES", 5)
    for i in range(6):
        (tmp_path / f"f{i}").touch()
    watch._next = 0.0
    assert "more than 5 files" in (watch.over() or ("", "", ""))[2]
    for i in range(6):
        (tmp_path / f"f{i}").unlink()
    watch._next = 0.0
    assert watch.over() is None


def test_files_unlinked_while_held_open_count_too(tmp_path: Path) -> None:
    """libvips unlinks its temporary images as it opens them: a 400 MB canvas
    in scratch never counted against the scratch limit."""
    scratch, outside = tmp_path / "scratch", tmp_path / "outside.bin"
    scratch.mkdir()
    held = open(scratch / "#temp", "wb")  # noqa: SIM115  # held open on purpose
    elsewhere = open(outside, "wb")  # noqa: SIM115
    try:
        for f in (held, elsewhere):
            f.write(os.urandom(3 << 20))
            f.flush()
        os.unlink(scratch / "#temp")
        os.unlink(outside)  # outside the scratch folder: not the attempt's
        assert scratch_usage(str(scratch), 1000) == (0, 0)
        assert 3 << 20 <= slot.unlinked_usage(os.getpid(), str(scratch)) < 4 << 20
        watch = ScratchWatch(str(scratch), 2, time.monotonic() - 10, os.getpid())
        stop = watch.over()
        assert stop is not None and stop[1] == "LIMIT_EXCEEDED", stop
    finally:
        held.close()
        elsewhere.close()
    assert slot.unlinked_usage(os.getpid(), str(scratch)) == 0

"""Leftovers of processes that died: a folder or file is swept only when no
live process holds its lock (real processes, killed with SIGKILL, real
flocks), never while young, never without a lock file, never through a
symlink."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hypermedia import leftovers

HOLD = """
import sys, time
from pathlib import Path
from hypermedia import leftovers
kind, path = sys.argv[1], Path(sys.argv[2])
leftovers.hold_folder(path) if kind == "folder" else leftovers.hold(path)
print("held", flush=True)
time.sleep(600)
"""


def _holder(kind: str, path: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, kind, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _end(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _age(path: Path, seconds: float = 60) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_a_folder_is_swept_only_once_its_owner_is_dead(tmp_path: Path) -> None:
    live, dead = tmp_path / "live", tmp_path / "dead"
    holders = [_holder("folder", live), _holder("folder", dead)]
    try:
        (dead / "input.jpg").write_bytes(b"x" * 1000)
        for folder in (live, dead):
            _age(folder / leftovers.OWNER)
        assert leftovers.sweep_folders(tmp_path) == []  # both owners alive
        holders[1].send_signal(signal.SIGKILL)  # as the OOM killer would
        holders[1].wait()
        assert leftovers.sweep_folders(tmp_path) == ["dead"]  # a worker's name: its id
        assert live.exists() and not dead.exists()
    finally:
        for p in holders:
            _end(p)


def test_young_unlocked_and_symlinked_folders_stay(tmp_path: Path) -> None:
    young = tmp_path / "young"
    young.mkdir()
    (young / leftovers.OWNER).touch()  # unlocked, but just made: its owner may lock it yet
    unlocked_old = tmp_path / "no-lock-file"
    unlocked_old.mkdir()
    _age(unlocked_old)
    target = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    target.mkdir()
    (target / leftovers.OWNER).touch()
    _age(target / leftovers.OWNER)
    (tmp_path / "link").symlink_to(target)
    assert leftovers.sweep_folders(tmp_path) == []
    assert young.exists() and unlocked_old.exists() and target.exists()
    _age(young / leftovers.OWNER)
    assert leftovers.sweep_folders(tmp_path) == ["young"] and not young.exists()


def test_files_are_swept_by_the_same_rule(tmp_path: Path) -> None:
    held, dropped = tmp_path / "upload-a.part", tmp_path / "upload-b.part"
    other = tmp_path / "keep.txt"
    holder = _holder("file", held)
    try:
        dropped.touch()
        other.touch()
        for f in (held, dropped, other):
            _age(f)
        assert leftovers.sweep_files(tmp_path, "upload-*.part") == 1
        assert held.exists() and other.exists() and not dropped.exists()
    finally:
        _end(holder)
    assert leftovers.sweep_files(tmp_path, "upload-*.part") == 1 and not held.exists()


def test_a_second_holder_is_refused(tmp_path: Path) -> None:
    fd = leftovers.hold(tmp_path / "x")
    try:
        with pytest.raises(BlockingIOError):
            leftovers.hold(tmp_path / "x")
    finally:
        os.close(fd)

"""Files and folders that belong to a running process, and sweeping those
whose process died.

A worker's scratch folder and an API upload's temp file are removed by their
process when it is done.  One killed on the spot (kill -9, the OOM killer, a
power cut) cannot: its leftovers, inputs of hundreds of MB among them, would
stay until the disk fills.  So the owner holds an flock(2) on them for as
long as they are in use; the kernel drops it the moment the process dies,
however it dies, and a sweeper that can take the lock knows nobody holds
them.  Nothing is judged by a process id (reused) or by age alone (a long
upload is old and alive); age only covers the microseconds between creating
a file and locking it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import time
from pathlib import Path

log = logging.getLogger(__name__)

OWNER = ".owner"  # the lock file inside an owned folder
# Never swept younger: its owner may not have locked it yet (the lock is
# taken right after the file is made).  It was 10 s, and a `process` killed
# in its first ten seconds was judged by nobody until a sweep a minute later.
YOUNG_SECONDS = 2.0


def hold(path: Path) -> int:
    """Open (creating) ``path`` and lock it for this process's life, or
    until the returned descriptor is closed."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    return fd


def hold_folder(folder: Path) -> int:
    """Create ``folder`` (private) and hold it: see ``hold``."""
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    return hold(folder / OWNER)


def _abandoned(lock: Path, now: float) -> bool:
    """Whether nobody holds ``lock`` and it is old enough to judge."""
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        if now - os.fstat(fd).st_mtime < YOUNG_SECONDS:
            return False
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True  # released with the descriptor below: the caller removes it
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def sweep_folders(parent: Path) -> list[str]:
    """Remove the folders in ``parent`` whose owner is gone; their names (a
    worker's is its id: its process is known to have died).  A folder
    without a lock file is left alone: half made, or made by an older
    version that did not lock (which may still be running)."""
    removed, now = [], time.time()
    with contextlib.suppress(FileNotFoundError), os.scandir(parent) as entries:
        for e in entries:
            if e.is_dir(follow_symlinks=False) and _abandoned(Path(e.path) / OWNER, now):
                shutil.rmtree(e.path, ignore_errors=True)
                removed.append(e.name)
    if removed:
        log.info("removed %d folder(s) of stopped processes under %s", len(removed), parent)
    return removed


def sweep_files(parent: Path, pattern: str) -> int:
    """Remove the files in ``parent`` matching ``pattern`` whose owner is gone."""
    removed, now = 0, time.time()
    for path in parent.glob(pattern):
        if not path.is_symlink() and path.is_file() and _abandoned(path, now):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed += 1
    if removed:
        log.info("removed %d file(s) of stopped processes under %s", removed, parent)
    return removed

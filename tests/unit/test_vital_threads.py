"""A worker whose flusher thread died went on heartbeating and renewing its
leases, so its jobs were held for as long as the process lived.  Now such a
thread's failure ends the process (the reaper frees the jobs after their
leases); any other thread's failure is only logged."""

from __future__ import annotations

import subprocess
import sys
import time

from hypermedia.worker.monitor import EXIT_THREAD_DIED

PROGRAM = """
import threading, time
from hypermedia.worker.monitor import exit_if_they_die

def boom():
    raise RuntimeError("the flusher's bug")

vital = threading.Thread(target=boom, name="flusher")
other = threading.Thread(target=boom, name="availability")
exit_if_they_die({vital})
other.start(); other.join()
print("survived the other thread", flush=True)
{start}
time.sleep(30)
"""


def _run(start: str) -> tuple[subprocess.CompletedProcess[str], float]:
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM.replace("{start}", start)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done, time.monotonic() - began


def test_a_vital_threads_failure_ends_the_process_at_once() -> None:
    done, took = _run("vital.start()")
    assert done.returncode == EXIT_THREAD_DIED, done.stderr
    assert took < 20
    assert "survived the other thread" in done.stdout  # another thread's failure is logged only
    assert "the flusher's bug" in done.stderr  # its traceback is kept
    assert "the flusher thread failed: the worker exits now" in done.stderr


def test_a_stop_held_by_a_blocked_thread_ends_all_the_same() -> None:
    """`hypermedia api` stayed after SIGTERM for as long as a stream's read
    waited on a database that stopped answering: the interpreter's exit joins
    such a thread.  Past the grace the process leaves, with status 0."""
    program = (
        "import threading, time\n"
        "from hypermedia.api.server import exit_within\n"
        "threading.Thread(target=time.sleep, args=(60,)).start()  # not a daemon\n"
        "exit_within(0.5)\n"
    )
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - began < 20
    assert "still stopping after 0.5 s" in done.stderr

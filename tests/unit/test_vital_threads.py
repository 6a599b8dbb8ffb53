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

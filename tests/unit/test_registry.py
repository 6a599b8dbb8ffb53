"""The pipeline registry under concurrent first use (slots, API threads)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

SCRIPT = """
import threading
from hypermedia.pipelines import registry
barrier = threading.Barrier(8)
failures = []
def first_use():
    barrier.wait()
    try:
        registry.get("image.thumbnail")
        assert "pdf.preview" in registry.job_types_for(["documents"])
    except Exception as exc:
        failures.append(repr(exc))
threads = [threading.Thread(target=first_use) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(len(failures), failures[:1])
"""


def test_first_lookups_from_many_threads_all_find_the_built_ins() -> None:
    # A fresh interpreter each time: the registry loads its built-ins once.
    for _ in range(3):
        out = subprocess.run(
            [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.startswith("0 "), out.stdout


REPORT = """
import logging, sys
from hypermedia.pipelines import registry
from hypermedia.worker.runner import report_availability

def run(params, ctx):
    return {}

def broken():
    raise RuntimeError("probe crashed")

for name, probe in (("t.missing", lambda: "the frobnicator is not installed"),
                    ("t.broken", broken), ("t.fine", lambda: None)):
    registry.register(registry.Pipeline(name, "tq", lambda p, s: p, run, available=probe))
logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(levelname)s %(message)s")
report_availability(["t.missing", "t.broken", "t.fine", "not.registered"])
ready = registry.readiness([
    {"ref": "a:v1", "job_type": "security.virus_scan", "settings": {"clamd": "tcp://127.0.0.1:9"}},
    {"ref": "b:v1", "job_type": "t.fine", "settings": {}},
    {"ref": "c:v1", "job_type": "gone.type", "settings": {}},
])
print(sorted(ready.items()))
"""


def test_a_worker_says_which_job_types_cannot_run_here() -> None:
    """At start, each of its job types whose tools are missing, with why; a
    probe that breaks is "not available", never a crash; a profile is probed
    with its own settings (the clamd it names)."""
    out = subprocess.run([sys.executable, "-c", REPORT], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[:2] == [
        "WARNING t.broken cannot run on this machine: its tools could not be checked",
        "WARNING t.missing cannot run on this machine: the frobnicator is not installed",
    ]
    assert lines[2] == str(
        [
            ("a:v1", "clamd does not answer on tcp://127.0.0.1:9"),
            ("b:v1", None),
            ("c:v1", "unknown job type"),
        ]
    )


def test_profiles_are_probed_at_once_and_remembered_a_little_while() -> None:
    """The dashboard's Upload and Profiles pages probe every profile on each
    load: four whose clamd takes connections and never answers cost 1 s
    each, one after another, on every load."""
    from hypermedia.pipelines import registry

    silent = [socket.socket() for _ in range(4)]
    try:
        for s in silent:  # connections complete in the kernel's backlog; no answer
            s.bind(("127.0.0.1", 0))
            s.listen(8)
        profiles = [
            {
                "ref": f"scan{i}:v1",
                "job_type": "security.virus_scan",
                "settings": {"clamd": f"tcp://127.0.0.1:{s.getsockname()[1]}"},
            }
            for i, s in enumerate(silent)
        ]
        started = time.monotonic()
        ready = registry.readiness(profiles)
        first = time.monotonic() - started
        started = time.monotonic()
        again = registry.readiness(profiles)
        second = time.monotonic() - started
    finally:
        for s in silent:
            s.close()
    assert all(r.startswith("clamd does not answer on tcp://") for r in ready.values()), ready
    assert again == ready and len(ready) == 4
    assert 0.9 < first < 2.5, first  # a PING's second, not four of them
    assert second < 0.2, second

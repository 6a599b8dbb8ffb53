"""The pipeline registry under concurrent first use (slots, API threads)."""

from __future__ import annotations

import subprocess
import sys

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

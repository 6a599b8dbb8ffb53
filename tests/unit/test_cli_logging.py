"""What -v turns on: hypermedia's debug lines, not its libraries'."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, logging, sys
from hypermedia.cli.common import setup_logging
setup_logging(sys.argv[1] == "verbose")
names = ("hypermedia.worker.runner", "botocore.endpoint", "urllib3.connectionpool", "s3transfer")
print(json.dumps({n: logging.getLogger(n).isEnabledFor(logging.DEBUG) for n in names}))
"""


def _debug_on(mode: str) -> dict[str, bool]:
    # A process of its own: logging.basicConfig is set once per process.
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True, timeout=60
    )
    return dict(json.loads(done.stdout))


def test_verbose_is_hypermedias_debug_and_not_its_libraries() -> None:
    """botocore's debug lines carry each S3 request's signed headers."""
    on = _debug_on("verbose")
    assert on.pop("hypermedia.worker.runner") is True
    assert not any(on.values()), on
    assert not any(_debug_on("quiet").values())

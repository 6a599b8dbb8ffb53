"""An attempt child's limits hold against the attempt's own code: hard limits
at the worker's ceiling, and no capability left to lift them (a worker run as
root).  Each check runs in a fresh process: limits and capabilities are for good."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_PROBE = textwrap.dedent(
    """
    import json, resource, sys
    from hypermedia.worker import child, sandbox
    scratch = sys.argv[1]
    sandbox.drop_capabilities()
    child._limit(256, None, 5, 1024)
    out = {}
    for name, which in (("as", resource.RLIMIT_AS), ("fsize", resource.RLIMIT_FSIZE)):
        soft, hard = resource.getrlimit(which)
        try:  # what attempt code would do: lift its limit
            resource.setrlimit(which, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            out[name] = "lifted"
        except (ValueError, OSError):
            out[name] = [soft >> 20, hard >> 20]
    child._limit(512, None, 5, 1024)  # a later attempt may have more, up to the ceiling
    out["later"] = resource.getrlimit(resource.RLIMIT_AS)[0] >> 20
    status = open("/proc/self/status").read().splitlines()
    sets = ("CapEff", "CapPrm", "CapBnd")
    out["caps"] = sorted({l.split()[1] for l in status if l.startswith(sets)})
    print(json.dumps(out))
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux rlimits and capabilities")
def test_attempt_code_cannot_lift_its_limits(tmp_path: Path) -> None:
    """Only the soft limits were lowered: the attempt raised them back to the
    hard ones (400 MiB allocated under 256 MiB, a file past the size cap)."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "as": [256, 1024],
        "fsize": [5, 5],
        "later": 512,
        "caps": ["0000000000000000"],
    }


def test_a_python_write_past_the_file_size_limit_is_limit_exceeded() -> None:
    """EFBIG from a pipeline's own write was INTERNAL, a bug, not the limit."""
    import errno

    from hypermedia.errors import FILE_TOO_LARGE
    from hypermedia.worker.child import _os_failure

    said = _os_failure(OSError(errno.EFBIG, "File too large"))
    assert (said["code"], said["message"]) == ("LIMIT_EXCEEDED", FILE_TOO_LARGE)
    assert _os_failure(OSError(errno.ENOSPC, "No space left"))["code"] == "STORAGE_UNAVAILABLE"

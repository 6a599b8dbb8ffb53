"""Jobs read inputs from and write outputs to the ledger, through a real worker.

The child never touches the store: the worker downloads the input into the
scratch directory (checksum verified) and uploads what the child declares,
after checking it is a regular file inside scratch.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hypermedia.db.driver import Driver
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import NewJob
from hypermedia.storage.gc import GarbageCollector
from hypermedia.storage.ledger import Storage
from tests.harness import checksum_of
from tests.integration._procs import Procs, eventually, sqlite_only, wait_job

pytestmark = pytest.mark.timeout(120)


def _outputs(driver: Driver, job_id: int) -> list:  # type: ignore[type-arg]
    with driver.read() as tx:
        return tx.outputs(job_id)


def test_a_job_copies_its_input_to_a_new_object(
    driver: Driver, live: Engine, storage: Storage, procs: Procs
) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)
    src = storage.put(io.BytesIO(data), filename="in.bin")
    job_id = live.enqueue(NewJob("debug.copy", object_id=src["object_id"]))
    procs.worker("--concurrency", "1")
    row = wait_job(driver, job_id)
    assert row["status"] == "completed", (row["error_code"], row["safe_reason"])
    (out,) = _outputs(driver, job_id)
    obj = storage.get(out["object_id"])
    assert obj["state"] == "ready"
    assert obj["storage_key"] == f"objects/{obj['object_id']}/copy.bin" == out["output_key"]
    assert out["output_size_bytes"] == obj["size"] == len(data)
    assert obj["checksum"] == checksum_of(data)
    with storage.open(obj["object_id"]) as f:
        assert f.read() == data
    # The scratch directory was emptied after the attempt.
    scratch = list((procs.home / "scratch").rglob("*.bin"))
    assert scratch == []


@sqlite_only
@pytest.mark.parametrize(
    ("params", "sandbox", "code", "why"),
    [
        # The sandbox refuses the write itself; without one, the worker
        # refuses the output it names.
        ({"name": "../escaped.bin"}, "required", "PERMISSION_DENIED", "outside its sandbox"),
        ({"name": "../escaped.bin"}, "off", "INVALID_OUTPUT", "outside its scratch directory"),
        ({"symlink": "/etc/passwd", "name": "link.bin"}, "auto", "INVALID_OUTPUT", "regular file"),
        # A folder that is not there: the params' fault, said once (not INTERNAL x3).
        ({"name": "no/such/dir.bin"}, "auto", "INVALID_PARAMS", "cannot write there"),
    ],
)
def test_hostile_outputs_fail_the_job_and_store_nothing(
    driver: Driver,
    live: Engine,
    storage: Storage,
    procs: Procs,
    params: dict,  # type: ignore[type-arg]
    sandbox: str,
    code: str,
    why: str,
    request: pytest.FixtureRequest,
) -> None:
    if sandbox == "required":
        request.getfixturevalue("landlock")  # skips (fails in CI) without Landlock
    src = storage.put(io.BytesIO(b"some input"))
    job_id = live.enqueue(NewJob("debug.copy", params, object_id=src["object_id"]))
    w = procs.worker("--concurrency", "1", HYPERMEDIA_CHILD_SANDBOX=sandbox)
    row = wait_job(driver, job_id)
    assert (row["status"], row["error_code"]) == ("failed", code)
    assert why in row["safe_reason"]
    assert row["attempt_count"] == 1  # permanent: not retried
    assert [o["object_id"] for o in storage.list()] == [src["object_id"]]
    assert w.alive()
    # The worker still runs jobs afterwards.
    ok = live.enqueue(NewJob("debug.copy", object_id=src["object_id"]))
    assert wait_job(driver, ok)["status"] == "completed"


@sqlite_only
def test_a_corrupted_input_fails_the_job_permanently(
    driver: Driver, live: Engine, storage: Storage, procs: Procs
) -> None:
    src = storage.put(io.BytesIO(b"x" * 100_000))
    path = storage.settings.home / "storage" / src["storage_key"]
    path.write_bytes(b"y" * 100_000)  # bit rot behind the ledger's back
    job_id = live.enqueue(NewJob("debug.copy", object_id=src["object_id"]))
    procs.worker("--concurrency", "1")
    row = wait_job(driver, job_id)
    assert (row["status"], row["error_code"]) == ("failed", "CORRUPT_INPUT")
    assert "checksum" in row["safe_reason"]
    assert _outputs(driver, job_id) == []


_UPLOADER = textwrap.dedent(
    """
    import sys, time
    from hypermedia.config import Settings
    from hypermedia.db.driver import Driver
    from hypermedia.storage.ledger import Storage

    class Slow:
        def read(self, n=-1):
            time.sleep(0.01)
            return b"z" * 65536

    st = Storage(Driver(sys.argv[1]), Settings(home=__import__("pathlib").Path(sys.argv[2])))
    st.put(Slow())
    """
)


def test_a_crash_mid_upload_leaves_only_a_pending_object_for_gc(
    driver: Driver, storage: Storage, tmp_path: Path
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _UPLOADER, driver.url, str(storage.settings.home)],
        start_new_session=True,
    )
    tmp_dir = storage.settings.home / "storage" / ".tmp"
    try:

        def uploading() -> bool:
            rows = storage.list(reserved=True)  # the ledger's view: users see no pending row
            files = list(tmp_dir.iterdir()) if tmp_dir.exists() else []
            return bool(rows) and bool(files) and files[0].stat().st_size > 1_000_000

        eventually(uploading, 30, "the upload is under way")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    (row,) = storage.list(reserved=True)
    assert row["state"] == "pending"  # never ready without its blob
    assert not (storage.settings.home / "storage" / row["storage_key"]).exists()
    time.sleep(0.05)
    s = storage.settings.with_(gc_pending_seconds=0.0)
    report = GarbageCollector(Storage(driver, s)).run_once()
    assert report.marked_pending == 1 and report.deleted == 1
    assert storage.list(reserved=True) == []
    assert list(tmp_dir.iterdir()) == []

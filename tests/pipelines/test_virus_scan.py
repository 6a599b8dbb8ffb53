"""security.virus_scan against a real clamd (see conftest.py): verdicts, limits, outages.

Most tests run the pipeline as the child would (input file in a scratch
directory, settings validated from a profile); the last two run a real
``hypermedia worker`` on the ledger, including a clamd outage that the job
waits out in retry_wait.
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hypermedia.db.driver import Driver
from hypermedia.errors import ERROR_POLICY, JobError
from hypermedia.pipelines import registry, virus
from hypermedia.queue.engine import Engine
from hypermedia.queue.models import NewJob
from hypermedia.storage.ledger import Storage
from tests.integration._procs import Procs, attempts, eventually, sqlite_only, tail, wait_job
from tests.pipelines.conftest import (
    EICAR,
    EICAR_NAME,
    MARKER,
    MARKER_NAME,
    MAX_FILE,
    STREAM_MAX,
    Clamd,
)

pytestmark = pytest.mark.timeout(120)

CLEAN = b"just some harmless text, nothing to see here\n" * 200


def _scan(
    scratch: Path, data: bytes, settings: dict[str, Any]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run the pipeline on ``data`` as the child would; (result, declared outputs)."""
    path = scratch / "input.bin"
    path.write_bytes(data)
    params = virus.VIRUS_SCAN.validate({}, settings)
    ctx = registry.Context(str(scratch), lambda _: None, str(path))
    result = virus.VIRUS_SCAN.run(params, ctx)
    assert result is not None
    return result, ctx.outputs


@pytest.fixture(params=["unix", "tcp"])
def url(request: pytest.FixtureRequest, clamd: Clamd) -> str:
    return clamd.unix_url if request.param == "unix" else clamd.tcp_url


# -- verdicts ------------------------------------------------------------------------


def test_a_clean_file_is_clean(tmp_path: Path, url: str) -> None:
    result, outputs = _scan(tmp_path, CLEAN, {"clamd": url})
    assert result["verdict"] == "clean"
    assert result["signature"] is None and result["reason"] is None
    assert result["bytes_sent"] == len(CLEAN)
    assert result["engine"].startswith("ClamAV 1.")
    assert outputs == [
        {
            "output_type": "virus_verdict",
            "mime_type": "application/json",
            "metadata": {"verdict": "clean", "signature": None},
            "path": None,
        }
    ]


def test_eicar_is_infected_with_the_signature_name(tmp_path: Path, url: str) -> None:
    result, outputs = _scan(tmp_path, EICAR, {"clamd": url})
    assert result["verdict"] == "infected"
    assert result["signature"] == f"{EICAR_NAME}.UNOFFICIAL"
    assert outputs[0]["metadata"] == {"verdict": "infected", "signature": result["signature"]}


def test_a_body_signature_inside_a_larger_file_is_found(tmp_path: Path, clamd: Clamd) -> None:
    data = os.urandom(100_000) + MARKER + os.urandom(50_000)
    result, _ = _scan(tmp_path, data, {"clamd": clamd.unix_url})
    assert (result["verdict"], result["signature"]) == ("infected", f"{MARKER_NAME}.UNOFFICIAL")


def test_an_empty_file_is_clean(tmp_path: Path, clamd: Clamd) -> None:
    result, _ = _scan(tmp_path, b"", {"clamd": clamd.unix_url})
    assert (result["verdict"], result["bytes_sent"]) == ("clean", 0)


# -- limits: never "clean" -----------------------------------------------------------


def test_over_clamds_stream_limit_is_not_fully_scanned(tmp_path: Path, url: str) -> None:
    # Larger than what the kernel buffers on a loopback connection.
    data = b"a" * (24 * STREAM_MAX)
    result, outputs = _scan(tmp_path, data, {"clamd": url})
    assert result["verdict"] == "not_fully_scanned"
    assert "size limit exceeded" in result["reason"]
    assert result["signature"] is None
    assert result["bytes_sent"] < len(data)  # stopped sending once clamd refused
    assert outputs[0]["metadata"] == {"verdict": "not_fully_scanned", "signature": None}


def test_over_clamds_file_size_limit_is_not_fully_scanned(tmp_path: Path, clamd: Clamd) -> None:
    # Under StreamMaxLength, over MaxFileSize: clamd (AlertExceedsMax) names the limit.
    result, _ = _scan(tmp_path, b"b" * (MAX_FILE + 4096), {"clamd": clamd.unix_url})
    assert result["verdict"] == "not_fully_scanned"
    assert result["reason"] == "clamd stopped at its scan limit (MaxFileSize)"
    assert result["signature"] is None


def test_over_max_bytes_is_not_fully_scanned_and_only_a_prefix_is_sent(
    tmp_path: Path, clamd: Clamd
) -> None:
    settings = {"clamd": clamd.unix_url, "max_bytes": 10_000}
    result, _ = _scan(tmp_path, CLEAN * 3, settings)
    assert result["verdict"] == "not_fully_scanned"
    assert result["bytes_sent"] == 10_000
    assert "max_bytes" in result["reason"]
    # What the scanned part shows is still reported.
    result, _ = _scan(tmp_path, MARKER + CLEAN * 3, settings)
    assert (result["verdict"], result["signature"]) == ("infected", f"{MARKER_NAME}.UNOFFICIAL")


@pytest.mark.parametrize(
    ("reply", "sent", "size", "expected"),
    [
        ("stream: OK\0", 10, 10, ("clean", None, None)),
        ("stream: OK\0", 5, 10, ("not_fully_scanned", None, "larger than max_bytes")),
        ("stream: Foo.Bar FOUND\0", 5, 10, ("infected", "Foo.Bar", None)),
        (
            "stream: Heuristics.Limits.Exceeded.MaxScanTime FOUND\0",
            10,
            10,
            ("not_fully_scanned", None, "clamd stopped at its scan limit (MaxScanTime)"),
        ),
        (
            "INSTREAM size limit exceeded. ERROR\0",
            10,
            10,
            ("not_fully_scanned", None, "clamd could not scan it all: INSTREAM size limit"),
        ),
        (
            "stream: Can't allocate memory ERROR\0",
            10,
            10,
            ("not_fully_scanned", None, "clamd could not scan it all: Can't allocate memory"),
        ),
        # All-match mode: several answers; a real signature wins over a limit.
        (
            "stream: Heuristics.Limits.Exceeded.MaxFileSize FOUND\0stream: X.Y FOUND\0",
            10,
            10,
            ("infected", "X.Y", None),
        ),
        ("stream: Evil\x1b[31m\x07Name FOUND\0", 10, 10, ("infected", "Evil[31mName", None)),
    ],
)
def test_clamd_answers_map_to_verdicts(
    reply: str, sent: int, size: int, expected: tuple[str, str | None, str | None]
) -> None:
    verdict, signature, reason = virus.verdict(reply, sent, size)
    assert (verdict, signature) == expected[:2]
    if expected[2] is None:
        assert reason is None
    else:
        assert reason is not None and reason.startswith(expected[2])


@pytest.mark.parametrize("reply", ["", "UNKNOWN COMMAND\0", "stream: maybe\0"])
def test_an_answer_that_is_not_a_verdict_is_never_clean(reply: str) -> None:
    with pytest.raises(JobError) as err:
        virus.verdict(reply, 10, 10)
    assert err.value.code == "PROVIDER_UNAVAILABLE"


# -- clamd unreachable: PROVIDER_UNAVAILABLE, retryable --------------------------------


def _unavailable(tmp_path: Path, settings: dict[str, Any]) -> JobError:
    with pytest.raises(JobError) as err:
        _scan(tmp_path, CLEAN, settings)
    assert err.value.code == "PROVIDER_UNAVAILABLE"
    assert ERROR_POLICY["PROVIDER_UNAVAILABLE"].retryable
    return err.value


def test_clamd_down_is_provider_unavailable(tmp_path: Path, clamd: Clamd) -> None:
    clamd.stop()  # killed: the unix socket file stays behind, the port is closed
    for url in (clamd.unix_url, clamd.tcp_url):
        err = _unavailable(tmp_path, {"clamd": url})
        assert err.reason == "clamd is not reachable (connection refused)"
    clamd.start()
    result, _ = _scan(tmp_path, CLEAN, {"clamd": clamd.tcp_url})
    assert result["verdict"] == "clean"


def test_a_missing_socket_is_provider_unavailable(tmp_path: Path) -> None:
    err = _unavailable(tmp_path, {"clamd": f"unix://{tmp_path}/nothing-here.sock"})
    assert err.reason == "clamd is not reachable (no socket)"
    assert str(tmp_path) not in err.reason


@contextlib.contextmanager
def _fake_clamd(tmp_path: Path, answer: bytes | None) -> Iterator[str]:
    """A unix socket that reads whatever it is sent and then answers ``answer``
    (None: never answers, holding the connection open until the block ends)."""
    path = Path(f"/tmp/hm-fake-{uuid.uuid4().hex[:8]}.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    server.settimeout(0.2)
    done = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            held.append(conn)
            if answer is not None:
                with contextlib.suppress(OSError):
                    conn.settimeout(1)
                    conn.recv(65536)
                    conn.sendall(answer)
                    conn.shutdown(socket.SHUT_RDWR)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"unix://{path}"
    finally:
        done.set()
        thread.join(5)
        for conn in held:
            conn.close()
        server.close()
        path.unlink()


def test_clamd_not_answering_in_time_is_provider_unavailable(tmp_path: Path) -> None:
    with _fake_clamd(tmp_path, None) as url:
        err = _unavailable(tmp_path, {"clamd": url, "timeout_seconds": 1})
    assert err.reason == "clamd did not answer (timed out)"


def test_a_garbled_answer_is_provider_unavailable(tmp_path: Path) -> None:
    with _fake_clamd(tmp_path, b"HELLO THERE\0") as url:
        err = _unavailable(tmp_path, {"clamd": url})
    assert err.reason == "clamd gave an unexpected answer"


# -- settings ------------------------------------------------------------------------


def test_only_a_profile_names_the_socket(tmp_path: Path) -> None:
    validate = virus.VIRUS_SCAN.validate
    with pytest.raises(JobError, match="set by the profile"):
        validate({"clamd": "tcp://10.0.0.1:3310"}, {})
    with pytest.raises(JobError, match="set by the profile"):
        validate({"max_bytes": 10**9}, {})
    for bad in ("http://x:1", "unix://relative", "unix:///", "tcp://host", "tcp://:3310", "x"):
        with pytest.raises(JobError, match="clamd must be"):
            validate({}, {"clamd": bad})
    assert validate({}, {"clamd": "tcp://clamav.internal:3310"}) == {
        "clamd": "tcp://clamav.internal:3310",
        "max_bytes": 104_857_600,
        "timeout_seconds": 120,
    }
    assert virus.VIRUS_SCAN.schema is virus.SCHEMA


def test_available_pings_the_default_socket(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, clamd: Clamd
) -> None:
    monkeypatch.setattr(virus, "DEFAULT_CLAMD", f"unix://{tmp_path}/none.sock")
    assert virus.available() == f"clamd does not answer on unix://{tmp_path}/none.sock"
    monkeypatch.setattr(virus, "DEFAULT_CLAMD", clamd.tcp_url)
    assert virus.available() is None


# -- through a real worker -----------------------------------------------------------


def _profile(driver: Driver, clamd: Clamd, **settings: Any) -> str:
    """A profile naming the session's clamd, under a fresh key (profiles outlive tests)."""
    key = f"test-{uuid.uuid4().hex[:12]}"
    with driver.tx() as tx:
        tx.insert_profile(
            {
                "profile_key": key,
                "profile_version": "v1",
                "job_type": "security.virus_scan",
                "queue_name": "bulk",
                "settings": {"clamd": clamd.unix_url, **settings},
                "credit_cost_base": 1,
                "timeout_seconds": 60,
                "is_active": True,
            }
        )
    return key


@sqlite_only
def test_a_worker_scans_objects_from_the_ledger(
    driver: Driver, live: Engine, storage: Storage, procs: Procs, clamd: Clamd
) -> None:
    profile = _profile(driver, clamd)
    files = {
        "clean": (CLEAN, "clean", None),
        "eicar": (EICAR, "infected", f"{EICAR_NAME}.UNOFFICIAL"),
        "big": (os.urandom(2 * STREAM_MAX), "not_fully_scanned", None),
    }
    jobs = {}
    for name, (data, _, _) in files.items():
        obj = storage.put(io.BytesIO(data), filename=f"{name}.bin")
        jobs[name] = live.enqueue(
            NewJob("security.virus_scan", profile=profile, object_id=obj["object_id"])
        )
    args = ["--concurrency", "1", "--no-maintenance", "--burst"]
    proc = procs.spawn("worker", "--queues", "bulk", *args, name="worker")
    assert proc.wait(90) == 0, tail(procs._procs[-1][1])
    for name, (_, verdict, signature) in files.items():
        row = wait_job(driver, jobs[name], timeout=5)
        assert row["status"] == "completed", (row["error_code"], row["safe_reason"])
        assert (row["result"]["verdict"], row["result"]["signature"]) == (verdict, signature)
        assert row["result"]["engine"].startswith("ClamAV ")
        with driver.read() as tx:
            (out,) = tx.outputs(jobs[name])
        assert (out["output_type"], out["object_id"]) == ("virus_verdict", None)
        assert out["metadata"] == {"verdict": verdict, "signature": signature}
        assert out["profile_version"] == f"{profile}:v1"


@sqlite_only
def test_a_clamd_outage_is_waited_out_in_retry_wait(
    driver: Driver, live: Engine, storage: Storage, procs: Procs, clamd: Clamd
) -> None:
    profile = _profile(driver, clamd)
    obj = storage.put(io.BytesIO(EICAR), filename="eicar.com")
    clamd.stop()
    job_id = live.enqueue(
        NewJob("security.virus_scan", profile=profile, object_id=obj["object_id"], max_attempts=100)
    )
    procs.worker("--concurrency", "1")
    row = wait_job(driver, job_id, {"retry_wait"}, timeout=30)
    assert row["error_code"] == "PROVIDER_UNAVAILABLE"
    assert row["safe_reason"] == "clamd is not reachable (connection refused)"
    clamd.start()
    row = wait_job(driver, job_id, timeout=30)
    assert row["status"] == "completed", (row["error_code"], row["safe_reason"])
    assert row["result"]["verdict"] == "infected"
    tried = eventually(lambda: attempts(driver, job_id), 5, "attempts recorded")
    assert tried[0]["error_code"] == "PROVIDER_UNAVAILABLE"
    assert tried[-1]["status"] == "completed"

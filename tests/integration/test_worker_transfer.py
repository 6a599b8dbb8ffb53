"""The worker's transfers: inputs fetched ahead by the Stager, outputs stored by
the Storer while the slot moves on (hypermedia/worker/transfer.py).

Real ledger (SQLite, a local pool in tmp_path), real files; the end-to-end
path through a worker is covered by the image and storage job tests.
"""

from __future__ import annotations

import io
import os
import threading
import time
from pathlib import Path
from typing import Any, cast

import pytest

from hypermedia.errors import JobError
from hypermedia.queue.models import AttemptResult, Claimed
from hypermedia.storage.ledger import Storage
from hypermedia.worker.files import inside
from hypermedia.worker.transfer import Stager, Storer, move_outputs
from tests.harness import claimed_input
from tests.integration._procs import sqlite_only

pytestmark = pytest.mark.timeout(60)


def _job(obj: dict[str, Any], job_id: int = 1) -> Claimed:
    return cast(Claimed, claimed_input(obj, "image.thumbnail", job_id=job_id))


def _put(storage: Storage, data: bytes) -> dict[str, Any]:
    return storage.put(io.BytesIO(data), filename="in.bin")


@pytest.fixture
def stager(storage: Storage, tmp_path: Path):  # type: ignore[no-untyped-def]
    stages: list[Stager] = []

    def make(depth: int = 2, *, start: bool = True) -> Stager:
        s = Stager(storage, tmp_path / "stage", depth)
        if start:
            s.start()
        stages.append(s)
        return s

    yield make
    for s in stages:
        if s.is_alive():
            s.close()


def _scratch(tmp_path: Path, name: str = "slot") -> Path:
    d = tmp_path / name
    d.mkdir(exist_ok=True)
    return d


@sqlite_only
def test_inputs_are_fetched_ahead_then_moved_into_the_slot(
    storage: Storage, stager: Any, tmp_path: Path
) -> None:
    data = b"x" * 300_000
    job = _job(_put(storage, data))
    s = stager()
    staging = s.add(job)
    assert staging is not None and staging.done.wait(10)
    staged = list((tmp_path / "stage").glob("*input.*"))
    assert [p.read_bytes() for p in staged] == [data]  # there before any slot asked
    scratch = _scratch(tmp_path)
    name = s.take(job, staging, scratch)
    assert name is not None and (scratch / name).read_bytes() == data
    assert list((tmp_path / "stage").iterdir()) == []  # moved, not copied


@sqlite_only
def test_no_more_than_depth_inputs_wait_fetched(
    storage: Storage, stager: Any, tmp_path: Path
) -> None:
    jobs = [_job(_put(storage, bytes([i]) * 1000), job_id=i + 1) for i in range(3)]
    s = stager(depth=1)
    stagings = [s.add(j) for j in jobs]
    assert stagings[0] is not None and stagings[0].done.wait(10)
    time.sleep(0.3)
    assert [st.state for st in stagings if st] == ["ready", "queued", "queued"]
    s.take(jobs[0], stagings[0], _scratch(tmp_path, "a"))
    assert stagings[1] is not None and stagings[1].done.wait(10)
    assert stagings[2] is not None and stagings[2].state == "queued"


@sqlite_only
def test_a_slot_fetches_itself_an_input_the_stager_has_not_begun(
    storage: Storage, stager: Any, tmp_path: Path
) -> None:
    job = _job(_put(storage, b"abc" * 1000))
    s = stager(start=False)  # a stager that never gets to it
    staging = s.add(job)
    scratch = _scratch(tmp_path)
    name = s.take(job, staging, scratch)
    assert name is not None and (scratch / name).read_bytes() == b"abc" * 1000
    assert staging is not None and staging.state == "taken"


@sqlite_only
def test_a_corrupt_input_fails_at_take_and_leaves_nothing(
    storage: Storage, stager: Any, tmp_path: Path
) -> None:
    obj = _put(storage, b"good bytes" * 1000)
    blob = next(p for p in tmp_path.rglob("*") if p.is_file() and str(obj["object_id"]) in p.parts)
    blob.write_bytes(b"evil bytes" * 1000)  # same size, other content
    job = _job(obj)
    s = stager()
    staging = s.add(job)
    assert staging is not None and staging.done.wait(10)
    with pytest.raises(JobError) as err:
        s.take(job, staging, _scratch(tmp_path))
    assert err.value.code == "CORRUPT_INPUT"
    assert list((tmp_path / "slot").iterdir()) == []
    assert not [p for p in (tmp_path / "stage").rglob("*") if p.is_file()]


@sqlite_only
def test_a_dropped_input_is_removed(storage: Storage, stager: Any, tmp_path: Path) -> None:
    job = _job(_put(storage, b"z" * 5000))
    s = stager()
    staging = s.add(job)
    assert staging is not None and staging.done.wait(10)
    s.drop(job, staging)
    assert not [p for p in (tmp_path / "stage").rglob("*") if p.is_file()]
    # ...and its place counts again: the next job is fetched.
    nxt = s.add(_job(_put(storage, b"w" * 5000), job_id=2))
    assert nxt is not None and nxt.done.wait(10)


def test_outputs_outside_scratch_are_refused_when_moved(tmp_path: Path) -> None:
    scratch = _scratch(tmp_path)
    (tmp_path / "secret").write_bytes(b"host file")
    with pytest.raises(JobError) as err:
        move_outputs(scratch, [{"path": "../secret"}], tmp_path / "out")
    assert err.value.code == "INVALID_OUTPUT"
    assert (tmp_path / "secret").exists()


def test_only_regular_files_inside_scratch_are_outputs(tmp_path: Path) -> None:
    scratch = _scratch(tmp_path)
    outside = tmp_path / "secret"
    outside.write_bytes(b"host file")
    (scratch / "thumb.webp").write_bytes(b"ok")
    (scratch / "sub").mkdir()
    (scratch / "sub" / "page-1.png").write_bytes(b"ok")
    (scratch / "link.webp").symlink_to(outside)
    (scratch / "dirlink").symlink_to(tmp_path)
    assert inside(scratch, "thumb.webp") == scratch / "thumb.webp"
    assert inside(scratch, "sub/page-1.png") == scratch.resolve() / "sub" / "page-1.png"
    assert inside(scratch, "./thumb.webp") == scratch.resolve() / "thumb.webp"
    for name in ("link.webp", "dirlink/secret", "../secret", "sub", "missing.webp", "", ".",
                 "..", "/etc/passwd", "sub/../../secret"):  # fmt: skip
        with pytest.raises(JobError) as err:
            inside(scratch, name)
        assert err.value.code == "INVALID_OUTPUT", name


class _SlowStorage(Storage):
    """The real ledger, with each output upload held until the test lets it go."""

    gate = threading.Event()

    def add_output(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        assert self.gate.wait(10)
        return super().add_output(*args, **kwargs)


@sqlite_only
def test_outputs_are_stored_after_the_slot_has_moved_on(storage: Storage, tmp_path: Path) -> None:
    slow = _SlowStorage(storage.db, storage.settings)
    slow.gate.clear()
    reported: list[AttemptResult] = []
    storer = Storer(slow, reported.append, threads=1)
    job = _job(_put(storage, b"in" * 100))
    scratch = _scratch(tmp_path)
    (scratch / "thumb.webp").write_bytes(b"RIFF\x00\x00\x00\x00WEBPVP8 thumbnail")
    declared = [{"output_type": "thumbnail", "mime_type": "image/webp", "path": "thumb.webp"}]
    outbox = tmp_path / "out"
    (outbox).mkdir()
    (outbox / "0-1-0-thumb.webp").write_bytes(b"another attempt's, being stored")
    move_outputs(scratch, declared, outbox, prefix="0-2-")
    assert list(scratch.iterdir()) == []  # the next attempt may use scratch at once
    storer.submit(job, AttemptResult(1, 1, "completed", result={}), declared, outbox)
    time.sleep(0.2)
    assert reported == []  # still storing: nothing reported yet
    slow.gate.set()
    storer.close()
    [res] = reported
    assert res.status == "completed"
    [out] = res.outputs
    assert out.object_id is not None and out.output_size_bytes == 25
    with slow.db.read() as tx:  # ready only when the job completes (no object till then)
        assert tx.object(out.object_id)["state"] == "pending"
    # Its file left the shared outbox; another attempt's stays.
    assert [p.name for p in outbox.iterdir()] == ["0-1-0-thumb.webp"]


@sqlite_only
def test_an_input_read_with_the_claim_is_fetched_without_a_lookup(
    storage: Storage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hypermedia.worker.files import fetch_input

    data = b"z" * 70_000
    obj = _put(storage, data)
    job = _job(obj)
    job.input_object = {k: obj[k] for k in ("pool_id", "storage_key", "checksum")}

    def no_lookup(object_id: int) -> dict[str, Any]:
        raise AssertionError("the claim's row should have been used")

    monkeypatch.setattr(storage, "get", no_lookup)
    name = fetch_input(storage, job, _scratch(tmp_path))
    assert name is not None and (tmp_path / "slot" / name).read_bytes() == data
    # The row from the claim still has its bytes checked.
    job.input_object = {**job.input_object, "checksum": "blake3:" + "0" * 64}
    with pytest.raises(JobError) as info:
        fetch_input(storage, job, _scratch(tmp_path, "slot2"))
    assert info.value.code == "CORRUPT_INPUT"
    assert list((tmp_path / "slot2").iterdir()) == []


@sqlite_only
def test_an_input_is_a_hard_link_only_when_asked(storage: Storage, tmp_path: Path) -> None:
    """A link only for a child that Landlock keeps from writing it; otherwise
    a copy, so a write in the child cannot change the stored original."""
    from hypermedia.worker.files import fetch_input

    obj = _put(storage, b"original bytes")
    blob = cast(Any, storage.backend(obj["pool_id"]))._checked(obj["storage_key"])
    linked = fetch_input(storage, _job(obj), _scratch(tmp_path, "a"), link=True)
    copied = fetch_input(storage, _job(obj), _scratch(tmp_path, "b"))
    assert linked is not None and copied is not None
    assert (tmp_path / "a" / linked).stat().st_ino == os.stat(blob).st_ino
    assert (tmp_path / "b" / copied).stat().st_ino != os.stat(blob).st_ino
    (tmp_path / "b" / copied).write_bytes(b"changed by a child")
    with storage.open(obj["object_id"]) as f:
        assert f.read() == b"original bytes"

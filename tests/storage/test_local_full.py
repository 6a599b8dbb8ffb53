"""A local pool on a disk that is full: the write fails as StorageFull (a
StorageUnavailable: jobs retry it), leaves nothing behind, and works again
once there is room (a real small tmpfs)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from hypermedia.storage.base import StorageFull, StorageUnavailable
from hypermedia.storage.local import LocalBackend
from tests.harness import fill_disk, small_tmpfs


def test_a_full_disk_is_storage_full_and_leaves_nothing(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "disk", 16) as disk:
        backend = LocalBackend(disk / "pool")
        backend.put("objects/1/original.bin", io.BytesIO(b"room for this"))
        filler = fill_disk(disk, leave=256 << 10)
        data = os.urandom(1 << 20)
        with pytest.raises(StorageFull, match="No space left") as caught:
            backend.put("objects/2/original.bin", io.BytesIO(data))
        assert isinstance(caught.value, StorageUnavailable)
        left = sorted(
            p.relative_to(disk / "pool") for p in (disk / "pool").rglob("*") if p.is_file()
        )
        assert left == [Path("objects/1/original.bin")]  # no partial blob, no temp file
        filler.unlink()
        stored = backend.put("objects/2/original.bin", io.BytesIO(data))
        assert stored.size == len(data)


def test_a_download_to_a_full_disk_names_the_copy_not_the_store(tmp_path: Path) -> None:
    """A job's output written to a full `--out`: "could not read local storage
    (No space left on device)" sent the reader to a store that was fine."""
    pool = LocalBackend(tmp_path / "pool")
    data = os.urandom(1 << 20)
    stored = pool.put("objects/1/original.bin", io.BytesIO(data))
    with small_tmpfs(tmp_path / "disk", 16) as disk:
        fill_disk(disk, leave=256 << 10)
        dst = disk / "copy.bin"
        with pytest.raises(StorageUnavailable) as caught:
            pool.get_file("objects/1/original.bin", dst, stored.checksum)
        assert str(caught.value) == "could not write the copy (No space left on device)"
        assert not dst.exists()  # nothing unverified left behind


def test_a_copy_refused_its_folder_names_the_copy_not_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`process --out DIR` made unwritable during the run (EACCES, EPERM):
    "could not read local storage (Operation not permitted)" blamed the pool."""
    import errno

    pool = LocalBackend(tmp_path / "pool")
    stored = pool.put("objects/1/original.bin", io.BytesIO(os.urandom(4096)))
    dst = tmp_path / "out" / "copy.bin"
    dst.parent.mkdir()
    real = os.open

    def refused(path, *args, **kw):  # type: ignore[no-untyped-def]
        if str(path) == str(dst):  # as the kernel says it of a folder it refuses
            raise PermissionError(errno.EPERM, "Operation not permitted", str(path))
        return real(path, *args, **kw)

    monkeypatch.setattr(os, "open", refused)
    with pytest.raises(StorageUnavailable) as caught:
        pool.get_file("objects/1/original.bin", dst, stored.checksum)
    assert str(caught.value) == "could not write the copy (Operation not permitted)"
    assert not dst.exists()

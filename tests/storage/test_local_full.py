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

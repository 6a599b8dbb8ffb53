"""Checksums of stored blobs: tagged strings, two algorithms, threaded BLAKE3."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import blake3
import pytest

from hypermedia.storage import checksum as cs


def test_new_blobs_get_blake3_tagged() -> None:
    data = os.urandom(1000)
    assert cs.DEFAULT == "blake3"
    assert cs.of_bytes(data) == "blake3:" + blake3.blake3(data).hexdigest()
    assert cs.of_bytes(data, "sha256") == "sha256:" + hashlib.sha256(data).hexdigest()


def test_split_reads_tagged_and_bare_checksums() -> None:
    assert cs.split("blake3:ab") == ("blake3", "ab")
    assert cs.split("sha256:cd") == ("sha256", "cd")
    assert cs.split("ef" * 32) == ("sha256", "ef" * 32)  # what backends recorded untagged
    for bad in ("md5:00", "BLAKE3:00", ":00", "blake4:" + "0" * 64):
        with pytest.raises(cs.UnknownAlgorithm):
            cs.split(bad)
    with pytest.raises(cs.UnknownAlgorithm):
        cs.new("md5")


@pytest.mark.parametrize(
    "size", [0, 1, cs.READ_CHUNK - 1, cs.READ_CHUNK + 1, 5 * cs.READ_CHUNK + 7]
)
def test_files_hash_the_same_whichever_way(tmp_path: Path, size: int) -> None:
    """Whole or in pieces: the same digest as the library's."""
    data = os.urandom(size)
    path = tmp_path / "blob"
    path.write_bytes(data)
    expected = "blake3:" + blake3.blake3(data).hexdigest()
    assert cs.of_file(path) == (size, expected)
    incremental = cs.new()
    for i in range(0, size, 65536):
        incremental.update(data[i : i + 65536])
    assert cs.tagged("blake3", incremental.hexdigest()) == expected
    assert cs.of_file(path, "sha256") == (size, "sha256:" + hashlib.sha256(data).hexdigest())

"""Blobs as files under one root directory.

A write goes to a temporary file in the root's ``.tmp``, is fsynced, renamed
into place and the directory fsynced: a blob is complete or absent, never
half-written, and it survives a power cut once ``put`` returns.  Keys are
checked and the final path must stay under the root (symlinks included).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import time
import uuid
from pathlib import Path
from typing import BinaryIO

from hypermedia.storage.base import CHUNK, BlobMissing, StorageUnavailable, Stored, UnsafeKey
from hypermedia.storage.keys import check_key


class LocalBackend:
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def _path(self, key: str) -> Path:
        path = self.root / check_key(key)
        # check_key already refuses "..", but a symlink planted inside the root
        # could still lead out: resolve and compare.
        resolved = path.resolve()
        if resolved != path or not resolved.is_relative_to(self.root):
            raise UnsafeKey("unsafe storage key")
        return path

    def put(self, key: str, src: BinaryIO) -> Stored:
        path = self._path(key)
        tmp_dir = self.root / ".tmp"
        try:
            tmp_dir.mkdir(parents=True, exist_ok=True)
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageUnavailable(f"local storage is not writable ({exc.strerror})") from exc
        tmp = tmp_dir / uuid.uuid4().hex
        digest, size = hashlib.sha256(), 0
        try:
            with open(tmp, "xb") as out:
                while chunk := src.read(CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
            _fsync_dir(path.parent)
        except OSError as exc:
            raise StorageUnavailable(f"could not write to local storage ({exc.strerror})") from exc
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        return Stored(size, digest.hexdigest())

    def open(self, key: str) -> BinaryIO:
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError as exc:
            raise BlobMissing("no blob under this key") from exc
        except OSError as exc:
            raise StorageUnavailable(f"could not read local storage ({exc.strerror})") from exc
        return os.fdopen(fd, "rb", buffering=CHUNK)

    def stored_checksum(self, key: str) -> str | None:
        return None  # the ledger's checksum is the only one

    def delete(self, key: str) -> None:
        path = self._path(key)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        # Empty per-object directories go too (objects/{id}/).
        with contextlib.suppress(OSError):
            path.parent.rmdir()

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def presign(self, key: str, expires_seconds: int, filename: str = "") -> str | None:
        return None  # the service signs local downloads (see ledger.signed_url)

    def sweep_incomplete(self, older_than_seconds: float) -> int:
        """Remove temporary files of uploads that died (a killed process leaves them)."""
        removed, cutoff = 0, time.time() - older_than_seconds
        with contextlib.suppress(FileNotFoundError), os.scandir(self.root / ".tmp") as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    if entry.is_file(follow_symlinks=False) and entry.stat().st_mtime < cutoff:
                        os.unlink(entry.path)
                        removed += 1
        return removed

    def size(self, key: str) -> int:
        return self._path(key).stat().st_size


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sign(secret: bytes, object_id: int, expires_at: int) -> str:
    msg = f"{object_id}:{expires_at}".encode()
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()


def verify(secret: bytes, object_id: int, expires_at: int, signature: str) -> bool:
    if expires_at < time.time():
        return False
    return hmac.compare_digest(sign(secret, object_id, expires_at), signature)

"""Blobs as files under one root directory.

A write goes to a temporary file in the root's ``.tmp``, is fsynced, renamed
into place and the directory fsynced: a blob is complete or absent, never
half-written, and it survives a power cut once ``put`` returns.  (A batch,
``put_files``, writes in place and syncs once: there the ledger's pending
state stands for "not complete yet", see there.)  Keys are checked and the
final path must stay under the root (symlinks included).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import io
import os
import stat
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from hypermedia.storage import checksum as cs
from hypermedia.storage.base import (
    CHUNK,
    BlobMissing,
    ChecksumMismatch,
    Listed,
    StorageUnavailable,
    Stored,
    UnsafeKey,
    algorithm_of,
    unavailable,
)
from hypermedia.storage.keys import check_key, probe_key

# A new file, never through a symlink planted where it goes.
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


# Errors only a write gives: a download that meets one failed on its copy's side.
_WRITE_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})


class LocalBackend:
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self._root = str(self.root)
        # key -> the directories whose entries changed when it was written
        # with durable=False: what make_durable must fsync besides the file.
        self._unsynced_dirs: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    def _path(self, key: str) -> Path:
        return Path(self._checked(key))

    def _checked(self, key: str) -> str:
        """The blob's path; UnsafeKey if any part of it under the root is a symlink.

        check_key already refuses "..", absolute keys and odd characters, and
        the root is resolved once: so the path stays under the root unless a
        symlink was planted inside it.  Each existing component below the root
        is lstat-ed (what ``Path.resolve`` would do for the whole path, at a
        fraction of the cost: this runs for every file of a batch).
        """
        parts = check_key(key).split("/")
        path = self._root
        for part in parts:
            path = f"{path}/{part}"
            try:
                mode = os.lstat(path).st_mode
            except OSError:  # missing (or a file where a directory should be):
                return f"{self._root}/{key}"  # nothing exists below it
            if stat.S_ISLNK(mode):
                raise UnsafeKey("unsafe storage key: a symlink is on its path")
        return path

    def put(self, key: str, src: BinaryIO) -> Stored:
        path = self._path(key)
        tmp_dir = self.root / ".tmp"
        try:
            tmp_dir.mkdir(parents=True, exist_ok=True)
            new_dirs = _make_parents(path, self.root)
        except OSError as exc:
            raise unavailable("local storage is not writable", exc) from exc
        tmp = tmp_dir / uuid.uuid4().hex
        digest, size = cs.new(), 0
        try:
            with open(tmp, "xb") as out:
                while chunk := src.read(CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
                out.flush()
                os.fsync(out.fileno())
            new_dirs += _replace(tmp, path, self.root)
            for d in {path.parent, *new_dirs}:
                _fsync_dir(d)
        except OSError as exc:
            raise unavailable("could not write to local storage", exc) from exc
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        return Stored(size, cs.tagged(cs.DEFAULT, digest.hexdigest()))

    def put_file(self, key: str, path: Path, *, durable: bool = True, move: bool = False) -> Stored:
        """Like ``put`` for a file on disk: the kernel copies while a thread hashes.

        Both the in-kernel copy and the hash run without the GIL, so on two
        cores the upload costs about the longer of the two, not their sum.
        A file changed while it is stored gets a checksum that its bytes do
        not match: reads then fail, never return silently different data.
        With ``durable=False`` nothing is fsynced: the caller must call
        ``make_durable`` with the key before anyone may rely on the blob.
        With ``move`` the file is taken, renamed into the pool where it is on
        the same file system (a job's output: no copy, no second inode).
        """
        dst = self._path(key)
        tmp_dir = self.root / ".tmp"
        try:
            tmp_dir.mkdir(parents=True, exist_ok=True)
            new_dirs = _make_parents(dst, self.root)
            tmp = tmp_dir / uuid.uuid4().hex
            try:
                if move:
                    size, digest = _take_hashing(path, tmp, durable=durable)
                else:
                    size, digest = _copy_hashing(path, tmp, durable=durable)
                new_dirs += _replace(tmp, dst, self.root)
                if durable:
                    for d in {dst.parent, *new_dirs}:
                        _fsync_dir(d)
                else:
                    with self._lock:
                        self._unsynced_dirs[key] = {str(dst.parent), *map(str, new_dirs)}
            finally:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()
        except OSError as exc:
            raise unavailable("could not write to local storage", exc) from exc
        return Stored(size, digest)

    def make_durable(self, keys: Iterable[str]) -> None:
        """fsync blobs written with ``durable=False``, then each directory on
        their way up once: a batch of outputs shares the fsyncs of ``objects/``."""
        dirs: set[str] = set()
        try:
            for key in keys:
                dst = self._checked(key)
                _fsync_file(dst)
                with self._lock:
                    changed = self._unsynced_dirs.pop(key, None)
                # Written by another process (or before a failed sync): every
                # directory on the way up, to be sure.
                dirs.update(changed if changed is not None else _parents(dst, self._root))
            for d in sorted(dirs, key=len, reverse=True):  # deepest first
                _fsync_dir(d)
        except OSError as exc:
            raise unavailable("could not sync local storage", exc) from exc

    def put_files(self, items: list[tuple[str, Path]]) -> list[Stored]:
        """Store many files, made durable together by one file-system sync.

        Each file is copied and hashed straight into place under its new key,
        then one ``syncfs`` flushes every file and directory entry.  No
        temporary name and rename here: the ledger marks the objects ready
        only after the sync returns, so a crash (or an error) before it leaves
        pending rows whose blobs, complete or not, only GC ever touches.  (A
        rename would not make a blob complete-or-absent across a crash anyway
        without an fsync of each file, which is what the single sync replaces;
        on ext4, leaving it out made a batch of small files 25-40% faster.)
        """
        out: list[Stored] = []
        try:
            os.makedirs(self._root, exist_ok=True)
            for key, path in items:
                dst = self._checked(key)
                _mkdirs(os.path.dirname(dst), self._root)
                out.append(_copy_into_place(path, dst))
            _syncfs(self.root)
        except OSError as exc:
            raise unavailable("could not write to local storage", exc) from exc
        return out

    def get_file(self, key: str, dst: Path, checksum: str, *, link: bool = False) -> None:
        """Copy a blob to a new file ``dst`` and check it against ``checksum`` (tagged).

        With ``link``, ``dst`` is a hard link to the blob when both are on one
        file system (else a copy): for a worker's job input, which the child
        only reads, half the CPU of a copy.  The caller must never write to it.
        A mismatch raises ChecksumMismatch, a missing blob BlobMissing; either
        way, and on any other failure, ``dst`` is removed: no unverified bytes
        are left behind.
        """
        src = self._checked(key)
        algorithm = algorithm_of(checksum)
        try:
            _, digest = (
                _link_hashing(src, dst, algorithm)
                if link
                else _copy_hashing(src, dst, durable=False, algorithm=algorithm)
            )
        except FileExistsError:
            raise  # the caller's file, left as it was: a caller's error, not the pool's
        except OSError as exc:
            _remove(dst)
            if isinstance(exc, FileNotFoundError) and not os.path.lexists(src):
                raise BlobMissing("no blob under this key") from exc
            # A read fails no such way: the copy's disk.  Nor does the copy's
            # own name come with a read's error (a folder made unwritable
            # meanwhile: "could not read local storage" sent the user to the pool).
            if exc.errno in _WRITE_ERRORS or str(dst) in (exc.filename, exc.filename2):
                raise StorageUnavailable(f"could not write the copy ({exc.strerror})") from exc
            raise StorageUnavailable(f"could not read local storage ({exc.strerror})") from exc
        except BaseException:
            _remove(dst)
            raise
        if digest != checksum:
            _remove(dst)  # never leave unverified bytes behind
            raise ChecksumMismatch("the stored bytes do not match their checksum")

    def open(self, key: str) -> BinaryIO:
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError as exc:
            raise BlobMissing("no blob under this key") from exc
        except OSError as exc:
            raise StorageUnavailable(f"could not read local storage ({exc.strerror})") from exc
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a folder where the file should be
            os.close(fd)
            raise UnsafeKey("unsafe storage key: the blob is not a regular file")
        return os.fdopen(fd, "rb", buffering=CHUNK)

    def open_range(self, key: str, start: int, length: int) -> tuple[BinaryIO, int]:
        src = self.open(key)
        try:
            size = os.fstat(src.fileno()).st_size
            src.seek(start)
        except OSError as exc:
            src.close()
            raise StorageUnavailable(f"could not read local storage ({exc.strerror})") from exc
        return src, size

    def stored_checksum(self, key: str) -> str | None:
        check_key(key)
        return None  # the ledger's checksum is the only one

    def delete(self, key: str) -> None:
        check_key(key)  # a key refused as written ("..") is refused here, whatever follows
        try:
            path = self._path(key)
        except UnsafeKey:
            # A symlink planted as the blob itself goes (unlink never follows
            # one); GC kept its row and failed on it every run.  One on the way
            # to it still refuses: removing through it would reach outside.
            parent = self._path(key.rpartition("/")[0])
            path = parent / key.rpartition("/")[2]
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        # Empty per-object directories go too (objects/{id}/).
        with contextlib.suppress(OSError):
            path.parent.rmdir()

    def delete_prefix(self, prefix: str) -> None:
        # One object's directory: its files go, then the directory.  A symlink
        # inside is unlinked itself, never followed.
        path = self._checked(prefix.rstrip("/"))
        try:
            with os.scandir(path) as entries:
                names = [e.path for e in entries if not e.is_dir(follow_symlinks=False)]
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            raise StorageUnavailable(f"could not list local storage ({exc.strerror})") from exc
        for name in names:
            _remove(name)
        with contextlib.suppress(OSError):
            os.rmdir(path)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list_blobs(self, prefix: str) -> Iterator[Listed]:
        """The files of ``prefix``'s folders, as keys: ``objects/{id}/{name}``
        is two levels down.  Anything else there is listed as what it is (a
        file one level down, a folder two down, a symlinked folder: names
        that are no key), never followed or walked into: a symlink planted in
        the pool's folder leads outside it."""
        base = prefix.rstrip("/")
        try:
            top = os.scandir(self._checked(base))
        except FileNotFoundError:  # nothing stored yet
            return
        except OSError as exc:
            raise unavailable("could not list local storage", exc) from exc
        with top:  # read as it goes: a pool of millions is never held in memory
            for entry in top:
                if not entry.is_dir(follow_symlinks=False):
                    yield from _listed(entry, f"{base}/{entry.name}")
                    continue
                with contextlib.suppress(FileNotFoundError), os.scandir(entry.path) as inner:
                    for blob in inner:
                        key = f"{base}/{entry.name}/{blob.name}"
                        if blob.is_dir(follow_symlinks=False):
                            key += "/"  # a folder where blobs are: no key of ours
                        yield from _listed(blob, key)

    def ping(self) -> None:
        """A look into the pool's folder (/readyz): raises if it cannot be read,
        or written (a read-only mount answered ready while every upload got a
        503).  Before the first upload the folder may not exist yet: the
        nearest folder above it, where it will be made, is asked instead."""
        self.exists("objects/readyz-probe")
        where = self.root
        while not where.exists() and where != where.parent:
            where = where.parent
        if not where.is_dir():  # the pool's folder, or one above it, is a file
            raise StorageUnavailable("local storage is not a folder")
        if not os.access(where, os.W_OK):
            raise StorageUnavailable("local storage cannot be written (a read-only file system?)")

    def check_writable(self) -> None:
        """Store and delete a probe blob: the folder can be made and written
        (the way every upload is: ``.tmp``, fsync, rename)."""
        key = probe_key()
        self.put(key, io.BytesIO(b"probe"))
        try:
            self.delete(key)
        except OSError as exc:
            raise unavailable("could not delete from local storage", exc) from exc

    def presign(
        self, key: str, expires_seconds: int, filename: str = "", mime: str = ""
    ) -> str | None:
        check_key(key)
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
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError as exc:
            raise BlobMissing("no blob under this key") from exc


def _listed(entry: os.DirEntry[str], key: str) -> Iterator[Listed]:
    """``entry`` as listed under ``key`` (nothing if it went meanwhile)."""
    try:
        st = entry.stat(follow_symlinks=False)
    except FileNotFoundError:
        return
    yield Listed(key, 0 if key.endswith("/") else st.st_size, st.st_mtime)


def _parents(path: str, root: str) -> list[str]:
    """The directories from ``path``'s parent up to ``root``, both included."""
    out, d = [], os.path.dirname(path)
    while len(d) >= len(root):
        out.append(d)
        d = os.path.dirname(d)
    return out


def _replace(tmp: Path, dst: Path, root: Path) -> list[Path]:
    """Rename ``tmp`` to ``dst``; the directories made again on the way, if
    any.  An upload GC swept as stale while its bytes were still being written
    had its empty ``objects/{id}/`` removed by the sweep's delete: the rename
    failed, "could not write to local storage (No such file or directory)",
    sending operators to a disk that was fine.  Made again, the blob lands and
    the ledger, finding its row gone, deletes it and says "swept"."""
    try:
        os.replace(tmp, dst)
        return []
    except FileNotFoundError:
        if not tmp.exists():
            raise
    made = _make_parents(dst, root)
    os.replace(tmp, dst)
    return made


def _make_parents(path: Path, root: Path) -> list[Path]:
    """mkdir -p the parent of ``path``; return the directories whose entries changed."""
    missing = []
    d = path.parent
    while d != root and not d.exists():
        missing.append(d)
        d = d.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            d.mkdir()
    # A new directory is durable once its parent's entry for it is synced.
    return [d.parent for d in missing]


def _mkdirs(directory: str, root: str) -> None:
    """mkdir -p ``directory`` (under ``root``), trying the common case first."""
    try:
        os.mkdir(directory)
    except FileExistsError:
        return  # a file there instead makes the create below fail: fine
    except FileNotFoundError:
        parent = os.path.dirname(directory)
        if len(parent) <= len(root):
            raise
        _mkdirs(parent, root)
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory)


def _copy_into_place(src: str | Path, dst: str) -> Stored:
    """Copy and hash ``src`` to ``dst``, replacing a file there (never writing through it)."""
    try:
        return Stored(*_copy_small(src, dst))
    except FileExistsError:
        # Left by an upload that died (GC would remove it): unlink, do not
        # truncate, so a hard link planted there cannot redirect the write.
        os.unlink(dst)
        return Stored(*_copy_small(src, dst))


def _copy_small(src: str | Path, dst: str | Path, algorithm: str = cs.DEFAULT) -> tuple[int, str]:
    """Copy and hash in this thread: for small files a thread costs more than it saves.

    Plain descriptors and one buffer: Python file objects cost more than the
    copy of a 50 kB file.  ``dst`` must not exist; a symlink there is refused.
    """
    digest, size = cs.new(algorithm), 0
    fin = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fout = os.open(dst, _CREATE, 0o666)  # as open(dst, "xb"): the umask decides
        try:
            buf = bytearray(min(os.fstat(fin).st_size + 1, cs.READ_CHUNK))  # see READ_CHUNK
            view = memoryview(buf)
            while n := os.readv(fin, [buf]):
                digest.update(view[:n])
                done = 0
                while done < n:
                    done += os.write(fout, view[done:n])
                size += n
        except BaseException:
            os.close(fout)
            _remove(dst)  # ours, half-written
            raise
        os.close(fout)
    finally:
        os.close(fin)
    return size, cs.tagged(algorithm, digest.hexdigest())


def _remove(path: str | Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _syncfs(root: Path) -> None:
    """Flush the file system holding ``root`` (Linux syncfs), else everything."""
    fd = os.open(root, os.O_RDONLY)
    try:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            if libc.syncfs(fd) == 0:
                return
        except (OSError, AttributeError):
            pass
        os.sync()
    finally:
        os.close(fd)


def _copy_hashing(
    src: str | Path, dst: str | Path, *, durable: bool = True, algorithm: str = cs.DEFAULT
) -> tuple[int, str]:
    """Copy ``src`` to a new file ``dst`` in the kernel while hashing ``src`` in a thread."""
    if os.stat(src).st_size <= 4 * CHUNK:
        size, digest = _copy_small(src, dst, algorithm)
        if durable:
            _fsync_file(dst)
        return size, digest
    result: dict[str, str] = {}

    def hash_source() -> None:
        result["checksum"] = cs.of_file(src, algorithm)[1]

    hasher = threading.Thread(target=hash_source, name="hash", daemon=True)
    fin = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fout = os.open(dst, _CREATE, 0o666)  # as open(dst, "xb"): the umask decides
        try:
            size = os.fstat(fin).st_size
            hasher.start()
            try:
                _kernel_copy(fin, fout, size)
                if durable:
                    os.fsync(fout)
            finally:
                hasher.join()
        finally:
            os.close(fout)
    finally:
        os.close(fin)
    if "checksum" not in result:
        raise OSError(5, "the source could not be read")
    return size, result["checksum"]


def _take_hashing(src: str | Path, dst: str | Path, *, durable: bool) -> tuple[int, str]:
    """Rename ``src`` to the new file ``dst`` and hash it; copy where it cannot be renamed."""
    try:
        os.rename(src, dst)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        return _copy_hashing(src, dst, durable=durable)
    if not stat.S_ISREG(os.lstat(dst).st_mode):  # swapped for a link since it was checked
        _remove(dst)
        raise OSError(errno.EINVAL, "an output is not a regular file")
    size, digest = cs.of_file(dst)
    if durable:
        _fsync_file(dst)
    return size, digest


def _link_hashing(src: str | Path, dst: str | Path, algorithm: str) -> tuple[int, str]:
    """Hard-link ``src`` at ``dst`` and hash it, or copy it where links cannot go."""
    try:
        os.link(src, dst)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
        return _copy_hashing(src, dst, durable=False, algorithm=algorithm)
    try:
        return cs.of_file(dst, algorithm)
    except BaseException:
        _remove(dst)
        raise


def _kernel_copy(fin: int, fout: int, size: int) -> None:
    sent = 0
    while sent < size:
        try:
            n = os.copy_file_range(fin, fout, min(size - sent, 1 << 30))
        except OSError:  # not supported between these file systems
            n = os.sendfile(fout, fin, None, min(size - sent, 1 << 30))
        if n == 0:
            break
        sent += n
    if sent != size:
        raise OSError(5, "the source changed size while it was copied")


def _fsync_file(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sign(secret: bytes, object_id: int, expires_at: int) -> str:
    msg = f"{object_id}:{expires_at}".encode()
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()


def verify(
    secret: bytes, object_id: int, expires_at: int, signature: str, *, now: float | None = None
) -> bool:
    if expires_at < (time.time() if now is None else now):
        return False
    # As bytes: compare_digest refuses str with non-ASCII characters.
    return hmac.compare_digest(sign(secret, object_id, expires_at).encode(), signature.encode())

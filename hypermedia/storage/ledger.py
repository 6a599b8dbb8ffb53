"""The objects ledger: every blob has a row, and the row governs the blob.

An upload inserts a ``pending`` row, streams the bytes to the pool under the
row's opaque key (hashing on the way), and only then turns the row ``ready``.
A crash in between leaves a ``pending`` row for GC to sweep, never a ``ready``
row without its blob.  Reads verify the checksum where the bytes pass through
us; a mismatch is an error, never silent data.
"""

from __future__ import annotations

import calendar
import contextlib
import io
import os
import secrets
import signal
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO, NoReturn, cast
from urllib.parse import quote

from hypermedia.config import DEFAULT_PROJECT, HOME_MODE, MIN_SECRET_KEY, Settings
from hypermedia.db.driver import Driver
from hypermedia.db.schema_storage import OBJECT_STATES
from hypermedia.errors import Conflict, HypermediaError, InvalidRequest, NotFound, Refused
from hypermedia.queue.clock import utcnow
from hypermedia.queue.models import check_project_id
from hypermedia.redact import brief
from hypermedia.storage import local, sniff
from hypermedia.storage.backends import CredentialsRefused, open_backend, parse_pool_url
from hypermedia.storage.base import (
    Backend,
    ChecksumMismatch,
    ExactReader,
    SourceChanged,
    StorageError,
    StorageUnavailable,
    Stored,
    VerifyingReader,
    algorithm_of,
)
from hypermedia.storage.keys import display_name, object_key
from hypermedia.storage.reserve import Reservations

Row = dict[str, Any]
DEFAULT_POOL = "local"


# Ready objects whose blobs `pools set-url` looks for at the new URL.
SET_URL_SAMPLE = 3


# How soon a running process sees a pool's new URL (`pools set-url`): one
# read of the pool's row per pool and process this often.
POOL_RECHECK_SECONDS = 30.0


class Storage:
    def __init__(
        self, db: Driver, settings: Settings, *, clock: Callable[[], datetime] = utcnow
    ) -> None:
        self.db = db
        self.settings = settings
        self.clock = clock  # an engine's (queue/clock.py): the GC compares ages across machines
        self._backends: dict[int, Backend] = {}
        self._opened: dict[int, tuple[str, float]] = {}  # pool id -> (its URL, when read)
        self._secret: bytes | None = None
        # (pool, key) of output blobs written without fsync: see make_durable.
        self._unsynced: list[tuple[int, str]] = []
        self._unsynced_lock = threading.Lock()
        self.reservations = Reservations(db, clock=clock)

    # -- pools ---------------------------------------------------------------

    def add_pool(
        self, name: str, url: str, project_id: str | None = None, *, check: bool = True
    ) -> Row:
        """Store a pool.  With ``check`` its store is tried first (``check_pool``):
        a pool that cannot take a write is refused, not found out by a job."""
        parse_pool_url(url)  # refuse a bad URL before storing it
        if not name or len(name) > 64 or not name.isprintable():
            raise InvalidRequest("a pool name has 1 to 64 printable characters")
        if project_id is not None:
            check_project_id(project_id)
        if check:
            with self.db.read() as tx:  # a taken name needs no probe to be refused
                if tx.pool(name=name) is not None:
                    raise Conflict("a pool with this name exists")
            self.check_pool(url)
        with self.db.tx() as tx:
            pool_id = tx.insert_pool(
                {
                    "name": name,
                    "backend_url": url,
                    "project_id": project_id,
                    "created_at": self.clock(),
                }
            )
            return dict(tx.pool(pool_id=pool_id) or {})

    def check_pool(self, url: str) -> None:
        """Raise StorageError unless the store behind ``url`` answers and takes
        a write and a delete of a probe blob (its message names no secret)."""
        backend = open_backend(url, self.settings, strict=True)
        try:
            backend.check_writable()
        finally:
            _close(backend)

    def set_pool_url(self, name: str, url: str, *, check: bool = True) -> Row:
        """Point a pool at another URL (a store that moved, a URL stored before
        a check it fails), checked as ``add_pool`` checks one.  Its objects stay
        as they are: their blobs must be at the new place under the same keys.
        Other processes see the new URL within POOL_RECHECK_SECONDS."""
        parse_pool_url(url)
        if name == DEFAULT_POOL:
            raise Refused(f"{DEFAULT_POOL!r} is HYPERMEDIA_HOME/storage: it has no URL to set")
        with self.db.read() as tx:  # a missing pool needs no probe to be refused
            found = tx.pool(name=name)
            if found is None:
                raise NotFound(f"no pool named {name!r}")
            # Its oldest blobs: a typo naming another writable bucket passed
            # the probe, and every object of the pool then failed to read.
            sample = tx.ready_objects_after(0, SET_URL_SAMPLE, found["pool_id"])
        if check:
            self.check_pool(url)
            self._holds(found["pool_id"], url, sample)
        with self.db.tx() as tx:
            row = tx.pool(name=name, lock=True)
            if row is None:  # removed meanwhile
                raise NotFound(f"no pool named {name!r}")
            tx.set_pool_url(row["pool_id"], url)
            row = dict(tx.pool(pool_id=row["pool_id"]) or {})
        _close(self._backends.pop(row["pool_id"], None))
        return row

    def _holds(self, pool_id: int, url: str, sample: list[Row]) -> None:
        """Refuse a new URL whose store lacks any of ``sample``'s blobs, but
        for blobs the current URL lacks as well (lost already: one such made
        the same store look like another, and only --no-check, which skips
        the write probe too, got past it), as long as one blob is found."""
        backend = open_backend(url, self.settings, strict=True)
        try:
            missing = [r for r in sample if not backend.exists(r["storage_key"])]
        finally:
            _close(backend)
        unexcused = [r for r in missing if not self._lost_already(pool_id, r["storage_key"])]
        if unexcused or (sample and len(missing) == len(sample)):
            first = (unexcused or missing)[0]
            raise Refused(
                f"the store at the new URL lacks object {first['object_id']}'s blob "
                f"({len(sample)} checked): is it the same store? "
                "(--no-check sets the URL anyway)"
            )

    def _lost_already(self, pool_id: int, key: str) -> bool:
        """Whether the pool's current URL answers that it lacks ``key`` too
        (False when it cannot be asked: nothing is known then)."""
        try:
            return not self.backend(pool_id).exists(key)
        except (StorageError, OSError):
            return False

    def remove_pool(self, name: str) -> None:
        """Delete a pool's row; refused while anything still refers to it.

        The pool row is locked first: an object being stored into the pool
        meanwhile (its foreign key locks the row too) either commits before
        the count, which then sees it, or waits and then fails on the key.
        Rows workers reserved for outputs (storage/reserve.py) are no use of
        the pool: they go with it (``Tx.pool_users``)."""
        if name == DEFAULT_POOL:
            raise Refused(f"{DEFAULT_POOL!r} is the default pool: it cannot be removed")
        with self.db.tx() as tx:
            row = tx.pool(name=name, lock=True)
            if row is None:
                raise NotFound(f"no pool named {name!r}")
            objects, jobs = tx.pool_users(row["pool_id"])
            if objects or jobs:
                raise Refused(f"pool {name!r} is in use: {_users(objects, jobs)}")
            tx.delete_reservations(row["pool_id"])
            tx.delete_pool(row["pool_id"])
        _close(self._backends.pop(row["pool_id"], None))

    def pool(self, name: str | None = None) -> Row:
        """The named pool, or the default one: HYPERMEDIA_DEFAULT_POOL, by
        default ``local`` (HOME/storage, created on first use)."""
        named = bool(name)
        name = name or self.settings.default_pool
        with self.db.read() as tx:
            row = tx.pool(name=name)
        if row is not None:
            return row
        if name != DEFAULT_POOL:
            if not named:
                # The service's setting, not the request, is wrong: no 404 or
                # exit 2 for the caller, and the way out for the operator.
                raise StorageUnavailable(
                    f"the default pool {name!r} (HYPERMEDIA_DEFAULT_POOL) does not exist:"
                    " add it with `hypermedia pools add`"
                )
            raise NotFound(f"no pool named {name!r}")
        try:
            # Unchecked: HOME/storage is made by the first upload, as always.
            return self.add_pool(DEFAULT_POOL, "file:", check=False)
        except StorageError:
            raise
        except Exception:  # a concurrent first use created it
            with self.db.read() as tx:
                row = tx.pool(name=name)
            if row is None:
                raise
            return row

    def pool_for(self, name: str | None, project_id: str) -> Row:
        """The named (or default) pool, if ``project_id`` may store in it: a
        pool with an owner project holds that project's objects only."""
        check_project_id(project_id)  # every upload asks: one rule, as for jobs
        row = self.pool(name)
        if row["project_id"] is not None and row["project_id"] != project_id:
            raise InvalidRequest(f"pool {row['name']!r} belongs to another project")
        return row

    def pools(self) -> list[Row]:
        with self.db.read() as tx:
            return tx.pools()

    def backend(self, pool_id: int) -> Backend:
        """The pool's backend, opened once; its URL is read again every
        POOL_RECHECK_SECONDS, so that `pools set-url` reaches every process."""
        backend = self._backends.get(pool_id)
        opened = self._opened.get(pool_id)
        if backend is not None and opened and time.monotonic() - opened[1] < POOL_RECHECK_SECONDS:
            return backend
        try:
            with self.db.read() as tx:
                row = tx.pool(pool_id=pool_id)
        except Exception:
            if backend is None or opened is None:
                raise
            # The database is away: the store is not, and what it opened still
            # works (an output stored now is recorded once the database is back).
            self._opened[pool_id] = (opened[0], time.monotonic())
            return backend
        if row is None:
            raise NotFound(f"no pool {pool_id}")
        url = row["backend_url"]
        if backend is None or opened is None or opened[0] != url:
            # The old backend is not closed: another thread may be reading through it.
            backend = self._backends[pool_id] = self._open(row)
        self._opened[pool_id] = (url, time.monotonic())
        return backend

    def _open(self, row: Row) -> Backend:
        try:
            return open_backend(row["backend_url"], self.settings)
        except StorageError:
            raise
        except Exception as exc:
            # A value botocore only refuses when the client is made, the
            # credential settings: a storage failure of this pool (GC goes
            # on with the others, /readyz says 503), not a 500.
            if isinstance(exc, CredentialsRefused):
                fix = "fix the settings"
            elif row["name"] == DEFAULT_POOL:
                fix = "check HYPERMEDIA_HOME"
            else:
                fix = "fix its URL with `hypermedia pools set-url`"
            raise StorageUnavailable(
                f"pool {row['name']!r} cannot be opened ({brief(exc)}): {fix}"
            ) from None

    # -- writing -------------------------------------------------------------

    def put(
        self,
        src: BinaryIO,
        *,
        pool: str | None = None,
        filename: str = "",
        mime: str | None = None,
        project_id: str = DEFAULT_PROJECT,
        role: str = "original",
    ) -> Row:
        """Store a stream as a new ``ready`` object and return its row."""
        head = _read_head(src)
        mime = mime or sniff.media_type(head)
        width, height = sniff.dimensions(head, mime)
        pool_row = self.pool_for(pool, project_id)
        name = display_name(filename)
        obj = self._pending(pool_row["pool_id"], role, mime, project_id, name, width, height)
        stored = self._upload(obj, cast(BinaryIO, _Chain(head, src)))
        now = self.clock()
        values = {**_stored_values(stored), "state": "ready", "updated_at": now}
        return self._promote(obj, values)

    def put_file(
        self,
        path: Path,
        *,
        pool: str | None = None,
        filename: str | None = None,
        mime: str | None = None,
        project_id: str = DEFAULT_PROJECT,
        role: str = "original",
        ticket: Ticket | None = None,
    ) -> Row:
        """Store a file as a new ``ready`` object (backends may copy it in the
        kernel).  With a ``ticket``, another thread may call it off."""
        _regular(path)
        before = _version(path)  # before its head is read for the type: all of it covered
        pool_row = self.pool_for(pool, project_id)
        # A given name may be a browser's (a Windows path); the file's own is local.
        name = display_name(path.name, local=True) if filename is None else display_name(filename)
        # Named from the start: a row an upload left pending or deleting
        # (killed, refused) said which file it was only once it was ready.
        obj = self._pending_for_file(pool_row["pool_id"], path, role, mime, project_id, name)
        if ticket is not None and not ticket.taken(obj["object_id"]):
            self._abandon(obj["object_id"])
            raise CalledOff("the upload was called off")
        stored = self._upload_file(obj, path)
        if ticket is not None and ticket.called_off:  # its row is GC's already
            self._swept(
                [(obj["pool_id"], obj["storage_key"])], CalledOff("the upload was called off")
            )
        self._unchanged({obj["object_id"]: (path, before, stored)})
        values = {
            **_stored_values(stored),
            "filename": name,
            "state": "ready",
            "updated_at": self.clock(),
        }
        return self._promote(obj, values)

    def put_files(
        self, paths: list[Path], *, pool: str | None = None, project_id: str = DEFAULT_PROJECT
    ) -> list[Row]:
        """Store many files at once: one transaction to register them, one to make
        them ready, and (on local pools) one file-system sync for all the bytes."""
        for p in paths:
            _regular(p)
        before = [_version(p) for p in paths]
        pool_row = self.pool_for(pool, project_id)
        backend = self.backend(pool_row["pool_id"])
        heads = []
        for p in paths:
            with open(p, "rb") as f:
                head = _read_head(f)
            mime = sniff.media_type(head)
            heads.append((p, mime, *sniff.dimensions(head, mime)))
        now = self.clock()
        with self.db.tx() as tx:
            placeholders = [f"pending/{uuid.uuid4().hex}" for _ in paths]
            ids = tx.insert_objects(
                [
                    {
                        "pool_id": pool_row["pool_id"],
                        "storage_key": key,
                        "project_id": project_id,
                        "filename": display_name(p.name, local=True),
                        "mime_type": mime,
                        "width": w,
                        "height": h,
                        "state": "pending",
                        "created_at": now,
                        "updated_at": now,
                    }
                    for key, (p, mime, w, h) in zip(placeholders, heads, strict=True)
                ]
            )
            keys = [
                object_key(ids[ph], "original", mime)
                for ph, (_, mime, _, _) in zip(placeholders, heads, strict=True)
            ]
            tx.update_objects_many(
                "pending",
                [
                    {"_id": ids[ph], "storage_key": k}
                    for ph, k in zip(placeholders, keys, strict=True)
                ],
            )
        object_ids = [ids[ph] for ph in placeholders]
        try:
            put_files = getattr(backend, "put_files", None)
            if put_files is not None:
                stored = put_files(list(zip(keys, paths, strict=True)))
            else:
                stored = [self._put_path(backend, k, p) for k, p in zip(keys, paths, strict=True)]
            self._unchanged(
                {
                    i: (p, b, st)
                    for i, p, b, st in zip(object_ids, paths, before, stored, strict=True)
                },
                all_of=object_ids,
            )
            done = self.clock()
            with self.db.tx() as tx:
                tx.update_objects_many(
                    "pending",
                    [
                        {"_id": i, **_stored_values(st), "state": "ready", "updated_at": done}
                        for i, st in zip(object_ids, stored, strict=True)
                    ],
                )
                rows = {r["object_id"]: r for r in tx.objects_where(object_ids)}
        except BaseException as exc:  # Ctrl-C too: nothing else would hand these to GC
            self._abandon(*object_ids)  # (those made ready already stay: GC's in its time)
            _blame_source(exc, paths)
            raise
        gone = [i for i in object_ids if rows.get(i, {}).get("state") != "ready"]
        if gone:  # the ready ones are unreferenced: GC takes them in its time
            by_id = dict(zip(object_ids, keys, strict=True))
            self._swept([(pool_row["pool_id"], by_id[i]) for i in gone])
        return [rows[i] for i in object_ids]

    @staticmethod
    def _put_path(
        backend: Backend, key: str, path: Path, durable: bool = True, move: bool = False
    ) -> Stored:
        put_file = getattr(backend, "put_file", None)
        if put_file is not None and hasattr(backend, "make_durable"):  # local
            return cast(Stored, put_file(key, path, durable=durable, move=move))
        if put_file is not None:
            return cast(Stored, put_file(key, path))
        with open(path, "rb") as f:
            return backend.put(key, f)

    def add_output(
        self,
        pool_id: int,
        role: str,
        path: Path,
        mime: str,
        project_id: str,
        *,
        durable: bool = True,
        move: bool = False,
    ) -> Row:
        """A job's output: uploaded now, left ``pending`` until the job completes.

        Its row is a reserved one (storage/reserve.py): the key, media type,
        dimensions, size and checksum are returned, not written; the
        completing transaction writes them as it makes the object ready
        (``Tx.promote_objects``).  With ``durable=False`` a local blob is not
        fsynced yet: ``make_durable`` must run before that transaction (the
        worker's flusher does, once per batch of results).  With ``move`` a
        local pool takes the file itself where it can (``LocalBackend.put_file``).
        """
        with open(path, "rb") as f:
            head = _read_head(f)
        mime = mime or sniff.media_type(head)
        width, height = sniff.dimensions(head, mime)
        object_id = self.reservations.take(pool_id, project_id)
        key = object_key(object_id, role, mime)
        try:
            backend = self.backend(pool_id)
        except NotFound:  # `pools rm` took it, and our reservations with it
            raise StorageUnavailable(
                f"pool {pool_id} was removed: the output is not stored"
            ) from None
        try:
            stored = self._put_path(backend, key, path, durable, move)
        except BaseException:
            self._abandon(object_id)
            raise
        if not durable and hasattr(backend, "make_durable"):
            with self._unsynced_lock:
                self._unsynced.append((pool_id, key))
        return {
            "object_id": object_id,
            "pool_id": pool_id,
            "project_id": project_id,
            "storage_key": key,
            "mime_type": mime,
            "width": width,
            "height": height,
            "state": "pending",
            **_stored_values(stored),
        }

    def make_durable(self) -> None:
        """fsync every blob ``add_output(durable=False)`` wrote so far (StorageUnavailable
        if that fails: they are kept for the next call)."""
        with self._unsynced_lock:
            batch, self._unsynced = self._unsynced, []
        try:
            by_pool: dict[int, list[str]] = {}
            for pool_id, key in batch:
                by_pool.setdefault(pool_id, []).append(key)
            for pool_id, keys in by_pool.items():
                self.backend(pool_id).make_durable(keys)  # type: ignore[attr-defined]
        except Exception:
            with self._unsynced_lock:
                self._unsynced = batch + self._unsynced
            raise

    def _pending_for_file(
        self, pool_id: int, path: Path, role: str, mime: str | None, project_id: str, name: str
    ) -> Row:
        with open(path, "rb") as f:
            head = _read_head(f)
        mime = mime or sniff.media_type(head)
        width, height = sniff.dimensions(head, mime)
        return self._pending(pool_id, role, mime, project_id, name, width, height)

    def _upload_file(self, obj: Row, path: Path) -> Stored:
        try:
            return self._put_path(self.backend(obj["pool_id"]), obj["storage_key"], path)
        except BaseException as exc:  # Ctrl-C too
            self._abandon(obj["object_id"])
            _blame_source(exc, [path])
            raise

    def _pending(
        self,
        pool_id: int,
        role: str,
        mime: str,
        project_id: str,
        filename: str,  # shown as it is: display_name made it
        width: int,
        height: int,
    ) -> Row:
        now = self.clock()
        with self.db.tx() as tx:
            object_id = tx.insert_object(
                {
                    "pool_id": pool_id,
                    # The real key needs the id; a unique placeholder until then.
                    "storage_key": f"pending/{uuid.uuid4().hex}",
                    "project_id": project_id,
                    "filename": filename,
                    "mime_type": mime,
                    "width": width,
                    "height": height,
                    "state": "pending",
                    "created_at": now,
                    "updated_at": now,
                }
            )
            key = object_key(object_id, role, mime)
            tx.update_object(object_id, ["pending"], {"storage_key": key})
            return dict(tx.object(object_id) or {})

    def _upload(self, obj: Row, src: BinaryIO) -> Stored:
        try:
            return self.backend(obj["pool_id"]).put(obj["storage_key"], src)
        except BaseException:  # Ctrl-C too
            # Hand the row to GC at once rather than after the pending timeout.
            self._abandon(obj["object_id"])
            raise

    def _promote(self, obj: Row, values: Row) -> Row:
        """The pending row made ready with ``values``, or the upload refused
        as swept (its row gone meanwhile)."""
        with self.db.tx() as tx:
            promoted = tx.update_object(obj["object_id"], ["pending"], values)
            row = tx.object(obj["object_id"]) if promoted else None
        if row is None:
            self._swept([(obj["pool_id"], obj["storage_key"])])
        return dict(row)

    def _swept(self, blobs: list[tuple[int, str]], why: Exception | None = None) -> NoReturn:
        """GC swept these uploads' rows as stale pending while their bytes were
        still on their way (or they were called off): the blobs, written
        since, belong to no row, and GC (which works from rows) would never
        find them."""
        for pool_id, key in blobs:
            with contextlib.suppress(Exception):
                self.backend(pool_id).delete(key)
        raise why or StorageUnavailable("the upload took too long and was swept; try again")

    def call_off(self, ticket: Ticket) -> None:
        """Keep nothing of the upload ``ticket`` stands for, from now on: its
        row goes to GC at once, while its bytes may still be on their way
        (they are deleted once there).  The API's, when the server's stop
        cuts a request short: its client is told "not kept, send again"."""
        object_id = ticket.call_off()
        if object_id is not None:
            self._abandon(object_id)
            # Made ready in the moment before (its request cut between the
            # commit and its answer): not kept either, as the client is told.
            self.discard([object_id])

    def discard(self, object_ids: list[int]) -> int:
        """Hand uploads nothing came to use to GC at once (``process`` whose
        jobs were refused), rather than after ``gc_unreferenced_seconds``.

        As GC marks: each row locked (a binding locks it too), references
        checked again under the lock, the referenced ones kept.
        """
        with self.db.tx() as tx:
            for object_id in object_ids:
                tx.object(object_id, lock=True)
            keep = tx.referenced(object_ids)
            chosen = [i for i in object_ids if i not in keep]
            return int(tx.mark_deleting(chosen, "ready", self.clock()))

    def _unchanged(
        self,
        uploads: dict[int, tuple[Path, tuple[int, int], Stored]],
        all_of: list[int] | None = None,
    ) -> None:
        """Refuse uploads whose file changed while it was read (its size or
        modification time then differs): their checksum is of bytes no longer
        in the file, or of none that were ever in it at once, and the object
        was `ready` yet failed every read.  Refused, they all go to GC."""
        changed = [
            path.name
            for path, before, stored in uploads.values()
            if _version(path, before) != before or stored.size != before[0]
        ]
        if changed:
            self._abandon(*(all_of or list(uploads)))
            raise Conflict(
                f"{display_name(changed[0])} changed while it was stored: nothing was kept; "
                "store it again once nothing writes to it"
            )

    def _abandon(self, *object_ids: int) -> None:
        """Hand pending uploads to GC at once, in one transaction, with Ctrl-C
        held off meanwhile: one transaction each, a second press (a quick
        double one) broke the loop and left most of them pending for hours."""
        with _signals_held():
            try:
                with self.db.tx() as tx:
                    tx.update_objects_many(
                        "pending", [{"_id": i, "state": "deleting"} for i in object_ids]
                    )
            except Exception:  # the database is away too: GC sweeps them as stale pending
                pass

    # -- reading -------------------------------------------------------------

    def get(self, object_id: int) -> Row:
        """A ``ready`` object: what is still on its way (an upload, an output, a
        reservation) or GC's to delete is no object to show, as in listings."""
        with self.db.read() as tx:
            row = tx.shown_object(object_id)
        if row is None:
            raise NotFound(f"object {object_id} not found")
        return row

    def ready_ids(self, object_ids: list[int]) -> set[int]:
        """Which of ``object_ids`` are ``ready``: one query for a page of them."""
        if not object_ids:
            return set()
        with self.db.read() as tx:
            return {r["object_id"] for r in tx.objects_where(object_ids) if r["state"] == "ready"}

    def list(self, **filters: Any) -> list[Row]:
        state = filters.get("state")
        if state is not None and state not in OBJECT_STATES:
            raise InvalidRequest(f"state must be one of {', '.join(OBJECT_STATES)}")
        with self.db.read() as tx:
            return tx.objects(**filters)

    @contextmanager
    def open(self, object_id: int) -> Iterator[BinaryIO]:
        """Stream a ready object's bytes; raises ChecksumMismatch at the end if they differ."""
        row = self.get(object_id)
        if row["state"] != "ready":
            raise InvalidRequest(f"object {object_id} is {row['state']}, not ready")
        with self.open_row(row) as f:
            yield f

    @contextmanager
    def open_row(self, row: Row) -> Iterator[BinaryIO]:
        algorithm_of(row["checksum"])  # refused before anything is opened
        raw = self.backend(row["pool_id"]).open(row["storage_key"])
        reader = VerifyingReader(raw, row["checksum"], row["size"])
        try:
            yield reader  # type: ignore[misc]
        finally:
            reader.close()

    @contextmanager
    def open_part(self, row: Row, start: int, length: int) -> Iterator[BinaryIO]:
        """``length`` bytes of a ready object from ``start`` (a ranged download).

        A part cannot be checked against the whole object's checksum; its
        blob's size is, so one cut or grown behind the ledger's back is
        ChecksumMismatch before anything is read."""
        if row["state"] != "ready":
            raise InvalidRequest(f"object {row['object_id']} is {row['state']}, not ready")
        raw, size = self.backend(row["pool_id"]).open_range(row["storage_key"], start, length)
        reader = ExactReader(raw, length)
        try:
            if size != row["size"]:
                raise ChecksumMismatch("the stored bytes are not of their recorded size")
            yield reader  # type: ignore[misc]
        finally:
            reader.close()

    def download(self, row: Row, dst: Path, *, link: bool = False) -> None:
        """Copy an object to a new local file, verified.  ``link``: a job input,
        which nobody writes to; a local pool may hard-link it instead of copying."""
        backend = self.backend(row["pool_id"])
        get_file = getattr(backend, "get_file", None)
        if get_file is not None:
            get_file(row["storage_key"], dst, row["checksum"], link=link)
            return
        with self.open_row(row) as src, open(dst, "xb") as out:
            while chunk := src.read(1024 * 1024):
                out.write(chunk)

    def signed_url(self, object_id: int, base_url: str = "") -> str:
        """A download URL that expires: presigned on S3 (unless
        HYPERMEDIA_S3_PRESIGN is false), HMAC-signed by the service otherwise:
        its /content route checks the bytes against the checksum as they go."""
        row = self.get(object_id)
        if row["state"] != "ready":
            raise InvalidRequest(f"object {object_id} is {row['state']}, not ready")
        ttl = self.settings.signed_url_seconds
        if self.settings.s3_presign:
            url = self.backend(row["pool_id"]).presign(
                row["storage_key"], ttl, row["filename"], row["mime_type"] or ""
            )
            if url:
                return url
        expires = self.epoch() + ttl
        sig = local.sign(self.secret(), object_id, expires)
        return f"{base_url}/v1/objects/{object_id}/content?expires={expires}&sig={quote(sig)}"

    def reachable(self) -> bool:
        """Whether every pool's backend answers, and the default pool exists
        (for /readyz: a node whose HYPERMEDIA_DEFAULT_POOL names no pool
        refuses every upload, so it is not ready for them)."""
        try:
            rows = self.pools()
            wanted = self.settings.default_pool
            if wanted != DEFAULT_POOL and wanted not in {r["name"] for r in rows}:
                return False
            for row in rows:
                self.backend(row["pool_id"]).ping()
        except (HypermediaError, OSError):
            return False
        return True

    def check_signature(self, object_id: int, expires: int, sig: str) -> bool:
        now = self.epoch()
        if local.verify(self.secret(), object_id, expires, sig, now=now):
            return True
        previous = self.settings.previous_secret_key  # during a rotation
        return bool(previous) and local.verify(previous.encode(), object_id, expires, sig, now=now)

    def epoch(self) -> int:
        """Now in POSIX seconds, by the storage clock: a URL one API node signs
        expires when the others, on the same database's time, say it does."""
        return calendar.timegm(self.clock().timetuple())

    def secret(self) -> bytes:
        """The URL-signing key: HYPERMEDIA_SECRET_KEY, or one made once in HOME/secret.key."""
        if self._secret is None:
            if self.settings.secret_key:
                self._secret = self.settings.secret_key.encode()
            else:
                self._secret = _home_secret(self.settings.home)
        return self._secret


class CalledOff(HypermediaError):
    """An upload called off by another thread (``Storage.call_off``)."""


class Ticket:
    """An upload another thread may call off, and the object it made so far."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._object_id: int | None = None
        self.called_off = False

    def taken(self, object_id: int) -> bool:
        """The upload's pending row is ``object_id``; False if called off already."""
        with self._lock:
            self._object_id = object_id
            return not self.called_off

    def call_off(self) -> int | None:
        """Called off; the pending row made so far, if any."""
        with self._lock:
            self.called_off = True
            return self._object_id


def _home_secret(home: Path) -> bytes:
    # Written aside, then linked into place: two processes starting at once
    # agree on one key, and nobody ever reads a half-written file.
    path = home / "secret.key"
    if not path.exists():
        home.mkdir(mode=HOME_MODE, parents=True, exist_ok=True)
        tmp = home / f".secret.{uuid.uuid4().hex}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with open(fd, "wb") as f:
            f.write(secrets.token_hex(32).encode())
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    key = path.read_bytes().strip()
    if len(key) < MIN_SECRET_KEY:  # emptied, or written by hand
        raise InvalidRequest(
            f"{path} holds no usable URL-signing key (under {MIN_SECRET_KEY} characters): "
            "delete it to have a new one made, or set HYPERMEDIA_SECRET_KEY"
        )
    return key


def _users(objects: dict[str, int], jobs: int) -> str:
    """What holds a pool, said so that its owner knows what to wait for."""
    said = []
    if objects:
        states = ", ".join(f"{n} {state}" for state, n in sorted(objects.items()))
        said.append(f"{sum(objects.values())} object(s) ({states}) until GC collects them")
    if jobs:
        said.append(f"{jobs} unfinished job(s)")
    return "; ".join(said)


def _stored_values(stored: Stored) -> Row:
    return {"size": stored.size, "checksum": stored.checksum}


def _close(backend: object) -> None:
    """Close a backend that holds a client of its own (S3: its sockets go with it)."""
    close = getattr(backend, "close", None)
    if close is not None:
        close()


@contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM ignored for the block, in the main thread (only it
    may set handlers; a signal is delivered there alone)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in kept:
        signal.signal(sig, signal.SIG_IGN)
    try:
        yield
    finally:
        for sig, handler in kept.items():  # None: not set from Python, the default
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def _blame_source(exc: BaseException, paths: list[Path]) -> None:
    """A failed upload whose input file went away or became unreadable meanwhile
    is that file's fault, not the store's: "could not write to local storage
    (No such file or directory)" sent operators to a disk that was fine."""
    if not isinstance(exc, StorageError):
        return
    if isinstance(exc, SourceChanged):
        name = Path(exc.path).name if exc.path is not None else paths[0].name
        raise Conflict(
            f"{display_name(name)} changed while it was stored: nothing was kept; "
            "store it again once nothing writes to it"
        ) from None
    for path in paths:
        try:
            with open(path, "rb"):
                pass
        except OSError as err:
            raise Conflict(
                f"{display_name(path.name)} could not be read while it was stored "
                f"({err.strerror}): nothing was kept"
            ) from None


def _version(path: Path, gone: tuple[int, int] = (-1, -1)) -> tuple[int, int]:
    """A file's size and modification time: what a write to it changes
    (``gone`` if it cannot be looked at now)."""
    try:
        st = os.stat(path)
    except OSError:  # removed, or its folder made unreadable: what was read stays whole
        return gone
    return st.st_size, st.st_mtime_ns


def _regular(path: Path) -> None:
    """A file is read twice (its first bytes for its type, then whole): a pipe
    or a device would give nothing the second time, and an empty object."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise InvalidRequest(f"{path.name} is not a regular file (a pipe or a device)")


def _read_head(src: BinaryIO) -> bytes:
    parts, n = [], 0
    while n < sniff.HEAD_BYTES:
        chunk = src.read(sniff.HEAD_BYTES - n)
        if not chunk:
            break
        parts.append(chunk)
        n += len(chunk)
    return b"".join(parts)


class _Chain(io.RawIOBase):
    """The bytes already read for sniffing, then the rest of the stream."""

    def __init__(self, head: bytes, rest: BinaryIO) -> None:
        self._head = memoryview(head)
        self._rest = rest

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        if self._head:
            n = min(len(buf), len(self._head))
            buf[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        data = self._rest.read(len(buf))
        buf[: len(data)] = data
        return len(data)

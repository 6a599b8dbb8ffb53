"""Photo use cases (seed 002): photos are metadata bound to objects by role.

* ``add`` stores the original through the ledger (streamed, outside any
  transaction), then in ONE transaction inserts the photo, binds the original,
  writes the durable ``variant_jobs`` row and enqueues the engine jobs that make
  the thumbnail and the preview.  Each job's idempotency key names the photo
  and the role, so the bridge adopting the same row can never make a second job.
* ``copy`` and ``move`` are metadata-only: a copy binds the same objects (locked,
  ``ready`` required, as GC's protocol asks), nothing is uploaded again.
* ``delete`` removes the photo and its bindings and stops its variant jobs;
  GC collects the objects once nothing else references them (outputs of a
  variant job that completes anyway are retired as they arrive).
* ``attach_variants`` binds finished variant outputs to their photos.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Collection, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO

from hypermedia.config import DEFAULT_PROJECT
from hypermedia.db.dialects import is_transient
from hypermedia.db.photo_queries import VARIANT_ROLES, variant_key
from hypermedia.db.photo_queries import photo_of_variant_key as photo_of_variant_key
from hypermedia.db.schema_storage import PHOTO_ROLES
from hypermedia.errors import (
    BAD_CURSOR,
    HypermediaError,
    InvalidRequest,
    JobError,
    NotFound,
    StaleTransition,
)
from hypermedia.parse import storable
from hypermedia.pipelines import registry
from hypermedia.queue import states
from hypermedia.queue.engine import Engine
from hypermedia.queue.events import event
from hypermedia.queue.models import NewJob
from hypermedia.redact import brief, redact
from hypermedia.storage.ledger import Storage

log = logging.getLogger(__name__)

Row = dict[str, Any]
# Aliases: inside ``Photos`` the name ``list`` is the method.
Rows = list[Row]
JobIds = list[int]

# role → engine job type (its profile is the job type with dashes, queue "images"),
# for each of the roles variant keys name (db/photo_queries.py).
VARIANTS: dict[str, str] = dict(
    zip(VARIANT_ROLES, ("image.thumbnail", "image.preview"), strict=True)
)
BATCH = 100
MAX_ERROR = 500

# Engine statuses as a variant's user-facing status.
_VARIANT_STATUS = {
    "completed": "completed",
    "failed": "failed",
    "cancelled": "failed",
    "claimed": "processing",
    "processing": "processing",
    "cancel_requested": "processing",
    # An attempt failed and another comes after a backoff: said, with why.
    "retry_wait": "retry_wait",
}
BRIDGE = "photo-bridge"  # the actor of what the bridge does to jobs
NATIVE = "photos"  # ... and of our own photos' jobs
# Jobs a cancel still stops: not finished, and not already asked to stop.
_LIVE = frozenset(states.STATUSES) - states.TERMINAL - {"cancel_requested"}


_ENDED_UNMADE = ("failed", "cancelled")


def _failure(
    jobs: dict[str, Row | None], pending: Row
) -> tuple[dict[str, Row], list[str], int, bool]:
    """A photo's variant jobs that ended without their variant: (those jobs by
    role, what each said, attempts in all, whether its row says so already)."""
    failed = {r: j for r, j in jobs.items() if j and j["status"] in _ENDED_UNMADE}
    errors = [f"{r}: {j['safe_reason'] or j['status']}" for r, j in failed.items()]
    attempts = int(sum(j["attempt_count"] for j in failed.values()) or pending["attempts"])
    noted = (attempts, redact("; ".join(errors), MAX_ERROR)) == (
        pending["attempts"],
        pending["last_error"],
    )
    return failed, errors, attempts, noted


def _settled(job: Row | None, bound: int | None, outputs: dict[int, int]) -> bool:
    """A variant job that ended: without its variant, or with it bound."""
    if job is None:
        return False
    if job["status"] in _ENDED_UNMADE:
        return True
    made = outputs.get(job["job_id"]) if job["status"] == "completed" else None
    return made is not None and made == bound


def project_of(photo: Row) -> str:
    # Rows written by legacy producers carry no project.
    return str(photo["project_id"] or DEFAULT_PROJECT)


def variants_known() -> bool:
    """Whether the engine can take the variant jobs yet (their pipelines registered)."""
    try:
        for job_type in VARIANTS.values():
            registry.get(job_type)
    except JobError:
        return False
    return True


class Photos:
    def __init__(self, engine: Engine, storage: Storage) -> None:
        self.engine = engine
        self.storage = storage
        self.db = engine.db
        self._unreadable: set[str] = set()  # variant_jobs rows said to be unreadable

    # -- creating --------------------------------------------------------------

    def add(
        self,
        src: BinaryIO | Path | str,
        *,
        album: str = "",
        title: str = "",
        project_id: str = DEFAULT_PROJECT,
        owner_id: str = "",
        filename: str = "",
    ) -> Row:
        """Store an image as a new photo; its variants are made by the engine."""
        _check_name("album", album, 200, blank=False)
        _check_name("title", title, 500)
        _check_text("project", project_id, 64, empty=False)
        if isinstance(src, str | Path):
            path = Path(src)
            obj = self.storage.put_file(path, project_id=project_id, filename=filename or path.name)
        else:
            obj = self.storage.put(src, project_id=project_id, filename=filename)
        if not obj["mime_type"].startswith("image/"):
            self._discard(obj["object_id"])
            raise InvalidRequest(f"a photo must be an image, not {obj['mime_type']}")
        photo_id = _new_id()
        now = self.engine.clock()
        photo = {
            "photo_id": photo_id,
            "album": album,
            "title": title,
            "project_id": project_id,
            "owner_id": owner_id,
            "created_at": now,
            "updated_at": now,
        }
        with self.db.tx() as tx:
            tx.insert_photo(photo)
            tx.bind(photo_id, obj["object_id"], "original")
            tx.insert_variant_job(photo_id, now, native=True)
            if self._enqueue_variants(tx, photo, obj["object_id"]) is not None:
                tx.mark_variant_adopted(photo_id, now)
        return self.get(photo_id)

    def _enqueue_variants(
        self, tx: Any, photo: Row, object_id: int, roles: Collection[str] = VARIANTS
    ) -> JobIds | None:
        """Enqueue the variant jobs (of ``roles``) inside ``tx``; None (and
        nothing written) if the engine refused them: the row stays unadopted
        for the bridge to retry."""
        if not variants_known():
            return None
        jobs = [
            NewJob(
                job_type,
                {},
                project_id=project_of(photo),
                owner_id=photo["owner_id"] or "system",
                idempotency_key=variant_key(photo["photo_id"], role),
                object_id=object_id,
                created_by=NATIVE,
            )
            for role, job_type in VARIANTS.items()
            if role in roles
        ]
        try:
            with tx.savepoint():
                ids: JobIds = self.engine.enqueue_in(tx, jobs)
        except HypermediaError as exc:
            log.debug("photos: variant jobs of a photo not enqueued yet (%s)", redact(exc))
            return None
        return ids

    def _discard(self, object_id: int) -> None:
        """Hand an object nothing will reference to GC at once."""
        with self.db.tx() as tx:
            tx.update_object(object_id, ["ready"], {"state": "deleting"})

    # -- reading ---------------------------------------------------------------

    def get(
        self,
        photo_id: str,
        *,
        base_url: str = "",
        urls: bool = True,
        project_id: str | None = None,
    ) -> Row:
        """The photo as users see it: metadata, facts and URLs from the object layer,
        and the status of its variants.  ``urls=False``: every URL null (for a
        caller who may change photos but not read them).  ``project_id``: another
        project's photo is not found, and found out before anything else is
        read (its bindings and URLs took twice the time of a missing one's 404)."""
        with self.db.read() as tx:
            photo = tx.photo(photo_id)
            if photo is None or project_id not in (None, project_of(photo)):
                raise NotFound(f"photo {photo_id} not found")
            bindings = tx.bindings_of([photo_id])
            variants = self._variant_status(tx, photo, bindings)
        out = _render(photo, bindings)
        out.update(url=None, thumb_url=None, preview_url=None)
        for role, obj in out["objects"].items():
            obj["url"] = self._url(obj["object_id"], base_url) if urls else None
            out["url" if role == "original" else f"{role}_url"] = obj["url"]
        out["variants"] = variants
        return out

    def _url(self, object_id: int, base_url: str) -> str | None:
        try:
            return self.storage.signed_url(object_id, base_url)
        except (NotFound, InvalidRequest):  # GC can only take it once unbound: a race lost
            return None

    def _variant_status(self, tx: Any, photo: Row, bindings: list[Row]) -> Row:
        bound = {b["role"] for b in bindings}
        pending = tx.variant_job(photo["photo_id"])
        # Its own jobs (still named once their variants are bound, until job
        # retention deletes them) -- but a copy made before its source's
        # variants were ready has no row of its own: the variants come from
        # the source's jobs.
        owner = photo["photo_id"]
        original = next((b["object_id"] for b in bindings if b["role"] == "original"), None)
        if pending is None and original is not None and not {"thumb", "preview"} <= bound:
            for other in tx.photos_bound_to(original, "original"):
                row = tx.variant_job(other) if other != photo["photo_id"] else None
                if row is not None:
                    owner, pending = other, row
                    break
        out: Row = {}
        for role in VARIANTS:
            job = tx.job_by_idempotency_key(project_of(photo), variant_key(owner, role))
            if role in bound:
                status = "completed"
            elif job is not None:
                status = _VARIANT_STATUS.get(job["status"], "queued")
                if status == "completed":  # made, not bound yet: no URL to give
                    status = "processing"
            elif pending is not None:
                status = "queued"  # durable in variant_jobs, not yet in the engine
            else:
                status = None
            entry: Row = {"status": status, "job_id": job["job_id"] if job else None}
            if status == "failed":
                entry["error"] = (job or {}).get("safe_reason") or (pending or {}).get("last_error")
            elif status == "retry_wait" and job is not None:
                # Why its last attempt failed (a store away, a pool full).
                entry["error"] = job["safe_reason"] or job["error_code"]
            elif status == "queued" and job is None and pending and pending["last_error"]:
                # The engine refused its jobs so far (a credit budget, no original):
                # say why it waits; the bridge tries again later.
                entry["error"] = pending["last_error"]
            out[role] = entry
        return out

    def list(
        self,
        project_id: str = DEFAULT_PROJECT,
        *,
        album: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> Row:
        """A page of photos, newest first: ``{"photos": [...], "next_cursor": ...}``.

        Items carry the facts of their objects but no URLs (signing is per
        object; ``get`` one photo for them).
        """
        if not 1 <= limit <= 1000:
            raise InvalidRequest("limit must be from 1 to 1000")
        if album is not None:
            _check_text("album", album, 200)
        before = _parse_cursor(cursor) if cursor else None
        with self.db.read() as tx:
            # Rows of legacy producers carry no project: they are the default one's.
            projects = [project_id, ""] if project_id == DEFAULT_PROJECT else [project_id]
            rows = tx.photos(projects, album=album, before=before, limit=limit)
            bindings = tx.bindings_of([r["photo_id"] for r in rows])
        by_photo: dict[str, list[Row]] = {}
        for b in bindings:
            by_photo.setdefault(b["photo_id"], []).append(b)
        items = [_render(r, by_photo.get(r["photo_id"], [])) for r in rows]
        last = rows[-1] if len(rows) == limit else None
        return {
            "photos": items,
            "next_cursor": f"{last['created_at'].isoformat()}|{last['photo_id']}" if last else None,
        }

    # -- metadata-only changes -------------------------------------------------

    def copy(self, photo_id: str, *, album: str | None = None) -> Row:
        """A new photo bound to the same objects; no blob is copied."""
        if album is not None:
            _check_name("album", album, 200, blank=False)
        new_id = _new_id()
        now = self.engine.clock()
        with self.db.tx() as tx:
            # The source row lock keeps a concurrent delete from unbinding the
            # objects (and GC from taking them) while they are bound again here.
            src = tx.photo(photo_id, lock=True)
            if src is None:
                raise NotFound(f"photo {photo_id} not found")
            tx.insert_photo(
                {
                    **src,
                    "photo_id": new_id,
                    "album": src["album"] if album is None else album,
                    "created_at": now,
                    "updated_at": now,
                }
            )
            # In object order: two copies lock shared objects in the same order.
            for b in sorted(tx.bindings_of([photo_id]), key=lambda b: b["object_id"]):
                # A role the schema's CHECK refuses (a legacy row written with
                # checks off) is not copied: binding it failed every copy.
                if b["role"] in PHOTO_ROLES:
                    tx.bind(new_id, b["object_id"], b["role"])
        return self.get(new_id)

    def move(self, photo_id: str, album: str) -> Row:
        _check_name("album", album, 200, blank=False)
        with self.db.tx() as tx:
            if not tx.update_photo(photo_id, {"album": album, "updated_at": self.engine.clock()}):
                raise NotFound(f"photo {photo_id} not found")
        return self.get(photo_id)

    def update(self, photo_id: str, *, title: str | None = None, album: str | None = None) -> Row:
        values: Row = {}
        if title is not None:
            _check_name("title", title, 500)
            values["title"] = title
        if album is not None:
            _check_name("album", album, 200, blank=False)
            values["album"] = album
        if values:
            values["updated_at"] = self.engine.clock()
            with self.db.tx() as tx:
                if not tx.update_photo(photo_id, values):
                    raise NotFound(f"photo {photo_id} not found")
        return self.get(photo_id)

    def delete(self, photo_id: str) -> None:
        """Remove the photo and its bindings; objects nothing else references
        become collectable by GC."""
        now = self.engine.clock()
        with self.db.tx() as tx:
            photo = tx.photo(photo_id, lock=True)
            if photo is None:
                raise NotFound(f"photo {photo_id} not found")
            pending = tx.variant_job(photo_id)
            bindings = tx.bindings_of([photo_id])
            # Locked: a variant completing as the photo goes either committed
            # first (shared below) or waits; read unlocked, it was taken for
            # work still coming, and made again for a copy.
            key = project_of(photo)
            by_role = {
                role: j
                for role in VARIANTS
                if (j := tx.job_by_idempotency_key(key, variant_key(photo_id, role), lock=True))
            }
            jobs = list(by_role.values())
            # Finished variants first, so copies waiting for them still get them.
            self._share_finished(tx, photo_id, bindings, by_role)
            # Only work still coming is handed over: variant jobs that all
            # ended (failed for good, say on a corrupt original) ran again
            # for the copy, charged again, to fail the same way.
            coming = len(jobs) < len(VARIANTS) or any(j["status"] in _LIVE for j in jobs)
            tx.delete_photo(photo_id)
            self._stop(tx, jobs)
            # Its variant outputs no longer pin their objects (a copy's binding still does).
            tx.retire_outputs([j["job_id"] for j in jobs], now)
            if pending is not None and coming:
                self._hand_over(tx, photo, bindings, now)

    def _share_finished(self, tx: Any, photo_id: str, bindings: Rows, jobs: dict[str, Row]) -> None:
        """Share the deleted photo's completed variants with the copies that
        lack them, under its lock: read before it (a separate look), a
        variant completing in between was neither shared nor handed over,
        and its output was retired with the photo."""
        original = next((b["object_id"] for b in bindings if b["role"] == "original"), None)
        for role, job in jobs.items():
            made = tx.output_object(job["job_id"]) if job["status"] == "completed" else None
            if original is not None and made is not None:
                with contextlib.suppress(HypermediaError):  # the output is gone: none to share
                    self._share(tx, photo_id, original, role, made)

    def _stop(self, tx: Any, jobs: Rows) -> None:
        """Variants nobody will see: stop them (they also pin the original).

        In the delete's transaction, each job row locked: an attempt that
        completes meanwhile either committed first (its outputs exist, and
        are retired next) or ends a job that is ``cancel_requested`` of a
        photo that is gone, and the engine retires them as they arrive
        (``Engine._apply``).  Stopped after the commit, the attempt could
        complete in between and its outputs pin their objects for the
        month job retention keeps the job.
        """
        for j in jobs:
            if j["status"] in _LIVE:
                with contextlib.suppress(StaleTransition, NotFound):
                    self.engine.cancel_in(tx, j["job_id"], actor="photos")

    def _hand_over(self, tx: Any, photo: Row, bindings: Rows, now: datetime) -> None:
        """The deleted photo's variants were still coming: a copy waiting for them
        takes the work over (its own row and jobs; the old jobs are cancelled)."""
        original = next((b["object_id"] for b in bindings if b["role"] == "original"), None)
        if original is None:
            return
        for heir in tx.photos_bound_to(original, "original"):
            if tx.variant_job(heir) is not None:
                return
            roles = {b["role"] for b in tx.bindings_of([heir])}
            if {"thumb", "preview"} <= roles:
                continue
            heir_row = tx.photo(heir, lock=True)
            if heir_row is None:
                continue
            tx.insert_variant_job(heir, now, native=True)
            # The roles it still lacks only: a variant shared with it just now
            # (_share_finished) was made again, and charged again.
            missing = [r for r in VARIANTS if r not in roles]
            if self._enqueue_variants(tx, heir_row, original, missing) is not None:
                tx.mark_variant_adopted(heir, now)
            return

    # -- variants ----------------------------------------------------------------

    def attach_variants(self) -> dict[str, int]:
        """Bind the outputs of finished variant jobs to their photos (used by the bridge)."""
        return self.attach_variants_from("")[0]

    def attach_variants_from(
        self, after: str, deadline: float | None = None
    ) -> tuple[dict[str, int], str | None]:
        """``attach_variants`` for the rows after photo id ``after``, stopping once
        ``time.monotonic()`` passes ``deadline``: the counts and the photo id to go
        on after next time (None: every row was seen)."""
        counts = {"attached": 0, "variants_done": 0, "variants_failed": 0}
        seen = 0
        while True:
            with self.db.read() as tx:
                ids = tx.adopted_variant_jobs(after, BATCH)
            rows = self._readable(ids)
            dead = self._failed_for_good(rows)
            live = {r["photo_id"] for r in rows} - dead
            for photo_id in ids:
                # One row at least, so that every run gets on.
                if seen and deadline is not None and time.monotonic() >= deadline:
                    return counts, after
                seen += 1
                if photo_id in live:
                    for k, v in self._attach(photo_id).items():
                        counts[k] += v
                after = photo_id
            if len(ids) < BATCH:
                return counts, None

    def _readable(self, photo_ids: Sequence[str]) -> Rows:
        """The ``variant_jobs`` rows of ``photo_ids`` the driver can read.  A
        legacy producer's row may hold a value of no readable type (a
        '-infinity' timestamp, a number where SQLite keeps text): one such
        row made every run fail, and no photo's variants were bound again.
        It is skipped, said once; the others go on."""
        try:
            with self.db.read() as tx:
                return [*tx.variant_jobs_of(photo_ids)]
        except Exception as exc:
            if is_transient(exc):
                raise
        rows = []
        for photo_id in photo_ids:  # one by one, to find which
            try:
                with self.db.read() as tx:
                    row = tx.variant_job(photo_id)
            except Exception as exc:
                if is_transient(exc):
                    raise
                self.unreadable(photo_id, exc)
                continue
            if row is not None:
                rows.append(row)
        return rows

    def unreadable(self, photo_id: str, exc: BaseException) -> None:
        """Say once (per process) that a photo's ``variant_jobs`` row cannot be read."""
        if photo_id in self._unreadable:
            return
        if len(self._unreadable) >= 10_000:
            self._unreadable.clear()
        self._unreadable.add(photo_id)
        log.warning(
            "photo-bridge: the variant_jobs row of photo %s cannot be read (%s): left as it is",
            redact(photo_id, 100),
            brief(exc),
        )

    def _failed_for_good(self, rows: Rows) -> set[str]:
        """The photos of ``rows`` whose variant jobs all ended, failed or
        cancelled or completed with their variant bound, as their row says
        already: nothing to attach or note.  Such rows stay (the photo keeps
        saying why) and every run read each one again, six queries a row: 900
        photos of corrupt uploads made a new photo's variants wait 11 s
        instead of 1-2.  Read here for a batch in four; a retry by request
        makes a job live again, and its row is looked at again."""
        with self.db.read() as tx:
            photos = tx.photos_by_ids([r["photo_id"] for r in rows])
            keys = {
                pid: {role: (project_of(p), variant_key(pid, role)) for role in VARIANTS}
                for pid, p in photos.items()
            }
            jobs = tx.jobs_by_idempotency_keys([k for ks in keys.values() for k in ks.values()])
            made = [j["job_id"] for j in jobs.values() if j["status"] == "completed"]
            outputs = tx.output_objects(made)
            bound = {(b["photo_id"], b["role"]): b["object_id"] for b in tx.bindings_of(list(keys))}
        dead = set()
        for row in rows:
            pid = row["photo_id"]
            if pid not in keys:
                continue
            found = {role: jobs.get(key) for role, key in keys[pid].items()}
            failed, _, _, noted = _failure(found, row)
            if (
                failed
                and noted
                and all(_settled(j, bound.get((pid, r)), outputs) for r, j in found.items())
            ):
                dead.add(pid)
        return dead

    def _attach(self, photo_id: str) -> dict[str, int]:
        counts = {"attached": 0, "variants_done": 0, "variants_failed": 0}
        with self.db.read() as tx:
            photo = tx.photo(photo_id)
            pending = tx.variant_job(photo_id)
            if photo is None or pending is None or pending["adopted_at"] is None:
                return counts
            jobs = {
                role: tx.job_by_idempotency_key(project_of(photo), variant_key(photo_id, role))
                for role in VARIANTS
            }
            outputs = {
                role: obj
                for role, job in jobs.items()
                if job is not None
                and job["status"] == "completed"
                and (obj := tx.output_object(job["job_id"])) is not None
            }
            bound = {b["role"]: b["object_id"] for b in tx.bindings_of([photo_id])}
        if any(jobs[r] is None and r not in bound for r in VARIANTS):
            # Adopted, yet no engine job makes a variant it lacks: a producer
            # wrote adopted_at itself.  The photo said "queued" for ever.
            with self.db.tx() as tx:
                tx.unadopt_variant_job(photo_id, "no engine job made its variants: adopted again")
            return counts
        failed, errors, attempts, noted = _failure(jobs, pending)
        todo = {r: o for r, o in outputs.items() if bound.get(r) != o}
        # A role bound with no job of this photo's making (shared by the
        # photo it was copied from, at a hand-over) is done too.
        complete = all(r in outputs or (jobs[r] is None and r in bound) for r in VARIANTS)
        if not todo and not complete and (not failed or noted):
            return counts  # nothing new
        with self.db.tx() as tx:
            if tx.photo(photo_id, lock=True) is None:
                return counts
            original = bound.get("original")
            for role, object_id in todo.items():
                try:
                    tx.bind(photo_id, object_id, role)
                except HypermediaError as exc:  # the output is gone: say so, keep the row
                    errors.append(f"{role}: {exc}")
                    continue
                bound[role] = object_id
                counts["attached"] += 1
                if original is not None:
                    counts["attached"] += self._share(tx, photo_id, original, role, object_id)
            if complete and all(bound.get(r) == outputs.get(r, bound.get(r)) for r in VARIANTS):
                tx.delete_variant_job(photo_id)
                counts["variants_done"] = 1
            elif errors:
                error = redact("; ".join(errors), MAX_ERROR)
                if (attempts, error) != (pending["attempts"], pending["last_error"]):
                    tx.note_variant_error(photo_id, attempts, error)
                    counts["variants_failed"] = 1
        return counts

    def _share(self, tx: Any, photo_id: str, original: int, role: str, object_id: int) -> int:
        """Copies made before a variant was ready share it too."""
        n = 0
        for other in tx.copies_lacking(original, role, photo_id):
            if tx.photo(other, lock=True) is not None:
                tx.bind(other, object_id, role)
                n += 1
        return n

    # -- the bridge's side of adoption --------------------------------------------

    def adopt(self, photo_id: str, now: datetime, tx: Any, *, actor: str = BRIDGE) -> JobIds | None:
        """Enqueue the variant jobs of a row no engine job was made for, inside
        ``tx``: a legacy producer's, or one of ours the engine refused at first.

        Returns the job ids ([] when the photo has its variants already: the row
        is deleted), None when the photo is gone; raises when the engine refuses.
        """
        photo = tx.photo(photo_id, lock=True)
        if photo is None:
            return None
        bound = {b["role"]: b["object_id"] for b in tx.bindings_of([photo_id])}
        if set(VARIANTS) <= set(bound):  # nothing left to make
            tx.delete_variant_job(photo_id)
            return []
        original = bound.get("original")
        if original is None:
            raise InvalidRequest("the photo has no original object")
        obj = tx.object(original)
        if obj is not None and not obj["project_id"] and project_of(photo) == DEFAULT_PROJECT:
            # A legacy producer's object carries no project either (seed 002's
            # objects have no such column): the default project's, as its
            # photo is.  Taken into it, or its variants waited for ever.
            tx.update_object(original, [obj["state"]], {"project_id": DEFAULT_PROJECT})
            obj = {**obj, "project_id": DEFAULT_PROJECT}
        if obj is not None and obj["project_id"] != project_of(photo):
            # The engine's words were "object N does not exist" (another
            # project's object answers as a missing one), on every retry.
            raise InvalidRequest(
                f"the photo's original, object {original}, belongs to another project: "
                f"variants are made in the photo's project ({project_of(photo)}); "
                "bind one of its objects, or set the photo's project_id"
            )
        self._supersede(tx, photo, original, bound, now)
        jobs = [
            NewJob(
                job_type,
                {},
                project_id=project_of(photo),
                owner_id=photo["owner_id"] or "system",
                idempotency_key=variant_key(photo_id, role),
                object_id=original,
                created_by=actor,
            )
            for role, job_type in VARIANTS.items()
        ]
        with tx.savepoint():
            ids: JobIds = self.engine.enqueue_in(tx, jobs)
        tx.mark_variant_adopted(photo_id, now)
        return ids

    def _supersede(self, tx: Any, photo: Row, original: int, bound: Row, now: datetime) -> None:
        """A legacy producer that replaced a photo's original asks for its
        variants again: the variant jobs made from the earlier original give up
        their keys to the new ones (the key refused the new jobs for ever as a
        "different request"), the live ones are stopped, their outputs retired."""
        photo_id = photo["photo_id"]
        old = [
            job
            for role in VARIANTS
            if role not in bound
            and (job := tx.job_by_idempotency_key(project_of(photo), variant_key(photo_id, role)))
            and job["object_id"] != original
        ]
        if not old:
            return
        self._stop(tx, old)
        ids = [j["job_id"] for j in old]
        tx.release_variant_keys(ids)
        tx.retire_outputs(ids, now)
        note = "superseded: the photo's original changed, a new job makes this variant"
        tx.insert_events([event(i, now, None, None, message=note, actor=BRIDGE) for i in ids])


def _new_id() -> str:
    import uuid

    return str(uuid.uuid4())


# Bidirectional controls (ALM, LRM/RLM, the embeddings and overrides, the
# isolates): "x\u202egnp.exe" shows as "xexe.png".  Others of Unicode's
# format characters stay: a zero-width joiner is part of many emoji.
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _check_name(what: str, value: str, limit: int, *, blank: bool = True) -> None:
    """An album or title a photo is given: text as _check_text takes it, no
    bidirectional controls, and without ``blank`` none ("") or more than
    blanks (an album of spaces looked like no album in every listing)."""
    _check_text(what, value, limit)
    if any(c in _BIDI for c in value):
        raise InvalidRequest(f"{what} must not contain bidirectional control characters")
    if not blank and value and not value.strip():
        raise InvalidRequest(f"{what} must be empty or more than blanks")


def _check_text(what: str, value: str, limit: int, *, empty: bool = True) -> None:
    if not isinstance(value, str) or len(value) > limit or (not empty and not value):
        raise InvalidRequest(f"{what} must be text of {0 if empty else 1} to {limit} characters")
    # C0, DEL and C1 (U+0080-U+009F: NEL breaks a line in some viewers).
    if any(ord(c) < 32 or 127 <= ord(c) <= 159 for c in value):
        raise InvalidRequest(f"{what} must not contain control characters")
    if not storable(value):  # a lone surrogate: bytes not UTF-8 on a command line
        raise InvalidRequest(f"{what} must be valid UTF-8 text")


def _parse_cursor(cursor: str) -> tuple[datetime, str]:
    at, sep, pid = cursor.partition("|")
    try:
        if not sep or not pid:
            raise ValueError(cursor)
        return datetime.fromisoformat(at), pid
    except ValueError:
        raise InvalidRequest(BAD_CURSOR) from None


def _render(photo: Row, bindings: Sequence[Row]) -> Row:
    """A photo's metadata and, from the object layer, its original's facts."""
    objects = {
        b["role"]: {
            "object_id": b["object_id"],
            "mime_type": b["mime_type"],
            "size": b["size"],
            "width": b["width"],
            "height": b["height"],
        }
        for b in bindings
    }
    original = objects.get("original", {})
    return {
        "id": photo["photo_id"],
        "album": photo["album"],
        "title": photo["title"],
        "project_id": project_of(photo),
        "owner_id": photo["owner_id"],
        "created_at": photo["created_at"],
        "updated_at": photo["updated_at"],
        "object_id": original.get("object_id"),
        "mime_type": original.get("mime_type"),
        "size": original.get("size"),
        "width": original.get("width"),
        "height": original.get("height"),
        "objects": objects,
    }


def backoff(attempts: int) -> timedelta:
    """When a variant row the engine refused is tried again: 1 min doubling to 1 h.

    The exponent is capped first: a legacy row may say any count, and
    2 ** 2147483647 took the leader 15 s and hundreds of MB to work out."""
    return timedelta(seconds=min(3600, 60 * 2 ** min(6, max(0, attempts))))

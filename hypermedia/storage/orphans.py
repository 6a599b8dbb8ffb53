"""Orphan blobs: blobs in a pool's store that no ledger row leads to.

GC works from rows, so a blob without one is stored (and billed) for good.
They come from a PUT that timed out on our side but landed in the store
after GC had dropped its row, from a database restored from a backup older
than the store, from a row deleted by hand.  ``hypermedia gc orphans``
lists a pool's ``objects/`` and says which blobs no row has; with
``--delete`` each of them gets a ``deleting`` row (as a completion refused
for a lost output gives its blob one) and GC's sweep deletes it, blob then
row, the way it deletes every other.

Never a live object's blob: an upload writes its row, key included, before
its bytes, so a blob whose key no row has is nobody's upload.  The grace
(a day by default) leaves alone a PUT still on its way and a store whose
clock is off.  A deletion that would take more than half of what a pool
holds is refused unless forced: a service pointed at the wrong, or an
empty, database would otherwise empty the store.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from hypermedia.storage.base import Listed, StorageError, UnsafeKey
from hypermedia.storage.gc import GarbageCollector, os_error
from hypermedia.storage.keys import check_key
from hypermedia.storage.ledger import Storage
from hypermedia.storage.reserve import is_placeholder

PREFIX = "objects/"
PAGE = 500  # keys looked up per query
SHOWN = 10  # orphan keys a report names, for someone to look at
DEFAULT_GRACE_SECONDS = 24 * 3600
# Past this share of a pool's blobs, --delete needs --force (see above).
MOST = 0.5
# Deadlocks in a row a page's rows may meet: three runs at once over the same
# keys met three (CI, MariaDB); each retry backs off longer.
RETRIES = 8


@dataclass
class PoolOrphans:
    pool: str
    listed: int = 0  # blobs under objects/
    orphans: int = 0  # older than the grace, no row has their key
    orphan_bytes: int = 0
    too_young: int = 0  # no row either, but within the grace: left for a later run
    unrecognised: int = 0  # names under objects/ that are no key of ours: left alone
    handed_to_gc: int = 0  # given a ``deleting`` row (--delete)
    keys: list[str] = field(default_factory=list)  # the first SHOWN orphans
    refused: str | None = None  # why --delete handed none to GC
    error: str | None = None  # why the pool's store could not be listed (the rest still are)


@dataclass
class OrphanReport:
    pools: list[PoolOrphans] = field(default_factory=list)
    deleted: int = 0  # by GC's sweep after --delete (its other rows included)
    not_deleted: int = 0  # kept or failed in that sweep (`gc run-once` says why)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        said = [] if self.pools else ["no pools (nothing stored yet)"]
        for p in self.pools:
            line = (
                f"pool {p.pool}: {p.listed} blob(s) listed, {p.orphans} orphan(s) "
                f"({p.orphan_bytes} bytes)"
            )
            if p.too_young:
                line += f", {p.too_young} more within the grace"
            if p.unrecognised:
                line += f", {p.unrecognised} name(s) that are no key of ours (left alone)"
            said.append(line)
            said += [f"  {key}" for key in p.keys]
            if p.orphans > len(p.keys):
                said.append(f"  … and {p.orphans - len(p.keys)} more")
            if p.error:
                said.append(f"pool {p.pool}: not listed to the end: {p.error}")
            if p.refused:
                said.append(f"pool {p.pool}: none deleted: {p.refused}")
            elif p.handed_to_gc:
                said.append(f"pool {p.pool}: {p.handed_to_gc} handed to GC")
        return said


def find_orphans(
    storage: Storage,
    *,
    pool: str | None = None,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    delete: bool = False,
    force: bool = False,
) -> OrphanReport:
    """Every pool's orphans (or ``pool``'s); with ``delete``, handed to GC
    and swept."""
    rows = [storage.pool(pool)] if pool is not None else storage.pools()
    report = OrphanReport()
    cutoff = time.time() - grace_seconds
    for row in rows:
        found = PoolOrphans(row["name"])
        report.pools.append(found)
        try:
            _survey(storage, row, cutoff, found)
            if delete:
                _hand_to_gc(storage, row, found, cutoff, force)
        except (StorageError, OSError) as exc:  # this pool's store: the others are still looked at
            found.error = str(exc) if isinstance(exc, StorageError) else os_error(exc)
    if any(p.handed_to_gc for p in report.pools):
        gc = GarbageCollector(storage, log_failures=False)
        gc.sweep()
        report.deleted, report.not_deleted = gc.report.deleted, gc.report.failed + gc.report.kept
    return report


def _survey(storage: Storage, pool: dict[str, Any], cutoff: float, found: PoolOrphans) -> None:
    _survey_pages(storage, pool, cutoff, found)
    if found.listed:
        return
    with storage.db.read() as tx:
        ready = tx.pool_users(pool["pool_id"])[0].get("ready", 0)
    if ready:  # an unmounted volume, another bucket: not an empty pool
        found.error = (
            f"its store lists no blob, yet the ledger has {ready} ready object(s) in it: "
            "is it mounted, or the right bucket?"
        )


def _survey_pages(
    storage: Storage, pool: dict[str, Any], cutoff: float, found: PoolOrphans
) -> None:
    for page in _pages(storage, pool):
        found.listed += len(page.listed)
        found.unrecognised += page.unrecognised
        for blob in page.orphans:
            if blob.modified >= cutoff:
                found.too_young += 1
                continue
            found.orphans += 1
            found.orphan_bytes += blob.size
            if len(found.keys) < SHOWN:
                found.keys.append(blob.key)


def _hand_to_gc(
    storage: Storage, pool: dict[str, Any], found: PoolOrphans, cutoff: float, force: bool
) -> None:
    """A ``deleting`` row for each orphan, listed again and checked again at
    the moment its row is written (record_orphan: none if a row has its key)."""
    if not found.orphans:
        return
    # Young ones count as no row's too: a wrong database that owns nothing
    # must not get past this because the store's newest blobs are many.
    unowned, keys = found.orphans + found.too_young, found.listed - found.unrecognised
    if unowned > keys * MOST and not force:
        found.refused = (
            f"{unowned} of its {keys} blobs have no row: is this the service's "
            "own database? (--force deletes them anyway)"
        )
        return
    now = storage.clock()
    for page in _pages(storage, pool):
        old = [b.key for b in page.orphans if b.modified < cutoff]
        if old:
            # Another `gc orphans` at once: InnoDB may pick this one as a
            # deadlock's victim; run again, the keys it took are skipped.
            found.handed_to_gc += storage.db.tx_retrying(
                lambda tx, old=old: sum(  # type: ignore[misc]
                    tx.record_orphan(pool["pool_id"], key, "", now) for key in old
                ),
                attempts=RETRIES,
            )


@dataclass
class _Page:
    listed: list[Listed]
    orphans: list[Listed]  # of listed, those whose key no row has
    unrecognised: int


def _pages(storage: Storage, pool: dict[str, Any]) -> Iterator[_Page]:
    """The pool's blobs a page at a time, each page's keys looked up at once."""
    page: list[Listed] = []
    for blob in storage.backend(pool["pool_id"]).list_blobs(PREFIX):
        page.append(blob)
        if len(page) == PAGE:
            yield _looked_up(storage, page)
            page = []
    if page:
        yield _looked_up(storage, page)


def _looked_up(storage: Storage, listed: list[Listed]) -> _Page:
    ours = {b.key: i for b in listed if (i := _object_id(b.key)) is not None}
    with storage.db.read() as tx:
        taken = tx.taken_keys(list(ours))
        rows = tx.objects_where(sorted(set(ours.values())))
    reserved = {r["object_id"] for r in rows if is_placeholder(r["storage_key"])}
    orphans = [b for b in listed if b.key in ours and b.key not in taken]
    # An output stored, its row not yet given the key: its job's completion
    # does that (GC sweeps such a row's whole prefix if it never comes).
    orphans = [b for b in orphans if ours[b.key] not in reserved]
    return _Page(listed, orphans, len(listed) - len(ours))


def _object_id(key: str) -> int | None:
    """The object id of a name the service could have made,
    ``objects/{id}/{role}.{ext}``; None for anything else under
    ``objects/`` (someone else put it there)."""
    try:
        check_key(key)
    except UnsafeKey:
        return None
    parts = key.split("/")
    ok = len(parts) == 3 and parts[1].isascii() and parts[1].isdigit() and "." in parts[2]
    if not ok or len(parts[1]) > 18:
        return None
    object_id = int(parts[1])
    # As object_key writes it: "007" or "0" is nobody's (ids start at 1).
    return object_id if object_id > 0 and str(object_id) == parts[1] else None

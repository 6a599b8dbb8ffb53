"""Queries of the duplicate check (storage.dedup_check), mixed into ``Tx``.

Exact duplicates are objects with the same ``objects.checksum`` (indexed by
objects_checksum_idx); near duplicates compare perceptual hashes kept in
``object_hashes``, only within one project and one (algorithm, version): a
hash made by another algorithm or library version is not comparable.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql, sqlite

from hypermedia.db.schema_storage import object_hashes as OH
from hypermedia.db.schema_storage import objects as OB

Row = dict[str, Any]


class DedupQueries:
    conn: sa.Connection
    dialect: str

    def store_object_hash(self, values: Row) -> None:
        """Insert an object's hash unless that (object, algorithm, version) has one.

        Idempotent: a retried attempt stores nothing twice and never fails on
        the primary key.
        """
        q: Any
        if self.dialect == "postgresql":
            q = postgresql.insert(OH).values(values).on_conflict_do_nothing()
        elif self.dialect == "sqlite":
            q = sqlite.insert(OH).values(values).on_conflict_do_nothing()
        else:
            # Not INSERT IGNORE: that would also turn other errors into warnings.
            ins = mysql.insert(OH).values(values)
            q = ins.on_duplicate_key_update(hash=OH.c.hash)
        self.conn.execute(q)

    def drop_object_hashes(self, object_id: int, algorithm: str) -> None:
        """Forget the object's hashes of ``algorithm`` (every version)."""
        self.conn.execute(
            sa.delete(OH).where(OH.c.object_id == object_id, OH.c.algorithm == algorithm)
        )

    def object_hash(self, object_id: int, algorithm: str, version: str) -> str | None:
        q = sa.select(OH.c.hash).where(
            OH.c.object_id == object_id, OH.c.algorithm == algorithm, OH.c.version == version
        )
        return self.conn.execute(q).scalar()

    def same_checksum(
        self, project_id: str, checksums: Iterable[str], exclude: int, limit: int
    ) -> list[int]:
        """Ready objects of the project with any of these checksums, other than ``exclude``."""
        q = (
            sa.select(OB.c.object_id)
            .where(
                OB.c.checksum.in_(sorted(checksums)),
                OB.c.project_id == project_id,
                OB.c.state == "ready",
                OB.c.object_id != exclude,
            )
            .order_by(OB.c.object_id)
            .limit(limit)
        )
        return [r[0] for r in self.conn.execute(q)]

    def project_hashes(
        self, project_id: str, algorithm: str, version: str, exclude: int
    ) -> list[tuple[int, str]]:
        """(object_id, hash) of every ready object of the project hashed this way.

        All of them: the caller computes distances in Python, one pass per
        check (fine for tens of thousands of images per project; beyond that
        a BK-tree or a banded index is the next step).
        """
        q = (
            sa.select(OH.c.object_id, OH.c.hash)
            .join(OB, OB.c.object_id == OH.c.object_id)
            .where(
                OH.c.project_id == project_id,
                OH.c.algorithm == algorithm,
                OH.c.version == version,
                OB.c.state == "ready",
                OH.c.object_id != exclude,
            )
            .order_by(OH.c.object_id)
        )
        return [(r[0], r[1]) for r in self.conn.execute(q)]

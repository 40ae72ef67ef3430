"""Catalog revisions: durable, immutable (revision, digest, content) facts.

Theory of operation
-------------------
``catalog_revisions`` holds one row per published revision; its primary key
is the revision number. Publishing is a plain INSERT: a second publish of the
same number with the same digest is answered from the stored row (idempotent
after a lost response), with another digest it is refused; a row is never
updated. Every publish and delete is audited in its own transaction.

A revision is deleted only while no work pinned to it is unsettled: no open
command names it and no WorkItem naming it is outside a terminal state.
Admission does not lock the row it reads (plain reads on every backend), so a
delete racing an admission can leave a new command pinned to a revision that
is gone; that command's worker then finds no pinned content and refuses
before dispatch (``catalog_revision_unavailable``), never running it under
other definitions.
"""

from __future__ import annotations

import json

from daemon.core.states import TERMINAL
from storage.idgen import new_ulid
from storage.port import (
    AuditEntry,
    CatalogRevision,
    Database,
    DuplicateKey,
    PublishParams,
    RevisionConflict,
    RevisionNotPublished,
    RevisionPins,
    Row,
    SqlTx,
)
from storage.work_admin import append_audit
from storage.work_rows import in_states

_COLUMNS = "revision, digest, content, published_by, published_at_us"


def _revision(row: Row, *, with_content: bool = True) -> CatalogRevision:
    return CatalogRevision(revision=int(row[0]), digest=str(row[1]),
                           content=str(row[2]) if with_content else "",
                           published_by=str(row[3]), published_at_us=int(row[4]))


async def read_revision(tx: SqlTx, revision: int) -> CatalogRevision | None:
    rows = await tx.fetchall(
        f"SELECT {_COLUMNS} FROM catalog_revisions WHERE revision = ?", (revision,))
    return _revision(rows[0]) if rows else None


async def revision_pins(tx: SqlTx, revision: int) -> RevisionPins:
    commands = await tx.fetchall(
        "SELECT COUNT(*) FROM external_commands WHERE catalog_revision = ?"
        " AND settlement = 'open'", (revision,))
    work = await tx.fetchall(
        "SELECT COUNT(*) FROM work_items WHERE catalog_revision = ?"
        f" AND state NOT IN {in_states(TERMINAL)}", (revision,))
    return RevisionPins(open_commands=int(commands[0][0]), live_work=int(work[0][0]))


async def _audit(tx: SqlTx, action: str, revision: int, actor: str, role: str, reason: str,
                 before: dict[str, object], after: dict[str, object], now_us: int) -> None:
    await append_audit(tx, AuditEntry(
        audit_id=new_ulid(now_us), at_us=now_us, actor=actor, role=role, action=action,
        target_kind="catalog_revision", target_id=str(revision), reason=reason,
        before=json.dumps(before, sort_keys=True), after=json.dumps(after, sort_keys=True),
    ))


class CatalogRevisions:
    db: Database

    async def catalog_publish(self, params: PublishParams,
                              now_us: int) -> tuple[CatalogRevision, bool]:
        """Store a revision; (the stored revision, whether this call created it)."""

        async def body(tx: SqlTx) -> tuple[CatalogRevision, bool]:
            existing = await read_revision(tx, params.revision)
            if existing is None:
                try:
                    await tx.execute(
                        f"INSERT INTO catalog_revisions ({_COLUMNS}) VALUES (?, ?, ?, ?, ?)",
                        (params.revision, params.digest, params.content, params.actor,
                         now_us))
                except DuplicateKey:
                    existing = await read_revision(tx, params.revision)
                else:
                    await _audit(tx, "catalog.publish", params.revision, params.actor,
                                 params.role, params.reason, {},
                                 {"revision": params.revision, "digest": params.digest},
                                 now_us)
                    return CatalogRevision(
                        revision=params.revision, digest=params.digest,
                        content=params.content, published_by=params.actor,
                        published_at_us=now_us), True
            assert existing is not None
            if existing.digest != params.digest:
                raise RevisionConflict(
                    f"catalog revision {params.revision} is already published with digest"
                    f" {existing.digest}; publish this content under a new revision number")
            return existing, False

        try:
            return await self.db.transact(body, name="catalog.publish")
        except DuplicateKey:  # TiDB may report the racing INSERT only at COMMIT
            return await self.db.transact(body, name="catalog.publish")

    async def catalog_get(self, revision: int) -> CatalogRevision | None:
        async def body(tx: SqlTx) -> CatalogRevision | None:
            return await read_revision(tx, revision)

        return await self.db.transact(body, name="catalog.get", write=False)

    async def catalog_digest(self, revision: int) -> str | None:
        """The published digest of ``revision`` (None if it is not published)."""

        async def body(tx: SqlTx) -> str | None:
            rows = await tx.fetchall(
                "SELECT digest FROM catalog_revisions WHERE revision = ?", (revision,))
            return str(rows[0][0]) if rows else None

        return await self.db.transact(body, name="catalog.digest", write=False)

    async def catalog_list(self) -> list[CatalogRevision]:
        """Every published revision, newest first, without its content."""

        async def body(tx: SqlTx) -> list[CatalogRevision]:
            rows = await tx.fetchall(
                "SELECT revision, digest, '', published_by, published_at_us"
                " FROM catalog_revisions ORDER BY revision DESC")
            return [_revision(r, with_content=False) for r in rows]

        return await self.db.transact(body, name="catalog.list", write=False)

    async def catalog_pins(self, revision: int) -> RevisionPins:
        async def body(tx: SqlTx) -> RevisionPins:
            return await revision_pins(tx, revision)

        return await self.db.transact(body, name="catalog.pins", write=False)

    async def catalog_delete(self, revision: int, *, actor: str, role: str, reason: str,
                             now_us: int) -> CatalogRevision:
        """Delete a revision no unsettled work is pinned to (audited)."""

        async def body(tx: SqlTx) -> CatalogRevision:
            existing = await read_revision(tx, revision)
            if existing is None:
                raise RevisionNotPublished(revision)
            pins = await revision_pins(tx, revision)
            if pins.open_commands or pins.live_work:
                raise RevisionConflict(
                    f"catalog revision {revision} still has unsettled work pinned to it"
                    f" ({pins.open_commands} open commands, {pins.live_work} live work"
                    " items); settle or retire them first")
            await tx.execute("DELETE FROM catalog_revisions WHERE revision = ? AND digest = ?",
                             (revision, existing.digest))
            await _audit(tx, "catalog.delete", revision, actor, role, reason,
                         {"revision": revision, "digest": existing.digest}, {}, now_us)
            return existing

        return await self.db.transact(body, name="catalog.delete")

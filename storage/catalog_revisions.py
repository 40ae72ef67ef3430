"""Catalog revisions: durable, immutable (revision, digest, content) facts.

Theory of operation
-------------------
``catalog_revisions`` holds one row per published revision; its primary key
is the revision number. Publishing is a plain INSERT: a second publish of the
same number with the same digest is answered from the stored row (idempotent
after a lost response), with another digest it is refused; a row is never
updated. Every publish and delete is audited in its own transaction.

A revision is deleted only while no work pinned to it is unsettled: no open
command names it and no WorkItem naming it is outside a terminal state. Both are
asked of an index (migration 0031) as "is there one" (LIMIT 1); the listing counts
them up to ``PIN_COUNT_LIMIT`` each and says "more" beyond, never counting a
revision's whole history.
Admission does not lock the row it reads (plain reads on every backend), so a
delete racing an admission can leave a new command pinned to a revision that
is gone; that command's worker then finds no pinned content and refuses
before dispatch (``catalog_revision_unavailable``), never running it under
other definitions.
"""

from __future__ import annotations

import json

from daemon.core.states import TERMINAL, WorkState
from storage.idgen import new_ulid
from storage.port import (
    PIN_COUNT_LIMIT,
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


_OPEN_COMMANDS = "FROM external_commands WHERE catalog_revision = ? AND settlement = 'open'"
# The live states as an IN list: ranges of (catalog_revision, state) that skip the
# revision's terminal history (a NOT IN would read every entry of the revision).
_LIVE_WORK = (f"FROM work_items WHERE catalog_revision = ?"
              f" AND state IN {in_states(set(WorkState) - TERMINAL)}")


async def _bounded(tx: SqlTx, where: str, revision: int) -> tuple[int, bool]:
    """(count up to PIN_COUNT_LIMIT, whether there are more): an index range that stops
    after PIN_COUNT_LIMIT + 1 entries."""
    rows = await tx.fetchall(
        f"SELECT COUNT(*) FROM (SELECT 1 AS pinned {where} LIMIT {PIN_COUNT_LIMIT + 1}) AS t",
        (revision,))
    n = int(rows[0][0])
    return min(n, PIN_COUNT_LIMIT), n > PIN_COUNT_LIMIT


async def revision_pins(tx: SqlTx, revision: int) -> RevisionPins:
    """Unsettled work pinned to ``revision``, each counted up to PIN_COUNT_LIMIT."""
    commands, commands_more = await _bounded(tx, _OPEN_COMMANDS, revision)
    work, work_more = await _bounded(tx, _LIVE_WORK, revision)
    return RevisionPins(open_commands=commands, live_work=work,
                        open_commands_more=commands_more, live_work_more=work_more)


async def revision_pinned(tx: SqlTx, revision: int) -> bool:
    """Whether any unsettled work is pinned to ``revision`` (one index entry each)."""
    for where in (_OPEN_COMMANDS, _LIVE_WORK):
        if await tx.fetchall(f"SELECT 1 {where} LIMIT 1", (revision,)):
            return True
    return False


def pins_text(pins: RevisionPins) -> str:
    """The refusal's figures, such as ``3 open commands, 1000+ live work items`` (a count
    that stopped at the limit says so)."""
    return (f"{pins.open_commands}{'+' if pins.open_commands_more else ''} open commands,"
            f" {pins.live_work}{'+' if pins.live_work_more else ''} live work items")


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
            if await revision_pinned(tx, revision):
                pins = await revision_pins(tx, revision)  # only for the refusal's figures
                raise RevisionConflict(
                    f"catalog revision {revision} still has unsettled work pinned to it"
                    f" ({pins_text(pins)}); settle or retire them first")
            await tx.execute("DELETE FROM catalog_revisions WHERE revision = ? AND digest = ?",
                             (revision, existing.digest))
            await _audit(tx, "catalog.delete", revision, actor, role, reason,
                         {"revision": revision, "digest": existing.digest}, {}, now_us)
            return existing

        return await self.db.transact(body, name="catalog.delete")

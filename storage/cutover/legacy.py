"""Legacy outcome receipts and their durable projector (seed 11.1).

Theory of operation
-------------------
The legacy owner writes one versioned :class:`LegacyOutcomeReceipt` in the same
transaction as its terminal transition of a fenced item
(:func:`legacy_receipt_write`, called inside its own transaction). Receipts
are facts: a second write of the same receipt is a no-op; a different receipt
for the same item and fence is kept beside it.

The projector takes unprojected receipts oldest first and, per receipt, in one
transaction moves the matching ``awaiting_legacy_outcome`` row to
``reconciled_legacy_terminal`` with the receipt's version and digest and marks
the receipt projected. A crash anywhere leaves the receipt unprojected, so the
next run converges. The same receipt again projects as ``duplicate``; an item
with two different receipts, or a receipt that names another fence, is a
``conflict``: the row (if still awaiting) becomes ``legacy_outcome_unknown``,
which is non-executable and blocks re-cutover, as every conflicting receipt
does. :meth:`LegacyOutcomes.legacy_fence_close` is the legacy owner's (or an
operator's) word that the fence is done: rows still awaiting with no receipt
then have a *missing* outcome and become ``legacy_outcome_unknown`` too.
"""

from __future__ import annotations

import attrs

from storage.cutover.values import FenceProgress
from storage.idgen import new_ulid
from storage.port import Database, DuplicateKey, SqlTx

PROJECTED = ("reconciled", "duplicate", "conflict")


@attrs.frozen
class LegacyOutcomeReceipt:
    work_id: str
    fence_id: str
    version: int
    digest: str
    outcome: str  # the legacy owner's terminal outcome (succeeded, dead, ...)


@attrs.frozen
class ProjectionReport:
    reconciled: int = 0
    duplicate: int = 0
    conflict: int = 0

    @property
    def projected(self) -> int:
        return self.reconciled + self.duplicate + self.conflict


async def legacy_receipt_write(tx: SqlTx, receipt: LegacyOutcomeReceipt, now_us: int) -> bool:
    """Inside the legacy owner's terminal transaction: record its receipt.
    False when exactly this receipt was already recorded (idempotent)."""
    try:
        await tx.execute(
            "INSERT INTO legacy_outcome_receipts (receipt_id, work_id, fence_id, version,"
            " digest, outcome, written_at_us, projection, projected_at_us)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, NULL, NULL)",
            (new_ulid(now_us), receipt.work_id, receipt.fence_id, receipt.version,
             receipt.digest, receipt.outcome, now_us))
    except DuplicateKey:
        return False
    return True


async def _project_one(tx: SqlTx, receipt_id: str, now_us: int) -> str | None:
    # Take the receipt first (row-locked until COMMIT): a projector in every
    # replica may run; only one projects each receipt, the others skip it.
    if not await tx.execute(
        "UPDATE legacy_outcome_receipts SET projected_at_us = ?"
        " WHERE receipt_id = ? AND projected_at_us IS NULL", (now_us, receipt_id)):
        return None
    rows = await tx.fetchall(
        "SELECT work_id, fence_id, version, digest FROM legacy_outcome_receipts"
        " WHERE receipt_id = ?", (receipt_id,))
    work_id, fence_id, version, digest = (str(rows[0][0]), str(rows[0][1]), int(rows[0][2]),
                                          str(rows[0][3]))
    distinct = await tx.fetchall(
        "SELECT COUNT(*) FROM legacy_outcome_receipts WHERE work_id = ? AND fence_id = ?",
        (work_id, fence_id))
    projection = "conflict"
    if int(distinct[0][0]) == 1 and await tx.execute(
        "UPDATE work_items SET state = 'reconciled_legacy_terminal',"
        " legacy_outcome_receipt_version = ?, legacy_outcome_receipt_digest = ?,"
        " terminal_outcome = 'reconciled_legacy_terminal', row_version = row_version + 1,"
        " updated_at_us = ? WHERE work_id = ? AND state = 'awaiting_legacy_outcome'"
        " AND rollback_execution_fence_id = ?",
        (version, digest, now_us, work_id, fence_id)):
        projection = "reconciled"
    else:
        row = await tx.fetchall(
            "SELECT state, rollback_execution_fence_id, legacy_outcome_receipt_version,"
            " legacy_outcome_receipt_digest FROM work_items WHERE work_id = ?", (work_id,))
        same = (bool(row) and row[0][0] == "reconciled_legacy_terminal"
                and row[0][1] == fence_id and row[0][2] is not None
                and int(row[0][2]) == version and row[0][3] == digest)
        if same and int(distinct[0][0]) == 1:
            projection = "duplicate"
        else:
            # Two outcomes for one item, or a receipt for a fence the row is not
            # under: the legacy outcome is ambiguous. A fenced row still waiting
            # is quarantined; a terminal row is never reopened (the conflicting
            # receipts themselves block re-cutover).
            await tx.execute(
                "UPDATE work_items SET state = 'legacy_outcome_unknown',"
                " row_version = row_version + 1, updated_at_us = ?"
                " WHERE work_id = ? AND state = 'awaiting_legacy_outcome'",
                (now_us, work_id))
            await tx.execute(
                "UPDATE legacy_outcome_receipts SET projection = 'conflict'"
                " WHERE work_id = ? AND fence_id = ? AND projected_at_us IS NOT NULL",
                (work_id, fence_id))
    await tx.execute(
        "UPDATE legacy_outcome_receipts SET projection = ? WHERE receipt_id = ?",
        (projection, receipt_id))
    return projection


class LegacyOutcomes:
    """Legacy receipts and the projector (mixed into ``WorkStore``)."""

    db: Database

    async def legacy_receipt_record(self, receipt: LegacyOutcomeReceipt, now_us: int) -> bool:
        """:func:`legacy_receipt_write` in its own transaction (tests, repair tools)."""

        async def body(tx: SqlTx) -> bool:
            return await legacy_receipt_write(tx, receipt, now_us)

        return await self.db.transact(body, name="legacy.receipt")

    async def legacy_project(self, now_us: int, limit: int = 100) -> ProjectionReport:
        """Project up to ``limit`` unprojected receipts, one transaction each."""

        async def pending(tx: SqlTx) -> list[str]:
            rows = await tx.fetchall(
                "SELECT receipt_id FROM legacy_outcome_receipts WHERE projected_at_us IS NULL"
                " ORDER BY receipt_id LIMIT ?", (limit,))
            return [str(r[0]) for r in rows]

        counts = {p: 0 for p in PROJECTED}
        for receipt_id in await self.db.transact(pending, name="legacy.pending",
                                                 write=False):
            async def body(tx: SqlTx, rid: str = receipt_id) -> str | None:
                return await _project_one(tx, rid, now_us)

            done = await self.db.transact(body, name="legacy.project")
            if done is not None:
                counts[done] += 1
        return ProjectionReport(**counts)

    async def legacy_fence_close(self, fence_id: str, now_us: int) -> int:
        """The fence is done: project what arrived, then every row still awaiting
        under it has a missing outcome (-> ``legacy_outcome_unknown``)."""
        while (await self.legacy_project(now_us)).projected:
            pass

        async def body(tx: SqlTx) -> int:
            return await tx.execute(
                "UPDATE work_items SET state = 'legacy_outcome_unknown',"
                " row_version = row_version + 1, updated_at_us = ?"
                " WHERE rollback_execution_fence_id = ? AND state = 'awaiting_legacy_outcome'"
                " AND NOT EXISTS (SELECT 1 FROM legacy_outcome_receipts r"
                " WHERE r.work_id = work_items.work_id AND r.fence_id = ?)",
                (now_us, fence_id, fence_id))

        return await self.db.transact(body, name="legacy.fence_close")

    async def legacy_fence_progress(self, family: str) -> list[FenceProgress]:
        """Every rollback fence of ``family`` and how far its projection has come."""

        async def body(tx: SqlTx) -> list[FenceProgress]:
            fences = await tx.fetchall(
                "SELECT fence_id, fenced_count FROM cutover_receipts WHERE family = ?"
                " AND fence_id IS NOT NULL ORDER BY generation", (family,))
            out = []
            for fence_id, fenced in fences:
                by_state: dict[str, int] = {str(st): int(n) for st, n in await tx.fetchall(
                    "SELECT state, COUNT(*) FROM work_items"
                    " WHERE rollback_execution_fence_id = ? GROUP BY state", (fence_id,))}
                unprojected = await tx.fetchall(
                    "SELECT COUNT(*) FROM legacy_outcome_receipts WHERE fence_id = ?"
                    " AND projected_at_us IS NULL", (fence_id,))
                conflicting = await tx.fetchall(
                    "SELECT COUNT(*) FROM legacy_outcome_receipts WHERE fence_id = ?"
                    " AND projection = 'conflict'", (fence_id,))
                out.append(FenceProgress(
                    fence_id=str(fence_id), fenced=int(fenced),
                    awaiting=int(by_state.get("awaiting_legacy_outcome", 0)),
                    reconciled=int(by_state.get("reconciled_legacy_terminal", 0)),
                    unknown=int(by_state.get("legacy_outcome_unknown", 0)),
                    receipts_unprojected=int(unprojected[0][0]),
                    receipts_conflicting=int(conflicting[0][0])))
            return out

        return await self.db.transact(body, name="legacy.fence_progress", write=False)

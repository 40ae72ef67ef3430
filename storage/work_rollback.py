"""Rollback-only transitions (seed section 11.1).

A rollback to a legacy owner first drains this kernel to zero ``processing``
rows for the family and refuses while any unstarted row has dispatch history
in the effect journal (a prior or ambiguous external call), then fences every
remaining unstarted row as
``awaiting_legacy_outcome`` under one ``rollback_execution_fence_id``. The
legacy owner's terminal receipts reconcile those rows to the terminal
``reconciled_legacy_terminal`` (idempotent for the same receipt; a different
receipt for a reconciled row is a conflict), or an operator quarantines a row
as ``legacy_outcome_unknown``. Re-cutover is allowed only when no row of the
family is awaiting or unknown.
"""

from __future__ import annotations

import attrs

from daemon.core.states import WorkState
from storage.cutover.steps import fence_unstarted
from storage.port import Database, SqlTx, WorkConflict, WorkNotFound


@attrs.frozen
class LegacyReceipt:
    work_id: str
    fence_id: str
    version: int
    digest: str


class WorkRollback:
    db: Database

    async def work_rollback_fence(self, family: str, fence_id: str, now_us: int) -> int:
        """Fence every unstarted row of ``family``; refuse while any row is processing.

        Move first, then prove: the conditional UPDATE row-locks every row it
        fences (a claim's UPDATE of such a row now waits for us and then finds
        it fenced), and it waits for any row a claim has already locked and
        re-reads it (such a row is ``processing`` by then and is skipped). So
        the proof that follows, in the same transaction, sees every claim that
        could overlap the fence; any finding rolls the whole move back. Counting
        first and moving after (two decisions) let a claim commit in between.
        """

        async def body(tx: SqlTx) -> int:
            moved = await fence_unstarted(tx, family, fence_id, now_us)
            rows = await tx.fetchall(
                "SELECT COUNT(*) FROM work_items WHERE state = 'processing' AND family = ?",
                (family,),
            )
            if int(rows[0][0]):
                raise WorkConflict(
                    f"rollback blocked: {int(rows[0][0])} {family} items are processing;"
                    " drain first"
                )
            # Prior dispatch or an ambiguous outcome blocks rollback: a legacy owner
            # could not know what this kernel already sent.
            dispatched = 0
            for join in ("e.work_id = w.work_id",
                         "w.subject_kind = 'command' AND e.command_id = w.subject_id"):
                found = await tx.fetchall(
                    "SELECT COUNT(*) FROM work_items w JOIN effect_attempts e ON " + join
                    + " WHERE w.rollback_execution_fence_id = ?"
                    " AND w.state = 'awaiting_legacy_outcome'",
                    (fence_id,),
                )
                dispatched += int(found[0][0])
            if dispatched:
                raise WorkConflict(
                    f"rollback blocked: unstarted {family} items have dispatch history"
                    " (prior or ambiguous effects); settle or repair them first"
                )
            return moved

        return await self.db.transact(body, name="work.rollback_fence")

    async def work_legacy_reconcile(self, receipt: LegacyReceipt, now_us: int) -> WorkState:
        """Project one legacy terminal receipt onto its fenced row (idempotent)."""

        async def body(tx: SqlTx) -> WorkState:
            if await tx.execute(
                "UPDATE work_items SET state = 'reconciled_legacy_terminal',"
                " legacy_outcome_receipt_version = ?, legacy_outcome_receipt_digest = ?,"
                " terminal_outcome = 'reconciled_legacy_terminal',"
                " row_version = row_version + 1, updated_at_us = ?"
                " WHERE work_id = ? AND state = 'awaiting_legacy_outcome'"
                " AND rollback_execution_fence_id = ?",
                (receipt.version, receipt.digest, now_us, receipt.work_id, receipt.fence_id),
            ):
                return WorkState.RECONCILED_LEGACY_TERMINAL
            rows = await tx.fetchall(
                "SELECT state, rollback_execution_fence_id, legacy_outcome_receipt_version,"
                " legacy_outcome_receipt_digest FROM work_items WHERE work_id = ?",
                (receipt.work_id,),
            )
            if not rows:
                raise WorkNotFound(receipt.work_id)
            state, fence_id, version, digest = rows[0]
            same = (
                state == WorkState.RECONCILED_LEGACY_TERMINAL.value
                and fence_id == receipt.fence_id
                and version is not None
                and int(version) == receipt.version
                and digest == receipt.digest
            )
            if same:
                return WorkState.RECONCILED_LEGACY_TERMINAL
            raise WorkConflict(
                f"legacy receipt for {receipt.work_id} does not match its fence or its"
                " recorded receipt"
            )

        return await self.db.transact(body, name="work.legacy_reconcile")

    async def work_legacy_unknown(self, work_id: str, fence_id: str, now_us: int) -> None:
        """Quarantine a fenced row whose legacy outcome cannot be proven."""

        async def body(tx: SqlTx) -> None:
            if not await tx.execute(
                "UPDATE work_items SET state = 'legacy_outcome_unknown',"
                " row_version = row_version + 1, updated_at_us = ?"
                " WHERE work_id = ? AND state = 'awaiting_legacy_outcome'"
                " AND rollback_execution_fence_id = ?",
                (now_us, work_id, fence_id),
            ):
                raise WorkConflict(f"work {work_id} is not awaiting a legacy outcome under"
                                   " that fence")

        await self.db.transact(body, name="work.legacy_unknown")

    async def work_cutover_blockers(self, family: str) -> int:
        """Rows that block re-cutover: awaiting or unknown legacy outcomes."""

        async def body(tx: SqlTx) -> int:
            rows = await tx.fetchall(
                "SELECT COUNT(*) FROM work_items WHERE family = ? AND state IN"
                " ('awaiting_legacy_outcome', 'legacy_outcome_unknown')",
                (family,),
            )
            return int(rows[0][0])

        return await self.db.transact(body, name="work.cutover_blockers", write=False)

"""The execution journal: one ``work_executions`` row per execution (ownership epoch).

A finalization journals its execution in its own transaction, with the state it
produced as the outcome. An execution that never finalized (its replica was
killed, hung or partitioned) is journaled by whoever supersedes its lease: the
claim that reclaims it (or moves it to dead, attempts spent) writes outcome
``lease_lost`` with the previous owner as ``replica`` and itself as
``reclaimed_by``, in the same transaction as the reclaim. So the journal holds
every execution a lease was ever granted for, except one running now. A claim
given back unstarted by a drain (``release``) is not journaled; one deferred until
a known time (no quota slot before then) is, as outcome ``deferred`` with its
``reason``, so that every wait is visible.

The primary key is (work id, epoch): an entry already there (a finalize
repeated after an unknown COMMIT) is the same fact and is skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from storage.history import count_executions
from storage.port import Database, DuplicateKey, Execution, ExecutionSummary, OutcomeCount, SqlTx

LEASE_LOST = "lease_lost"
# A claim given back unstarted until a known time (its attempt refunded; the row
# is pending again): journaled so that operators see every wait, with its reason.
DEFERRED = "deferred"

_JOURNAL_SQL = (
    "INSERT INTO work_executions (work_id, ownership_epoch, family, attempt, replica,"
    " outcome, finished_at_us, reclaimed_by, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def journal_entry(work_id: str, epoch: int, family: str, attempt: int, replica: str,
                  outcome: str, finished_at_us: int,
                  reclaimed_by: str | None = None,
                  reason: str | None = None) -> tuple[Any, ...]:
    """One row for :func:`journal` (column order of the INSERT)."""
    return (work_id, epoch, family, attempt, replica, outcome, finished_at_us, reclaimed_by,
            reason)


async def journal(tx: SqlTx, entries: Sequence[tuple[Any, ...]]) -> None:
    """Journal executions inside the caller's transaction; repeats are skipped. The
    console's history rollup counts the new rows in the same transaction."""
    if not entries:
        return
    try:
        await tx.executemany(_JOURNAL_SQL, entries)
    except DuplicateKey:
        added = []
        for entry in entries:
            try:
                await tx.execute(_JOURNAL_SQL, entry)
            except DuplicateKey:
                continue
            added.append(entry)
        entries = added
    await count_executions(tx, entries)


class WorkExecutions:
    """Journal reads of the work store (mixed into ``WorkStore``)."""

    db: Database

    async def work_executions(self, work_id: str) -> list[Execution]:
        """Every journaled execution of one item, oldest epoch first."""

        async def body(tx: SqlTx) -> list[Execution]:
            rows = await tx.fetchall(
                "SELECT work_id, ownership_epoch, attempt, replica, outcome, finished_at_us,"
                " reclaimed_by, reason FROM work_executions WHERE work_id = ?"
                " ORDER BY ownership_epoch",
                (work_id,),
            )
            return [
                Execution(str(a), int(b), int(c), str(d), str(e), int(f),
                          str(g) if g is not None else None,
                          str(h) if h is not None else None)
                for a, b, c, d, e, f, g, h in rows
            ]

        return await self.db.transact(body, name="work.executions", write=False)

    async def work_execution_totals(self, family: str) -> tuple[int, int]:
        """(execution rows, distinct work ids) that *succeeded* for one family."""

        async def body(tx: SqlTx) -> tuple[int, int]:
            rows = await tx.fetchall(
                "SELECT COUNT(*), COUNT(DISTINCT work_id) FROM work_executions"
                " WHERE family = ? AND outcome = 'succeeded'",
                (family,),
            )
            return int(rows[0][0]), int(rows[0][1])

        return await self.db.transact(body, name="work.execution_totals", write=False)

    async def work_execution_summary(self, family: str) -> ExecutionSummary:
        """Every execution of one family, by outcome (``lease_lost`` included)."""

        async def body(tx: SqlTx) -> ExecutionSummary:
            by_outcome = {
                str(o): int(n) for o, n in await tx.fetchall(
                    "SELECT outcome, COUNT(*) FROM work_executions WHERE family = ?"
                    " GROUP BY outcome",
                    (family,),
                )
            }
            ((items,),) = await tx.fetchall(
                "SELECT COUNT(DISTINCT work_id) FROM work_executions WHERE family = ?",
                (family,),
            )
            ((succeeded,),) = await tx.fetchall(
                "SELECT COUNT(DISTINCT work_id) FROM work_executions"
                " WHERE family = ? AND outcome = 'succeeded'",
                (family,),
            )
            return ExecutionSummary(executions=sum(by_outcome.values()), items=int(items),
                                    succeeded_items=int(succeeded), by_outcome=by_outcome)

        return await self.db.transact(body, name="work.execution_summary", write=False)

    async def work_outcome_counts(self, since_us: int, until_us: int) -> list[OutcomeCount]:
        """Executions finished in ``[since_us, until_us)`` per family and outcome (cluster-wide)."""

        async def body(tx: SqlTx) -> list[OutcomeCount]:
            rows = await tx.fetchall(
                "SELECT family, outcome, COUNT(*) FROM work_executions"
                " WHERE finished_at_us >= ? AND finished_at_us < ? GROUP BY family, outcome",
                (since_us, until_us),
            )
            return [OutcomeCount(str(f), str(o), int(n)) for f, o, n in rows]

        return await self.db.transact(body, name="work.outcome_counts", write=False)

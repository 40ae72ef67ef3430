"""A legacy claimant described by SQL: the adapter an operator configures.

Theory of operation
-------------------
The legacy owner's tables live in the same database as integrationd's. The
operator declares (``[[legacy_claimants]]``, ``adapter = "sql"``) the statements
that answer the port's questions (:class:`storage.cutover.values.LegacyClaimant`),
each with ``:family`` where the family goes:

* ``lock_sql`` (an UPDATE) runs first, inside the cutover step's transaction, and
  touches every legacy row that is live (pending or claimed). It row-locks them
  on MySQL-family servers and takes the writer lock on SQLite, waiting for any a
  legacy claim holds, so the counts below and the step are one decision: no
  legacy claim commits unseen between them.
* ``processing_sql`` and ``uncovered_sql``: one row, one integer each (the
  legacy owner's active claims and leases; its eligible items no WorkItem covers).
* ``processes_sql`` and ``open_claims_sql`` (optional): one column of names each
  (its live claim-capable processes; its claim transactions still open).

A statement that answers out of shape is a :class:`LegacyClaimantError` naming
its key. :meth:`SqlLegacyClaimant.verify` runs every statement once, each in a
transaction it rolls back, and names the key of one the database refuses
(``check-config --connect`` and every cutover step call it first): the adapter
is wrong, not the database, and the operator hears which statement.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

import attrs

from storage.cutover.values import LegacyClaimantError, LegacyProof
from storage.port import Database, Row, SqlTx, StorageError

FAMILY_PARAM = re.compile(r":family\b")
# Statement keys, in the order they run.
COUNTS = ("processing_sql", "uncovered_sql")
NAMES = ("processes_sql", "open_claims_sql")


def bind_family(sql: str) -> tuple[str, int]:
    """``sql`` with each ``:family`` as ``?``, and how many there were."""
    return FAMILY_PARAM.sub("?", sql), len(FAMILY_PARAM.findall(sql))


class _DryRun(Exception):
    """Rolls back :meth:`SqlLegacyClaimant.verify`'s transaction."""


@attrs.frozen
class SqlLegacyClaimant:
    """The port over configured statements (``name``: its configuration key)."""

    name: str
    family: str
    lock_sql: str
    processing_sql: str
    uncovered_sql: str
    processes_sql: str = ""
    open_claims_sql: str = ""

    def _key(self, field: str) -> str:
        return f"{self.name}.{field}"

    async def _rows(self, tx: SqlTx, field: str, family: str) -> list[Row]:
        sql, n = bind_family(getattr(self, field))
        return await tx.fetchall(sql, (family,) * n)

    async def _count(self, tx: SqlTx, field: str, family: str) -> int:
        rows = await self._rows(tx, field, family)
        if len(rows) != 1 or len(rows[0]) != 1 or not _is_count(rows[0][0]):
            raise LegacyClaimantError(self._key(field), "expected one row with one count,"
                                      f" got {len(rows)} rows")
        return int(rows[0][0])

    async def _names(self, tx: SqlTx, field: str, family: str) -> tuple[str, ...]:
        if not getattr(self, field):
            return ()
        rows = await self._rows(tx, field, family)
        if any(len(r) != 1 for r in rows):
            raise LegacyClaimantError(self._key(field), "expected one column (a name per row)")
        return tuple(sorted(str(r[0]) for r in rows))

    async def _lock(self, tx: SqlTx, family: str) -> None:
        sql, n = bind_family(self.lock_sql)
        await tx.execute(sql, (family,) * n)

    async def legacy_proof(self, tx: SqlTx, family: str) -> LegacyProof:
        await self._lock(tx, family)
        return LegacyProof(
            processing=await self._count(tx, "processing_sql", family),
            uncovered=await self._count(tx, "uncovered_sql", family),
            processes=await self._names(tx, "processes_sql", family),
            open_claims=await self._names(tx, "open_claims_sql", family))

    async def verify(self, db: Database) -> None:
        """Run every statement once, each in a transaction of its own that is rolled
        back, so that a failing one is named by its key."""
        steps = {"lock_sql": self._lock, "processing_sql": self._count_of("processing_sql"),
                 "uncovered_sql": self._count_of("uncovered_sql"),
                 "processes_sql": self._names_of("processes_sql"),
                 "open_claims_sql": self._names_of("open_claims_sql")}
        for field, run in steps.items():
            async def body(tx: SqlTx, run: _Step = run) -> None:
                await run(tx, self.family)
                raise _DryRun

            try:
                await db.transact(body, name="cutover.legacy_verify")
            except _DryRun:
                continue
            except StorageError as exc:
                if _waiting_fixes(exc):
                    raise
                raise LegacyClaimantError(self._key(field), _said(exc)) from None

    def _count_of(self, field: str) -> _Step:
        async def run(tx: SqlTx, family: str) -> None:
            await self._count(tx, field, family)
        return run

    def _names_of(self, field: str) -> _Step:
        async def run(tx: SqlTx, family: str) -> None:
            await self._names(tx, field, family)
        return run


_Step = Callable[[SqlTx, str], Awaitable[None]]


def _is_count(value: object) -> bool:
    try:
        return int(str(value)) >= 0
    except ValueError:
        return False


def _waiting_fixes(exc: StorageError) -> bool:
    """Errors of the database, not of the adapter's statements (re-raised as they are)."""
    from storage.port import (
        CommitOutcomeUnknown,
        DatabaseUnavailable,
        RetriesExhausted,
        RetryableConflict,
    )

    return isinstance(exc, DatabaseUnavailable | CommitOutcomeUnknown | RetryableConflict
                      | RetriesExhausted)


def _said(exc: StorageError) -> str:
    """The database's own words, on one line."""
    return " ".join(str(exc).split())

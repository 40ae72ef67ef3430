"""Side writes of many finalizations coalesced into one statement per kind of row.

Theory of operation
-------------------
A batch of finalizations (``WorkStore.work_finalize_if_owner``) runs every item's side
writes after the fence UPDATE proved the item's claim: an effect's outcome, its
settlement, its receipt and the receipt's WorkItem; a receipt's confirmation. Written row
at a time that is four or five statements per effect, each a round trip. On the
optimistic path (no item's writes have failed yet) the writes that can wait go through a
:class:`Coalescing` transaction instead: each is *deferred* (its row queued under its
kind) and answered as if it matched its one row, and :meth:`Coalescing.flush` writes
each kind's rows in one statement (a multi-row INSERT, an UPDATE that sets each row's
values with ``CASE``), with the same guards in its WHERE clause, then checks that the
statement matched every row it was given.

Nothing is weakened by answering early: a statement that matched fewer rows than were
deferred into it (a guard that did not hold, a duplicate key) raises
:class:`~storage.port.WorkConflict`, a :class:`~storage.port.StorageError`, so the whole
optimistic transaction rolls back and the finalization runs again *isolated*, each item
under its own savepoint, with the row-at-a-time writes and their exact errors (that path
never coalesces). Statement order is kept where it could matter: any statement that is
not deferred (a read, a write of another shape) first flushes everything deferred, so it
sees every earlier write; deferred writes are only grouped among themselves, each kind
in the order its first row came, each kind's rows in their own order (writes to
different rows, or guarded writes of which at most one matches, commute).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from storage.port import Row, SqlTx, WorkConflict

# Rows per coalesced UPDATE (its CASE lists grow with it; a bigger batch is cut).
UPDATE_CHUNK = 100


@attrs.frozen
class RowUpdate:
    """The shape of a guarded single-row UPDATE: ``UPDATE table SET c = ?, ... WHERE
    key = ? AND guard``. ``guard`` (with ``guard_params``, the same for every row of a
    statement) is the row-at-a-time statement's own condition. ``checked``: the
    statement must match each of its rows (the row-at-a-time caller raised otherwise)."""

    table: str
    key: str
    columns: tuple[str, ...]
    guard: str = ""
    guard_params: tuple[Any, ...] = ()
    # Fixed assignments, the same for every row (``row_version = row_version + 1``).
    fixed: str = ""
    checked: bool = True


def update_statement(shape: RowUpdate, rows: Sequence[tuple[Any, ...]]
                     ) -> tuple[str, tuple[Any, ...]]:
    """One UPDATE for ``rows`` (each ``(key, *values)``): a column whose value is the same
    in every row is set once; the others with ``CASE key WHEN ? THEN ? ... END``."""
    sets: list[str] = []
    params: list[Any] = []
    for i, column in enumerate(shape.columns, start=1):
        first = rows[0][i]
        if all(r[i] == first and type(r[i]) is type(first) for r in rows):
            sets.append(f"{column} = ?")
            params.append(first)
            continue
        sets.append(f"{column} = CASE {shape.key}"
                    + " WHEN ? THEN ?" * len(rows) + " END")
        for r in rows:
            params.extend((r[0], r[i]))
    if shape.fixed:
        sets.append(shape.fixed)
    marks = ", ".join("?" * len(rows))
    guard = f" AND {shape.guard}" if shape.guard else ""
    sql = (f"UPDATE {shape.table} SET {', '.join(sets)}"
           f" WHERE {shape.key} IN ({marks}){guard}")
    return sql, (*params, *(r[0] for r in rows), *shape.guard_params)


@attrs.define(eq=False)
class Coalescing:
    """A transaction whose deferrable writes wait for :meth:`flush` (see the module)."""

    tx: SqlTx
    # Insertion-ordered: each kind is flushed in the order its first row came.
    _pending: dict[str | RowUpdate, list[tuple[Any, ...]]] = attrs.field(factory=dict)

    def insert(self, sql: str, row: tuple[Any, ...]) -> None:
        """Defer a one-row ``INSERT ... VALUES (...)`` (all rows of ``sql`` go in one
        multi-row INSERT; a duplicate key fails them all)."""
        self._pending.setdefault(sql, []).append(row)

    def update(self, shape: RowUpdate, key: Any, values: Sequence[Any]) -> None:
        """Defer ``shape``'s UPDATE of the row ``key`` to ``values`` (one per column)."""
        if len(values) != len(shape.columns):
            raise ValueError(f"{len(shape.columns)} values expected, got {len(values)}")
        self._pending.setdefault(shape, []).append((key, *values))

    async def flush(self) -> None:
        pending, self._pending = self._pending, {}
        for kind, rows in pending.items():
            if isinstance(kind, str):
                matched = await self.tx.executemany(kind, rows)
                if matched != len(rows):
                    raise WorkConflict(f"a batched INSERT wrote {matched} of {len(rows)} rows")
                continue
            for start in range(0, len(rows), UPDATE_CHUNK):
                chunk = rows[start:start + UPDATE_CHUNK]
                matched = await self.tx.execute(*update_statement(kind, chunk))
                if kind.checked and matched != len(chunk):
                    raise WorkConflict(f"a batched UPDATE of {kind.table} matched {matched}"
                                       f" of {len(chunk)} rows")

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        await self.flush()
        return await self.tx.execute(sql, params)

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        await self.flush()
        return await self.tx.executemany(sql, rows)

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        await self.flush()
        return await self.tx.fetchall(sql, params)


def coalescing(tx: SqlTx) -> Coalescing | None:
    """The coalescing transaction ``tx`` is, if it is one (writes may be deferred)."""
    return tx if isinstance(tx, Coalescing) else None

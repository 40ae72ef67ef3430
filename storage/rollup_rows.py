"""One counter of a history read model at all its levels, in one statement when it can.

Theory of operation
-------------------
The history rollups (``history_flow``, ``history_quota``) keep a count per (level,
bucket, key, shard) at the minute, hour and day levels (:data:`storage.history.LEVELS_US`;
``history_rollup`` also at five minutes and six hours, ``EXECUTION_LEVELS_US``, migration
0049). Adding ``n`` to one key is one ``UPDATE`` of its rows, one per level (an ``OR`` of
whole primary keys: point lookups, no range over other keys' rows, so it locks only
those rows). It matches them all in the steady state: one statement per fact.

When it matches fewer, which rows were there follows from an invariant of every writer:
a row is only ever created together with its coarser levels (a writer inserts the
levels that are missing, in one transaction; a rebuild deletes and rewrites whole days,
every level). So a minute row implies its hour and day rows, and an hour row its day
row: ``k`` rows matched means the ``k`` coarsest levels were there (and are counted).
The missing finer levels are inserted; an ``INSERT`` that meets a row a concurrent
transaction inserted first (``DuplicateKey``) adds to it instead. Every level is thus
counted exactly once, on every backend.
"""

from __future__ import annotations

from collections.abc import Sequence

from storage.history import LEVELS_US, bucket_of
from storage.port import DuplicateKey, SqlTx


async def add_at_levels(tx: SqlTx, table: str, columns: Sequence[str],
                        values: Sequence[object], at_us: int, n: int,
                        count: str = "n",
                        also: Sequence[tuple[str, object]] = (),
                        levels: Sequence[int] = LEVELS_US) -> None:
    """Add ``n`` to the rows of ``table`` keyed by ``columns = values`` (the shard among
    them) at ``at_us``'s bucket of each of ``levels`` (finest first: minute, hour and day
    by default), inside the caller's transaction; ``also`` sets further columns of those
    rows to the values given (the same statements)."""
    key = " AND ".join(f"{c} = ?" for c in columns)
    one = f"(level_us = ? AND bucket_us = ? AND {key})"
    rows = [(level, bucket_of(at_us, level), *values) for level in levels]
    sets = "".join(f", {c} = ?" for c, _ in also)
    set_args = tuple(v for _, v in also)
    matched = await tx.execute(
        f"UPDATE {table} SET {count} = {count} + ?{sets}"
        f" WHERE {' OR '.join([one] * len(rows))}",
        (n, *set_args, *(v for row in rows for v in row)))
    # The coarsest ``matched`` levels were there: insert the finer ones, coarse first.
    extra = "".join(f", {c}" for c, _ in also)
    marks = ", ".join("?" for _ in (*columns, *also))
    for row in reversed(rows[:len(rows) - matched]):
        try:
            await tx.execute(
                f"INSERT INTO {table} ({count}, level_us, bucket_us, {', '.join(columns)}"
                f"{extra}) VALUES (?, ?, ?, {marks})", (n, *row, *set_args))
        except DuplicateKey:  # a concurrent transaction inserted it first: add to it
            await tx.execute(
                f"UPDATE {table} SET {count} = {count} + ?{sets} WHERE {one}",
                (n, *set_args, *row))

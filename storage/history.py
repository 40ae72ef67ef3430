"""The console's history read model: executions per minute, hour and day, family and
outcome.

Theory of operation
-------------------
``history_rollup`` (migration 0039) counts the ``work_executions`` rows per
(level, bucket, family, outcome), at three levels (:data:`LEVELS_US`: minute, hour,
day) so that a range of days reads hours or days, not ten thousand minutes.
:func:`count_executions` runs inside the transaction that journals them
(``storage.work_executions.journal``: finalizations, reclaims and deferrals), once per
journaling call, so a finalization batch of many items costs three statements per
(minute, family, outcome) it touches, not per item. A rollup row is
a read model (seed 5.2): nothing decides work from it, and :meth:`HistoryStore.history_rebuild`
recomputes it from the journal rows.

Hot path: the increment is a plain conditional ``UPDATE ... SET executions =
executions + ?`` (portable: no ``ON DUPLICATE KEY``/``ON CONFLICT``, design.md section 5),
then an ``INSERT`` when no row matched, then the ``UPDATE`` again when a concurrent
transaction inserted first (``DuplicateKey``). Each journaling transaction picks one of
:data:`SHARDS` rows per key (from its first work id), so replicas finishing the same
family and outcome in the same minute mostly lock different rows; readers sum the shards.

The journal has a retention horizon; the rollup does not. A rebuild therefore replaces
whole days from the first whole day of journal rows still kept (or a day the operator
names), and leaves older buckets as they are (they can no longer be recomputed, and
they were counted when the rows existed).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import attrs

from storage.port import Database, DuplicateKey, SqlTx

BUCKET_US = 60_000_000
HOUR_US = 3_600_000_000
DAY_US = 86_400_000_000
LEVELS_US = (BUCKET_US, HOUR_US, DAY_US)
SHARDS = 4

# Column positions in storage.work_executions.journal_entry rows.
_WORK_ID, _FAMILY, _OUTCOME, _FINISHED = 0, 2, 5, 6

_INCREMENT = ("UPDATE history_rollup SET executions = executions + ?"
              " WHERE level_us = ? AND bucket_us = ? AND family = ? AND outcome = ?"
              " AND shard = ?")
_INSERT = ("INSERT INTO history_rollup (executions, level_us, bucket_us, family, outcome,"
           " shard) VALUES (?, ?, ?, ?, ?, ?)")


def bucket_of(at_us: int, level_us: int = BUCKET_US) -> int:
    """The first microsecond of ``at_us``'s minute (or hour, or day)."""
    return at_us - at_us % level_us


def level_for(step_us: int) -> int:
    """The coarsest level whose buckets tile a step of ``step_us``."""
    return max(level for level in LEVELS_US if step_us % level == 0)


def step_range(since_us: int, until_us: int, step_us: int, column: str,
               value: str | None) -> tuple[str, tuple[Any, ...]]:
    """A rollup's WHERE clause and arguments for steps of ``step_us`` in
    ``[since_us, until_us)``: an index range on its primary key (level, then bucket) at
    the coarsest level that tiles the step, and ``column = value`` when a value is given.
    The arguments begin with the step, for the ``bucket_us - (bucket_us % ?)`` it
    selects by."""
    if step_us <= 0 or step_us % BUCKET_US:
        raise ValueError("step_us must be a positive multiple of a minute")
    level = level_for(step_us)
    where = "level_us = ? AND bucket_us >= ? AND bucket_us < ?"
    args: tuple[Any, ...] = (step_us, level, bucket_of(since_us, level), until_us)
    if value is not None:
        where += f" AND {column} = ?"
        args += (value,)
    return where, args


async def per_hour(tx: SqlTx, select: str, start: int, end: int) -> list[tuple[Any, ...]]:
    """The rows of ``select`` (a per-minute ``GROUP BY`` over ``[?, ?)``, after the
    minute's length) for ``[start, end)``, one hour per statement: a rebuild's grouping
    never spans more than an hour of rows (the 20M-row load's single ``GROUP BY`` over
    every execution died in MariaDB's on-disk temporary table after 14 min)."""
    rows: list[tuple[Any, ...]] = []
    for hour in range(start, end, HOUR_US):
        rows += [tuple(r) for r in await tx.fetchall(select,
                                                    (BUCKET_US, hour, min(end, hour + HOUR_US)))]
    return rows


def shard_of(work_id: str) -> int:
    return zlib.crc32(work_id.encode()) % SHARDS


async def count_executions(tx: SqlTx, entries: Sequence[Sequence[Any]]) -> None:
    """Add newly journaled executions to the rollup, inside the journaling transaction."""
    if not entries:
        return
    shard = shard_of(str(entries[0][_WORK_ID]))
    counts: dict[tuple[int, int, str, str], int] = {}
    for entry in entries:
        at, family, outcome = int(entry[_FINISHED]), str(entry[_FAMILY]), str(entry[_OUTCOME])
        for level in LEVELS_US:
            key = (level, bucket_of(at, level), family, outcome)
            counts[key] = counts.get(key, 0) + 1
    # One order for every writer: two transactions never wait on each other's rows in turn.
    for (level, bucket, family, outcome), n in sorted(counts.items()):
        await _add(tx, (n, level, bucket, family, outcome, shard))


async def _add(tx: SqlTx, row: tuple[int, int, int, str, str, int]) -> None:
    if await tx.execute(_INCREMENT, row):
        return
    try:
        await tx.execute(_INSERT, row)
    except DuplicateKey:  # another transaction inserted the row first: add to it
        await tx.execute(_INCREMENT, row)


@attrs.frozen
class HistoryPoint:
    """Executions of one family that ended in one outcome in ``[at_us, at_us + step)``."""

    at_us: int
    family: str
    outcome: str
    executions: int


@attrs.frozen
class HistoryExecution:
    """One journaled execution (the items behind a point)."""

    work_id: str
    ownership_epoch: int
    family: str
    attempt: int
    replica: str
    outcome: str
    finished_at_us: int


class HistoryStore:
    """History reads and the rebuild (mixed into ``WorkStore``)."""

    db: Database

    async def history_outcomes(self, since_us: int, until_us: int, step_us: int,
                               family: str | None = None) -> list[HistoryPoint]:
        """Executions per ``step_us`` bucket (a multiple of a minute) in
        ``[since_us, until_us)``, per family and outcome, cluster-wide, from the rollup's
        coarsest level that tiles the step (a step of hours reads hours)."""
        where, args = step_range(since_us, until_us, step_us, "family", family)

        async def body(tx: SqlTx) -> list[HistoryPoint]:
            rows = await tx.fetchall(
                "SELECT bucket_us - (bucket_us % ?) AS step_at, family, outcome,"
                f" SUM(executions) FROM history_rollup WHERE {where}"
                " GROUP BY step_at, family, outcome ORDER BY step_at, family, outcome",
                args,
            )
            return [HistoryPoint(int(a), str(f), str(o), int(n)) for a, f, o, n in rows]

        return await self.db.transact(body, name="history.outcomes", write=False)

    async def history_executions(self, since_us: int, until_us: int, *, family: str | None,
                                 outcome: str | None, limit: int) -> list[HistoryExecution]:
        """The journaled executions behind a point, newest first, at most ``limit``."""
        where = "finished_at_us >= ? AND finished_at_us < ?"
        args: tuple[Any, ...] = (since_us, until_us)
        if family is not None:
            where += " AND family = ?"
            args += (family,)
        if outcome is not None:
            where += " AND outcome = ?"
            args += (outcome,)

        async def body(tx: SqlTx) -> list[HistoryExecution]:
            rows = await tx.fetchall(
                "SELECT work_id, ownership_epoch, family, attempt, replica, outcome,"
                f" finished_at_us FROM work_executions WHERE {where}"
                # The order of work_executions_finished (finished_at_us, family, then the
                # primary key), read backwards: the newest rows, never a sort of the span.
                " ORDER BY finished_at_us DESC, family DESC, work_id DESC,"
                " ownership_epoch DESC LIMIT ?",
                (*args, limit),
            )
            return [HistoryExecution(str(w), int(e), str(f), int(a), str(r), str(o), int(t))
                    for w, e, f, a, r, o, t in rows]

        return await self.db.transact(body, name="history.executions", write=False)

    async def history_rebuild(self, since_us: int | None = None, batch_days: int = 1) -> int:
        """Recompute the rollup from the journal rows, whole days at a time, from the day of
        ``since_us`` (default: the first whole day of rows still kept); the rows written.

        Days before are kept (retention removed their rows, or the operator left them).
        One transaction per ``batch_days``, so a long journal never makes one huge
        transaction, and one grouping statement per hour of rows in it
        (:func:`per_hour`); a finalization racing a rebuild of its own day is counted
        once: the rebuild's delete and recount of a day run in one transaction, which
        takes the rollup rows' locks (MariaDB) or the write lock (SQLite) before it
        counts.
        """

        async def bounds(tx: SqlTx) -> tuple[int | None, int | None]:
            ((low, high),) = await tx.fetchall(
                "SELECT MIN(finished_at_us), MAX(finished_at_us) FROM work_executions")
            return (None if low is None else int(low), None if high is None else int(high))

        low, high = await self.db.transact(bounds, name="history.rebuild_bounds", write=False)
        if low is None or high is None:
            return 0
        if since_us is not None:
            start = bucket_of(since_us, DAY_US)
        else:
            # The oldest kept row's day may have lost older rows to retention: it keeps its
            # maintained counts, unless the row opens the day.
            start = low if low % DAY_US == 0 else bucket_of(low, DAY_US) + DAY_US
        written = 0
        while start <= high:
            end = start + batch_days * DAY_US

            async def body(tx: SqlTx, start: int = start, end: int = end) -> int:
                await tx.execute(
                    "DELETE FROM history_rollup WHERE level_us IN (?, ?, ?)"
                    " AND bucket_us >= ? AND bucket_us < ?", (*LEVELS_US, start, end))
                counts: dict[tuple[int, int, str, str], int] = {}
                for bucket, family, outcome, n in await per_hour(
                        tx, "SELECT finished_at_us - (finished_at_us % ?) AS bucket, family,"
                        " outcome, COUNT(*) FROM work_executions"
                        " WHERE finished_at_us >= ? AND finished_at_us < ?"
                        " GROUP BY bucket, family, outcome", start, end):
                    for level in LEVELS_US:
                        key = (level, bucket_of(int(bucket), level), str(family), str(outcome))
                        counts[key] = counts.get(key, 0) + int(n)
                if counts:
                    await tx.executemany(_INSERT, [(n, *key, 0)
                                                   for key, n in sorted(counts.items())])
                return len(counts)

            written += await self.db.transact(body, name="history.rebuild", write=True)
            start = end
        return written

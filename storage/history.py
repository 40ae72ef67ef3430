"""The console's history read model: executions per minute, five minutes, hour, six
hours and day, family and outcome.

Theory of operation
-------------------
``history_rollup`` (migration 0039) counts the ``work_executions`` rows per
(level, bucket, family, outcome), at five levels (:data:`EXECUTION_LEVELS_US`: minute,
five minutes and six hours since migration 0049, hour, day) so that a range reads the
coarsest buckets that tile its step (:func:`level_for`): a 6 h range's 5-minute step
reads five-minute rows, a month's 6-hour step six-hour rows, not minutes or hours.
:func:`count_executions` runs inside the transaction that journals them
(``storage.work_executions.journal``: finalizations, reclaims and deferrals), once per
journaling call, so a finalization batch of many items costs one statement per
(minute, family, outcome, org, binding, operation) it touches, not per item. A rollup row is
a read model (seed 5.2): nothing decides work from it, and :meth:`HistoryStore.history_rebuild`
recomputes it from the journal rows.

An item of the effect family (``external_effect``) is counted under its command's org,
binding and provider operation (migration 0048), so the executions and the DLQ inflow
narrow by them as the effect path's charts do; every other family's items carry ``''``
(none). The journaling call reads them for its effect items in one statement (the work
items and their commands by primary key, :func:`effect_keys`), and only when the batch
holds an effect item.

Hot path: a key's levels are one conditional ``UPDATE`` of its five rows
(:func:`storage.rollup_rows.add_at_levels`; portable: no ``ON DUPLICATE KEY``/``ON
CONFLICT``, design.md section 5), plus an ``INSERT`` per level new in that bucket (a
new minute, five minutes, hour, six hours or day). Each journaling transaction picks
one of :data:`SHARDS` rows per key (from its first work id), so replicas finishing the
same family and outcome in the same minute mostly lock different rows; readers sum the
shards.

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

from storage.port import Database, SqlTx

BUCKET_US = 60_000_000
FIVE_MIN_US = 300_000_000
HOUR_US = 3_600_000_000
SIX_HOURS_US = 21_600_000_000
DAY_US = 86_400_000_000
# The levels of history_flow and history_quota (and of add_at_levels by default).
LEVELS_US = (BUCKET_US, HOUR_US, DAY_US)
# history_rollup's levels (migration 0049): also five minutes, which a 6 h range's
# 5-minute step (and a 10-minute one) reads instead of five times as many minute rows,
# and six hours, which the 6 and 12 h steps of custom ranges of 15 to 60 days read
# instead of six times as many hour rows (the keys of 0048 multiplied both).
EXECUTION_LEVELS_US = (BUCKET_US, FIVE_MIN_US, HOUR_US, SIX_HOURS_US, DAY_US)
SHARDS = 4
# The family whose items carry an org, binding and operation in the rollup (the
# effect runner's; storage.commands names it from here).
EFFECT_FAMILY = "external_effect"

# Column positions in storage.work_executions.journal_entry rows.
_WORK_ID, _FAMILY, _OUTCOME, _FINISHED = 0, 2, 5, 6

_KEY_COLUMNS = ("family", "outcome", "org_id", "binding_id", "operation", "shard")
_INSERT = ("INSERT INTO history_rollup (executions, level_us, bucket_us, family, outcome,"
           " org_id, binding_id, operation, shard) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
# The rebuild's per-minute counts of an hour: an effect item under its command (an
# item or command retention removed first: none, as for every other family).
_REBUILD_SELECT = (
    "SELECT e.finished_at_us - (e.finished_at_us % ?) AS bucket, e.family, e.outcome,"
    " c.org_id, c.binding_id, c.operation, COUNT(*) FROM work_executions e"
    " LEFT JOIN work_items w ON w.work_id = e.work_id AND w.subject_kind = 'command'"
    f" AND e.family = '{EFFECT_FAMILY}'"
    " LEFT JOIN external_commands c ON c.command_id = w.subject_id"
    " WHERE e.finished_at_us >= ? AND e.finished_at_us < ?"
    " GROUP BY bucket, e.family, e.outcome, c.org_id, c.binding_id, c.operation")
# An effect item's command: its org, binding and provider operation (the work item's
# subject is its command). Both by primary key.
_EFFECT_KEYS = ("SELECT w.work_id, c.org_id, c.binding_id, c.operation FROM work_items w"
                " JOIN external_commands c ON c.command_id = w.subject_id"
                " WHERE w.subject_kind = 'command' AND w.work_id IN ({marks})")
NO_KEY = ("", "", "")


def bucket_of(at_us: int, level_us: int = BUCKET_US) -> int:
    """The first microsecond of ``at_us``'s minute (or hour, or day)."""
    return at_us - at_us % level_us


def level_for(step_us: int, levels: Sequence[int] = LEVELS_US) -> int:
    """The coarsest of ``levels`` whose buckets tile a step of ``step_us``."""
    return max(level for level in levels if step_us % level == 0)


def step_range(since_us: int, until_us: int, step_us: int, column: str,
               value: str | None, levels: Sequence[int] = LEVELS_US
               ) -> tuple[str, tuple[Any, ...]]:
    """A rollup's WHERE clause and arguments for steps of ``step_us`` in
    ``[since_us, until_us)``: an index range on its primary key (level, then bucket) at
    the coarsest level that tiles the step, and ``column = value`` when a value is given.
    The arguments begin with the step, for the ``bucket_us - (bucket_us % ?)`` it
    selects by."""
    if step_us <= 0 or step_us % BUCKET_US:
        raise ValueError("step_us must be a positive multiple of a minute")
    level = level_for(step_us, levels)
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


async def effect_keys(tx: SqlTx, work_ids: Sequence[str]) -> dict[str, tuple[str, str, str]]:
    """(org, binding, operation) of each effect item among ``work_ids``: one read."""
    if not work_ids:
        return {}
    rows = await tx.fetchall(_EFFECT_KEYS.format(marks=", ".join("?" for _ in work_ids)),
                             tuple(work_ids))
    return {str(w): (str(o), str(b), str(p)) for w, o, b, p in rows}


async def count_executions(tx: SqlTx, entries: Sequence[Sequence[Any]]) -> None:
    """Add newly journaled executions to the rollup, inside the journaling transaction:
    an effect item under its command's org, binding and operation (one read for the
    batch's effect items), one statement per key in the steady state."""
    from storage.rollup_rows import add_at_levels  # it imports this module's levels

    if not entries:
        return
    shard = shard_of(str(entries[0][_WORK_ID]))
    keyed = await effect_keys(tx, sorted({str(e[_WORK_ID]) for e in entries
                                          if e[_FAMILY] == EFFECT_FAMILY}))
    counts: dict[tuple[int, str, str, str, str, str], int] = {}
    for entry in entries:
        at, family, outcome = int(entry[_FINISHED]), str(entry[_FAMILY]), str(entry[_OUTCOME])
        key = (bucket_of(at), family, outcome, *keyed.get(str(entry[_WORK_ID]), NO_KEY))
        counts[key] = counts.get(key, 0) + 1
    # One order for every writer: two transactions never wait on each other's rows in turn.
    for (minute, family, outcome, org, binding, operation), n in sorted(counts.items()):
        await add_at_levels(tx, "history_rollup", _KEY_COLUMNS,
                            (family, outcome, org, binding, operation, shard), minute, n,
                            count="executions", levels=EXECUTION_LEVELS_US)


def key_filter(org: str | None, binding: str | None, operation: str | None, *,
               prefix: str = "") -> tuple[str, tuple[str, ...]]:
    """`` AND {prefix}org_id = ?`` (and binding, operation) for each filter given, and
    their arguments: the rollups' and the commands' key columns share these names."""
    clauses, args = [], []
    for column, value in (("org_id", org), ("binding_id", binding), ("operation", operation)):
        if value is not None:
            clauses.append(f" AND {prefix}{column} = ?")
            args.append(value)
    return "".join(clauses), tuple(args)


@attrs.frozen
class ExecutionFilter:
    """The executions' filters (None: all). Org, binding and operation keep only the
    effect family's items (no other family's item carries them)."""

    family: str | None = None
    org: str | None = None
    binding: str | None = None
    operation: str | None = None

    def narrowed(self) -> bool:
        return any(v is not None for v in (self.org, self.binding, self.operation))

    def where(self, *, prefix: str = "") -> tuple[str, tuple[str, ...]]:
        keys, args = key_filter(self.org, self.binding, self.operation, prefix=prefix)
        if self.family is None:
            return keys, args
        return f" AND {prefix}family = ?{keys}", (self.family, *args)


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
                               family: str | None = None, *,
                               where: ExecutionFilter | None = None) -> list[HistoryPoint]:
        """Executions per ``step_us`` bucket (a multiple of a minute) in
        ``[since_us, until_us)``, per family and outcome, cluster-wide, from the rollup's
        coarsest level that tiles the step (a step of hours reads hours); ``where``
        narrows by org, binding and operation (the effect family's items)."""
        narrow = attrs.evolve(where or ExecutionFilter(), family=family)
        extra, extra_args = narrow.where()
        where_sql, args = step_range(since_us, until_us, step_us, "family", None,
                                     EXECUTION_LEVELS_US)

        async def body(tx: SqlTx) -> list[HistoryPoint]:
            rows = await tx.fetchall(
                "SELECT bucket_us - (bucket_us % ?) AS step_at, family, outcome,"
                f" SUM(executions) FROM history_rollup WHERE {where_sql}{extra}"
                " GROUP BY step_at, family, outcome ORDER BY step_at, family, outcome",
                (*args, *extra_args),
            )
            return [HistoryPoint(int(a), str(f), str(o), int(n)) for a, f, o, n in rows]

        return await self.db.transact(body, name="history.outcomes", write=False)

    async def history_executions(self, since_us: int, until_us: int, *, family: str | None,
                                 outcome: str | None, limit: int,
                                 where: ExecutionFilter | None = None
                                 ) -> list[HistoryExecution]:
        """The journaled executions behind a point, newest first, at most ``limit``;
        ``where`` keeps the effect items of one org, binding or operation (each row
        joined to its item and command by primary key)."""
        clauses = "e.finished_at_us >= ? AND e.finished_at_us < ?"
        args: tuple[Any, ...] = (since_us, until_us)
        if family is not None:
            clauses += " AND e.family = ?"
            args += (family,)
        if outcome is not None:
            clauses += " AND e.outcome = ?"
            args += (outcome,)
        join = ""
        if where is not None and where.narrowed():
            extra, extra_args = attrs.evolve(where, family=None).where(prefix="c.")
            join = (" JOIN work_items w ON w.work_id = e.work_id"
                    " JOIN external_commands c ON c.command_id = w.subject_id")
            clauses += " AND e.family = ? AND w.subject_kind = 'command'" + extra
            args += (EFFECT_FAMILY, *extra_args)

        # The order of work_executions_finished (finished_at_us, family, then the primary
        # key), read backwards: the newest rows, never a sort of the span. With one family
        # (a constant then) the family leaves the ORDER BY, the same order: MariaDB then
        # reads work_executions_family_finished (family, finished_at_us, outcome; 0050) in
        # order, where the family in the ORDER BY made it sort the span (or drive a
        # narrowed read from every command of the binding).
        order = ("e.finished_at_us DESC, e.work_id DESC" if family is not None or join
                 else "e.finished_at_us DESC, e.family DESC, e.work_id DESC")

        async def body(tx: SqlTx) -> list[HistoryExecution]:
            rows = await tx.fetchall(
                "SELECT e.work_id, e.ownership_epoch, e.family, e.attempt, e.replica,"
                f" e.outcome, e.finished_at_us FROM work_executions e{join} WHERE {clauses}"
                f" ORDER BY {order}, e.ownership_epoch DESC LIMIT ?",
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
                marks = ", ".join("?" for _ in EXECUTION_LEVELS_US)
                await tx.execute(
                    f"DELETE FROM history_rollup WHERE level_us IN ({marks})"
                    " AND bucket_us >= ? AND bucket_us < ?", (*EXECUTION_LEVELS_US, start, end))
                counts: dict[tuple[int, int, str, str, str, str, str], int] = {}
                for bucket, family, outcome, org, binding, operation, n in await per_hour(
                        tx, _REBUILD_SELECT, start, end):
                    for level in EXECUTION_LEVELS_US:
                        key = (level, bucket_of(int(bucket), level), str(family), str(outcome),
                               *(NO_KEY if family != EFFECT_FAMILY or org is None
                                 else (str(org), str(binding), str(operation))))
                        counts[key] = counts.get(key, 0) + int(n)
                if counts:
                    await tx.executemany(_INSERT, [(n, *key, 0)
                                                   for key, n in sorted(counts.items())])
                return len(counts)

            written += await self.db.transact(body, name="history.rebuild", write=True)
            start = end
        return written

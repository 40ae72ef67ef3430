"""The console's history of the work queue's own pressure: per family, ready, waiting and
claimed items, sampled once a minute.

Theory of operation
-------------------
``history_pressure`` (migration 0046) holds one sample a minute, cluster-wide, of how
many WorkItems of each family were

* ``ready``: ``pending`` or ``retry`` and due (``run_after_us <= now``: claimable now,
  lane holds aside),
* ``retry_wait``: ``retry`` and not yet due (a retry's backoff),
* ``held``: ``pending`` and not yet due (a quota deferral, or work scheduled later),
* ``claimed``: ``processing`` (a live or expired lease).

Why a sample, not transactional +1/-1 deltas: a delta per transition would add a write
to every enqueue, claim, finalization, retry, deferral and reclaim (the hot path),
would need a base that a rebuild cannot recover (WorkItems keep no state history), and
one lost or doubled delta would skew every later point. A sample is counted from the
WorkItems themselves (seed 5.2: pressure derives from WorkItems), so it is exact at its
moment, nothing accumulates and nothing drifts; it costs nothing on the hot path and one
bounded read a minute. What it misses: whatever happens between two samples (an item
ready for 20 s between them; a peak inside the minute), and the minutes no replica was
up to sample (drawn as gaps).

One replica a minute: every replica's sampler, at its own offset into the minute
(``daemon.core.pressure_sample``), first reads the minute's ``'*'`` row (a primary-key
lookup); when it is there another replica sampled the minute. Otherwise it counts (one
read transaction: per family, index probes of ``work_items_ready`` (state, family,
run_after), each count stopping at :data:`COUNT_CAP`) and writes the minute in one
transaction that begins with the ``INSERT`` of the ``'*'`` rows: a concurrent sampler
of the same minute gets ``DuplicateKey`` there and writes nothing. No lease: the
minute's primary key is the arbiter, and a sampler that dies mid-way leaves no row.

Hour and day rows hold the highest sample of the hour or day (``UPDATE ... SET n = ?
WHERE ... AND n < ?``, an ``INSERT`` when the row is new), so a range of days reads
hours or days; :meth:`HistoryPressureStore.history_pressure_rebuild` recomputes them
from the minute rows. The samples themselves cannot be recomputed (the WorkItems have
moved on) and need not be: each is a fact of its minute. Nothing decides work from
this table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from daemon.core.states import WorkState
from storage.history import BUCKET_US, DAY_US, HOUR_US, bucket_of, step_range
from storage.port import Database, DuplicateKey, SqlTx
from storage.work_admin import families_in

ALL = "*"
READY, RETRY_WAIT, HELD, CLAIMED = "ready", "retry_wait", "held", "claimed"
SERIES = (READY, RETRY_WAIT, HELD, CLAIMED)
# A count per (family, series) stops here (more = 1): a sample reads at most this many
# index entries per family and series, however deep the queue.
COUNT_CAP = 100_000

_INSERT = ("INSERT INTO history_pressure (level_us, bucket_us, family, series, n, more)"
           " VALUES (?, ?, ?, ?, ?, ?)")
_RAISE = ("UPDATE history_pressure SET n = ?, more = ? WHERE level_us = ? AND bucket_us = ?"
          " AND family = ? AND series = ? AND n < ?")
_SAMPLED = ("SELECT 1 FROM history_pressure WHERE level_us = ? AND bucket_us = ?"
            " AND family = ? AND series = ?")


@attrs.frozen
class PressureCount:
    """``n`` items of ``family`` in ``series`` (``more``: at least ``n``)."""

    family: str
    series: str
    n: int
    more: bool = False


@attrs.frozen
class PressurePoint:
    """The highest sample of ``family`` (or ``'*'``) and ``series`` in ``[at_us, at_us +
    step)``."""

    at_us: int
    family: str
    series: str
    n: int
    more: bool


async def _bounded(tx: SqlTx, where: str, args: Sequence[Any]) -> tuple[int, bool]:
    ((found,),) = await tx.fetchall(
        f"SELECT COUNT(*) FROM (SELECT 1 FROM work_items WHERE {where} LIMIT ?) bounded",
        (*args, COUNT_CAP + 1))
    return min(int(found), COUNT_CAP), int(found) > COUNT_CAP


async def count_pressure(tx: SqlTx, now_us: int) -> list[PressureCount]:
    """Per family with open items: ready, retry_wait, held and claimed at ``now_us``
    (zeros left out), each an index range of ``work_items_ready`` (state, family,
    run_after) read up to :data:`COUNT_CAP` entries."""
    out: list[PressureCount] = []
    families = sorted({f for state in (WorkState.PENDING, WorkState.RETRY,
                                       WorkState.PROCESSING)
                       for f in await families_in(tx, state)})
    for family in families:
        due = [await _bounded(tx, "state = ? AND family = ? AND run_after_us <= ?",
                              (state.value, family, now_us))
               for state in (WorkState.PENDING, WorkState.RETRY)]
        counts = {
            READY: (sum(n for n, _ in due), any(m for _, m in due)),
            RETRY_WAIT: await _bounded(tx, "state = ? AND family = ? AND run_after_us > ?",
                                       (WorkState.RETRY.value, family, now_us)),
            HELD: await _bounded(tx, "state = ? AND family = ? AND run_after_us > ?",
                                 (WorkState.PENDING.value, family, now_us)),
            CLAIMED: await _bounded(tx, "state = ? AND family = ?",
                                    (WorkState.PROCESSING.value, family)),
        }
        out += [PressureCount(family, s, n, more) for s, (n, more) in counts.items() if n]
    return out


def with_totals(counts: Sequence[PressureCount]) -> list[PressureCount]:
    """The counts and the ``'*'`` row of every series (zeros too: the sampled marker)."""
    totals = [PressureCount(ALL, s, sum(c.n for c in counts if c.series == s),
                            any(c.more for c in counts if c.series == s)) for s in SERIES]
    return [*totals, *counts]


async def _raise_peak(tx: SqlTx, level: int, bucket: int, c: PressureCount) -> None:
    """Hour/day row: the highest sample (conditional UPDATE; INSERT when new)."""
    args = (c.n, int(c.more), level, bucket, c.family, c.series, c.n)
    if await tx.execute(_RAISE, args):
        return
    try:
        await tx.execute(_INSERT, (level, bucket, c.family, c.series, c.n, int(c.more)))
    except DuplicateKey:  # there already (as high or higher), or a concurrent first writer
        await tx.execute(_RAISE, args)


class HistoryPressureStore:
    """The pressure sample, its reads and its rebuild (mixed into ``WorkStore``)."""

    db: Database

    async def history_pressure_sampled(self, minute_us: int) -> bool:
        """Whether some replica already sampled the minute (a primary-key read)."""

        async def body(tx: SqlTx) -> bool:
            return bool(await tx.fetchall(_SAMPLED, (BUCKET_US, minute_us, ALL, READY)))

        return await self.db.transact(body, name="history.pressure_sampled", write=False)

    async def history_pressure_sample(self, now_us: int) -> list[PressureCount] | None:
        """Count the queue at ``now_us`` and write it as its minute's sample; None (and
        nothing written) when another replica sampled the minute first."""
        minute = bucket_of(now_us)
        if await self.history_pressure_sampled(minute):
            return None

        async def count(tx: SqlTx) -> list[PressureCount]:
            return with_totals(await count_pressure(tx, now_us))

        counts = await self.db.transact(count, name="history.pressure_count", write=False)

        async def write(tx: SqlTx) -> bool:
            try:  # the '*' rows first: the minute's arbiter
                await tx.executemany(_INSERT, [(BUCKET_US, minute, c.family, c.series, c.n,
                                                int(c.more)) for c in counts])
            except DuplicateKey:
                return False
            for c in counts:
                for level in (HOUR_US, DAY_US):
                    await _raise_peak(tx, level, bucket_of(minute, level), c)
            return True

        wrote = await self.db.transact(write, name="history.pressure_write", write=True)
        return counts if wrote else None

    async def history_pressure(self, since_us: int, until_us: int, step_us: int,
                               family: str | None = None) -> list[PressurePoint]:
        """The highest sample per step and series in ``[since_us, until_us)`` of one
        family (with the ``'*'`` rows, which say which steps were sampled) or of all
        (the ``'*'`` rows alone): an index range on (level, bucket)."""
        where, args = step_range(since_us, until_us, step_us, "family", None)
        where += " AND family IN (?, ?)"
        args += (ALL, family if family is not None else ALL)

        async def body(tx: SqlTx) -> list[PressurePoint]:
            rows = await tx.fetchall(
                "SELECT bucket_us - (bucket_us % ?) AS step_at, family, series, MAX(n),"
                f" MAX(more) FROM history_pressure WHERE {where}"
                " GROUP BY step_at, family, series ORDER BY step_at, family, series", args)
            return [PressurePoint(int(a), str(f), str(s), int(n), bool(m))
                    for a, f, s, n, m in rows]

        return await self.db.transact(body, name="history.pressure", write=False)

    async def history_pressure_rebuild(self, since_us: int | None = None) -> int:
        """Recompute the hour and day rows (each the highest minute sample in it) from
        the minute rows, one UTC day per transaction, from ``since_us``'s day (default:
        the first day sampled); the rows written. The minute rows are the samples
        themselves and stay as they are."""

        async def bounds(tx: SqlTx) -> tuple[Any, Any]:
            ((low, high),) = await tx.fetchall(
                "SELECT MIN(bucket_us), MAX(bucket_us) FROM history_pressure"
                " WHERE level_us = ?", (BUCKET_US,))
            return low, high

        low, high = await self.db.transact(bounds, name="history.pressure_bounds",
                                           write=False)
        if low is None or high is None:
            return 0
        start = bucket_of(int(low) if since_us is None else since_us, DAY_US)
        written = 0
        while start <= int(high):
            end = start + DAY_US

            async def body(tx: SqlTx, start: int = start, end: int = end) -> int:
                await tx.execute(
                    "DELETE FROM history_pressure WHERE level_us IN (?, ?)"
                    " AND bucket_us >= ? AND bucket_us < ?", (HOUR_US, DAY_US, start, end))
                rows = await tx.fetchall(
                    "SELECT bucket_us - (bucket_us % ?) AS hour, family, series, MAX(n),"
                    " MAX(more) FROM history_pressure WHERE level_us = ? AND bucket_us >= ?"
                    " AND bucket_us < ? GROUP BY hour, family, series",
                    (HOUR_US, BUCKET_US, start, end))
                peaks: dict[tuple[int, int, str, str], tuple[int, int]] = {}
                for hour, family, series, n, more in rows:
                    for level in (HOUR_US, DAY_US):
                        key = (level, bucket_of(int(hour), level), str(family), str(series))
                        was = peaks.get(key, (-1, 0))
                        if int(n) > was[0]:
                            peaks[key] = (int(n), int(more))
                if peaks:
                    await tx.executemany(_INSERT, [(*key, n, more) for key, (n, more)
                                                   in sorted(peaks.items())])
                return len(peaks)

            written += await self.db.transact(body, name="history.pressure_rebuild",
                                              write=True)
            start = end
        return written

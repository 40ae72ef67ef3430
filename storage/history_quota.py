"""The console's quota history: slots granted and given back per key, per minute, hour
and day, drawn against the key's limit.

Theory of operation
-------------------
``history_quota`` (migration 0044) counts quota reservations by the time of their slot,
at the levels of ``history_rollup`` (storage/history.py), in one shard (a grant already
holds its key's ``quota_keys`` row lock, so more shards would add rows, not spread
contention):

* ``granted``: :func:`count_slot` runs in the transaction that reserves the slot for a
  claim (``storage.quota.reservation_open``: the grant and its reservation commit
  together, so every granted slot of a claim is counted once);
* ``released``: :func:`count_released` runs where a reservation moves to ``released``
  (given back unused: ``storage.quota.reservation_move`` and the quota sweep), once per
  move (the move is a compare-and-swap out of ``reserved``).

The slots used in an interval are granted minus released; the page draws them against
the key's allowance for the interval: ``limit_count * step / window_us`` of the limit in
force then (a ``granted`` row records the policy its latest grant was made under,
migration 0047, by the statements that count it, so an hour or day row holds the limit
of its latest grant; a step spanning several rows takes the most generous), else of the
key's latest policy from ``quota_keys`` (rows from before 0047). A rebuild from the
reservations gives the same counts and keeps the recorded limits (the reservations do
not hold them). The quota bench's bare ``quota_grant`` (no claim, no reservation) is not
counted. A read model (seed 5.2): nothing grants from it.
"""

from __future__ import annotations

from typing import Any

import attrs

from storage.history import DAY_US, LEVELS_US, bucket_of, per_hour, step_range
from storage.port import Database, SqlTx
from storage.rollup_rows import add_at_levels

GRANTED = "granted"
RELEASED = "released"
METRICS = (GRANTED, RELEASED)

# Limits are read as slots per 10^12 us (a decimal with 4+ places keeps 5 significant
# digits down to one slot a year).
_RATE_SCALE = 1_000_000_000_000
_INSERT = ("INSERT INTO history_quota (n, level_us, bucket_us, quota_key, metric, shard,"
           " limit_count, window_us) VALUES (?, ?, ?, ?, ?, ?, ?, ?)")


async def _count(tx: SqlTx, quota_key: str, metric: str, slot_at_us: int,
                 also: tuple[tuple[str, object], ...] = ()) -> None:
    # The three levels in one statement in the steady state (storage/rollup_rows.py).
    await add_at_levels(tx, "history_quota", ("quota_key", "metric", "shard"),
                        (quota_key, metric, 0), slot_at_us, 1, also=also)


async def count_slot(tx: SqlTx, quota_key: str, slot_at_us: int,
                     limit: tuple[int, int] | None = None) -> None:
    """One slot granted to a claim, inside the reserving transaction; ``limit`` (the
    policy's ``limit_count`` and ``window_us``) is recorded on the rows as the limit in
    force (migration 0047), by the same statements."""
    also: tuple[tuple[str, object], ...] = ()
    if limit is not None:
        also = (("limit_count", limit[0]), ("window_us", limit[1]))
    await _count(tx, quota_key, GRANTED, slot_at_us, also)


async def count_released(tx: SqlTx, quota_key: str, slot_at_us: int) -> None:
    """One reserved slot given back unused, inside the transaction that moved it."""
    await _count(tx, quota_key, RELEASED, slot_at_us)


@attrs.frozen
class QuotaPoint:
    """``n`` slots of ``quota_key`` in ``[at_us, at_us + step)`` that ``metric``."""

    at_us: int
    quota_key: str
    metric: str
    n: int
    # granted: the limit recorded in force in the step (a row's: its latest grant's; of
    # several rows, the most generous), in slots per microsecond (limit_count /
    # window_us); None where none was recorded.
    per_us: float | None = None


@attrs.frozen
class QuotaLimit:
    """A key's latest policy: ``limit_count`` slots per ``window_us``."""

    quota_key: str
    limit_count: int
    window_us: int


@attrs.frozen
class QuotaSlot:
    """One reservation behind a point."""

    reservation_id: str
    work_id: str
    state: str
    slot_at_us: int


class HistoryQuotaStore:
    """Quota history reads and the rebuild (mixed into ``WorkStore``)."""

    db: Database

    async def history_quota(self, since_us: int, until_us: int, step_us: int,
                            quota_key: str | None = None
                            ) -> tuple[list[QuotaPoint], list[QuotaLimit]]:
        """Slots granted and released per step and key in ``[since_us, until_us)`` (an
        index range on the primary key: level, then bucket), and the keys' limits."""
        where, args = step_range(since_us, until_us, step_us, "quota_key", quota_key)

        async def body(tx: SqlTx) -> tuple[list[QuotaPoint], list[QuotaLimit]]:
            rows = await tx.fetchall(
                "SELECT bucket_us - (bucket_us % ?) AS step_at, quota_key, metric, SUM(n),"
                # Scaled: MariaDB divides decimals to 4 more digits only (1/60e6 -> 0).
                f" MAX(limit_count * {_RATE_SCALE}.0 / window_us)"
                f" FROM history_quota WHERE {where}"
                " GROUP BY step_at, quota_key, metric ORDER BY step_at, quota_key, metric",
                args)
            points = [QuotaPoint(int(a), str(k), str(m), int(n),
                                 None if r is None else float(r) / _RATE_SCALE)
                      for a, k, m, n, r in rows]
            keys = sorted({p.quota_key for p in points})
            limits: list[QuotaLimit] = []
            for i in range(0, len(keys), 100):
                chunk = keys[i:i + 100]
                marks = ", ".join("?" for _ in chunk)
                limits += [QuotaLimit(str(k), int(c), int(w)) for k, c, w in await tx.fetchall(
                    "SELECT quota_key, limit_count, window_us FROM quota_keys"
                    f" WHERE quota_key IN ({marks}) ORDER BY quota_key", chunk)]
            return points, limits

        return await self.db.transact(body, name="history.quota", write=False)

    async def history_quota_slots(self, quota_key: str, since_us: int, until_us: int,
                                  limit: int) -> list[QuotaSlot]:
        """The reservations of one key whose slot falls in the span, newest slot first
        (the ``quota_reservations_key_slot`` index, read backwards)."""

        async def body(tx: SqlTx) -> list[QuotaSlot]:
            rows = await tx.fetchall(
                "SELECT reservation_id, work_id, state, slot_at_us FROM quota_reservations"
                " WHERE quota_key = ? AND slot_at_us >= ? AND slot_at_us < ?"
                " ORDER BY slot_at_us DESC, reservation_id DESC LIMIT ?",
                (quota_key, since_us, until_us, limit))
            return [QuotaSlot(str(r), str(w), str(s), int(t)) for r, w, s, t in rows]

        return await self.db.transact(body, name="history.quota_slots", write=False)

    async def history_quota_rebuild(self, since_us: int | None = None) -> int:
        """Recompute ``history_quota`` from the reservations still kept, one UTC day of
        slots per transaction, from ``since_us``'s day (default: the first whole day
        kept); the rows written. Older days keep their maintained counts."""

        async def bounds(tx: SqlTx) -> tuple[Any, Any]:
            ((low, high),) = await tx.fetchall(
                "SELECT MIN(slot_at_us), MAX(slot_at_us) FROM quota_reservations")
            return low, high

        low, high = await self.db.transact(bounds, name="history.quota_bounds", write=False)
        if low is None or high is None:
            return 0
        if since_us is not None:
            start = bucket_of(since_us, DAY_US)
        else:
            start = int(low) if int(low) % DAY_US == 0 else bucket_of(int(low), DAY_US) + DAY_US
        written = 0
        while start <= int(high):
            end = start + DAY_US

            async def body(tx: SqlTx, start: int = start, end: int = end) -> int:
                # The limits recorded in force (migration 0047) are facts the
                # reservations do not hold: kept across the rewrite.
                limits = {(int(lv), int(b), str(k)): (int(c), int(w))
                          for lv, b, k, c, w in await tx.fetchall(
                              "SELECT level_us, bucket_us, quota_key, limit_count, window_us"
                              " FROM history_quota WHERE level_us IN (?, ?, ?)"
                              " AND bucket_us >= ? AND bucket_us < ? AND metric = ?"
                              " AND limit_count IS NOT NULL AND window_us IS NOT NULL",
                              (*LEVELS_US, start, end, GRANTED))}
                await tx.execute(
                    "DELETE FROM history_quota WHERE level_us IN (?, ?, ?)"
                    " AND bucket_us >= ? AND bucket_us < ?", (*LEVELS_US, start, end))
                rows = await per_hour(
                    tx, "SELECT slot_at_us - (slot_at_us % ?) AS bucket, quota_key,"
                    " COUNT(*), SUM(CASE WHEN state = 'released' THEN 1 ELSE 0 END)"
                    " FROM quota_reservations WHERE slot_at_us >= ? AND slot_at_us < ?"
                    " GROUP BY bucket, quota_key", start, end)
                counts: dict[tuple[int, int, str, str], int] = {}
                for bucket, key, granted, released in rows:
                    for level in LEVELS_US:
                        for metric, n in ((GRANTED, int(granted)), (RELEASED, int(released))):
                            if n:
                                at = (level, bucket_of(int(bucket), level), str(key), metric)
                                counts[at] = counts.get(at, 0) + n
                if counts:
                    await tx.executemany(_INSERT, [
                        (n, *key, 0, *(limits.get(key[:3], (None, None))
                                       if key[3] == GRANTED else (None, None)))
                        for key, n in sorted(counts.items())])
                return len(counts)

            written += await self.db.transact(body, name="history.quota_rebuild", write=True)
            start = end
        return written

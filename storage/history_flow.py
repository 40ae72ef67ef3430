"""The console's effect-path history: commands accepted and Runtime receipts confirmed,
with their latencies, per minute, hour and day, per org, binding and provider operation.

Theory of operation
-------------------
``history_flow`` (migration 0043) is the effect path's companion to ``history_rollup``
(storage/history.py), at the same three levels and with the same four shards. It holds
two metrics:

* ``accepted``: commands admitted in the bucket (arrivals). :func:`count_accepted` runs
  in the admission's transaction, after the ``INSERT INTO external_commands`` of the
  whole batch, once per (level, bucket, org, binding, operation) the batch touches.
* ``receipted``: receipts the Runtime confirmed in the bucket (completions of the effect
  path), each with the log bucket (:mod:`daemon.core.latency`: eight per doubling,
  within 9 %) of its two latencies, from durable timestamps: accept -> provider answer
  (``external_commands.created_at_us`` -> ``result_receipts.created_at_us``, the answer
  settled the command and queued its receipt) and accept -> Runtime receipt
  (``-> result_receipts.confirmed_at_us``). :func:`count_receipt` runs in the
  confirmation's transaction (``storage.effects.mark_receipt``), only when its
  ``UPDATE`` moved the receipt from pending (a repeat counts nothing). Both latencies'
  buckets are one row, so a confirmation adds to one key; either histogram is the sum
  over the other bucket.

``accepted`` rows are spread over the four shards (per admission transaction, from its
first command id): one org's admissions on several replicas would otherwise queue on one
row a minute. ``receipted`` rows use shard 0: their latency buckets spread them already.
Each key's three levels are one ``UPDATE`` in the steady state
(:func:`storage.rollup_rows.add_at_levels`); a new minute, hour or day adds an
``INSERT`` per new row.

Accepted against receipted per interval is the effect path's pressure (what came in
against what it finished); the latency percentiles are read from the summed buckets.
A row is a read model (seed 5.2): nothing decides work from it, and
:meth:`HistoryFlowStore.history_flow_rebuild` recomputes whole UTC days from the rows
(commands and receipts) still kept, leaving older days as counted.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import attrs

from daemon.core.latency import bucket_of as latency_bucket
from storage.history import (
    BUCKET_US,
    DAY_US,
    LEVELS_US,
    SHARDS,
    bucket_of,
    key_filter,
    level_for,
    per_hour,
)
from storage.port import Database, SqlTx
from storage.rollup_rows import add_at_levels

ACCEPTED = "accepted"
RECEIPTED = "receipted"
METRICS = (ACCEPTED, RECEIPTED)

_KEY_COLUMNS = ("metric", "org_id", "binding_id", "operation", "answer_le", "receipt_le",
                "shard")
_INSERT = ("INSERT INTO history_flow (n, level_us, bucket_us, metric, org_id, binding_id,"
           " operation, answer_le, receipt_le, shard) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")

# (level, bucket, metric, org, binding, operation, answer_le, receipt_le)
_Key = tuple[int, int, str, str, str, str, int, int]


def _shard(command_id: str) -> int:
    return zlib.crc32(command_id.encode()) % SHARDS


def _spread(counts: dict[_Key, int], at_us: int, metric: str, org: str, binding: str,
            operation: str, answer_le: int, receipt_le: int, n: int = 1) -> None:
    for level in LEVELS_US:
        key = (level, bucket_of(at_us, level), metric, org, binding, operation, answer_le,
               receipt_le)
        counts[key] = counts.get(key, 0) + n


async def count_accepted(tx: SqlTx, commands: Sequence[tuple[str, str, str, str]],
                         now_us: int) -> None:
    """Count admitted commands ``(command_id, org, binding, operation)``, inside the
    admission's transaction (the batch's ``created_at_us`` is ``now_us``): one statement
    per (org, binding, operation) the batch holds (:func:`add_at_levels`)."""
    if not commands:
        return
    shard = _shard(commands[0][0])
    counts: dict[tuple[str, str, str], int] = {}
    for _, org, binding, operation in commands:
        counts[(org, binding, operation)] = counts.get((org, binding, operation), 0) + 1
    # One order for every writer: two transactions never wait on each other's rows in turn.
    for (org, binding, operation), n in sorted(counts.items()):
        await add_at_levels(tx, "history_flow", _KEY_COLUMNS,
                            (ACCEPTED, org, binding, operation, 0, 0, shard), now_us, n)


async def count_receipt(tx: SqlTx, command_id: str) -> None:
    """Count one receipt just confirmed, inside the confirming transaction: one read of
    the receipt and its command (both by primary key), one row per level."""
    rows = await tx.fetchall(
        "SELECT c.org_id, c.binding_id, c.operation, c.created_at_us, r.created_at_us,"
        " r.confirmed_at_us FROM result_receipts r JOIN external_commands c"
        " ON c.command_id = r.command_id WHERE r.command_id = ?", (command_id,))
    if not rows or rows[0][5] is None:
        return
    org, binding, operation, accepted, answered, confirmed = rows[0]
    await add_at_levels(tx, "history_flow", _KEY_COLUMNS, (
        RECEIPTED, str(org), str(binding), str(operation),
        latency_bucket(int(answered) - int(accepted)),
        # One shard: the key's latency buckets already spread concurrent confirmations
        # over rows; more shards would only add rows (an INSERT each) per minute.
        latency_bucket(int(confirmed) - int(accepted)), 0), int(confirmed), 1)


@attrs.frozen
class FlowFilter:
    """The effect path's filters (None: all)."""

    org: str | None = None
    binding: str | None = None
    operation: str | None = None

    def where(self) -> tuple[str, tuple[str, ...]]:
        return key_filter(self.org, self.binding, self.operation)


@attrs.frozen
class FlowPoint:
    """``n`` of ``metric`` in ``[at_us, at_us + step)`` with these latency buckets (0 for
    ``accepted``), summed over what the filter keeps."""

    at_us: int
    metric: str
    answer_le: int
    receipt_le: int
    n: int


@attrs.frozen
class FlowCommand:
    """One command behind a point: accepted, or its receipt confirmed, in the bucket."""

    command_id: str
    org_id: str
    binding_id: str
    operation: str
    settlement: str
    accepted_at_us: int
    answered_at_us: int | None
    confirmed_at_us: int | None


class HistoryFlowStore:
    """Effect-path history reads and the rebuild (mixed into ``WorkStore``)."""

    db: Database

    async def history_flow(self, since_us: int, until_us: int, step_us: int,
                           where: FlowFilter = FlowFilter()) -> list[FlowPoint]:
        """Per ``step_us`` bucket in ``[since_us, until_us)``: accepted, and receipted per
        latency bucket pair, cluster-wide, read from the coarsest level that tiles the
        step (an index range on the primary key: level, then bucket)."""
        if step_us <= 0 or step_us % BUCKET_US:
            raise ValueError("step_us must be a positive multiple of a minute")
        level = level_for(step_us)
        extra, extra_args = where.where()

        async def body(tx: SqlTx) -> list[FlowPoint]:
            rows = await tx.fetchall(
                "SELECT bucket_us - (bucket_us % ?) AS step_at, metric, answer_le,"
                " receipt_le, SUM(n) FROM history_flow"
                f" WHERE level_us = ? AND bucket_us >= ? AND bucket_us < ?{extra}"
                " GROUP BY step_at, metric, answer_le, receipt_le"
                " ORDER BY step_at, metric, answer_le, receipt_le",
                (step_us, level, bucket_of(since_us, level), until_us, *extra_args))
            return [FlowPoint(int(a), str(m), int(x), int(y), int(n))
                    for a, m, x, y, n in rows]

        return await self.db.transact(body, name="history.flow", write=False)

    async def history_flow_commands(self, since_us: int, until_us: int, metric: str,
                                    where: FlowFilter, limit: int) -> list[FlowCommand]:
        """The commands behind a point, newest first: accepted in the span (the
        ``external_commands_created`` index) or confirmed in it (``result_receipts
        _confirmed``), at most ``limit``."""
        if metric not in METRICS:
            raise ValueError(f"unknown metric {metric!r}")
        extra, extra_args = where.where()
        extra = extra.replace(" AND ", " AND c.")
        time = "c.created_at_us" if metric == ACCEPTED else "r.confirmed_at_us"
        join = "LEFT JOIN" if metric == ACCEPTED else "JOIN"

        async def body(tx: SqlTx) -> list[FlowCommand]:
            rows = await tx.fetchall(
                "SELECT c.command_id, c.org_id, c.binding_id, c.operation, c.settlement,"
                " c.created_at_us, r.created_at_us, r.confirmed_at_us"
                f" FROM external_commands c {join} result_receipts r"
                f" ON r.command_id = c.command_id WHERE {time} >= ? AND {time} < ?{extra}"
                f" ORDER BY {time} DESC, c.command_id DESC LIMIT ?",
                (since_us, until_us, *extra_args, limit))
            return [FlowCommand(str(i), str(o), str(b), str(p), str(s), int(a),
                                None if x is None else int(x), None if y is None else int(y))
                    for i, o, b, p, s, a, x, y in rows]

        return await self.db.transact(body, name="history.flow_commands", write=False)

    async def history_flow_rebuild(self, since_us: int | None = None) -> int:
        """Recompute ``history_flow`` from the commands and receipts still kept, one UTC
        day per transaction, from ``since_us``'s day (default: the first whole day both
        tables still hold); the rows written. Older days keep their maintained counts."""

        async def bounds(tx: SqlTx) -> tuple[list[int], list[int]]:
            ((c_low, c_high),) = await tx.fetchall(
                "SELECT MIN(created_at_us), MAX(created_at_us) FROM external_commands")
            ((r_low, r_high),) = await tx.fetchall(
                "SELECT MIN(confirmed_at_us), MAX(confirmed_at_us) FROM result_receipts"
                " WHERE confirmed_at_us IS NOT NULL")
            return ([int(v) for v in (c_low, r_low) if v is not None],
                    [int(v) for v in (c_high, r_high) if v is not None])

        lows, highs = await self.db.transact(bounds, name="history.flow_bounds", write=False)
        if not lows:
            return 0
        if since_us is not None:
            start = bucket_of(since_us, DAY_US)
        else:
            # Retention may have taken older rows of the oldest kept day of either table.
            low = max(lows)
            start = low if low % DAY_US == 0 else bucket_of(low, DAY_US) + DAY_US
        high = max(highs)
        written = 0
        while start <= high:
            end = start + DAY_US

            async def body(tx: SqlTx, start: int = start, end: int = end) -> int:
                await tx.execute(
                    "DELETE FROM history_flow WHERE level_us IN (?, ?, ?)"
                    " AND bucket_us >= ? AND bucket_us < ?", (*LEVELS_US, start, end))
                counts: dict[_Key, int] = {}
                for at, org, binding, operation, n in await per_hour(
                        tx, "SELECT created_at_us - (created_at_us % ?) AS bucket, org_id,"
                        " binding_id, operation, COUNT(*) FROM external_commands"
                        " WHERE created_at_us >= ? AND created_at_us < ?"
                        " GROUP BY bucket, org_id, binding_id, operation", start, end):
                    _spread(counts, int(at), ACCEPTED, str(org), str(binding), str(operation),
                            0, 0, int(n))
                # Durations need the log in Python: an hour of receipts per read.
                for hour in range(start, end, LEVELS_US[1]):
                    for org, binding, operation, accepted, answered, confirmed in (
                            await tx.fetchall(
                                "SELECT c.org_id, c.binding_id, c.operation, c.created_at_us,"
                                " r.created_at_us, r.confirmed_at_us FROM result_receipts r"
                                " JOIN external_commands c ON c.command_id = r.command_id"
                                " WHERE r.confirmed_at_us >= ? AND r.confirmed_at_us < ?",
                                (hour, hour + LEVELS_US[1]))):
                        _spread(counts, int(confirmed), RECEIPTED, str(org), str(binding),
                                str(operation), latency_bucket(int(answered) - int(accepted)),
                                latency_bucket(int(confirmed) - int(accepted)))
                if counts:
                    await tx.executemany(_INSERT, [(n, *key, 0)
                                                   for key, n in sorted(counts.items())])
                return len(counts)

            written += await self.db.transact(body, name="history.flow_rebuild", write=True)
            start = end
        return written

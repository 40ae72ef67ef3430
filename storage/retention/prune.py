"""The pruner's storage: the cluster-wide lease and one fenced batch per call.

Theory of operation
-------------------
``retention_leases`` holds one row per pruner name (``retention``). Taking it is a
compare-and-swap on its epoch (:func:`daemon.core.retention.lease_decision` says when it
may be taken); the winner's token fences every batch: the batch's first statement is a
conditional UPDATE of the lease row on that token, unexpired, which also extends it. A
pruner that lost the lease (paused past it, partitioned) matches nothing and deletes
nothing (:class:`RetentionLeaseLost`). On MySQL-family engines that UPDATE also locks the
lease row until COMMIT, so two batches never interleave.

A batch is one transaction: scan up to ``batch_rows`` candidates after the cursor, let
the rule's guard judge them, delete the prunable ones that fit the byte budget (the
DELETE re-checks the rule's predicate and cutoff), and store the new cursor. A pruner
killed mid-batch leaves the transaction uncommitted: nothing of it happened.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from daemon.core import retention as core
from daemon.core.ids import encode_ulid
from daemon.core.retention import Cutoffs
from storage.port import Database, DuplicateKey, Row, SqlTx, StorageError
from storage.retention.rules import RetentionRule

LEASE_NAME = "retention"
_LEASE_COLUMNS = ("holder, lease_token, until_us, epoch, batches_total, sweep_started_at_us,"
                  " cursors_json, last_pass_at_us, last_pass_json")


class RetentionLeaseLost(StorageError):
    """This pruner no longer holds the retention lease: the batch deleted nothing."""


@attrs.frozen(kw_only=True)
class LeaseParams:
    holder: str
    token: str
    ttl_us: int
    sweep_interval_us: int
    name: str = LEASE_NAME


@attrs.frozen(kw_only=True)
class LeaseGranted:
    token: str
    epoch: int
    until_us: int
    # Each scan's position (rule cursor key -> order values); empty after a sweep restart.
    cursors: dict[str, list[Any]]
    sweep_restarted: bool


@attrs.frozen(kw_only=True)
class BatchParams:
    rule: RetentionRule
    partition: str | None
    cursor: list[Any] | None  # None: from the beginning
    token: str
    cutoffs: Cutoffs
    batch_rows: int
    batch_bytes: int
    ttl_us: int
    name: str = LEASE_NAME


@attrs.frozen(kw_only=True)
class BatchResult:
    deleted: int
    scanned: int
    cursor: list[Any] | None  # where the next batch (or the next pass) starts
    exhausted: bool  # the scan reached its end: nothing past the cursor is old enough
    oldest_prunable_age_us: int | None
    kept: dict[str, int]  # reason -> rows kept in this batch


@attrs.frozen(kw_only=True)
class RetentionStatus:
    holder: str | None
    until_us: int
    epoch: int
    batches_total: int
    sweep_started_at_us: int
    last_pass_at_us: int
    last_pass: dict[str, Any]


def ulid_floor(cutoff_us: int) -> str:
    """The smallest ULID of the cutoff's millisecond: every id below it is older."""
    return encode_ulid(max(0, cutoff_us // 1000), bytes(10))


def _after(columns: Sequence[str], cursor: Sequence[Any]) -> tuple[str, list[Any]]:
    """``(a, b, c) > (?, ?, ?)`` spelled out, which every engine turns into ranges."""
    head, *rest = columns
    if not rest:
        return f"{head} > ?", [cursor[0]]
    inner, params = _after(rest, cursor[1:])
    return f"({head} > ? OR ({head} = ? AND {inner}))", [cursor[0], cursor[0], *params]


def scan_sql(rule: RetentionRule, partition: str | None, cursor: Sequence[Any] | None,
             cutoff_us: int, limit: int) -> tuple[str, list[Any]]:
    """The keyset scan of one batch (the dialect guard collects it too)."""
    clauses: list[str] = []
    params: list[Any] = []
    order = ", ".join(rule.order_columns)
    if rule.partition_column is not None:
        # A closed range and the partition column in the ORDER BY keep the engine on the
        # (partition, order) index (see storage.work_rows.newest_first).
        clauses.append(f"{rule.partition_column} >= ? AND {rule.partition_column} <= ?")
        params.extend((partition, partition))
        order = f"{rule.partition_column}, {order}"
    clauses.append(rule.where)
    clauses.append(f"{rule.age_column} < ?")
    params.append(cutoff_us)
    if rule.ulid_order:
        clauses.append(f"{rule.order_columns[0]} < ?")
        params.append(ulid_floor(cutoff_us))
    if cursor is not None:
        after, after_params = _after(rule.order_columns, cursor)
        clauses.append(after)
        params.extend(after_params)
    columns = ", ".join((*rule.order_columns, rule.age_column, f"({rule.size_sql})",
                         *rule.guard_columns))
    sql = (f"SELECT {columns} FROM {rule.table} WHERE {' AND '.join(clauses)}"
           f" ORDER BY {order} LIMIT {int(limit)}")
    return sql, params


def delete_sql(rule: RetentionRule, keys: Sequence[Sequence[Any]],
               cutoff_us: int) -> tuple[str, list[Any]]:
    params: list[Any] = []
    if len(rule.key_columns) == 1:
        match = f"{rule.key_columns[0]} IN ({', '.join('?' * len(keys))})"
        params.extend(k[0] for k in keys)
    else:
        one = "(" + " AND ".join(f"{c} = ?" for c in rule.key_columns) + ")"
        match = "(" + " OR ".join([one] * len(keys)) + ")"
        for k in keys:
            params.extend(k)
    params.append(cutoff_us)
    return (f"DELETE FROM {rule.table} WHERE {match} AND {rule.where}"
            f" AND {rule.age_column} < ?", params)


def dependents_sql(rule: RetentionRule, keys: Sequence[Sequence[Any]]
                   ) -> list[tuple[str, list[Any]]]:
    """After the rule's DELETE: each dependent table's rows of the keys whose row is now
    gone (a row the DELETE's re-check kept keeps its dependents)."""
    if not rule.dependents:
        return []
    (key,) = rule.key_columns
    marks = ", ".join("?" * len(keys))
    values = [k[0] for k in keys]
    return [(f"DELETE FROM {table} WHERE {column} IN ({marks}) AND {column} NOT IN"
             f" (SELECT {key} FROM {rule.table} WHERE {key} IN ({marks}))",
             [*values, *values])
            for table, column in rule.dependents]


def _key_of(rule: RetentionRule, row: Row) -> list[Any]:
    return [row[rule.order_columns.index(c)] for c in rule.key_columns]


async def _fence(tx: SqlTx, name: str, token: str, ttl_us: int, now_us: int) -> None:
    matched = await tx.execute(
        "UPDATE retention_leases SET until_us = ?, batches_total = batches_total + 1"
        " WHERE name = ? AND lease_token = ? AND until_us >= ?",
        (now_us + ttl_us, name, token, now_us))
    if matched != 1:
        raise RetentionLeaseLost("the retention lease is no longer ours: nothing pruned")


class RetentionStore:
    """Retention methods of the work store (mixed into ``WorkStore``)."""

    db: Database

    async def retention_lease_acquire(self, params: LeaseParams, now_us: int
                                      ) -> LeaseGranted | core.LeaseHeld:
        """Take the pruner lease if nobody holds it (or it expired)."""

        async def body(tx: SqlTx) -> LeaseGranted | core.LeaseHeld:
            rows = await tx.fetchall(
                f"SELECT {_LEASE_COLUMNS} FROM retention_leases WHERE name = ?",
                (params.name,))
            view = None if not rows else core.LeaseView(
                holder=rows[0][0], token=rows[0][1], until_us=int(rows[0][2]),
                epoch=int(rows[0][3]))
            decision = core.lease_decision(view, now_us)
            if isinstance(decision, core.LeaseHeld):
                return decision
            if isinstance(decision, core.CreateLease):
                try:
                    await tx.execute(
                        f"INSERT INTO retention_leases (name, {_LEASE_COLUMNS}) VALUES"
                        " (?, NULL, NULL, 0, 0, 0, 0, '{}', 0, '{}')", (params.name,))
                except DuplicateKey:
                    return core.LeaseHeld("", now_us)  # another pruner created it first
                epoch, sweep_at, cursors_text = 0, 0, "{}"
            else:
                epoch, sweep_at, cursors_text = decision.expected_epoch, int(rows[0][5]), \
                    str(rows[0][6])
            restart = core.sweep_due(sweep_at, now_us, params.sweep_interval_us)
            cursors: dict[str, list[Any]] = {} if restart else json.loads(cursors_text)
            if not await tx.execute(
                "UPDATE retention_leases SET holder = ?, lease_token = ?, until_us = ?,"
                " epoch = ?, sweep_started_at_us = ?, cursors_json = ?"
                " WHERE name = ? AND epoch = ?",
                (params.holder, params.token, now_us + params.ttl_us, epoch + 1,
                 now_us if restart else sweep_at, json.dumps(cursors), params.name, epoch),
            ):
                return core.LeaseHeld("", now_us)
            return LeaseGranted(token=params.token, epoch=epoch + 1,
                                until_us=now_us + params.ttl_us, cursors=cursors,
                                sweep_restarted=restart)

        try:
            return await self.db.transact(body, name="retention.lease_acquire")
        except DuplicateKey:  # TiDB may report the lost creation race only at COMMIT
            return core.LeaseHeld("", now_us)

    async def retention_lease_release(self, *, token: str, summary: dict[str, Any],
                                      now_us: int, name: str = LEASE_NAME) -> bool:
        """End our lease, recording the pass (False: it was no longer ours)."""

        async def body(tx: SqlTx) -> bool:
            return bool(await tx.execute(
                "UPDATE retention_leases SET holder = NULL, lease_token = NULL, until_us = 0,"
                " epoch = epoch + 1, last_pass_at_us = ?, last_pass_json = ?"
                " WHERE name = ? AND lease_token = ?",
                (now_us, json.dumps(summary, sort_keys=True), name, token)))

        return await self.db.transact(body, name="retention.lease_release")

    async def retention_prune_batch(self, params: BatchParams,
                                    now: Callable[[], int]) -> BatchResult:
        """One fenced batch of one rule's scan (raises :class:`RetentionLeaseLost`).

        ``now`` is read inside the transaction: the retention lease is judged (and
        renewed) when the batch's statements run, not at a time read before a wait for
        a connection or a freeze, when another pruner may hold the lease already."""
        rule = params.rule
        cutoff = params.cutoffs.of(rule.horizon)

        async def body(tx: SqlTx) -> BatchResult:
            now_us = now()
            await _fence(tx, params.name, params.token, params.ttl_us, now_us)
            sql, args = scan_sql(rule, params.partition, params.cursor, cutoff,
                                 params.batch_rows)
            rows = await tx.fetchall(sql, args)
            verdicts = await rule.guard(tx, rows, params.cutoffs) if rows else []
            n_order = len(rule.order_columns)
            plan = core.plan_batch(
                [(v, int(row[n_order + 1] or 0)) for row, v in zip(rows, verdicts, strict=True)],
                max_bytes=params.batch_bytes)
            doomed = [_key_of(rule, rows[i]) for i in plan.prune]
            oldest = min((int(rows[i][n_order]) for i in plan.prune), default=None)
            kept: dict[str, int] = {}
            for v in verdicts[:plan.walked]:
                if isinstance(v, core.Keep):
                    kept[v.reason] = kept.get(v.reason, 0) + 1
            walked = plan.walked
            deleted = 0
            if doomed:
                dsql, dargs = delete_sql(rule, doomed, cutoff)
                deleted = await tx.execute(dsql, dargs)
                for dep_sql, dep_args in dependents_sql(rule, doomed):
                    await tx.execute(dep_sql, dep_args)
            exhausted = walked == len(rows) and len(rows) < params.batch_rows
            # Caught up or not, the next batch (or pass) resumes after the last row
            # walked: rows a guard kept are found again when a sweep restarts.
            cursor = list(rows[walked - 1][:n_order]) if walked else params.cursor
            key = rule.cursor_key(params.partition)
            cursors_text = await tx.fetchall(
                "SELECT cursors_json FROM retention_leases WHERE name = ?", (params.name,))
            cursors = json.loads(str(cursors_text[0][0])) if cursors_text else {}
            if cursor is None:
                cursors.pop(key, None)
            else:
                cursors[key] = cursor
            await tx.execute(
                "UPDATE retention_leases SET cursors_json = ? WHERE name = ? AND lease_token = ?",
                (json.dumps(cursors), params.name, params.token))
            return BatchResult(deleted=deleted, scanned=walked, cursor=cursor,
                               exhausted=exhausted, oldest_prunable_age_us=oldest, kept=kept)

        return await self.db.transact(body, name=f"retention.prune.{rule.name}")

    async def retention_status(self, name: str = LEASE_NAME) -> RetentionStatus | None:
        """The lease and the last pass's figures (the console and the CLI read this)."""

        async def body(tx: SqlTx) -> RetentionStatus | None:
            rows = await tx.fetchall(
                f"SELECT {_LEASE_COLUMNS} FROM retention_leases WHERE name = ?", (name,))
            if not rows:
                return None
            r = rows[0]
            return RetentionStatus(
                holder=None if r[0] is None else str(r[0]), until_us=int(r[2]),
                epoch=int(r[3]), batches_total=int(r[4]), sweep_started_at_us=int(r[5]),
                last_pass_at_us=int(r[7]), last_pass=json.loads(str(r[8])))

        return await self.db.transact(body, name="retention.status", write=False)

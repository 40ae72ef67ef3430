"""Enqueue, read, cancel, replay, depths, replicas and audit: the non-claim half.

Replay never touches the terminal row it replays: it inserts a new WorkItem
with ``replay_of`` lineage (unique, so two racing replays of one item have one
winner) and appends an audit entry in the same transaction. The replay of a
command's work item is guarded in that same transaction, after it took the
command's row (:mod:`storage.command_operator`): no check-then-act.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from typing import Any

from daemon.core.cancel import CancelAction, CancelRule, decide_cancel
from daemon.core.find_query import id_floor
from daemon.core.states import TERMINAL, WorkState
from daemon.core.work import WorkItem, WorkSpec
from storage.coalesce import coalescing
from storage.idgen import new_ulid
from storage.port import (
    AuditEntry,
    CancelParams,
    CancelResult,
    Database,
    DeadClassCount,
    DeadQuery,
    DuplicateKey,
    EnqueueResult,
    QueueDepth,
    ReplayParams,
    ReplicaInfo,
    Row,
    SqlTx,
    WorkConflict,
    WorkNotFound,
    WorkQuery,
)
from storage.work_rows import SELECT_WORK, from_row, in_states, newest_first, placeholders

_INSERT_COLUMNS = (
    "work_id, family, org_id, app_installation_id, subject_kind, subject_id, definition_ref,"
    " catalog_revision, catalog_digest, payload, payload_schema_version,"
    " engine_capability_version, queue_class, source_lane, source_seq, target_lane,"
    " target_lane_hold, state, run_after_us, attempt, max_attempts, lease_owner, lease_token,"
    " lease_until_us, ownership_epoch, cancel_requested, rollback_execution_fence_id,"
    " legacy_outcome_receipt_version, legacy_outcome_receipt_digest, terminal_outcome,"
    " failure_class, operator_summary, dedupe_key, replay_of, row_version, created_at_us,"
    " updated_at_us"
)
_INSERT_SQL = (
    f"INSERT INTO work_items ({_INSERT_COLUMNS}) VALUES"
    " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, 'pending', ?, 0, ?, NULL, NULL,"
    " NULL, 0, 0, NULL, NULL, NULL, NULL, NULL, NULL, ?, ?, 0, ?, ?)"
)
# States whose depth the pressure gauges report (dead is the DLQ).
DEPTH_STATES = frozenset(WorkState) - TERMINAL | {WorkState.DEAD}
async def families_in(tx: SqlTx, state: WorkState) -> list[str]:
    """The families with items in ``state``: one index probe each (no engine we run on
    skips through an index prefix by itself; a DISTINCT reads every entry)."""
    found: list[str] = []
    while len(found) < 1000:
        rows = await tx.fetchall(
            "SELECT family FROM work_items WHERE state = ? AND family > ?"
            " ORDER BY family LIMIT 1", (state.value, found[-1] if found else ""))
        if not rows:
            break
        found.append(str(rows[0][0]))
    return found


# The depth sampler counts each (family, state) up to this many items, then says "at
# least" (QueueDepth.capped): a deeper queue is not counted row by row every interval.
DEPTH_COUNT_CAP = 10_000
REPLAYABLE = TERMINAL - {WorkState.RECONCILED_LEGACY_TERMINAL}


def _resolved(params: ReplayParams) -> dict[str, Any]:
    if params.resolved_catalog is None:
        return {}
    revision, digest = params.resolved_catalog
    return {"resolved_catalog_revision": revision, "resolved_catalog_digest": digest}


def _insert_params(
    work_id: str, spec: WorkSpec, seq: int | None, now_us: int
) -> tuple[Any, ...]:
    return (
        work_id,
        spec.family,
        spec.org_id,
        spec.app_installation_id,
        spec.subject_kind,
        spec.subject_id,
        spec.definition_ref,
        spec.catalog_revision,
        spec.catalog_digest,
        spec.payload,
        spec.payload_schema_version,
        spec.engine_capability_version,
        spec.queue_class,
        spec.source_lane,
        seq,
        spec.target_lane,
        spec.run_after_us if spec.run_after_us is not None else now_us,
        spec.max_attempts,
        spec.dedupe_key,
        spec.replay_of,
        now_us,
        now_us,
    )


async def allocate_source_seqs(tx: SqlTx, lanes: Counter[str]) -> dict[str, int]:
    """Reserve ``n`` consecutive sequence numbers per lane; return each lane's first.

    The counter row's lock serializes enqueuers of one lane until COMMIT, so
    sequence order is commit order: no later number becomes visible first.
    One UPDATE takes every existing lane (InnoDB locks the primary-key IN list
    in key order, so two enqueuers never deadlock on lane order); lanes that
    do not exist yet are created with one multi-row INSERT, or one at a time
    if another enqueuer created one of them first.
    """
    names = sorted(lanes)
    marks = placeholders(len(names))
    cases = " ".join("WHEN ? THEN ?" for _ in names)
    await tx.execute(
        f"UPDATE work_source_lanes SET next_seq = next_seq + CASE source_lane {cases} END"
        f" WHERE source_lane IN ({marks})",
        (*(v for lane in names for v in (lane, lanes[lane])), *names),
    )
    rows = await tx.fetchall(
        f"SELECT source_lane, next_seq FROM work_source_lanes WHERE source_lane IN ({marks})",
        tuple(names),
    )
    first = {str(lane): int(next_seq) - lanes[str(lane)] for lane, next_seq in rows}
    missing = [lane for lane in names if lane not in first]
    if not missing:
        return first
    try:
        await tx.executemany(
            "INSERT INTO work_source_lanes (source_lane, next_seq) VALUES (?, ?)",
            [(lane, lanes[lane] + 1) for lane in missing],
        )
        first.update((lane, 1) for lane in missing)
    except DuplicateKey:  # the statement wrote nothing; take the lanes one by one
        for lane in missing:
            first[lane] = await _allocate_one(tx, lane, lanes[lane])
    return first


async def _allocate_one(tx: SqlTx, lane: str, n: int) -> int:
    while True:
        if await tx.execute(
            "UPDATE work_source_lanes SET next_seq = next_seq + ? WHERE source_lane = ?",
            (n, lane),
        ):
            rows = await tx.fetchall(
                "SELECT next_seq FROM work_source_lanes WHERE source_lane = ?", (lane,)
            )
            return int(rows[0][0]) - n
        try:
            await tx.execute(
                "INSERT INTO work_source_lanes (source_lane, next_seq) VALUES (?, ?)",
                (lane, n + 1),
            )
            return 1
        except DuplicateKey:
            continue  # another enqueuer created the lane first: take the UPDATE path


async def insert_work(
    tx: SqlTx, specs: Sequence[WorkSpec], now_us: int, *, fresh_dedupe_keys: bool = False
) -> list[EnqueueResult]:
    """Insert WorkItems inside the caller's transaction (used by enqueue and admission).

    ``fresh_dedupe_keys``: the caller guarantees no dedupe key can already
    exist (it derives them from ids it just generated), so every row goes into
    one multi-row INSERT.
    """
    batch = coalescing(tx)
    if batch is not None and all(s.source_lane is None and s.replay_of is None
                                 for s in specs):
        # Coalesced (storage.coalesce): a dedupe key already taken fails the whole
        # batch, which is redone row at a time (where it answers the existing item).
        ids = [new_ulid(now_us) for _ in specs]
        for work_id, spec in zip(ids, specs, strict=True):
            batch.insert(_INSERT_SQL, _insert_params(work_id, spec, None, now_us))
        return [EnqueueResult(work_id, True) for work_id in ids]
    lanes = Counter(s.source_lane for s in specs if s.source_lane is not None)
    next_seq = await allocate_source_seqs(tx, lanes) if lanes else {}
    plain: list[tuple[Any, ...]] = []
    results: list[EnqueueResult] = []
    for spec in specs:
        seq = None
        if spec.source_lane is not None:
            seq = next_seq[spec.source_lane]
            next_seq[spec.source_lane] = seq + 1
        work_id = new_ulid(now_us)
        params = _insert_params(work_id, spec, seq, now_us)
        if fresh_dedupe_keys or (spec.dedupe_key is None and spec.replay_of is None):
            plain.append(params)
            results.append(EnqueueResult(work_id, True))
            continue
        try:
            await tx.execute(_INSERT_SQL, params)
            results.append(EnqueueResult(work_id, True))
        except DuplicateKey:
            if spec.replay_of is not None:
                raise
            rows = await tx.fetchall(
                "SELECT work_id FROM work_items WHERE dedupe_key = ?", (spec.dedupe_key,)
            )
            results.append(EnqueueResult(str(rows[0][0]), False))
    if plain:
        await tx.executemany(_INSERT_SQL, plain)
    return results


AUDIT_COLUMNS = ("audit_id, at_us, actor, role, action, target_kind, target_id, reason,"
                 " before_json, after_json, origin_json")


def audit_from_row(r: Row) -> AuditEntry:
    return AuditEntry(
        audit_id=str(r[0]), at_us=int(r[1]), actor=str(r[2]), role=str(r[3]),
        action=str(r[4]), target_kind=str(r[5]), target_id=str(r[6]), reason=str(r[7]),
        before=str(r[8]), after=str(r[9]), origin=str(r[10]) if r[10] is not None else None,
    )


class WorkAdmin:
    """Non-claim methods of the work store (mixed into ``WorkStore``)."""

    db: Database

    async def work_enqueue(self, specs: Sequence[WorkSpec], now_us: int) -> list[EnqueueResult]:
        if not specs:
            return []

        async def body(tx: SqlTx) -> list[EnqueueResult]:
            return await insert_work(tx, specs, now_us)

        return await self.db.transact(body, name="work.enqueue")

    async def work_get(self, work_id: str) -> WorkItem | None:
        async def body(tx: SqlTx) -> WorkItem | None:
            rows = await tx.fetchall(f"{SELECT_WORK} WHERE work_id = ?", (work_id,))
            return from_row(rows[0]) if rows else None

        return await self.db.transact(body, name="work.get", write=False)

    async def work_list(self, query: WorkQuery) -> list[WorkItem]:
        equal = [(column, value) for column, value in (
            ("state", query.state.value if query.state else None),
            ("family", query.family),
            ("org_id", query.org_id),
            ("subject_id", query.subject_id),
        ) if value is not None]
        clauses, params, order = newest_first(equal)
        if query.lane is not None:
            clauses.append("(source_lane = ? OR target_lane = ?)")
            params.extend((query.lane, query.lane))
        for bound, op in ((query.after_id, "<"), (query.until_id, "<"),
                          (query.since_id, ">=")):
            if bound is not None:
                clauses.append(f"work_id {op} ?")
                params.append(bound)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        limit = max(1, min(query.limit, 1000))

        async def body(tx: SqlTx) -> list[WorkItem]:
            rows = await tx.fetchall(
                f"{SELECT_WORK}{where} {order} LIMIT ?", (*params, limit)
            )
            return [from_row(r) for r in rows]

        return await self.db.transact(body, name="work.list", write=False)

    async def work_cancel(self, work_id: str, now_us: int,
                          rules: Mapping[str, CancelRule] | None = None) -> CancelResult:
        """Cancel without an audit entry (the storage primitive; operators use
        :meth:`work_cancel_audited`). ``rules``: each family's cancel rule."""

        async def body(tx: SqlTx) -> CancelResult:
            return await cancel_in_tx(tx, work_id, now_us, rules)

        return await self.db.transact(body, name="work.cancel")

    async def work_replay(self, params: ReplayParams, now_us: int) -> WorkItem:
        """Create a new WorkItem with lineage to a terminal one (authorization is the caller's)."""

        async def body(tx: SqlTx) -> WorkItem:
            rows = await tx.fetchall(f"{SELECT_WORK} WHERE work_id = ?", (params.work_id,))
            if not rows:
                raise WorkNotFound(params.work_id)
            old = from_row(rows[0])
            if old.subject_kind == "command":
                replayed = await tx.fetchall(
                    "SELECT work_id FROM work_items WHERE replay_of = ?", (old.work_id,))
                if replayed:  # said first: the unique key below is what holds
                    raise WorkConflict(f"work {old.work_id} was already replayed"
                                       f" (as {replayed[0][0]})")
                await _command_replay_guard(tx, old.subject_id, params)
            if old.state not in REPLAYABLE:
                raise WorkConflict(f"work {old.work_id} is {old.state.value}; only terminal work"
                                   " can be replayed")
            spec = WorkSpec(
                family=old.family,
                org_id=old.org_id,
                app_installation_id=old.app_installation_id,
                subject_kind=old.subject_kind,
                subject_id=old.subject_id,
                definition_ref=old.definition_ref,
                catalog_revision=old.catalog_revision,
                catalog_digest=old.catalog_digest,
                payload=old.payload,
                payload_schema_version=old.payload_schema_version,
                engine_capability_version=old.engine_capability_version,
                queue_class=old.queue_class,
                source_lane=old.source_lane,
                target_lane=old.target_lane,
                max_attempts=old.max_attempts,
                replay_of=old.work_id,
            )
            try:
                (created,) = await insert_work(tx, [spec], now_us)
            except DuplicateKey:
                raise WorkConflict(f"work {old.work_id} was already replayed") from None
            await append_audit(
                tx,
                AuditEntry(
                    audit_id=new_ulid(now_us),
                    at_us=now_us,
                    actor=params.actor,
                    role=params.role,
                    action="work.replay",
                    target_kind="work_item",
                    target_id=old.work_id,
                    reason=params.reason,
                    before=json.dumps({"work_id": old.work_id, "state": old.state.value,
                                       "catalog_revision": old.catalog_revision,
                                       "catalog_digest": old.catalog_digest}),
                    after=json.dumps({"work_id": created.work_id, "state": "pending"}
                                     | _resolved(params)),
                ),
            )
            new_rows = await tx.fetchall(f"{SELECT_WORK} WHERE work_id = ?", (created.work_id,))
            return from_row(new_rows[0])

        return await self.db.transact(body, name="work.replay")

    async def work_state_counts(self, since_us: int | None, until_us: int,
                                family: str | None = None) -> list[tuple[str, str, int]]:
        """(family, state, count) of the items created in ``[since_us, until_us)`` (from
        the beginning when ``since_us`` is None), one family or all: ``work count``.
        A count over the range's rows (an operator's question, not a sampled gauge).

        The range is one of the primary key: a work id is a ULID of its creation, so
        ``created_at_us`` in ``[since, until)`` is ``work_id`` in ``[id_floor(since),
        id_floor(until))`` to the millisecond. ``created_at_us`` has no index: bounding it
        read every row of the table, whatever the range (issue 23 at 21M items)."""

        async def body(tx: SqlTx) -> list[tuple[str, str, int]]:
            where = ["work_id < ?"]
            args: list[Any] = [id_floor(until_us)]
            if since_us is not None:
                where.append("work_id >= ?")
                args.append(id_floor(since_us))
            if family is not None:
                where.append("family = ?")
                args.append(family)
            rows = await tx.fetchall(
                "SELECT family, state, COUNT(*) FROM work_items WHERE "
                + " AND ".join(where) + " GROUP BY family, state", tuple(args))
            return sorted((str(f), str(s), int(n)) for f, s, n in rows)

        return await self.db.transact(body, name="work.state_counts", write=False)

    async def work_depths(self) -> list[QueueDepth]:
        """Depth and oldest ``run_after`` per (family, state) of :data:`DEPTH_STATES`.

        Bounded whatever the table holds: the families present in a state come from the
        (state, family, run_after) index, one probe per family (a skip scan), each
        count stops at :data:`DEPTH_COUNT_CAP` (``capped``: at least that many), and the
        oldest ``run_after`` is the index's first entry. A year of dead items, or a
        million-deep backlog, costs a bounded read per sample, not a count of them all."""

        async def body(tx: SqlTx) -> list[QueueDepth]:
            out: list[QueueDepth] = []
            for state in sorted(DEPTH_STATES):
                for family in await families_in(tx, state):
                    ((n,),) = await tx.fetchall(
                        "SELECT COUNT(*) FROM (SELECT 1 FROM work_items WHERE state = ?"
                        " AND family = ? LIMIT ?) bounded",
                        (state.value, family, DEPTH_COUNT_CAP + 1))
                    ((oldest,),) = await tx.fetchall(
                        "SELECT MIN(run_after_us) FROM work_items WHERE state = ?"
                        " AND family = ?", (state.value, family))
                    out.append(QueueDepth(
                        str(family), state, min(int(n), DEPTH_COUNT_CAP),
                        int(oldest) if oldest is not None else None,
                        capped=int(n) > DEPTH_COUNT_CAP))
            return out

        return await self.db.transact(body, name="work.depths", write=False)

    async def work_count_open(self, family: str | None = None) -> int:
        """Non-terminal items (of one family, or all)."""
        family_clause = " AND family = ?" if family is not None else ""

        async def body(tx: SqlTx) -> int:
            rows = await tx.fetchall(
                "SELECT COUNT(*) FROM work_items WHERE state IN"
                f" {in_states(frozenset(WorkState) - TERMINAL)}{family_clause}",
                (family,) if family is not None else (),
            )
            return int(rows[0][0])

        return await self.db.transact(body, name="work.count_open", write=False)

    async def replica_heartbeat(self, info: ReplicaInfo) -> None:
        async def body(tx: SqlTx) -> None:
            if await tx.execute(
                "UPDATE replicas SET state = ?, heartbeat_at_us = ?, families = ?,"
                " hostname = ?, pid = ?, version = ?, started_at_us = ? WHERE replica_id = ?",
                (
                    info.state,
                    info.heartbeat_at_us,
                    info.families,
                    info.hostname,
                    info.pid,
                    info.version,
                    info.started_at_us,
                    info.replica_id,
                ),
            ):
                return
            await tx.execute(
                "INSERT INTO replicas (replica_id, hostname, pid, version, state, families,"
                " started_at_us, heartbeat_at_us) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    info.replica_id,
                    info.hostname,
                    info.pid,
                    info.version,
                    info.state,
                    info.families,
                    info.started_at_us,
                    info.heartbeat_at_us,
                ),
            )

        await self.db.transact(body, name="replica.heartbeat")

    async def replica_list(self, seen_since_us: int) -> list[ReplicaInfo]:
        async def body(tx: SqlTx) -> list[ReplicaInfo]:
            rows = await tx.fetchall(
                "SELECT replica_id, hostname, pid, version, state, families, started_at_us,"
                " heartbeat_at_us FROM replicas WHERE heartbeat_at_us >= ?"
                " ORDER BY replica_id",
                (seen_since_us,),
            )
            return [
                ReplicaInfo(
                    replica_id=str(r[0]),
                    hostname=str(r[1]),
                    pid=int(r[2]),
                    version=str(r[3]),
                    state=str(r[4]),
                    families=str(r[5]),
                    started_at_us=int(r[6]),
                    heartbeat_at_us=int(r[7]),
                )
                for r in rows
            ]

        return await self.db.transact(body, name="replica.list", write=False)

    async def audit_list(self, limit: int = 100, target_id: str | None = None) -> list[AuditEntry]:
        clause = " WHERE target_id = ?" if target_id is not None else ""
        params: tuple[Any, ...] = (target_id,) if target_id is not None else ()

        async def body(tx: SqlTx) -> list[AuditEntry]:
            rows = await tx.fetchall(
                f"SELECT {AUDIT_COLUMNS} FROM audit_log{clause}"
                " ORDER BY audit_id DESC LIMIT ?",
                (*params, max(1, min(limit, 1000))),
            )
            return [audit_from_row(r) for r in rows]

        return await self.db.transact(body, name="audit.list", write=False)

    # ------------------------------------------- operator console (admin UI)

    async def work_cancel_audited(self, params: CancelParams, now_us: int,
                                  rules: Mapping[str, CancelRule] | None = None
                                  ) -> CancelResult:
        """Cancel like :meth:`work_cancel` and append an audit entry in the same
        transaction. A refusal (a terminal item, or the family's rule) raises
        :class:`CancelRefused` and writes nothing."""

        async def body(tx: SqlTx) -> CancelResult:
            rows = await tx.fetchall(
                "SELECT state FROM work_items WHERE work_id = ?", (params.work_id,)
            )
            if not rows:
                raise WorkNotFound(params.work_id)
            result = await cancel_in_tx(tx, params.work_id, now_us, rules,
                                        refuse_terminal=True)
            # What the matched UPDATE proves about the state before it.
            before = WorkState.PROCESSING if result.disposition == "requested" else WorkState(
                rows[0][0])
            await append_audit(
                tx,
                AuditEntry(
                    audit_id=new_ulid(now_us),
                    at_us=now_us,
                    actor=params.actor,
                    role=params.role,
                    action="work.cancel",
                    target_kind="work_item",
                    target_id=params.work_id,
                    reason=params.reason,
                    before=json.dumps({"work_id": params.work_id, "state": before.value}),
                    after=json.dumps({"work_id": params.work_id, "state": result.state.value,
                                      "disposition": result.disposition}),
                ),
            )
            return result

        return await self.db.transact(body, name="work.cancel_audited")

    async def work_replays_of(self, work_id: str) -> list[WorkItem]:
        """Items replayed from ``work_id`` (``replay_of`` is unique: zero or one)."""

        async def body(tx: SqlTx) -> list[WorkItem]:
            rows = await tx.fetchall(f"{SELECT_WORK} WHERE replay_of = ?", (work_id,))
            return [from_row(r) for r in rows]

        return await self.db.transact(body, name="work.replays_of", write=False)

    async def work_dead_list(self, query: DeadQuery) -> list[WorkItem]:
        """Dead items, newest first, optionally of one family and failure class."""
        equal: list[tuple[str, Any]] = [("state", "dead")]
        if query.family is not None:
            equal.append(("family", query.family))
        if query.failure_class is not None:
            equal.append(("failure_class", query.failure_class))
        clauses, params, order = newest_first(equal)
        if query.unreplayed_only:
            clauses.append(
                "NOT EXISTS (SELECT 1 FROM work_items r WHERE r.replay_of = work_items.work_id)"
            )
        if query.after_id is not None:
            clauses.append("work_id < ?")
            params.append(query.after_id)
        limit = max(1, min(query.limit, 1000))

        async def body(tx: SqlTx) -> list[WorkItem]:
            rows = await tx.fetchall(
                f"{SELECT_WORK} WHERE {' AND '.join(clauses)} {order} LIMIT ?",
                (*params, limit),
            )
            return [from_row(r) for r in rows]

        return await self.db.transact(body, name="work.dead_list", write=False)

    async def work_dead_classes(self, sample: int = 5000) -> list[DeadClassCount]:
        """(family, failure class) counts among the newest ``sample`` dead items (bounded)."""

        async def body(tx: SqlTx) -> list[DeadClassCount]:
            rows = await tx.fetchall(
                "SELECT family, failure_class, COUNT(*) FROM (SELECT family, failure_class"
                # (A closed range and the full ORDER BY keep the index order: newest_first.)
                " FROM work_items WHERE state >= 'dead' AND state <= 'dead'"
                " ORDER BY state DESC, work_id DESC LIMIT ?) newest"
                " GROUP BY family, failure_class",
                (max(1, min(sample, 100_000)),),
            )
            out = [
                DeadClassCount(str(f), str(c) if c is not None else None, int(n))
                for f, c, n in rows
            ]
            out.sort(key=lambda d: (-d.count, d.family, d.failure_class or ""))
            return out

        return await self.db.transact(body, name="work.dead_classes", write=False)

    async def work_replay_map(self, work_ids: Sequence[str]) -> dict[str, str]:
        """For each of ``work_ids`` that was replayed: original id -> replay's id."""
        ids = list(dict.fromkeys(work_ids))[:1000]
        if not ids:
            return {}

        async def body(tx: SqlTx) -> dict[str, str]:
            rows = await tx.fetchall(
                f"SELECT replay_of, work_id FROM work_items WHERE replay_of IN"
                f" ({placeholders(len(ids))})",
                ids,
            )
            return {str(a): str(b) for a, b in rows}

        return await self.db.transact(body, name="work.replay_map", write=False)

    async def audit_append(self, entry: AuditEntry) -> None:
        """Append one audit entry in its own transaction (e.g. a bulk action's summary)."""

        async def body(tx: SqlTx) -> None:
            await append_audit(tx, entry)

        await self.db.transact(body, name="audit.append")


async def _command_replay_guard(tx: SqlTx, command_id: str, params: ReplayParams) -> None:
    """The replay guard of a command's work item, in the replay's own transaction: it
    takes the command's row first, then the operator-path table decides on what is
    committed now (settled, repaired, retired, unresolved, proven applied, superseded by
    a newer open or settled intent, moved pins: refused, with the reason).
    (Imported here: the effect journal it reads imports this module.)"""
    from daemon.core.operator_paths import Action
    from storage.command_operator import decide

    await decide(tx, command_id, Action.REPLAY, current_catalog=params.resolved_catalog)


class CancelRequested(WorkConflict):
    """A step refused because an operator asked the item to stop (acknowledge it)."""


class CancelRefused(WorkConflict):
    """An operator's cancel refused by the family's rule; ``code`` is stable."""

    def __init__(self, work_id: str, code: str, reason: str) -> None:
        super().__init__(f"work {work_id} cannot be cancelled: {reason}")
        self.code = code


# Attempts of the item's command with no proven outcome and no disposition.
_UNRESOLVED_OF_COMMAND = (
    "SELECT COUNT(*) FROM effect_attempts WHERE command_id = ? AND disposition IS NULL"
    " AND (outcome IS NULL OR outcome = 'OUTCOME_UNKNOWN')"
)


async def cancel_in_tx(tx: SqlTx, work_id: str, now_us: int,
                       rules: Mapping[str, CancelRule] | None = None, *,
                       refuse_terminal: bool = False) -> CancelResult:
    """Cancel per the item's family rule (:func:`daemon.core.cancel.decide_cancel`).

    Unclaimed work is cancelled at once; a running item gets a cancel request
    that its claimant acknowledges (fenced); terminal work is left alone
    (``noop``, or :class:`CancelRefused` with ``refuse_terminal``). A family
    missing from ``rules`` may be cancelled any time, except that an item whose
    command has an unresolved effect attempt is never cancelled (the journal's
    rule, whatever the caller passes).

    The state change is made *first* and judged by matched rows, then the
    journal is read: the UPDATE waits for a concurrent dispatch checkpoint
    (which locks the same row), so the read sees its attempt and the cancel
    is rolled back; a checkpoint that comes later sees ``cancel_requested``.
    """
    rows = await tx.fetchall(
        "SELECT family, state, subject_kind, subject_id FROM work_items WHERE work_id = ?",
        (work_id,))
    if not rows:
        raise WorkNotFound(work_id)
    family, state = str(rows[0][0]), WorkState(rows[0][1])
    is_effect = str(rows[0][2]) == "command"
    rule = (rules or {}).get(family, CancelRule.ANYTIME)
    if is_effect and rule is CancelRule.ANYTIME:
        rule = CancelRule.BEFORE_DISPATCH
    verdict = decide_cancel(rule, state, unresolved_attempt=False, family=family)
    if verdict.action is CancelAction.REFUSE:
        if verdict.code == "terminal" and not refuse_terminal:
            return CancelResult(work_id, "noop", state)
        raise CancelRefused(work_id, verdict.code, verdict.reason)
    result = await _cancel_update(tx, work_id, now_us)
    if result.disposition == "noop":  # the state moved on since our read
        if refuse_terminal:
            raise CancelRefused(work_id, "terminal", f"the item is {result.state.value}")
        return result
    if is_effect:
        unresolved = await tx.fetchall(_UNRESOLVED_OF_COMMAND, (str(rows[0][3]),))
        late = decide_cancel(rule, result.state if result.disposition == "requested"
                             else state, unresolved_attempt=bool(int(unresolved[0][0])),
                             family=family)
        if late.action is CancelAction.REFUSE:
            raise CancelRefused(work_id, late.code, late.reason)  # rolls the UPDATE back
    return result


async def _cancel_update(tx: SqlTx, work_id: str, now_us: int) -> CancelResult:
    if await tx.execute(
        "UPDATE work_items SET state = 'cancelled', terminal_outcome = 'cancelled',"
        " operator_summary = 'cancelled before it ran', row_version = row_version + 1,"
        " updated_at_us = ? WHERE work_id = ? AND state IN ('pending', 'retry')",
        (now_us, work_id),
    ):
        return CancelResult(work_id, "cancelled", WorkState.CANCELLED)
    if await tx.execute(
        "UPDATE work_items SET cancel_requested = 1, row_version = row_version + 1,"
        " updated_at_us = ? WHERE work_id = ? AND state = 'processing'",
        (now_us, work_id),
    ):
        return CancelResult(work_id, "requested", WorkState.PROCESSING)
    rows = await tx.fetchall("SELECT state FROM work_items WHERE work_id = ?", (work_id,))
    if not rows:
        raise WorkNotFound(work_id)
    return CancelResult(work_id, "noop", WorkState(rows[0][0]))


# Where this process's operator actions come from (JSON text), recorded with every
# audit entry that does not name its own origin: the CLI sets it once at start-up
# (the OS user and SUDO_USER beside --actor). Context-local, so a test or a
# server can set it per task.
AUDIT_ORIGIN: ContextVar[str | None] = ContextVar("integrationd_audit_origin", default=None)


async def append_audit(tx: SqlTx, entry: AuditEntry) -> None:
    """Append one audit entry inside the caller's transaction (there is no update path)."""
    origin = entry.origin if entry.origin is not None else AUDIT_ORIGIN.get()
    await tx.execute(
        "INSERT INTO audit_log (audit_id, at_us, actor, role, action, target_kind, target_id,"
        " reason, before_json, after_json, origin_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (entry.audit_id, entry.at_us, entry.actor, entry.role, entry.action, entry.target_kind,
         entry.target_id, entry.reason, entry.before, entry.after, origin),
    )

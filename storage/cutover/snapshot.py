"""What a cutover step proves, counted inside the step's own transaction."""

from __future__ import annotations

import json

import attrs

from daemon.core.cutover import Snapshot
from storage.cutover.values import LEGACY, LegacyClaimant, LegacyProof
from storage.port import SqlTx

# Joins from a WorkItem to the effect attempts made for it (its own, and those of
# the command it carries).
ATTEMPT_JOINS = ("e.work_id = w.work_id",
                 "w.subject_kind = 'command' AND e.command_id = w.subject_id")
# States of a process row that prove it can no longer claim: it said so itself
# (stopped) or an operator proved it (gone). Anything else counts as live.
NOT_LIVE = ("stopped", "gone")


async def _count(tx: SqlTx, sql: str, args: tuple[object, ...]) -> int:
    rows = await tx.fetchall(sql, args)
    return int(rows[0][0])


async def attempts_where(tx: SqlTx, where: str, args: tuple[object, ...],
                         attempt_clause: str = "") -> int:
    """Effect attempts of the WorkItems matching ``where`` (alias ``w``)."""
    total = 0
    for join in ATTEMPT_JOINS:
        total += await _count(
            tx, "SELECT COUNT(*) FROM work_items w JOIN effect_attempts e ON " + join
            + " WHERE " + where + attempt_clause, args)
    return total


def serves(families: str, family: str) -> bool:
    """Whether a replica row's ``families`` (a JSON list, or comma-separated) names it."""
    try:
        doc = json.loads(families)
    except ValueError:
        doc = families.split(",")
    return isinstance(doc, list) and family in {str(f).strip() for f in doc}


async def live_replicas(tx: SqlTx, family: str) -> tuple[str, ...]:
    rows = await tx.fetchall(
        "SELECT replica_id, families FROM replicas WHERE state NOT IN (?, ?)"
        " ORDER BY replica_id", NOT_LIVE)
    return tuple(str(r[0]) for r in rows if serves(str(r[1]), family))


async def live_legacy(tx: SqlTx, family: str) -> tuple[str, ...]:
    rows = await tx.fetchall(
        "SELECT process_id FROM claimant_processes WHERE family = ? AND owner = ?"
        " AND state NOT IN (?, ?) ORDER BY process_id", (family, LEGACY, *NOT_LIVE))
    return tuple(str(r[0]) for r in rows)


async def fence_counts(tx: SqlTx, family: str) -> Snapshot:
    """The re-cutover side: fenced rows and legacy receipts of the family."""
    awaiting = await _count(
        tx, "SELECT COUNT(*) FROM work_items WHERE family = ?"
        " AND state = 'awaiting_legacy_outcome'", (family,))
    unknown = await _count(
        tx, "SELECT COUNT(*) FROM work_items WHERE family = ?"
        " AND state = 'legacy_outcome_unknown'", (family,))
    unprojected = await _count(
        tx, "SELECT COUNT(*) FROM legacy_outcome_receipts r JOIN work_items w"
        " ON w.work_id = r.work_id WHERE w.family = ? AND r.projected_at_us IS NULL",
        (family,))
    conflicting = await _count(
        tx, "SELECT COUNT(*) FROM legacy_outcome_receipts r JOIN work_items w"
        " ON w.work_id = r.work_id WHERE w.family = ? AND r.projection = 'conflict'",
        (family,))
    return Snapshot(awaiting=awaiting, unknown=unknown, unprojected_receipts=unprojected,
                    conflicting_receipts=conflicting)


async def integrationd_counts(tx: SqlTx, family: str, now_us: int) -> Snapshot:
    """The rollback side: what integrationd could still execute or reclaim."""
    processing = await _count(
        tx, "SELECT COUNT(*) FROM work_items WHERE family = ? AND state = 'processing'"
        " AND lease_until_us >= ?", (family, now_us))
    expired = await _count(
        tx, "SELECT COUNT(*) FROM work_items WHERE family = ? AND state = 'processing'"
        " AND (lease_until_us IS NULL OR lease_until_us < ?)", (family, now_us))
    started = await attempts_where(
        tx, "w.family = ?", (family,),
        " AND e.outcome IS NULL AND e.disposition IS NULL")
    history = await attempts_where(tx, "w.family = ? AND w.state IN ('pending', 'retry')",
                                   (family,))
    return Snapshot(processing=processing, expired_leases=expired, started_attempts=started,
                    dispatch_history=history, replicas=await live_replicas(tx, family))


async def full_snapshot(tx: SqlTx, family: str, now_us: int,
                        legacy: LegacyClaimant | None) -> Snapshot:
    ours = await integrationd_counts(tx, family, now_us)
    fences = await fence_counts(tx, family)
    proof = LegacyProof(processing=0, uncovered=0)
    if legacy is not None:
        proof = await legacy.legacy_proof(tx, family)
    # Live legacy processes: the heartbeats in claimant_processes and whatever the
    # legacy owner's own adapter reports (either one is enough to block).
    processes = tuple(sorted(set(await live_legacy(tx, family)) | set(proof.processes)))
    return attrs.evolve(
        ours, awaiting=fences.awaiting, unknown=fences.unknown,
        unprojected_receipts=fences.unprojected_receipts,
        conflicting_receipts=fences.conflicting_receipts,
        legacy_processing=proof.processing, legacy_uncovered=proof.uncovered,
        legacy_open_claims=proof.open_claims, legacy_processes=processes)


def snapshot_json(snap: Snapshot) -> str:
    return json.dumps(attrs.asdict(snap), sort_keys=True)

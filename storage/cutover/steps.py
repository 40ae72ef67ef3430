"""Moving a family's owner generation: begin, commit, rollback begin, rollback commit.

Theory of operation
-------------------
Every step is one write transaction that first locks the family's
owner-generation row (a conditional UPDATE: the row lock on MySQL-family
servers, the writer lock on SQLite), so two operators' steps serialize. The
pure core (``daemon/core/cutover.py``) says whether the step is legal from the
current phase and, from counts taken inside the same transaction, what blocks
it; a blocked step raises :class:`CutoverBlocked` and commits nothing.

``begin`` and ``rollback_begin`` only close admission (``claimant = 'none'``):
from their COMMIT on, no claim statement of the closed owner matches (each
reads this row in the statement itself). ``commit`` and ``rollback_commit``
write the receipt of a new generation binding the zero proof.

The rollback fence moves before it proves: one UPDATE moves every ``pending``
or ``retry`` row of the family to ``awaiting_legacy_outcome`` under a new
fence id, row-locking what it moves and waiting for (then re-reading) any row
a claim holds; the proof that follows in the same transaction therefore sees
every claim that could overlap, and any finding rolls the move back.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import NoReturn

import attrs

from daemon.core.cutover import (
    CLAIM_SCHEMA_VERSION,
    CLAIMANT,
    NEW_GENERATION,
    Claimant,
    Phase,
    Snapshot,
    Step,
    blockers,
    next_phase,
)
from storage.cutover.open_claims import OpenClaims, find_open_claims
from storage.cutover.snapshot import (
    attempts_where,
    fence_counts,
    full_snapshot,
    integrationd_counts,
    snapshot_json,
)
from storage.cutover.values import (
    INTEGRATIOND,
    LEGACY,
    OWNER_GENERATION_COLUMNS,
    RECEIPT_COLUMNS,
    CutoverBlocked,
    CutoverReceipt,
    LegacyClaimant,
    OwnerGeneration,
    StepParams,
    StepResult,
)
from storage.idgen import new_ulid
from storage.port import AuditEntry, Database, SqlTx, WorkConflict
from storage.work_admin import append_audit

# A step's proof: counts (and, for a fence, its id and the rows it moved).
Prover = Callable[[SqlTx], Awaitable[tuple[Snapshot, str | None, int]]]


class _Looked(Exception):
    """Carries a status snapshot out of its transaction, rolling the transaction back."""

    def __init__(self, generation: OwnerGeneration | None, snapshot: Snapshot) -> None:
        super().__init__("snapshot taken")
        self.generation = generation
        self.snapshot = snapshot


class NotUnderCutover(WorkConflict):
    def __init__(self, family: str) -> None:
        super().__init__(f"family {family} has no owner generation: it never had another"
                         " claimant (begin a cutover first)")
        self.code = "cutover_not_started"


async def read_generation(tx: SqlTx, family: str) -> OwnerGeneration | None:
    rows = await tx.fetchall(
        f"SELECT {OWNER_GENERATION_COLUMNS} FROM owner_generations WHERE family = ?",
        (family,))
    return OwnerGeneration.from_row(rows[0]) if rows else None


async def lock_generation(tx: SqlTx, family: str, now_us: int) -> OwnerGeneration | None:
    """Lock the family's row for the rest of ``tx`` (None: there is none)."""
    if not await tx.execute(
        "UPDATE owner_generations SET row_version = row_version + 1, updated_at_us = ?"
        " WHERE family = ?", (now_us, family)):
        return None
    return await read_generation(tx, family)


async def fence_unstarted(tx: SqlTx, family: str, fence_id: str, now_us: int) -> int:
    """Move every unstarted row of ``family`` under ``fence_id`` (prove after this)."""
    return await tx.execute(
        "UPDATE work_items SET state = 'awaiting_legacy_outcome',"
        " rollback_execution_fence_id = ?, row_version = row_version + 1,"
        " updated_at_us = ? WHERE family = ? AND state IN ('pending', 'retry')",
        (fence_id, now_us, family),
    )


async def fenced_digest(tx: SqlTx, fence_id: str) -> tuple[int, str]:
    """(count, sha256 over the sorted work ids) of the rows fenced under ``fence_id``."""
    rows = await tx.fetchall(
        "SELECT work_id FROM work_items WHERE rollback_execution_fence_id = ?"
        " ORDER BY work_id", (fence_id,))
    digest = hashlib.sha256("\n".join(str(r[0]) for r in rows).encode()).hexdigest()
    return len(rows), "sha256:" + digest


def _audit(params: StepParams, action: str, before: OwnerGeneration | None,
           after: OwnerGeneration, now_us: int) -> AuditEntry:
    def doc(g: OwnerGeneration | None) -> str:
        if g is None:
            return "{}"
        return json.dumps({"generation": g.generation, "phase": g.phase.value,
                           "claimant": g.claimant.value}, sort_keys=True)

    return AuditEntry(audit_id=new_ulid(now_us), at_us=now_us, actor=params.actor,
                      role=params.role, action=action, target_kind="cutover",
                      target_id=params.family, reason=params.reason, before=doc(before),
                      after=doc(after))


class CutoverSteps:
    """Owner-generation steps of the work store (mixed into ``WorkStore``)."""

    db: Database

    async def owner_generation_get(self, family: str) -> OwnerGeneration | None:
        async def body(tx: SqlTx) -> OwnerGeneration | None:
            return await read_generation(tx, family)

        return await self.db.transact(body, name="cutover.generation", write=False)

    async def _close(self, params: StepParams, step: Step, now_us: int) -> StepResult:
        """``begin`` / ``rollback_begin``: close the open owner's admission."""

        async def body(tx: SqlTx) -> StepResult:
            before = await lock_generation(tx, params.family, now_us)
            if before is None:
                if step is not Step.BEGIN:
                    raise NotUnderCutover(params.family)
                phase = next_phase(Phase.LEGACY_ACTIVE, step)
                await tx.execute(
                    "INSERT INTO owner_generations (family, generation, phase, claimant,"
                    " receipt_id, admission_closed_at_us, row_version, updated_at_us)"
                    " VALUES (?, 0, ?, ?, NULL, ?, 1, ?)",
                    (params.family, phase.value, CLAIMANT[phase].value, now_us, now_us))
            else:
                phase = next_phase(before.phase, step)
                await tx.execute(
                    "UPDATE owner_generations SET phase = ?, claimant = ?,"
                    " admission_closed_at_us = COALESCE(admission_closed_at_us, ?)"
                    " WHERE family = ?",
                    (phase.value, CLAIMANT[phase].value, now_us, params.family))
            after = await read_generation(tx, params.family)
            assert after is not None
            await append_audit(tx, _audit(params, f"cutover.{step.value}", before, after,
                                          now_us))
            return StepResult(after)

        return await self.db.transact(body, name=f"cutover.{step.value}")

    async def cutover_begin(self, params: StepParams, now_us: int) -> StepResult:
        """Close the legacy owner's admission; nobody claims while it drains."""
        return await self._close(params, Step.BEGIN, now_us)

    async def cutover_rollback_begin(self, params: StepParams, now_us: int) -> StepResult:
        """Close integrationd's claim and reclaim admission for the family."""
        return await self._close(params, Step.ROLLBACK_BEGIN, now_us)

    async def _open(self, params: StepParams, step: Step, now_us: int,
                    prove: Prover) -> StepResult:
        """``commit`` / ``rollback_commit``: prove, then write a new generation's receipt."""
        assert step in NEW_GENERATION

        async def body(tx: SqlTx) -> StepResult:
            before = await lock_generation(tx, params.family, now_us)
            if before is None:
                raise NotUnderCutover(params.family)
            phase = next_phase(before.phase, step)
            snap, fence_id, moved = await prove(tx)
            closed_for = (now_us - before.admission_closed_at_us
                          if before.admission_closed_at_us is not None else None)
            snap = attrs.evolve(snap, closed_for_us=closed_for,
                                claim_tx_bound_us=params.claim_tx_bound_us)
            found = blockers(step, snap)
            if found:
                raise CutoverBlocked(params.family, step.value, found)
            count, digest = (await fenced_digest(tx, fence_id)) if fence_id else (0, None)
            owner = CLAIMANT[phase]
            receipt = CutoverReceipt(
                receipt_id=new_ulid(now_us), family=params.family,
                generation=before.generation + 1, owner=owner.value,
                kind="cutover" if owner is Claimant.INTEGRATIOND else "rollback",
                claim_schema_version=CLAIM_SCHEMA_VERSION, proof_json=snapshot_json(snap),
                fence_id=fence_id, fenced_count=count, fenced_digest=digest,
                actor=params.actor, created_at_us=now_us)
            await tx.execute(
                f"INSERT INTO cutover_receipts ({RECEIPT_COLUMNS}) VALUES"
                " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", attrs.astuple(receipt))
            await tx.execute(
                "UPDATE owner_generations SET generation = ?, phase = ?, claimant = ?,"
                " receipt_id = ?, admission_closed_at_us = NULL WHERE family = ?",
                (receipt.generation, phase.value, owner.value, receipt.receipt_id,
                 params.family))
            after = await read_generation(tx, params.family)
            assert after is not None
            await append_audit(tx, _audit(params, f"cutover.{step.value}", before, after,
                                          now_us))
            return StepResult(after, receipt, moved)

        return await self.db.transact(body, name=f"cutover.{step.value}")

    async def cutover_commit(self, params: StepParams, now_us: int,
                             legacy: LegacyClaimant | None) -> StepResult:
        """Admit integrationd: zero legacy claimers, full coverage, re-cutover rules."""

        async def prove(tx: SqlTx) -> tuple[Snapshot, str | None, int]:
            snap = await full_snapshot(tx, params.family, now_us, legacy)
            return attrs.evolve(snap, legacy_reported=legacy is not None), None, 0

        return await self._open(params, Step.COMMIT, now_us, prove)

    async def cutover_rollback_commit(self, params: StepParams, now_us: int) -> StepResult:
        """The atomic rollback fence, then the legacy owner's receipt.

        First, claims a frozen process left open (``open_claims``): the fence would
        wait on their row locks, so the step refuses at once, naming them."""
        stuck = await find_open_claims(self.db, params.family)
        if stuck.owners:
            await self._refuse_open_claims(params, now_us, stuck)
        fence_id = new_ulid(now_us)

        async def prove(tx: SqlTx) -> tuple[Snapshot, str | None, int]:
            moved = await fence_unstarted(tx, params.family, fence_id, now_us)
            snap = await integrationd_counts(tx, params.family, now_us)
            history = await attempts_where(
                tx, "w.rollback_execution_fence_id = ? AND w.state = 'awaiting_legacy_outcome'",
                (fence_id,))
            return attrs.evolve(snap, dispatch_history=history), fence_id, moved

        return await self._open(params, Step.ROLLBACK_COMMIT, now_us, prove)

    async def _refuse_open_claims(self, params: StepParams, now_us: int,
                                  stuck: OpenClaims) -> NoReturn:
        """Raise the rollback commit's blockers, counted by reads that take no lock
        (a committed read never waits for the open claims' row locks)."""

        async def body(tx: SqlTx) -> tuple[OwnerGeneration | None, Snapshot]:
            return (await read_generation(tx, params.family),
                    await integrationd_counts(tx, params.family, now_us))

        gen, snap = await self.db.transact(body, name="cutover.rollback_refusal",
                                           write=False)
        if gen is None:
            raise NotUnderCutover(params.family)
        next_phase(gen.phase, Step.ROLLBACK_COMMIT)  # an illegal step says so first
        closed_for = (now_us - gen.admission_closed_at_us
                      if gen.admission_closed_at_us is not None else None)
        snap = attrs.evolve(snap, open_claims=stuck.described(),
                            open_claim_owners=stuck.owners, closed_for_us=closed_for,
                            claim_tx_bound_us=params.claim_tx_bound_us)
        raise CutoverBlocked(params.family, Step.ROLLBACK_COMMIT.value,
                             blockers(Step.ROLLBACK_COMMIT, snap))

    async def cutover_snapshot(self, family: str, now_us: int,
                               legacy: LegacyClaimant | None) -> tuple[
                                   OwnerGeneration | None, Snapshot]:
        """The counts a status page shows (the steps count again themselves).

        The legacy claimant's lock statement is an UPDATE: run in a read it would
        commit on its own (autocommit), so a status look would write to the legacy
        owner's tables. The snapshot runs in a write transaction that is always
        rolled back instead."""

        async def body(tx: SqlTx) -> None:
            gen = await read_generation(tx, family)
            snap = await full_snapshot(tx, family, now_us, legacy)
            closed = (now_us - gen.admission_closed_at_us
                      if gen is not None and gen.admission_closed_at_us is not None else None)
            raise _Looked(gen, attrs.evolve(snap, legacy_reported=legacy is not None,
                                            closed_for_us=closed))

        try:
            await self.db.transact(body, name="cutover.snapshot")
        except _Looked as looked:
            return looked.generation, looked.snapshot
        raise AssertionError("unreachable: the snapshot always rolls back")

    async def cutover_families(self) -> list[OwnerGeneration]:
        """Every family under the cutover protocol."""

        async def body(tx: SqlTx) -> list[OwnerGeneration]:
            rows = await tx.fetchall(
                f"SELECT {OWNER_GENERATION_COLUMNS} FROM owner_generations ORDER BY family")
            return [OwnerGeneration.from_row(r) for r in rows]

        return await self.db.transact(body, name="cutover.families", write=False)

    async def cutover_receipts(self, family: str, limit: int = 50) -> list[CutoverReceipt]:
        async def body(tx: SqlTx) -> list[CutoverReceipt]:
            rows = await tx.fetchall(
                f"SELECT {RECEIPT_COLUMNS} FROM cutover_receipts WHERE family = ?"
                " ORDER BY generation DESC LIMIT ?", (family, limit))
            return [CutoverReceipt.from_row(r) for r in rows]

        return await self.db.transact(body, name="cutover.receipts", write=False)

    async def cutover_fence_blockers(self, family: str) -> Snapshot:
        async def body(tx: SqlTx) -> Snapshot:
            return await fence_counts(tx, family)

        return await self.db.transact(body, name="cutover.fence_blockers", write=False)

    async def claimant_heartbeat(self, process_id: str, owner: str, family: str,
                                 generation_seen: int, state: str, now_us: int) -> None:
        """A claim-capable process of either owner reports itself (legacy workers)."""
        if owner not in (INTEGRATIOND, LEGACY):
            raise ValueError(f"unknown claimant owner {owner!r}")

        async def body(tx: SqlTx) -> None:
            if await tx.execute(
                "UPDATE claimant_processes SET owner = ?, family = ?, generation_seen = ?,"
                " state = ?, heartbeat_at_us = ? WHERE process_id = ?",
                (owner, family, generation_seen, state, now_us, process_id)):
                return
            await tx.execute(
                "INSERT INTO claimant_processes (process_id, owner, family, generation_seen,"
                " state, heartbeat_at_us) VALUES (?, ?, ?, ?, ?, ?)",
                (process_id, owner, family, generation_seen, state, now_us))

        await self.db.transact(body, name="cutover.claimant_heartbeat")

    async def process_mark_gone(self, process_id: str, params: StepParams,
                                now_us: int) -> bool:
        """An operator's proof that a replica or legacy process is gone (audited).
        A process that is in fact alive reports itself again at its next heartbeat."""

        async def body(tx: SqlTx) -> bool:
            n = await tx.execute(
                "UPDATE replicas SET state = 'gone' WHERE replica_id = ?", (process_id,))
            n += await tx.execute(
                "UPDATE claimant_processes SET state = 'gone' WHERE process_id = ?",
                (process_id,))
            if n:
                await append_audit(tx, AuditEntry(
                    audit_id=new_ulid(now_us), at_us=now_us, actor=params.actor,
                    role=params.role, action="cutover.process_gone", target_kind="process",
                    target_id=process_id, reason=params.reason, before="{}",
                    after='{"state": "gone"}'))
            return n > 0

        return await self.db.transact(body, name="cutover.process_gone")



"""Cutover rows as values, and what a legacy owner must let integrationd prove."""

from __future__ import annotations

from typing import Any, Protocol

import attrs

from daemon.core.cutover import Blocker, Claimant, Phase, Snapshot
from storage.port import SqlTx, WorkConflict

INTEGRATIOND = Claimant.INTEGRATIOND.value
LEGACY = Claimant.LEGACY.value


@attrs.frozen
class OwnerGeneration:
    family: str
    generation: int
    phase: Phase
    claimant: Claimant
    receipt_id: str | None
    admission_closed_at_us: int | None
    row_version: int
    updated_at_us: int

    @classmethod
    def from_row(cls, r: tuple[Any, ...]) -> OwnerGeneration:
        return cls(str(r[0]), int(r[1]), Phase(str(r[2])), Claimant(str(r[3])),
                   str(r[4]) if r[4] is not None else None,
                   int(r[5]) if r[5] is not None else None, int(r[6]), int(r[7]))


OWNER_GENERATION_COLUMNS = (
    "family, generation, phase, claimant, receipt_id, admission_closed_at_us, row_version,"
    " updated_at_us"
)


@attrs.frozen
class CutoverReceipt:
    receipt_id: str
    family: str
    generation: int
    owner: str
    kind: str  # cutover | rollback
    claim_schema_version: int
    proof_json: str
    fence_id: str | None
    fenced_count: int
    fenced_digest: str | None
    actor: str
    created_at_us: int

    @classmethod
    def from_row(cls, r: tuple[Any, ...]) -> CutoverReceipt:
        return cls(str(r[0]), str(r[1]), int(r[2]), str(r[3]), str(r[4]), int(r[5]),
                   str(r[6]), str(r[7]) if r[7] is not None else None, int(r[8]),
                   str(r[9]) if r[9] is not None else None, str(r[10]), int(r[11]))


RECEIPT_COLUMNS = (
    "receipt_id, family, generation, owner, kind, claim_schema_version, proof_json,"
    " fence_id, fenced_count, fenced_digest, actor, created_at_us"
)


@attrs.frozen
class LegacyProof:
    """The legacy owner's side of a proof, counted inside the step's transaction.

    What the cutover needs of any legacy claimant (the port, seed 11.1): its
    active claims and leases (rows it is processing), the eligible items it has
    that no WorkItem covers, the claim-capable processes it knows to be live, and
    its claim transactions still open. Terminal-outcome receipts are the other
    half of the contract: the legacy owner writes them into
    ``legacy_outcome_receipts`` in the same transaction as each terminal
    transition of a fenced item (docs/operations.md, "Your legacy claimant").
    """

    processing: int   # legacy items claimed (leased) by the legacy owner now
    uncovered: int    # eligible legacy items with no WorkItem
    processes: tuple[str, ...] = ()    # live claim-capable processes the owner reports
    open_claims: tuple[str, ...] = ()  # its claim transactions still open, named


class LegacyClaimant(Protocol):
    """The port: how integrationd proves the legacy owner drained and was covered.

    ``legacy_proof`` runs inside the cutover step's own write transaction and must
    make its count one decision with the step (a guarded statement or locking read
    over the legacy owner's rows), so that no legacy claim can commit unseen.
    Adapters are declared in configuration (``[[legacy_claimants]]``); a mistake in
    an adapter's own statements is a :class:`LegacyClaimantError` naming its key.
    """

    @property
    def name(self) -> str:
        """The adapter's configuration key (``legacy_claimants[0]``)."""
        ...

    async def legacy_proof(self, tx: SqlTx, family: str) -> LegacyProof: ...


class LegacyClaimantError(Exception):
    """A configured legacy claimant's statement failed or answered out of contract:
    one line naming the configuration key (the operator fixes the adapter)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.code = "legacy_claimant_misconfigured"


@attrs.frozen
class StepParams:
    family: str
    actor: str
    reason: str
    role: str = "admin"
    # Claim statements that started before admission closed may still be running
    # for at most this long (the storage transaction bound): the next owner is not
    # admitted until admission has been closed at least this long.
    claim_tx_bound_us: int = 60_000_000


@attrs.frozen
class StepResult:
    generation: OwnerGeneration
    receipt: CutoverReceipt | None = None
    moved: int = 0  # rows the rollback fence moved


class CutoverBlocked(WorkConflict):
    """A cutover step refused: ``blockers`` say exactly what prevents it."""

    def __init__(self, family: str, step: str, blockers: tuple[Blocker, ...]) -> None:
        super().__init__(f"cutover {step} of {family} blocked: "
                         + "; ".join(b.sentence for b in blockers))
        self.code = "cutover_blocked"
        self.blockers = blockers


@attrs.frozen
class CutoverStatus:
    family: str
    generation: OwnerGeneration | None
    snapshot: Snapshot
    next_step: str | None
    blockers: tuple[Blocker, ...]
    receipts: tuple[CutoverReceipt, ...]
    fences: tuple[FenceProgress, ...]


@attrs.frozen
class FenceProgress:
    """A rollback fence and how far the legacy outcome projection has come."""

    fence_id: str
    fenced: int
    awaiting: int
    reconciled: int
    unknown: int
    receipts_unprojected: int
    receipts_conflicting: int

    @property
    def confirmed(self) -> bool:
        return (self.awaiting == 0 and self.unknown == 0 and self.receipts_unprojected == 0
                and self.receipts_conflicting == 0)

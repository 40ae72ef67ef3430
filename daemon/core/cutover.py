"""Ownership cutover between claimants, as data (seed 11).

Theory of operation
-------------------
A work family that has (or had) another claimant -- the *legacy* owner -- has
one owner-generation row. Its ``phase`` says who may claim now, and every
claim statement of either owner reads it (by primary key) in the statement
itself, so a process that missed a change cannot claim after it:

* ``legacy_active``: the legacy owner claims; integrationd may not.
* ``cutover_draining``: ``begin`` closed the legacy owner's admission; nobody
  claims while the legacy owner drains to zero.
* ``integrationd_active``: a cutover receipt (generation + 1) binds the zero
  proof; integrationd claims.
* ``rollback_draining``: ``rollback`` closed integrationd's claim *and
  reclaim* admission in the transaction that began it; nobody claims while
  integrationd drains to zero.

Rules, before code:

* Each step is legal only from the phases in :data:`TRANSITIONS`; an illegal
  one raises :class:`IllegalStep`.
* A step is taken only when :func:`blockers` finds nothing in the snapshot
  taken inside the step's own transaction; each blocker names exactly what
  prevents the step. ``begin`` and ``rollback_begin`` only close admission,
  so nothing blocks them.
* ``commit`` (legacy -> integrationd, also abandoning a rollback) needs zero
  legacy processing rows, open legacy claim transactions and live legacy
  claim-capable processes, every eligible legacy item covered by a WorkItem,
  and the re-cutover rules: no fenced row awaiting or unknown, no conflicting
  or unprojected legacy receipt.
* ``rollback_commit`` (integrationd -> legacy) needs zero integrationd
  processing rows (active or expired leases), zero ``Started`` effect
  attempts, zero live claim-capable replicas of the family, no unstarted
  item with dispatch history, and no claim transaction still open past the
  claim-transaction bound (a frozen process holding the rows the fence moves:
  named, instead of the fence waiting on it until a statement timeout).
* A process counts as live until its own row says it stopped or an operator
  proved it gone: silence is not proof.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

import attrs

# The WorkItem claim schema a cutover receipt binds (the columns and predicates
# the claim statement relies on). Raise it when they change.
CLAIM_SCHEMA_VERSION = 1


class Phase(enum.StrEnum):
    LEGACY_ACTIVE = "legacy_active"
    CUTOVER_DRAINING = "cutover_draining"
    INTEGRATIOND_ACTIVE = "integrationd_active"
    ROLLBACK_DRAINING = "rollback_draining"


class Claimant(enum.StrEnum):
    INTEGRATIOND = "integrationd"
    LEGACY = "legacy"
    NONE = "none"


class Step(enum.StrEnum):
    BEGIN = "begin"
    COMMIT = "commit"
    ROLLBACK_BEGIN = "rollback_begin"
    ROLLBACK_COMMIT = "rollback_commit"


P = Phase

TRANSITIONS: Mapping[tuple[Phase, Step], Phase] = {
    (P.LEGACY_ACTIVE, Step.BEGIN): P.CUTOVER_DRAINING,
    (P.CUTOVER_DRAINING, Step.BEGIN): P.CUTOVER_DRAINING,
    (P.CUTOVER_DRAINING, Step.COMMIT): P.INTEGRATIOND_ACTIVE,
    (P.ROLLBACK_DRAINING, Step.COMMIT): P.INTEGRATIOND_ACTIVE,
    (P.INTEGRATIOND_ACTIVE, Step.ROLLBACK_BEGIN): P.ROLLBACK_DRAINING,
    (P.CUTOVER_DRAINING, Step.ROLLBACK_BEGIN): P.ROLLBACK_DRAINING,
    (P.ROLLBACK_DRAINING, Step.ROLLBACK_BEGIN): P.ROLLBACK_DRAINING,
    (P.ROLLBACK_DRAINING, Step.ROLLBACK_COMMIT): P.LEGACY_ACTIVE,
}

CLAIMANT: Mapping[Phase, Claimant] = {
    P.LEGACY_ACTIVE: Claimant.LEGACY,
    P.CUTOVER_DRAINING: Claimant.NONE,
    P.INTEGRATIOND_ACTIVE: Claimant.INTEGRATIOND,
    P.ROLLBACK_DRAINING: Claimant.NONE,
}

# Steps that write a receipt and so start a new owner generation.
NEW_GENERATION: frozenset[Step] = frozenset({Step.COMMIT, Step.ROLLBACK_COMMIT})


class IllegalStep(Exception):
    """A cutover step that is not legal from the family's current phase."""

    def __init__(self, phase: Phase, step: Step) -> None:
        super().__init__(f"cutover {step.value} is not possible while the family is"
                         f" {phase.value}")
        self.phase = phase
        self.step = step
        self.code = "cutover_illegal_step"


# The step an operator takes next from each phase (``None``: the family never had another
# claimant; ``begin`` puts it under the protocol).
NEXT_STEP: Mapping[Phase | None, Step] = {
    None: Step.BEGIN,
    P.LEGACY_ACTIVE: Step.BEGIN,
    P.CUTOVER_DRAINING: Step.COMMIT,
    P.INTEGRATIOND_ACTIVE: Step.ROLLBACK_BEGIN,
    P.ROLLBACK_DRAINING: Step.ROLLBACK_COMMIT,
}

# The operator verb (``integrationd cutover <verb>``, the console's step form) that takes
# each step: ``rollback`` takes both halves of a rollback, ``re-cutover`` is ``begin``
# then ``commit``.
VERB_OF_STEP: Mapping[Step, str] = {
    Step.BEGIN: "begin",
    Step.COMMIT: "commit",
    Step.ROLLBACK_BEGIN: "rollback",
    Step.ROLLBACK_COMMIT: "rollback",
}


def next_step(phase: Phase | None) -> Step:
    """The step an operator takes next from ``phase`` (always legal from it)."""
    return NEXT_STEP[phase]


def next_verb(phase: Phase | None) -> str:
    """The operator verb that takes :func:`next_step` (the one step form offered)."""
    return VERB_OF_STEP[next_step(phase)]


def next_phase(phase: Phase, step: Step) -> Phase:
    """The phase after ``step``, or raise :class:`IllegalStep`."""
    try:
        return TRANSITIONS[(phase, step)]
    except KeyError:
        raise IllegalStep(phase, step) from None


@attrs.frozen
class Snapshot:
    """What the step's own transaction counted (every field a count or names)."""

    processing: int = 0            # integrationd rows processing, lease still live
    expired_leases: int = 0        # integrationd rows processing, lease expired
    started_attempts: int = 0      # effect attempts dispatched without an outcome
    dispatch_history: int = 0      # unstarted rows with any effect attempt on record
    replicas: tuple[str, ...] = ()           # live claim-capable integrationd replicas
    # Claim transactions of integrationd left open by a frozen process (described:
    # replica, items, the server's connection) and their replicas: the fence would
    # wait for their row locks.
    open_claims: tuple[str, ...] = ()
    open_claim_owners: tuple[str, ...] = ()
    legacy_reported: bool = True   # a legacy claimant answered inside the transaction
    legacy_processing: int = 0
    legacy_processes: tuple[str, ...] = ()   # live claim-capable legacy processes
    legacy_uncovered: int = 0      # eligible legacy items with no WorkItem
    legacy_open_claims: tuple[str, ...] = ()  # legacy claim transactions still open
    awaiting: int = 0              # rows awaiting_legacy_outcome
    unknown: int = 0               # rows legacy_outcome_unknown
    unprojected_receipts: int = 0
    conflicting_receipts: int = 0
    # Microseconds since admission closed (None: it is open); a claim statement
    # begun before that may still run for ``claim_tx_bound_us``.
    closed_for_us: int | None = None
    claim_tx_bound_us: int = 0


@attrs.frozen
class Blocker:
    code: str
    sentence: str


def _n(count: int, what: str) -> str:
    return f"{count} {what}"


def blockers(step: Step, snap: Snapshot) -> tuple[Blocker, ...]:
    """What exactly prevents ``step`` (empty: the step may be taken)."""
    out: list[Blocker] = []
    if step in NEW_GENERATION and (
            snap.closed_for_us is None or snap.closed_for_us < snap.claim_tx_bound_us):
        out.append(Blocker("admission_recently_closed", (
            "admission has not been closed for the claim transaction bound"
            f" ({snap.claim_tx_bound_us / 1_000_000:g} s): a claim begun before it may still"
            " run; try again later")))
    if step is Step.COMMIT:
        if not snap.legacy_reported:
            out.append(Blocker("legacy_unreported", (
                "no legacy claimant is declared for this family ([[legacy_claimants]] in the"
                " configuration): its drain and coverage cannot be proven")))
        if snap.legacy_processing:
            out.append(Blocker("legacy_processing", _n(
                snap.legacy_processing, "legacy items are still claimed by the legacy owner;"
                " let it drain")))
        if snap.legacy_processes:
            out.append(Blocker("legacy_processes", "legacy claim-capable processes are live: "
                               + ", ".join(snap.legacy_processes)
                               + "; stop them (or prove them gone)"))
        if snap.legacy_open_claims:
            out.append(Blocker("legacy_open_claims", "legacy claim transactions are open: "
                               + "; ".join(snap.legacy_open_claims)
                               + "; let them finish (or stop their processes)"))
        if snap.legacy_uncovered:
            out.append(Blocker("coverage_gap", _n(
                snap.legacy_uncovered, "eligible legacy items have no WorkItem;"
                " materialize them first")))
        if snap.awaiting:
            out.append(Blocker("awaiting_legacy_outcome", _n(
                snap.awaiting, "fenced items still await their legacy outcome")))
        if snap.unknown:
            out.append(Blocker("legacy_outcome_unknown", _n(
                snap.unknown, "fenced items have an unknown legacy outcome; repair them")))
        if snap.unprojected_receipts:
            out.append(Blocker("receipts_unprojected", _n(
                snap.unprojected_receipts, "legacy outcome receipts are not projected yet;"
                " run the projector")))
        if snap.conflicting_receipts:
            out.append(Blocker("receipts_conflicting", _n(
                snap.conflicting_receipts, "legacy outcome receipts conflict with the"
                " recorded outcome")))
    elif step is Step.ROLLBACK_COMMIT:
        if snap.open_claims:
            out.append(Blocker("open_claim_transaction", "an open claim transaction holds"
                               " rows the fence must move (its process is frozen or hung"
                               " between its claim and its COMMIT): "
                               + "; ".join(snap.open_claims)
                               + "; stop that process (SIGKILL: the server then rolls the"
                               " claim back) or KILL its connection on the server"))
        if snap.processing:
            out.append(Blocker("processing", _n(
                snap.processing, "items are processing under a live lease; let them"
                " finish")))
        if snap.expired_leases:
            out.append(Blocker("expired_leases", _n(
                snap.expired_leases, "items hold an expired lease (reclaim is stopped);"
                " commit to reopen admission, or repair them")))
        if snap.started_attempts:
            out.append(Blocker("started_attempts", _n(
                snap.started_attempts, "effect attempts were dispatched without an outcome")))
        if snap.dispatch_history:
            out.append(Blocker("dispatch_history", _n(
                snap.dispatch_history, "unstarted items have dispatch history (prior or"
                " ambiguous effects); settle or repair them first")))
        # A replica already named by its open claim is not named twice.
        others = [r for r in snap.replicas if r not in snap.open_claim_owners]
        if others:
            out.append(Blocker("replicas_live", "claim-capable replicas are live: "
                               + ", ".join(others) + "; stop them (or prove them"
                               " gone)"))
    return tuple(out)


def may_claim(phase: Phase | None, claimant: Claimant) -> bool:
    """Whether ``claimant`` may claim a family in ``phase`` (``None``: the family
    never had another claimant, so only integrationd claims it)."""
    if phase is None:
        return claimant is Claimant.INTEGRATIOND
    return CLAIMANT[phase] is claimant

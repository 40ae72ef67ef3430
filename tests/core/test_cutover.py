"""The cutover phases and blockers, table-driven (daemon/core/cutover.py)."""

from __future__ import annotations

import itertools
from typing import Any

import attrs
import pytest

from daemon.core.cutover import (
    CLAIMANT,
    NEW_GENERATION,
    TRANSITIONS,
    Claimant,
    IllegalStep,
    Phase,
    Snapshot,
    Step,
    blockers,
    may_claim,
    next_phase,
    next_step,
    next_verb,
)

P = Phase
LEGAL = {
    (P.LEGACY_ACTIVE, Step.BEGIN): P.CUTOVER_DRAINING,
    (P.CUTOVER_DRAINING, Step.BEGIN): P.CUTOVER_DRAINING,
    (P.CUTOVER_DRAINING, Step.COMMIT): P.INTEGRATIOND_ACTIVE,
    (P.ROLLBACK_DRAINING, Step.COMMIT): P.INTEGRATIOND_ACTIVE,
    (P.INTEGRATIOND_ACTIVE, Step.ROLLBACK_BEGIN): P.ROLLBACK_DRAINING,
    (P.CUTOVER_DRAINING, Step.ROLLBACK_BEGIN): P.ROLLBACK_DRAINING,
    (P.ROLLBACK_DRAINING, Step.ROLLBACK_BEGIN): P.ROLLBACK_DRAINING,
    (P.ROLLBACK_DRAINING, Step.ROLLBACK_COMMIT): P.LEGACY_ACTIVE,
}
BOUND = 60_000_000
# Admission closed long enough, nothing else to report.
QUIET = Snapshot(closed_for_us=BOUND, claim_tx_bound_us=BOUND)


@pytest.mark.parametrize(("phase", "step"), list(itertools.product(Phase, Step)))
def test_every_phase_and_step(phase: Phase, step: Step) -> None:
    if (phase, step) in LEGAL:
        assert next_phase(phase, step) is LEGAL[(phase, step)]
    else:
        with pytest.raises(IllegalStep, match=f"cutover {step.value} is not possible"):
            next_phase(phase, step)


def test_table_is_exactly_the_legal_set() -> None:
    assert dict(TRANSITIONS) == LEGAL


def test_no_phase_admits_two_claimants() -> None:
    for phase in Phase:
        admitted = [c for c in (Claimant.INTEGRATIOND, Claimant.LEGACY) if may_claim(phase, c)]
        assert len(admitted) <= 1, phase
    # Draining phases admit nobody; no row means integrationd alone.
    assert CLAIMANT[P.CUTOVER_DRAINING] is CLAIMANT[P.ROLLBACK_DRAINING] is Claimant.NONE
    assert may_claim(None, Claimant.INTEGRATIOND)
    assert not may_claim(None, Claimant.LEGACY)


@pytest.mark.parametrize("step", [Step.BEGIN, Step.ROLLBACK_BEGIN])
def test_closing_admission_is_never_blocked(step: Step) -> None:
    worst = Snapshot(processing=3, expired_leases=1, started_attempts=1, dispatch_history=1,
                     replicas=("r1",), legacy_reported=False, legacy_processing=2,
                     legacy_processes=("l1",), legacy_uncovered=4, awaiting=1, unknown=1,
                     unprojected_receipts=1, conflicting_receipts=1)
    assert blockers(step, worst) == ()


@pytest.mark.parametrize("step", sorted(NEW_GENERATION))
def test_quiet_snapshot_admits_the_next_owner(step: Step) -> None:
    assert blockers(step, QUIET) == ()


# (step, field changed from QUIET, value, blocker code) -- one negative row each.
ROWS = [
    (Step.COMMIT, "closed_for_us", None, "admission_recently_closed"),
    (Step.COMMIT, "closed_for_us", BOUND - 1, "admission_recently_closed"),
    (Step.COMMIT, "legacy_reported", False, "legacy_unreported"),
    (Step.COMMIT, "legacy_processing", 1, "legacy_processing"),
    (Step.COMMIT, "legacy_processes", ("legacy-1",), "legacy_processes"),
    (Step.COMMIT, "legacy_uncovered", 2, "coverage_gap"),
    (Step.COMMIT, "legacy_open_claims", ("worker-3: event ev-1",), "legacy_open_claims"),
    (Step.COMMIT, "awaiting", 1, "awaiting_legacy_outcome"),
    (Step.COMMIT, "unknown", 1, "legacy_outcome_unknown"),
    (Step.COMMIT, "unprojected_receipts", 1, "receipts_unprojected"),
    (Step.COMMIT, "conflicting_receipts", 1, "receipts_conflicting"),
    (Step.ROLLBACK_COMMIT, "closed_for_us", None, "admission_recently_closed"),
    (Step.ROLLBACK_COMMIT, "processing", 1, "processing"),
    (Step.ROLLBACK_COMMIT, "expired_leases", 1, "expired_leases"),
    (Step.ROLLBACK_COMMIT, "started_attempts", 1, "started_attempts"),
    (Step.ROLLBACK_COMMIT, "dispatch_history", 1, "dispatch_history"),
    (Step.ROLLBACK_COMMIT, "replicas", ("replica-a",), "replicas_live"),
    (Step.ROLLBACK_COMMIT, "open_claims", ("replica r-a holds 2 items",),
     "open_claim_transaction"),
]


@pytest.mark.parametrize(("step", "field", "value", "code"), ROWS)
def test_each_finding_blocks_with_its_code(step: Step, field: str, value: Any,
                                           code: str) -> None:
    found = blockers(step, attrs.evolve(QUIET, **{field: value}))
    assert [b.code for b in found] == [code]
    assert found[0].sentence  # a sentence an operator can act on


# Findings of one direction never block the other.
CROSS = [
    (Step.COMMIT, "processing", 5), (Step.COMMIT, "replicas", ("replica-a",)),
    (Step.COMMIT, "started_attempts", 1),
    (Step.ROLLBACK_COMMIT, "legacy_processing", 1),
    (Step.ROLLBACK_COMMIT, "legacy_uncovered", 1),
    (Step.ROLLBACK_COMMIT, "legacy_reported", False),
    (Step.ROLLBACK_COMMIT, "legacy_open_claims", ("worker-3",)),
    (Step.COMMIT, "open_claims", ("replica r-a holds 2 items",)),
]


@pytest.mark.parametrize(("step", "field", "value"), CROSS)
def test_the_other_owners_findings_do_not_block(step: Step, field: str,
                                                value: Any) -> None:
    assert blockers(step, attrs.evolve(QUIET, **{field: value})) == ()


def test_blocker_sentences_name_the_processes() -> None:
    (b,) = blockers(Step.ROLLBACK_COMMIT, attrs.evolve(QUIET, replicas=("r-1", "r-2")))
    assert "r-1, r-2" in b.sentence


def test_a_replica_named_by_its_open_claim_is_not_named_again() -> None:
    frozen = attrs.evolve(QUIET, replicas=("r-a", "r-b"), open_claim_owners=("r-a",),
                          open_claims=("replica r-a holds 1 item claimed but uncommitted",))
    found = blockers(Step.ROLLBACK_COMMIT, frozen)
    assert [b.code for b in found] == ["open_claim_transaction", "replicas_live"]
    assert "r-a holds 1 item" in found[0].sentence
    assert "r-b" in found[1].sentence and "r-a" not in found[1].sentence
    only = attrs.evolve(frozen, replicas=("r-a",))
    assert [b.code for b in blockers(Step.ROLLBACK_COMMIT, only)] == ["open_claim_transaction"]


@pytest.mark.parametrize(("phase", "step", "verb"), [
    (None, Step.BEGIN, "begin"),
    (P.LEGACY_ACTIVE, Step.BEGIN, "begin"),
    (P.CUTOVER_DRAINING, Step.COMMIT, "commit"),
    (P.INTEGRATIOND_ACTIVE, Step.ROLLBACK_BEGIN, "rollback"),
    (P.ROLLBACK_DRAINING, Step.ROLLBACK_COMMIT, "rollback"),
])
def test_the_next_step_and_the_verb_that_takes_it(phase: Phase | None, step: Step,
                                                  verb: str) -> None:
    assert next_step(phase) is step
    assert next_verb(phase) == verb


@pytest.mark.parametrize("phase", list(Phase))
def test_the_next_step_is_legal_and_moves_on(phase: Phase) -> None:
    # Never an idempotent repeat (begin while draining): the offered step changes the phase.
    assert next_phase(phase, next_step(phase)) is not phase

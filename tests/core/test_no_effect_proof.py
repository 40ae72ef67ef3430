"""NO_EFFECT only from proof (seed 003): the whole table, negative rows included."""

from __future__ import annotations

import itertools

import pytest

from daemon.core.effects import (
    DispatchObservation,
    Evidence,
    OutcomeClass,
    Phase,
    classify,
)
from daemon.core.handoff import NoEffectReason
from daemon.core.no_effect import AttemptFacts, Refusal, evidence_of, no_effect_proof
from tests.support.contracts import PROOF, contract

OC = OutcomeClass
EV = Evidence
BEFORE = NoEffectReason.REJECTED_BEFORE_DISPATCH
DEFINITIVE = NoEffectReason.DEFINITIVE_NO_EFFECT


def A(outcome: str | None, evidence: str | None = None,
      disposition: str | None = None) -> AttemptFacts:
    return AttemptFacts(outcome, evidence, disposition)


# One attempt: every (class, evidence, disposition) that can be stored.
SINGLE = [
    # --- proven before dispatch
    (A(OC.RETRYABLE_PRE_DISPATCH, EV.NOT_SENT), BEFORE, None),
    (A(OC.RETRYABLE_PRE_DISPATCH, None), BEFORE, None),  # legacy row
    # --- proven not applied by the provider's answer
    (A(OC.REJECTED, EV.NOT_APPLIED), DEFINITIVE, None),
    (A(OC.REJECTED, None), DEFINITIVE, None),  # legacy row
    (A(OC.REPLAY_SAFE_RETRY, EV.NOT_APPLIED), DEFINITIVE, None),  # a 429
    # --- maybe applied: a replay-safe contract is no proof (timeout, reset, 5xx)
    (A(OC.REPLAY_SAFE_RETRY, EV.MAYBE_APPLIED), None, Refusal.MAYBE_APPLIED),
    (A(OC.REPLAY_SAFE_RETRY, None), None, Refusal.MAYBE_APPLIED),  # legacy: conservative
    # --- unresolved: unknown outcome, or a crash / expired lease after the checkpoint
    (A(OC.OUTCOME_UNKNOWN, EV.MAYBE_APPLIED), None, Refusal.UNRESOLVED),
    (A(OC.OUTCOME_UNKNOWN, None), None, Refusal.UNRESOLVED),
    (A(None), None, Refusal.UNRESOLVED),
    # --- applied (a partial mutation is a mutation)
    (A(OC.ACCEPTED, EV.APPLIED), None, Refusal.APPLIED),
    (A(OC.ACCEPTED, None), None, Refusal.APPLIED),
    # --- dispositions of unresolved attempts
    (A(OC.OUTCOME_UNKNOWN, EV.MAYBE_APPLIED, "proven_absent"), DEFINITIVE, None),
    (A(OC.OUTCOME_UNKNOWN, EV.MAYBE_APPLIED, "operator_absent"), DEFINITIVE, None),
    (A(None, None, "proven_absent"), DEFINITIVE, None),
    (A(None, None, "operator_absent"), DEFINITIVE, None),
    (A(OC.OUTCOME_UNKNOWN, EV.MAYBE_APPLIED, "proven_applied"), None, Refusal.APPLIED),
    (A(None, None, "operator_applied"), None, Refusal.APPLIED),
    (A(OC.OUTCOME_UNKNOWN, EV.MAYBE_APPLIED, "looks_fine"), None, Refusal.INCONSISTENT),
    # --- evidence that contradicts its class never proves anything
    (A(OC.REJECTED, EV.MAYBE_APPLIED), None, Refusal.INCONSISTENT),
    (A(OC.REJECTED, EV.NOT_SENT), None, Refusal.INCONSISTENT),
    (A(OC.RETRYABLE_PRE_DISPATCH, EV.NOT_APPLIED), None, Refusal.INCONSISTENT),
    (A(OC.RETRYABLE_PRE_DISPATCH, EV.MAYBE_APPLIED), None, Refusal.INCONSISTENT),
    (A(OC.REPLAY_SAFE_RETRY, EV.NOT_SENT), None, Refusal.INCONSISTENT),
    (A(OC.REPLAY_SAFE_RETRY, "proven"), None, Refusal.INCONSISTENT),
    (A("SOMETHING_NEW", EV.NOT_APPLIED), None, Refusal.INCONSISTENT),
]


@pytest.mark.parametrize(("attempt", "reason", "refusal"), SINGLE)
def test_one_attempt(attempt: AttemptFacts, reason: NoEffectReason | None,
                     refusal: Refusal | None) -> None:
    proof = no_effect_proof("UPSERT", [attempt])
    assert (proof.reason, proof.refusal) == (reason, refusal)
    assert proof.proven is (reason is not None)
    assert bool(proof.sentence) is (refusal is not None)


HISTORIES = [
    ([], BEFORE, None),
    ([A(OC.RETRYABLE_PRE_DISPATCH, EV.NOT_SENT)] * 3, BEFORE, None),
    # A 429 then a 404: every attempt is proven not applied.
    ([A(OC.REPLAY_SAFE_RETRY, EV.NOT_APPLIED), A(OC.REJECTED, EV.NOT_APPLIED)],
     DEFINITIVE, None),
    # Not sent, then rejected: one attempt reached the provider.
    ([A(OC.RETRYABLE_PRE_DISPATCH, EV.NOT_SENT), A(OC.REJECTED, EV.NOT_APPLIED)],
     DEFINITIVE, None),
    # A definitive failure of the latest attempt does not hide an earlier unresolved one.
    ([A(OC.OUTCOME_UNKNOWN, EV.MAYBE_APPLIED), A(OC.REJECTED, EV.NOT_APPLIED)],
     None, Refusal.UNRESOLVED),
    ([A(None), A(OC.REJECTED, EV.NOT_APPLIED)], None, Refusal.UNRESOLVED),
    # ... nor an earlier maybe-applied one (a replay-safe timeout, then a 400).
    ([A(OC.REPLAY_SAFE_RETRY, EV.MAYBE_APPLIED), A(OC.REJECTED, EV.NOT_APPLIED)],
     None, Refusal.MAYBE_APPLIED),
    # Retry exhaustion over replay-safe 5xx answers proves nothing.
    ([A(OC.REPLAY_SAFE_RETRY, EV.MAYBE_APPLIED)] * 5, None, Refusal.MAYBE_APPLIED),
    # An unresolved attempt later proven absent, then a rejection.
    ([A(OC.OUTCOME_UNKNOWN, EV.MAYBE_APPLIED, "proven_absent"), A(OC.REJECTED, EV.NOT_APPLIED)],
     DEFINITIVE, None),
    # The worst refusal is reported, whatever the order.
    ([A(OC.REPLAY_SAFE_RETRY, EV.MAYBE_APPLIED), A(None), A(OC.ACCEPTED, EV.APPLIED)],
     None, Refusal.APPLIED),
    ([A(OC.ACCEPTED, EV.APPLIED), A(OC.REPLAY_SAFE_RETRY, EV.MAYBE_APPLIED)],
     None, Refusal.APPLIED),
]


@pytest.mark.parametrize(("history", "reason", "refusal"), HISTORIES)
def test_histories(history: list[AttemptFacts], reason: NoEffectReason | None,
                   refusal: Refusal | None) -> None:
    proof = no_effect_proof("DELETE", history)
    assert (proof.reason, proof.refusal) == (reason, refusal)


@pytest.mark.parametrize("kind", ["CREATE", "UPDATE", "", "upsert", "SEND"])
def test_only_upsert_and_delete_admit_a_no_effect_result(kind: str) -> None:
    assert no_effect_proof(kind, []).refusal is Refusal.INTENT_KIND
    assert no_effect_proof(kind, [A(OC.REJECTED, EV.NOT_APPLIED)]).reason is None


def test_a_history_is_proven_exactly_when_every_attempt_is() -> None:
    """Composition over every pair of single-attempt rows, in both orders."""
    rows = [attempt for attempt, _, _ in SINGLE]
    for first, second in itertools.product(rows, rows):
        alone = [no_effect_proof("UPSERT", [a]).proven for a in (first, second)]
        assert no_effect_proof("UPSERT", [first, second]).proven is all(alone)


REPLAY_SAFE = contract(replay=PROOF)


@pytest.mark.parametrize(("seen", "proven"), [
    (DispatchObservation(Phase.NOT_CONNECTED), True),
    (DispatchObservation(Phase.HELD, detail="quota_slot_expired"), True),
    (DispatchObservation(Phase.RESPONDED, 429), True),
    (DispatchObservation(Phase.RESPONDED, 404), True),
    # timeout / reset after sending, 5xx: never, although the contract says replay-safe
    (DispatchObservation(Phase.SENT), False),
    (DispatchObservation(Phase.RESPONDED, 500), False),
    (DispatchObservation(Phase.RESPONDED, 503), False),
    (DispatchObservation(Phase.RESPONDED, 200), False),
])
def test_a_replay_safe_timeout_or_5xx_is_never_proof(seen: DispatchObservation,
                                                      proven: bool) -> None:
    verdict = classify(REPLAY_SAFE, seen)
    facts = A(verdict.outcome.value, verdict.evidence.value)
    assert no_effect_proof("UPSERT", [facts]).proven is proven


def test_legacy_rows_read_conservatively() -> None:
    assert evidence_of(OC.REPLAY_SAFE_RETRY, None) == EV.MAYBE_APPLIED
    assert evidence_of(OC.REPLAY_SAFE_RETRY, EV.NOT_APPLIED) == EV.NOT_APPLIED
    assert evidence_of(None, None) is None
    assert evidence_of("SOMETHING_NEW", None) is None

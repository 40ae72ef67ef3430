"""tests.support.attempts looks past our own holds, and only past them."""

from __future__ import annotations

import pytest

from daemon.core.effects import (
    CONNECTION_WAIT,
    SLOT_EXPIRED,
    DispatchObservation,
    Phase,
    classify,
)
from storage.effect_values import EffectAttempt
from tests.support.attempts import held_by_us, sent_attempts
from tests.support.contracts import contract


def _attempt(attempt_id: str, outcome: str, evidence: str | None,
             failure_class: str | None) -> EffectAttempt:
    return EffectAttempt(
        attempt_id=attempt_id, command_id="c1", work_id="w1", ownership_epoch=1,
        method="PATCH", target_path="/crm/v3/objects/contacts/101", safe_headers="{}",
        body_sha256="0" * 64, idempotency_key="k", pre_dispatch_evidence="{}",
        dispatch_started_at_us=1, response_status=None, provider_evidence=None,
        outcome=outcome, failure_class=failure_class, finished_at_us=2, disposition=None,
        disposition_note=None, disposition_by=None, disposition_at_us=None,
        evidence=evidence)


@pytest.mark.parametrize(("outcome", "evidence", "failure_class", "held"), [
    ("RETRYABLE_PRE_DISPATCH", "not_sent", "quota_slot_expired", True),
    ("RETRYABLE_PRE_DISPATCH", "not_sent", "quota_connection_wait", True),
    ("RETRYABLE_PRE_DISPATCH", "not_sent", "quota_held", True),
    # A refused connect is the network's answer, not our hold: a test sees it.
    ("RETRYABLE_PRE_DISPATCH", "not_sent", "connect", False),
    ("REPLAY_SAFE_RETRY", "maybe_applied", "transport", False),
    ("REJECTED", "not_applied", "http_400", False),
    ("OUTCOME_UNKNOWN", "maybe_applied", "quota_slot_expired", False),
    ("RETRYABLE_PRE_DISPATCH", None, "quota_slot_expired", False),
])
def test_only_our_own_holds_are_held(outcome: str, evidence: str | None,
                                     failure_class: str, held: bool) -> None:
    assert held_by_us(_attempt("a1", outcome, evidence, failure_class)) is held


def test_sent_attempts_keeps_the_order_of_what_left() -> None:
    attempts = [_attempt("a1", "RETRYABLE_PRE_DISPATCH", "not_sent", "quota_slot_expired"),
                _attempt("a2", "REPLAY_SAFE_RETRY", "maybe_applied", "transport"),
                _attempt("a3", "RETRYABLE_PRE_DISPATCH", "not_sent", "connect"),
                _attempt("a4", "REJECTED", "not_applied", "http_400")]
    assert [a.attempt_id for a in sent_attempts(attempts)] == ["a2", "a3", "a4"]


@pytest.mark.parametrize("detail", [SLOT_EXPIRED, CONNECTION_WAIT, "anything else"])
def test_every_hold_classify_journals_is_one_the_helper_knows(detail: str) -> None:
    """The helper follows the product: whatever a hold's detail, the class classify()
    gives it (and the evidence) is one held_by_us recognises."""
    verdict = classify(contract(), DispatchObservation(Phase.HELD, detail=detail))
    attempt = _attempt("a1", verdict.outcome.value, verdict.evidence.value,
                       verdict.failure_class)
    assert verdict.held and held_by_us(attempt)

"""Outcome classification and reconciliation: every observation maps to one class."""

from __future__ import annotations

import pytest

from daemon.core.effects import (
    Classification,
    DispatchObservation,
    Evidence,
    OperationContract,
    OutcomeClass,
    Phase,
    Reconciled,
    Reconciliation,
    RemoteSnapshot,
    classify,
    reconcile,
)
from tests.support.contracts import IDEMPOTENCY_HEADER, PROOF, contract

PATCH = contract(default_retry_after_s=5.0)
SAFE = contract(not_applied_statuses=frozenset({429, 503}), replay=PROOF)
H = IDEMPOTENCY_HEADER
OC = OutcomeClass
NS, NA, MA, AP = (Evidence.NOT_SENT, Evidence.NOT_APPLIED, Evidence.MAYBE_APPLIED,
                  Evidence.APPLIED)


@pytest.mark.parametrize(
    ("contract", "seen", "expected"),
    [
        (PATCH, DispatchObservation(Phase.NOT_CONNECTED), Classification(
            OC.RETRYABLE_PRE_DISPATCH, NS, None, "connect")),
        # Held back by our own quota or send gate: not sent, and not a failure.
        (PATCH, DispatchObservation(Phase.HELD, detail="quota_slot_expired"), Classification(
            OC.RETRYABLE_PRE_DISPATCH, NS, None, "quota_slot_expired", held=True)),
        (SAFE, DispatchObservation(Phase.HELD, detail="connection_wait"), Classification(
            OC.RETRYABLE_PRE_DISPATCH, NS, None, "quota_connection_wait", held=True)),
        (PATCH, DispatchObservation(Phase.HELD), Classification(
            OC.RETRYABLE_PRE_DISPATCH, NS, None, "quota_held", held=True)),
        # A refused connect is the provider's side: a failed attempt, never held.
        (PATCH, DispatchObservation(Phase.NOT_CONNECTED, detail="quota_slot_expired"),
         Classification(OC.RETRYABLE_PRE_DISPATCH, NS, None, "connect")),
        (PATCH, DispatchObservation(Phase.SENT), Classification(
            OC.OUTCOME_UNKNOWN, MA, None, "transport")),
        (SAFE, DispatchObservation(Phase.SENT, idempotency_header=H), Classification(
            OC.REPLAY_SAFE_RETRY, MA, None, "transport")),
        # Negative rows: a proof holds only for a request that carried its header.
        (SAFE, DispatchObservation(Phase.SENT), Classification(
            OC.OUTCOME_UNKNOWN, MA, None, "transport")),
        (SAFE, DispatchObservation(Phase.SENT, idempotency_header="X-Request-Id"),
         Classification(OC.OUTCOME_UNKNOWN, MA, None, "transport")),
        (SAFE, DispatchObservation(Phase.RESPONDED, 502), Classification(
            OC.OUTCOME_UNKNOWN, MA, None, "http_502")),
        # The header's name is matched as HTTP matches it: without regard to case.
        (SAFE, DispatchObservation(Phase.SENT, idempotency_header="idempotency-key"),
         Classification(OC.REPLAY_SAFE_RETRY, MA, None, "transport")),
        # No proof declared: carrying a header proves nothing.
        (PATCH, DispatchObservation(Phase.SENT, idempotency_header=H), Classification(
            OC.OUTCOME_UNKNOWN, MA, None, "transport")),
        (PATCH, DispatchObservation(Phase.RESPONDED, 200), Classification(OC.ACCEPTED, AP)),
        (PATCH, DispatchObservation(Phase.RESPONDED, 204), Classification(OC.ACCEPTED, AP)),
        (PATCH, DispatchObservation(Phase.RESPONDED, 429, 7.0), Classification(
            OC.REPLAY_SAFE_RETRY, NA, 7.0, "http_429")),
        (PATCH, DispatchObservation(Phase.RESPONDED, 429), Classification(
            OC.REPLAY_SAFE_RETRY, NA, 5.0, "http_429")),
        (PATCH, DispatchObservation(Phase.RESPONDED, 400), Classification(
            OC.REJECTED, NA, None, "http_400")),
        (PATCH, DispatchObservation(Phase.RESPONDED, 404), Classification(
            OC.REJECTED, NA, None, "http_404")),
        (PATCH, DispatchObservation(Phase.RESPONDED, 500), Classification(
            OC.OUTCOME_UNKNOWN, MA, None, "http_500")),
        (PATCH, DispatchObservation(Phase.RESPONDED, 503), Classification(
            OC.OUTCOME_UNKNOWN, MA, None, "http_503")),
        (SAFE, DispatchObservation(Phase.RESPONDED, 503), Classification(
            OC.REPLAY_SAFE_RETRY, NA, 5.0, "http_503")),
        (SAFE, DispatchObservation(Phase.RESPONDED, 502, idempotency_header=H),
         Classification(OC.REPLAY_SAFE_RETRY, MA, None, "http_502")),
    ],
)
def test_classify(contract: OperationContract, seen: DispatchObservation,
                  expected: Classification) -> None:
    assert classify(contract, seen) == expected


# Declared status semantics (L1 accepted_statuses / not_applied_statuses /
# rejected_statuses): classify reads the sets, not the 2xx/4xx ranges.
STRICT = OperationContract(accepted_statuses=frozenset({200}),
                           not_applied_statuses=frozenset({429, 409}),
                           rejected_statuses=frozenset({400, 422}))
LENIENT = OperationContract(accepted_statuses=frozenset({200, 202, 302}),
                            not_applied_statuses=frozenset({503}),
                            rejected_statuses=frozenset({404, 410}), replay=PROOF)
# Nothing declared about 429: L0 gives it no meaning of its own (maybe applied).
SILENT_429 = OperationContract(accepted_statuses=frozenset({200}),
                               not_applied_statuses=frozenset(),
                               rejected_statuses=frozenset({400}))


@pytest.mark.parametrize(
    ("contract", "status", "expected"),
    [
        (STRICT, 200, Classification(OC.ACCEPTED, AP)),
        (STRICT, 400, Classification(OC.REJECTED, NA, None, "http_400")),
        (STRICT, 422, Classification(OC.REJECTED, NA, None, "http_422")),
        (STRICT, 409, Classification(OC.REPLAY_SAFE_RETRY, NA, 5.0, "http_409")),
        # Negative rows: a 2xx or a 4xx the operation does not declare is neither
        # accepted nor rejected: bytes left and nothing proves the outcome.
        (STRICT, 201, Classification(OC.OUTCOME_UNKNOWN, MA, None, "http_201")),
        (STRICT, 204, Classification(OC.OUTCOME_UNKNOWN, MA, None, "http_204")),
        (STRICT, 404, Classification(OC.OUTCOME_UNKNOWN, MA, None, "http_404")),
        (STRICT, 429, Classification(OC.REPLAY_SAFE_RETRY, NA, 5.0, "http_429")),
        (SILENT_429, 429, Classification(OC.OUTCOME_UNKNOWN, MA, None, "http_429")),
        (STRICT, 302, Classification(OC.OUTCOME_UNKNOWN, MA, None, "http_302")),
        (LENIENT, 302, Classification(OC.ACCEPTED, AP)),
        (LENIENT, 202, Classification(OC.ACCEPTED, AP)),
        (LENIENT, 410, Classification(OC.REJECTED, NA, None, "http_410")),
        (LENIENT, 503, Classification(OC.REPLAY_SAFE_RETRY, NA, 5.0, "http_503")),
        # Undeclared, on a replay-safe operation: a safe replay, but only *maybe* applied.
        (LENIENT, 204, Classification(OC.REPLAY_SAFE_RETRY, MA, None, "http_204")),
        (LENIENT, 400, Classification(OC.REPLAY_SAFE_RETRY, MA, None, "http_400")),
        (LENIENT, 500, Classification(OC.REPLAY_SAFE_RETRY, MA, None, "http_500")),
    ],
)
def test_classify_reads_the_declared_status_semantics(
        contract: OperationContract, status: int, expected: Classification) -> None:
    seen = DispatchObservation(Phase.RESPONDED, status, idempotency_header=IDEMPOTENCY_HEADER)
    assert classify(contract, seen) == expected


def test_a_contract_declares_every_status_set() -> None:
    """L0 has no default meaning for any status: a contract must declare all three."""
    with pytest.raises(TypeError, match="not_applied_statuses"):
        OperationContract(accepted_statuses=frozenset({200}),  # type: ignore[call-arg]
                          rejected_statuses=frozenset({400}))


def test_a_response_needs_a_status() -> None:
    with pytest.raises(ValueError, match="status"):
        classify(PATCH, DispatchObservation(Phase.RESPONDED))


DISPATCH = 1_000_000_000
SKEW = 2_000_000
WINDOW = 20_000_000
LATER = DISPATCH + WINDOW


@pytest.mark.parametrize(
    ("snapshot", "now", "expected"),
    [
        # The desired value is there: applied, at any time.
        (RemoteSnapshot(True, {"jobtitle": "CTO"}, DISPATCH + 5), DISPATCH + 1,
         Reconciliation(Reconciled.APPLIED)),
        (RemoteSnapshot(True, {"jobtitle": "CTO"}, None), LATER, Reconciliation(
            Reconciled.APPLIED)),
        # Untouched since before the dispatch, and the in-flight window has passed: absent.
        (RemoteSnapshot(True, {"jobtitle": "old"}, DISPATCH - SKEW - 1), LATER,
         Reconciliation(Reconciled.ABSENT)),
        # ...but not while a request could still be in flight.
        (RemoteSnapshot(True, {"jobtitle": "old"}, DISPATCH - SKEW - 1), LATER - 5_000_000,
         Reconciliation(Reconciled.UNPROVEN, 5.0)),
        # Modified within the skew margin, or after the dispatch: unproven.
        (RemoteSnapshot(True, {"jobtitle": "old"}, DISPATCH - SKEW), LATER,
         Reconciliation(Reconciled.UNPROVEN)),
        (RemoteSnapshot(True, {"jobtitle": "other"}, DISPATCH + 1), LATER,
         Reconciliation(Reconciled.UNPROVEN)),
        (RemoteSnapshot(True, {"jobtitle": "old"}, None), LATER,
         Reconciliation(Reconciled.UNPROVEN)),
        (RemoteSnapshot(False), LATER, Reconciliation(Reconciled.UNPROVEN)),
    ],
)
def test_reconcile(snapshot: RemoteSnapshot, now: int, expected: Reconciliation) -> None:
    assert reconcile({"jobtitle": "CTO"}, snapshot, earliest_dispatch_us=DISPATCH,
                     latest_dispatch_us=DISPATCH, now_us=now, clock_skew_us=SKEW,
                     max_in_flight_us=WINDOW) == expected


def test_absence_counts_from_the_latest_dispatch() -> None:
    snap = RemoteSnapshot(True, {"jobtitle": "old"}, DISPATCH - SKEW - 1)
    verdict = reconcile({"jobtitle": "CTO"}, snap, earliest_dispatch_us=DISPATCH,
                        latest_dispatch_us=DISPATCH + 10_000_000, now_us=LATER,
                        clock_skew_us=SKEW, max_in_flight_us=WINDOW)
    assert verdict == Reconciliation(Reconciled.UNPROVEN, 10.0)


# Our own accepted change left the record last modified here, within the skew margin of
# the lost dispatch: the time rule can never prove it absent.
OURS = DISPATCH - 500_000


@pytest.mark.parametrize(
    ("snapshot", "unchanged_since", "now", "expected"),
    [
        # Still exactly as our change left it, the window passed: absent.
        (RemoteSnapshot(True, {"jobtitle": "old"}, OURS), OURS, LATER,
         Reconciliation(Reconciled.ABSENT)),
        # ...never while a request could still be in flight.
        (RemoteSnapshot(True, {"jobtitle": "old"}, OURS), OURS, LATER - 1_000_000,
         Reconciliation(Reconciled.UNPROVEN, 1.0)),
        # Changed since (by the lost PATCH, by anyone): unproven.
        (RemoteSnapshot(True, {"jobtitle": "other"}, OURS + 1), OURS, LATER,
         Reconciliation(Reconciled.UNPROVEN)),
        (RemoteSnapshot(True, {"jobtitle": "old"}, OURS - 1), OURS, LATER,
         Reconciliation(Reconciled.UNPROVEN)),
        # Nothing known of our last change, or the read-back names no time: unproven.
        (RemoteSnapshot(True, {"jobtitle": "old"}, OURS), None, LATER,
         Reconciliation(Reconciled.UNPROVEN)),
        (RemoteSnapshot(True, {"jobtitle": "old"}, None), OURS, LATER,
         Reconciliation(Reconciled.UNPROVEN)),
        # The record is gone: that proves nothing about the PATCH either.
        (RemoteSnapshot(False), OURS, LATER, Reconciliation(Reconciled.UNPROVEN)),
        # The desired value is there: applied, whatever the time says.
        (RemoteSnapshot(True, {"jobtitle": "CTO"}, OURS), OURS, LATER,
         Reconciliation(Reconciled.APPLIED)),
    ],
)
def test_reconcile_by_our_own_last_change(snapshot: RemoteSnapshot, unchanged_since: int | None,
                                          now: int, expected: Reconciliation) -> None:
    assert reconcile({"jobtitle": "CTO"}, snapshot, earliest_dispatch_us=DISPATCH,
                     latest_dispatch_us=DISPATCH, now_us=now, clock_skew_us=SKEW,
                     max_in_flight_us=WINDOW, unchanged_since_us=unchanged_since) == expected

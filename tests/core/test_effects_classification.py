"""Outcome classification and reconciliation: every observation maps to one class."""

from __future__ import annotations

import pytest

from daemon.core.effects import (
    Classification,
    DispatchObservation,
    OperationContract,
    OutcomeClass,
    Phase,
    Reconciled,
    RemoteSnapshot,
    classify,
    reconcile,
)

PATCH = OperationContract(not_applied_statuses=frozenset({429}), replay_safe=False,
                          default_retry_after_s=5.0)
SAFE = OperationContract(not_applied_statuses=frozenset({429, 503}), replay_safe=True)
OC = OutcomeClass


@pytest.mark.parametrize(
    ("contract", "seen", "expected"),
    [
        (PATCH, DispatchObservation(Phase.NOT_CONNECTED), Classification(
            OC.RETRYABLE_PRE_DISPATCH, None, "connect")),
        (PATCH, DispatchObservation(Phase.SENT), Classification(
            OC.OUTCOME_UNKNOWN, None, "transport")),
        (SAFE, DispatchObservation(Phase.SENT), Classification(
            OC.REPLAY_SAFE_RETRY, None, "transport")),
        (PATCH, DispatchObservation(Phase.RESPONDED, 200), Classification(OC.ACCEPTED)),
        (PATCH, DispatchObservation(Phase.RESPONDED, 204), Classification(OC.ACCEPTED)),
        (PATCH, DispatchObservation(Phase.RESPONDED, 429, 7.0), Classification(
            OC.REPLAY_SAFE_RETRY, 7.0, "http_429")),
        (PATCH, DispatchObservation(Phase.RESPONDED, 429), Classification(
            OC.REPLAY_SAFE_RETRY, 5.0, "http_429")),
        (PATCH, DispatchObservation(Phase.RESPONDED, 400), Classification(
            OC.REJECTED, None, "http_400")),
        (PATCH, DispatchObservation(Phase.RESPONDED, 404), Classification(
            OC.REJECTED, None, "http_404")),
        (PATCH, DispatchObservation(Phase.RESPONDED, 500), Classification(
            OC.OUTCOME_UNKNOWN, None, "http_500")),
        (PATCH, DispatchObservation(Phase.RESPONDED, 503), Classification(
            OC.OUTCOME_UNKNOWN, None, "http_503")),
        (SAFE, DispatchObservation(Phase.RESPONDED, 503), Classification(
            OC.REPLAY_SAFE_RETRY, 5.0, "http_503")),
        (SAFE, DispatchObservation(Phase.RESPONDED, 502), Classification(
            OC.REPLAY_SAFE_RETRY, None, "http_502")),
    ],
)
def test_classify(contract: OperationContract, seen: DispatchObservation,
                  expected: Classification) -> None:
    assert classify(contract, seen) == expected


def test_a_response_needs_a_status() -> None:
    with pytest.raises(ValueError, match="status"):
        classify(PATCH, DispatchObservation(Phase.RESPONDED))


DISPATCH = 1_000_000_000
SKEW = 2_000_000


@pytest.mark.parametrize(
    ("snapshot", "expected"),
    [
        (RemoteSnapshot(True, {"jobtitle": "CTO"}, DISPATCH + 5), Reconciled.APPLIED),
        (RemoteSnapshot(True, {"jobtitle": "CTO"}, None), Reconciled.APPLIED),
        (RemoteSnapshot(True, {"jobtitle": "old"}, DISPATCH - SKEW - 1), Reconciled.ABSENT),
        (RemoteSnapshot(True, {"jobtitle": "old"}, DISPATCH - SKEW), Reconciled.UNPROVEN),
        (RemoteSnapshot(True, {"jobtitle": "other"}, DISPATCH + 1), Reconciled.UNPROVEN),
        (RemoteSnapshot(True, {"jobtitle": "old"}, None), Reconciled.UNPROVEN),
        (RemoteSnapshot(False), Reconciled.UNPROVEN),
    ],
)
def test_reconcile(snapshot: RemoteSnapshot, expected: Reconciled) -> None:
    assert reconcile({"jobtitle": "CTO"}, snapshot, DISPATCH, SKEW) is expected

"""Issue 8, item 11: a 2xx proves our effect only if it names the pinned record.

Where the L1 definition says a response names its record, the executor puts
what it named in ``DispatchObservation.identity``; ``classify`` decides.
"""

from __future__ import annotations

import pytest

from daemon.core.effects import (
    Classification,
    DispatchObservation,
    Evidence,
    IdentityEvidence,
    OperationContract,
    OutcomeClass,
    Phase,
    classify,
)
from tests.support.contracts import PROOF, contract

EV = Evidence
PATCH = contract(default_retry_after_s=5.0)
SAFE = contract(replay=PROOF)
OC = OutcomeClass
SAME = IdentityEvidence(expected="101", named="101")
OTHER = IdentityEvidence(expected="101", named="202")
NONE = IdentityEvidence(expected="101", named=None)
# Near misses are mismatches: no normalisation of whitespace, case or leading zeros.
PADDED = IdentityEvidence(expected="101", named=" 101")
ZEROS = IdentityEvidence(expected="101", named="0101")


def seen(status: int, identity: IdentityEvidence | None,
         retry_after: float | None = None) -> DispatchObservation:
    return DispatchObservation(Phase.RESPONDED, status, retry_after, identity=identity)


@pytest.mark.parametrize(
    ("contract", "observation", "expected"),
    [
        # The definition declares no identity location: a 2xx is trusted as before.
        (PATCH, seen(200, None), Classification(OC.ACCEPTED, EV.APPLIED)),
        (PATCH, seen(200, SAME), Classification(OC.ACCEPTED, EV.APPLIED)),
        (PATCH, seen(204, SAME), Classification(OC.ACCEPTED, EV.APPLIED)),
        # Another record, or none where one is declared: not proof of our effect.
        (PATCH, seen(200, OTHER), Classification(OC.OUTCOME_UNKNOWN, EV.MAYBE_APPLIED, None,
                                                 "identity_mismatch")),
        (PATCH, seen(201, OTHER), Classification(OC.OUTCOME_UNKNOWN, EV.MAYBE_APPLIED, None,
                                                 "identity_mismatch")),
        (PATCH, seen(200, PADDED), Classification(OC.OUTCOME_UNKNOWN, EV.MAYBE_APPLIED, None,
                                                  "identity_mismatch")),
        (PATCH, seen(200, ZEROS), Classification(OC.OUTCOME_UNKNOWN, EV.MAYBE_APPLIED, None,
                                                 "identity_mismatch")),
        (PATCH, seen(200, NONE), Classification(OC.OUTCOME_UNKNOWN, EV.MAYBE_APPLIED, None,
                                                "identity_missing")),
        # Replay safety does not make a response about another record a retry:
        # whatever it changed, it is reconciled by reading back.
        (SAFE, seen(200, OTHER), Classification(OC.OUTCOME_UNKNOWN, EV.MAYBE_APPLIED, None,
                                                "identity_mismatch")),
        (SAFE, seen(200, NONE), Classification(OC.OUTCOME_UNKNOWN, EV.MAYBE_APPLIED, None,
                                               "identity_missing")),
        # Non-2xx answers are classified by status alone; identity plays no part.
        (PATCH, seen(429, OTHER, 3.0), Classification(OC.REPLAY_SAFE_RETRY, EV.NOT_APPLIED, 3.0,
                                                      "http_429")),
        (PATCH, seen(404, NONE), Classification(OC.REJECTED, EV.NOT_APPLIED, None, "http_404")),
        (PATCH, seen(500, OTHER), Classification(OC.OUTCOME_UNKNOWN, EV.MAYBE_APPLIED, None,
                                                    "http_500")),
    ],
)
def test_classify_checks_the_named_record(contract: OperationContract,
                                          observation: DispatchObservation,
                                          expected: Classification) -> None:
    assert classify(contract, observation) == expected


@pytest.mark.parametrize(
    ("evidence", "problem"),
    [(SAME, ""), (OTHER, "identity_mismatch"), (NONE, "identity_missing"),
     (PADDED, "identity_mismatch"), (IdentityEvidence(expected="", named=""), "")],
)
def test_identity_problem(evidence: IdentityEvidence, problem: str) -> None:
    assert evidence.problem == problem

"""Operation contracts for core tests: each status's meaning declared, as L1 must."""

from __future__ import annotations

from typing import Any

from daemon.core.effects import OperationContract, ReplayProof

# The header a replay-safe contract's proof names, and that proof (a day's retention).
IDEMPOTENCY_HEADER = "Idempotency-Key"
PROOF = ReplayProof(header=IDEMPOTENCY_HEADER, retention_s=86_400.0)
# The semantics the shipped definitions declare: every 2xx accepted, 429 not applied,
# every other 4xx rejected.
ACCEPTED = frozenset(range(200, 300))
REJECTED = frozenset(range(400, 500)) - {429}


def contract(**overrides: Any) -> OperationContract:
    """The shipped definitions' declared status semantics, with ``overrides``."""
    fields: dict[str, Any] = {"accepted_statuses": ACCEPTED,
                              "not_applied_statuses": frozenset({429}),
                              "rejected_statuses": REJECTED, **overrides}
    return OperationContract(**fields)

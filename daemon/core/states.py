"""The WorkItem state machine, as data.

Theory of operation
-------------------
Every work family shares one state machine. A WorkItem row owns *when* work
runs and *which claimant* may execute it; the transitions below are the only
ones any code path may take, and the storage adapters encode the same table in
their conditional UPDATEs (``WHERE state IN (...)``), so a transition that is
illegal here cannot be committed there either.

Rules, before code (after h11's ``_state.py``):

* ``pending`` and ``retry`` are *executable*: a claim moves them to
  ``processing``, installing a new lease token and a higher ownership epoch.
* ``processing`` is owned by exactly one live lease. A claim of a
  ``processing`` row is legal only once its lease has expired (``RECLAIM``);
  an expired row whose attempts are spent goes to ``dead`` (``EXPIRE_DEAD``).
* From ``processing`` the owner finalizes: ``succeeded``, ``skipped``,
  ``retry``, ``dead``, or ``cancelled`` (acknowledging a cancel request). A
  graceful drain ``RELEASE``-s the row back to ``retry`` without charging an
  attempt. A claimant that finds, before anything was dispatched, that the work
  cannot start until a known time (no provider quota slot) ``DEFER``-s it back
  to ``pending`` with ``run_after`` = that time, its attempt refunded.
* Unclaimed work (``pending``/``retry``) may be cancelled directly.
* Rollback-only: unclaimed work can be fenced as ``awaiting_legacy_outcome``;
  a legacy receipt then reconciles it to ``reconciled_legacy_terminal`` or it
  is quarantined as ``legacy_outcome_unknown`` (non-executable, blocks the next
  cutover, never leaves by itself).
* ``succeeded``, ``skipped``, ``dead``, ``cancelled`` and
  ``reconciled_legacy_terminal`` are terminal: nothing leaves them. Replay
  creates a *new* WorkItem with lineage; it never reopens a terminal row.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping


class WorkState(enum.StrEnum):
    PENDING = "pending"
    PROCESSING = "processing"
    SUCCEEDED = "succeeded"
    SKIPPED = "skipped"
    RETRY = "retry"
    DEAD = "dead"
    CANCELLED = "cancelled"
    AWAITING_LEGACY_OUTCOME = "awaiting_legacy_outcome"
    RECONCILED_LEGACY_TERMINAL = "reconciled_legacy_terminal"
    LEGACY_OUTCOME_UNKNOWN = "legacy_outcome_unknown"


class WorkEvent(enum.StrEnum):
    CLAIM = "claim"
    RECLAIM = "reclaim"
    EXPIRE_DEAD = "expire_dead"
    RENEW = "renew"
    COMPLETE = "complete"
    SKIP = "skip"
    RETRY = "retry"
    DEAD_LETTER = "dead_letter"
    CANCEL = "cancel"
    CANCEL_ACK = "cancel_ack"
    RELEASE = "release"
    DEFER = "defer"
    ROLLBACK_FENCE = "rollback_fence"
    LEGACY_RECONCILED = "legacy_reconciled"
    LEGACY_UNKNOWN = "legacy_unknown"


S = WorkState
E = WorkEvent

TRANSITIONS: Mapping[tuple[WorkState, WorkEvent], WorkState] = {
    (S.PENDING, E.CLAIM): S.PROCESSING,
    (S.RETRY, E.CLAIM): S.PROCESSING,
    (S.PROCESSING, E.RECLAIM): S.PROCESSING,
    (S.PROCESSING, E.EXPIRE_DEAD): S.DEAD,
    (S.PROCESSING, E.RENEW): S.PROCESSING,
    (S.PROCESSING, E.COMPLETE): S.SUCCEEDED,
    (S.PROCESSING, E.SKIP): S.SKIPPED,
    (S.PROCESSING, E.RETRY): S.RETRY,
    (S.PROCESSING, E.DEAD_LETTER): S.DEAD,
    (S.PROCESSING, E.CANCEL_ACK): S.CANCELLED,
    (S.PROCESSING, E.RELEASE): S.RETRY,
    (S.PROCESSING, E.DEFER): S.PENDING,
    (S.PENDING, E.CANCEL): S.CANCELLED,
    (S.RETRY, E.CANCEL): S.CANCELLED,
    (S.PENDING, E.ROLLBACK_FENCE): S.AWAITING_LEGACY_OUTCOME,
    (S.RETRY, E.ROLLBACK_FENCE): S.AWAITING_LEGACY_OUTCOME,
    (S.AWAITING_LEGACY_OUTCOME, E.LEGACY_RECONCILED): S.RECONCILED_LEGACY_TERMINAL,
    (S.AWAITING_LEGACY_OUTCOME, E.LEGACY_UNKNOWN): S.LEGACY_OUTCOME_UNKNOWN,
}

TERMINAL: frozenset[WorkState] = frozenset(
    {S.SUCCEEDED, S.SKIPPED, S.DEAD, S.CANCELLED, S.RECONCILED_LEGACY_TERMINAL}
)
EXECUTABLE: frozenset[WorkState] = frozenset({S.PENDING, S.RETRY})
# Non-terminal rows hold their source lane: nothing later in the lane may run.
LANE_BLOCKING: frozenset[WorkState] = frozenset(WorkState) - TERMINAL
# Events that a claimant may only take while holding the live fence.
FENCED_EVENTS: frozenset[WorkEvent] = frozenset(
    {E.RENEW, E.COMPLETE, E.SKIP, E.RETRY, E.DEAD_LETTER, E.CANCEL_ACK, E.RELEASE,
     E.DEFER}
)


class IllegalTransition(Exception):
    """An event that the state machine does not allow from this state."""

    def __init__(self, state: WorkState, event: WorkEvent) -> None:
        super().__init__(f"illegal work transition: {event.value} from {state.value}")
        self.state = state
        self.event = event


def transition(state: WorkState, event: WorkEvent) -> WorkState:
    """Return the state after ``event``, or raise :class:`IllegalTransition`."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalTransition(state, event) from None


def sources_of(event: WorkEvent) -> frozenset[WorkState]:
    """Every state from which ``event`` is legal (what a CAS ``WHERE state IN`` lists)."""
    return frozenset(src for (src, ev) in TRANSITIONS if ev is event)


def is_terminal(state: WorkState) -> bool:
    return state in TERMINAL

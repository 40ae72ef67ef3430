"""The state table, exhaustively: every (state, event) pair is legal or raises."""

from __future__ import annotations

import itertools

import pytest

from daemon.core.states import (
    EXECUTABLE,
    FENCED_EVENTS,
    TERMINAL,
    TRANSITIONS,
    IllegalTransition,
    WorkEvent,
    WorkState,
    is_terminal,
    sources_of,
    transition,
)

S, E = WorkState, WorkEvent

# The seed's state machine, written out independently of the module's table.
EXPECTED = {
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


@pytest.mark.parametrize(("state", "event"), list(itertools.product(WorkState, WorkEvent)))
def test_every_pair_is_legal_or_raises(state: WorkState, event: WorkEvent) -> None:
    if (state, event) in EXPECTED:
        assert transition(state, event) is EXPECTED[(state, event)]
    else:
        with pytest.raises(IllegalTransition) as info:
            transition(state, event)
        assert info.value.state is state
        assert info.value.event is event
        assert event.value in str(info.value)


def test_table_is_exactly_the_seed_machine() -> None:
    assert dict(TRANSITIONS) == EXPECTED


@pytest.mark.parametrize("state", sorted(TERMINAL))
def test_terminal_states_have_no_way_out(state: WorkState) -> None:
    assert is_terminal(state)
    assert not [ev for (src, ev) in TRANSITIONS if src is state]


def test_legacy_unknown_is_non_executable_and_not_terminal() -> None:
    assert S.LEGACY_OUTCOME_UNKNOWN not in TERMINAL
    assert S.LEGACY_OUTCOME_UNKNOWN not in EXECUTABLE
    assert not [ev for (src, ev) in TRANSITIONS if src is S.LEGACY_OUTCOME_UNKNOWN]


def test_fenced_events_all_leave_processing() -> None:
    for event in FENCED_EVENTS:
        assert sources_of(event) == {S.PROCESSING}


@pytest.mark.parametrize("state", sorted(set(WorkState) - {S.PROCESSING}))
def test_only_a_claim_in_processing_can_be_deferred(state: WorkState) -> None:
    """Deferral gives a claim back: never from unclaimed, terminal or legacy rows."""
    with pytest.raises(IllegalTransition):
        transition(state, E.DEFER)
    assert E.DEFER in FENCED_EVENTS


def test_claim_sources_are_the_executable_states() -> None:
    assert sources_of(E.CLAIM) == EXECUTABLE == {S.PENDING, S.RETRY}
    assert sources_of(E.ROLLBACK_FENCE) == EXECUTABLE

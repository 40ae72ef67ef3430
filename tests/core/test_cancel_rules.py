"""What cancel means per family: every (rule, state, journal) row, negative rows included."""

from __future__ import annotations

import itertools

import pytest

from daemon.core.cancel import CancelAction, CancelRule, decide_cancel
from daemon.core.states import TERMINAL, WorkState

R, S, A = CancelRule, WorkState, CancelAction
LIVE = (S.PENDING, S.RETRY, S.PROCESSING)

# (rule, state, unresolved attempt) -> (action, refusal code), written out by hand.
TABLE = {
    (R.ANYTIME, S.PENDING, False): (A.CANCEL, ""),
    (R.ANYTIME, S.RETRY, False): (A.CANCEL, ""),
    (R.ANYTIME, S.PROCESSING, False): (A.REQUEST, ""),
    (R.ANYTIME, S.PENDING, True): (A.CANCEL, ""),
    (R.ANYTIME, S.RETRY, True): (A.CANCEL, ""),
    (R.ANYTIME, S.PROCESSING, True): (A.REQUEST, ""),
    (R.BEFORE_DISPATCH, S.PENDING, False): (A.CANCEL, ""),
    (R.BEFORE_DISPATCH, S.RETRY, False): (A.CANCEL, ""),
    (R.BEFORE_DISPATCH, S.PROCESSING, False): (A.REQUEST, ""),
    (R.BEFORE_DISPATCH, S.PENDING, True): (A.REFUSE, "after_dispatch"),
    (R.BEFORE_DISPATCH, S.RETRY, True): (A.REFUSE, "after_dispatch"),
    (R.BEFORE_DISPATCH, S.PROCESSING, True): (A.REFUSE, "after_dispatch"),
    (R.NEVER, S.PENDING, False): (A.REFUSE, "family_not_cancellable"),
    (R.NEVER, S.RETRY, False): (A.REFUSE, "family_not_cancellable"),
    (R.NEVER, S.PROCESSING, False): (A.REFUSE, "family_not_cancellable"),
    (R.NEVER, S.PENDING, True): (A.REFUSE, "family_not_cancellable"),
    (R.NEVER, S.RETRY, True): (A.REFUSE, "family_not_cancellable"),
    (R.NEVER, S.PROCESSING, True): (A.REFUSE, "family_not_cancellable"),
}


@pytest.mark.parametrize(("key", "expected"), sorted(TABLE.items()))
def test_live_rows(key: tuple[CancelRule, WorkState, bool],
                   expected: tuple[CancelAction, str]) -> None:
    rule, state, unresolved = key
    verdict = decide_cancel(rule, state, unresolved_attempt=unresolved, family="f")
    assert (verdict.action, verdict.code) == expected
    assert bool(verdict.reason) is (verdict.action is A.REFUSE)


@pytest.mark.parametrize(("rule", "state", "unresolved"),
                         list(itertools.product(R, sorted(TERMINAL), (False, True))))
def test_terminal_items_are_refused_whatever_the_rule(rule: CancelRule, state: WorkState,
                                                      unresolved: bool) -> None:
    verdict = decide_cancel(rule, state, unresolved_attempt=unresolved)
    assert (verdict.action, verdict.code) == (A.REFUSE, "terminal")
    assert state.value in verdict.reason


@pytest.mark.parametrize("state", sorted(set(S) - TERMINAL - set(LIVE)))
def test_legacy_waiting_states_are_refused(state: WorkState) -> None:
    verdict = decide_cancel(R.ANYTIME, state, unresolved_attempt=False)
    assert (verdict.action, verdict.code) == (A.REFUSE, "not_cancellable")


def test_the_table_covers_every_live_row() -> None:
    assert set(TABLE) == set(itertools.product(R, LIVE, (False, True)))

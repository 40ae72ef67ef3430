"""The operator-path table (issue 20 item 3): which action from which effect state, and
the receipt it leads to; refusals name the one action that does (table-driven)."""

from __future__ import annotations

import itertools

import attrs
import pytest

from daemon.core.operator_paths import (
    Action,
    Allowed,
    CommandFacts,
    EffectState,
    Receipt,
    Refused,
    advice,
    advice_sentence,
    effect_state,
    verdict,
)

A, S, R = Action, EffectState, Receipt

OPEN = CommandFacts(settlement="open")
FACTS = {
    S.ANSWERED: CommandFacts(settlement="succeeded"),
    S.REPAIRED: CommandFacts(settlement="retired", repaired=True),
    S.RUNNING: attrs.evolve(OPEN, live_work=True),
    S.UNRESOLVED: attrs.evolve(OPEN, unresolved=True),
    S.RETIRED_APPLIED: CommandFacts(settlement="retired", applied=True),
    S.RETIRED: CommandFacts(settlement="retired"),
    S.APPLIED: attrs.evolve(OPEN, applied=True),
    S.NO_EFFECT: attrs.evolve(OPEN, no_effect_proven=True),
    S.UNPROVEN: OPEN,
}


@pytest.mark.parametrize(("state", "facts"), FACTS.items(), ids=lambda v: str(v)[:20])
def test_each_state_is_told_apart_from_its_facts(state: EffectState,
                                                  facts: CommandFacts) -> None:
    assert effect_state(facts) is state


# (state, action) -> the receipt and the state left, or the refusal's code and advice.
ROWS: list[tuple[EffectState, Action, object]] = [
    # Issue 20 item 3: a proven-applied command reaches its exact success receipt.
    (S.APPLIED, A.RETIRE, Allowed(R.SUCCESS, S.ANSWERED)),
    (S.APPLIED, A.REPAIR, ("proven_applied", A.RETIRE)),
    (S.APPLIED, A.REPLAY, ("proven_applied", A.RETIRE)),
    (S.APPLIED, A.DISPOSE_APPLIED, ("no_unresolved_attempt", A.RETIRE)),
    (S.APPLIED, A.CANCEL, ("terminal", A.RETIRE)),
    (S.RETIRED_APPLIED, A.RETIRE, Allowed(R.SUCCESS, S.ANSWERED)),
    (S.RETIRED_APPLIED, A.REPAIR, ("proven_applied", A.RETIRE)),
    (S.RETIRED_APPLIED, A.REPLAY, ("proven_applied", A.RETIRE)),
    (S.NO_EFFECT, A.RETIRE, Allowed(R.NO_EFFECT, S.ANSWERED)),
    (S.NO_EFFECT, A.REPLAY, Allowed(R.BY_WORK, S.RUNNING)),
    (S.NO_EFFECT, A.REPAIR, Allowed(R.BY_WORK, S.REPAIRED)),
    (S.NO_EFFECT, A.DISPOSE_ABSENT, ("no_unresolved_attempt", A.RETIRE)),
    (S.UNPROVEN, A.RETIRE, Allowed(R.NONE, S.RETIRED)),
    (S.UNPROVEN, A.REPLAY, Allowed(R.BY_WORK, S.RUNNING)),
    (S.UNPROVEN, A.REPAIR, Allowed(R.BY_WORK, S.REPAIRED)),
    (S.UNPROVEN, A.CANCEL, ("terminal", A.REPLAY)),
    (S.RETIRED, A.REPAIR, Allowed(R.BY_WORK, S.REPAIRED)),
    # Issue 20 item 5: a retired, repaired or settled command is never replayed.
    (S.RETIRED, A.REPLAY, ("retired", A.REPAIR)),
    (S.RETIRED, A.RETIRE, ("retired", A.REPAIR)),
    (S.REPAIRED, A.REPLAY, ("repaired", None)),
    (S.REPAIRED, A.REPAIR, ("repaired", None)),
    (S.REPAIRED, A.RETIRE, ("repaired", None)),
    (S.ANSWERED, A.REPLAY, ("settled", None)),
    (S.ANSWERED, A.RETIRE, ("settled", None)),
    (S.ANSWERED, A.REPAIR, ("settled", None)),
    (S.ANSWERED, A.DISPOSE_APPLIED, ("settled", None)),
    (S.UNRESOLVED, A.DISPOSE_APPLIED, Allowed(R.NONE, S.APPLIED)),
    (S.UNRESOLVED, A.DISPOSE_ABSENT, Allowed(R.NONE, S.NO_EFFECT)),
    (S.UNRESOLVED, A.RETIRE, ("unresolved", A.DISPOSE)),
    (S.UNRESOLVED, A.REPAIR, ("unresolved", A.DISPOSE)),
    (S.UNRESOLVED, A.REPLAY, ("unresolved", A.DISPOSE)),
    (S.RUNNING, A.CANCEL, Allowed(R.NONE, None)),
    (S.RUNNING, A.RETIRE, ("live_work", None)),
    (S.RUNNING, A.REPLAY, ("live_work", None)),
    (S.RUNNING, A.REPAIR, ("live_work", None)),
    (S.RUNNING, A.DISPOSE_ABSENT, ("live_work", None)),
]


@pytest.mark.parametrize(("state", "action", "expected"), ROWS,
                         ids=[f"{s}-{a}" for s, a, _ in ROWS])
def test_the_table(state: EffectState, action: Action, expected: object) -> None:
    got = verdict(FACTS[state], action)
    if isinstance(expected, Allowed):
        assert got == expected
    else:
        assert isinstance(got, Refused)
        assert (got.code, got.instead) == expected
        assert got.sentence


REFINED: list[tuple[CommandFacts, Action, tuple[str, Action | None] | Allowed]] = [
    # A newer intent for the same record and field: neither replay nor repair.
    (attrs.evolve(OPEN, superseded=True), A.REPLAY, ("superseded", None)),
    (attrs.evolve(OPEN, superseded=True), A.REPAIR, ("superseded", None)),
    (attrs.evolve(OPEN, superseded=True, no_effect_proven=True), A.REPLAY,
     ("superseded", A.RETIRE)),
    (CommandFacts(settlement="retired", superseded=True), A.REPAIR, ("superseded", None)),
    # A superseded command still settles what its own history proves.
    (attrs.evolve(OPEN, superseded=True, applied=True), A.RETIRE,
     Allowed(R.SUCCESS, S.ANSWERED)),
    # Moved pins: a replay would run the old ones; a repair pins anew.
    (attrs.evolve(OPEN, pins_moved=True), A.REPLAY, ("pins_moved", A.REPAIR)),
    (attrs.evolve(OPEN, pins_moved=True), A.REPAIR, Allowed(R.BY_WORK, S.REPAIRED)),
    (attrs.evolve(OPEN, applied=True, pins_moved=True), A.RETIRE,
     Allowed(R.SUCCESS, S.ANSWERED)),
    # Applied without a pinned remote id: no success result can be written.
    (attrs.evolve(OPEN, applied=True, remote_id_pinned=False), A.RETIRE,
     ("no_remote_id", None)),
]


@pytest.mark.parametrize(("facts", "action", "expected"), REFINED)
def test_the_refinements(facts: CommandFacts, action: Action,
                         expected: tuple[str, Action | None] | Allowed) -> None:
    got = verdict(facts, action)
    if isinstance(expected, Allowed):
        assert got == expected
    else:
        assert isinstance(got, Refused)
        assert (got.code, got.instead) == expected


def _every_facts() -> list[CommandFacts]:
    flags = ("repaired", "live_work", "unresolved", "applied", "no_effect_proven",
             "remote_id_pinned", "superseded", "pins_moved")
    out = []
    for settlement in ("open", "succeeded", "no_effect", "retired"):
        for values in itertools.product((False, True), repeat=len(flags)):
            out.append(CommandFacts(settlement=settlement, **dict(zip(flags, values,
                                                                      strict=True))))
    return out


ACTIONS = [a for a in Action if a is not A.DISPOSE]


def test_the_advice_is_never_refused_and_leads_to_a_receipt() -> None:
    for facts in _every_facts():
        action = advice(facts)
        assert advice_sentence(facts)
        if action is None:
            continue
        found = verdict(facts, action)
        assert isinstance(found, Allowed), (facts, action, found)
        if action is not A.DISPOSE:
            assert found.receipt is not R.NONE, (facts, action)


def test_a_refusal_never_names_a_refused_action_instead() -> None:
    for facts, action in itertools.product(_every_facts(), ACTIONS):
        found = verdict(facts, action)
        if isinstance(found, Refused) and found.instead is not None:
            assert found.instead is not action
            assert isinstance(verdict(facts, found.instead), Allowed), (facts, action)


def test_a_proven_applied_command_always_reaches_its_success_receipt() -> None:
    for facts in _every_facts():
        if effect_state(facts) in (S.APPLIED, S.RETIRED_APPLIED) and facts.remote_id_pinned:
            assert advice(facts) is A.RETIRE
            assert verdict(facts, A.RETIRE) == Allowed(R.SUCCESS, S.ANSWERED)
            # and nothing else can call the provider again
            for action in (A.REPLAY, A.REPAIR):
                assert isinstance(verdict(facts, action), Refused)


def test_only_a_proof_settles_at_once() -> None:
    """A success receipt only from applied facts, a no-effect one only from a proof."""
    for facts, action in itertools.product(_every_facts(), ACTIONS):
        found = verdict(facts, action)
        if not isinstance(found, Allowed):
            continue
        if found.receipt is R.SUCCESS:
            assert facts.applied and facts.remote_id_pinned and not facts.unresolved
        if found.receipt is R.NO_EFFECT:
            assert facts.no_effect_proven and not facts.applied and not facts.unresolved


def test_refusal_lines_name_code_and_instead() -> None:
    found = verdict(FACTS[S.APPLIED], A.REPAIR)
    assert isinstance(found, Refused)
    assert found.line(A.REPAIR) == (
        "repair refused (proven_applied): the command's effect is proven applied: retire"
        " settles its success receipt (a second call could only repeat the effect)."
        " Instead: retire.")

"""The bind decision (issue 20 item 8; seed 7, 10): every rule, with its negative rows."""

from __future__ import annotations

import pytest

from daemon.core.link_bind import BindFacts, BindOutcome, BindRefusal, LinkFacts, decide_bind

OWN = "ilk2:own"
OTHER = "ilk2:other"
WANTED = "loc:wanted"
ELSEWHERE = "loc:elsewhere"


def _link(state: str, generation: int = 3, locator: str | None = ELSEWHERE) -> LinkFacts:
    return LinkFacts(state=state, generation=generation, locator_hash=locator)


def facts(link: LinkFacts | None, *, holder: str | None = None, expected: int | None = None,
          unresolved: int = 0) -> BindFacts:
    return BindFacts(link=link, locator_hash=WANTED, holder_key=holder, own_key=OWN,
                     expected_generation=expected, unresolved_attempts=unresolved)


@pytest.mark.parametrize(("given", "answer"), [
    # Adopt: no link, or a retired one (with or without the generation seen).
    (facts(None), BindOutcome.ADOPTED),
    (facts(_link("retired", locator=None)), BindOutcome.ADOPTED),
    (facts(_link("retired", locator=None), expected=3), BindOutcome.ADOPTED),
    # The same record, active: nothing to do (the holder is the local record itself).
    (facts(_link("active", locator=WANTED), holder=OWN), BindOutcome.UNCHANGED),
    (facts(_link("active", locator=WANTED), holder=OWN, expected=3), BindOutcome.UNCHANGED),
    # Rebind: another record, the generation seen, nothing unresolved.
    (facts(_link("active"), expected=3), BindOutcome.REBOUND),
    # Refusals, in rule order.
    (facts(None, holder=OTHER), "remote_linked_elsewhere"),
    (facts(_link("active"), holder=OTHER, expected=3), "remote_linked_elsewhere"),
    (facts(_link("retired", locator=None), holder=OTHER), "remote_linked_elsewhere"),
    (facts(None, expected=1), "generation_moved"),
    (facts(_link("active"), expected=2), "generation_moved"),
    (facts(_link("retired", locator=None), expected=4), "generation_moved"),
    (facts(_link("pending_create", locator=None)), "link_pending_create"),
    (facts(_link("pending_create", locator=None), expected=3), "link_pending_create"),
    (facts(_link("active")), "generation_required"),
    (facts(_link("active"), unresolved=1), "generation_required"),
    (facts(_link("active"), expected=3, unresolved=2), "unresolved_attempt"),
])
def test_decide_bind(given: BindFacts, answer: BindOutcome | str) -> None:
    got = decide_bind(given)
    if isinstance(answer, BindOutcome):
        assert got is answer
    else:
        assert isinstance(got, BindRefusal) and got.code == answer
        assert got.sentence and not got.sentence[0].isupper()  # follows "code: "


def test_refusals_say_what_the_operator_saw_and_what_to_do() -> None:
    moved = decide_bind(facts(_link("active"), expected=2))
    assert moved == BindRefusal("generation_moved", "the link is not at generation 2 any more"
                                " (generation 3): look again")
    required = decide_bind(facts(_link("active")))
    assert isinstance(required, BindRefusal) and "generation 3" in required.sentence
    unresolved = decide_bind(facts(_link("active"), expected=3, unresolved=2))
    assert isinstance(unresolved, BindRefusal)
    assert unresolved.sentence == ("2 effect attempt(s) on generation 3 have no proven"
                                   " outcome; record their disposition first")

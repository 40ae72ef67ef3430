"""RemoteSubscription reconciliation's decisions, table-driven, negative rows included."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from daemon.core.subscriptions import (
    Create,
    Delete,
    Desired,
    Health,
    InFlight,
    LaneStep,
    Observed,
    ReadBack,
    Remote,
    Send,
    StepAttempt,
    WaitWindow,
    decide,
    decide_step,
    delete_allowed,
    in_flight,
)

URL = "https://hooks.example/hooks/outreach"
D = Desired(name="prospects", resource="prospect", action="*", payload_version=2, url=URL,
            secret_generation=1)
OBS = Observed(name="prospects", provider_id="11", generation=3, secret_generation=1,
             resource="prospect", action="*", url=URL, payload_version=2)
R = Remote(provider_id="11", resource="prospect", action="*", url=URL, payload_version=2)
OURS = frozenset({URL})

ROWS: list[tuple[str, dict[str, Any], tuple[Any, ...]]] = [
    ("in sync: nothing", {}, ()),
    ("never created", {"observed": [], "remote": []}, (Create("prospects", 1, "missing"),)),
    ("reinstalled: the old installation's subscription is an orphan",
     {"observed": []}, (Create("prospects", 1, "missing"), Delete("11", None, None, "orphan"))),
    ("deleted behind our back: recreated under the next generation", {"remote": []},
     (Create("prospects", 4, "deleted_behind_our_back"),)),
    ("disabled by the provider: reported, not recreated",
     {"remote": [attrs.evolve(R, active=False)]}, (Health("prospects", False),)),
    ("shape drifted: replaced", {"remote": [attrs.evolve(R, payload_version=1)]},
     (Create("prospects", 4, "drifted"),)),
    ("secret rotation: a new one beside the old",
     {"desired": [attrs.evolve(D, secret_generation=2)]},
     (Create("prospects", 4, "secret_rotation"),)),
    ("rotation overlap: the old one stays until the new secret is seen",
     {"observed": [attrs.evolve(OBS, provider_id="12", retiring=("11",), rotating=True)],
      "remote": [R, attrs.evolve(R, provider_id="12")]}, ()),
    ("rotation proven: the old one goes",
     {"observed": [attrs.evolve(OBS, provider_id="12", retiring=("11",), rotating=True)],
      "remote": [R, attrs.evolve(R, provider_id="12")], "seen": {"prospects"}},
     (Delete("11", "prospects", 3, "rotated"),)),
    ("replacement active: the old one goes",
     {"observed": [attrs.evolve(OBS, provider_id="12", retiring=("11",))],
      "remote": [R, attrs.evolve(R, provider_id="12")]},
     (Delete("11", "prospects", 3, "replaced"),)),
    ("replacement not active yet: the old one stays",
     {"observed": [attrs.evolve(OBS, provider_id="12", retiring=("11",))],
      "remote": [R, attrs.evolve(R, provider_id="12", active=False)]},
     (Health("prospects", False),)),
    ("orphan on our route: deleted, fenced on no row",
     {"remote": [R, attrs.evolve(R, provider_id="99")]}, (Delete("99", None, None, "orphan"),)),
    ("someone else's subscription: left alone",
     {"remote": [R, attrs.evolve(R, provider_id="99", url="https://other.example/x")]}, ()),
    ("no longer desired: deleted",
     {"desired": []}, (Delete("11", "prospects", 3, "undesired"),)),
    ("no longer desired and already gone: nothing", {"desired": [], "remote": []}, ()),
]


@pytest.mark.parametrize(("name", "case", "expected"), ROWS, ids=[r[0] for r in ROWS])
def test_decide(name: str, case: dict[str, Any], expected: tuple[Any, ...]) -> None:
    steps = decide(case.get("desired", [D]), case.get("observed", [OBS]),
                   case.get("remote", [R]), our_urls=OURS,
                   new_secret_seen=case.get("seen", set()))
    assert steps == expected


def test_a_delete_is_fenced_by_the_generation_it_was_decided_under() -> None:
    step = Delete("11", "prospects", 3, "replaced")
    assert delete_allowed(step, 3)
    assert not delete_allowed(step, 4)  # a reinstall moved the row on: refused
    orphan = Delete("99", None, None, "orphan")
    assert delete_allowed(orphan, None) and not delete_allowed(orphan, 1)


S = 1_000_000
WINDOW = 30 * S
SKEW = 2 * S
DEADLINE = 20 * S


def _attempt(i: int, at: int, gave_up: int | None, unresolved: bool = True) -> StepAttempt:
    return StepAttempt(attempt_id=f"a{i}", dispatched_at_us=at, gave_up_at_us=gave_up,
                       unresolved=unresolved)


STEP_ROWS: list[tuple[str, list[StepAttempt], int, Any]] = [
    ("no attempt: send", [], 0, Send()),
    ("only resolved attempts: send", [_attempt(1, 0, 5 * S, unresolved=False)], 0, Send()),
    ("unknown, within the window: wait until give-up + window + skew",
     [_attempt(1, 0, 5 * S)], 10 * S, WaitWindow(5 * S + WINDOW + SKEW)),
    ("unknown, one microsecond before the window ends: still wait",
     [_attempt(1, 0, 5 * S)], 5 * S + WINDOW + SKEW - 1, WaitWindow(5 * S + WINDOW + SKEW)),
    ("unknown, the window has passed: read back", [_attempt(1, 0, 5 * S)],
     5 * S + WINDOW + SKEW, ReadBack(("a1",))),
    ("no give-up recorded (a killed claimant): the client's deadline bounds it",
     [_attempt(1, 0, None)], DEADLINE + WINDOW + SKEW - 1, WaitWindow(DEADLINE + WINDOW + SKEW)),
    ("a give-up before the dispatch (clock moved back) counts from the dispatch",
     [_attempt(1, 10 * S, 3 * S)], 10 * S + WINDOW, WaitWindow(10 * S + WINDOW + SKEW)),
    ("the latest unresolved attempt decides",
     [_attempt(1, 0, S), _attempt(2, 60 * S, 61 * S)], 61 * S + WINDOW,
     WaitWindow(61 * S + WINDOW + SKEW)),
    ("a resolved later attempt does not extend the wait",
     [_attempt(1, 0, S), _attempt(2, 60 * S, 61 * S, unresolved=False)], S + WINDOW + SKEW,
     ReadBack(("a1",))),
    ("every unresolved attempt is read back together",
     [_attempt(1, 0, S), _attempt(2, 2 * S, 3 * S)], 100 * S, ReadBack(("a1", "a2"))),
]


@pytest.mark.parametrize(("attempts", "now", "expected"),
                         [pytest.param(a, n, e, id=i) for i, a, n, e in STEP_ROWS])
def test_decide_step(attempts: list[StepAttempt], now: int, expected: Any) -> None:
    assert decide_step(attempts, max_in_flight_us=WINDOW, clock_skew_us=SKEW,
                       client_deadline_us=DEADLINE, now_us=now) == expected


def _step(subject: str, state: str, *, create: bool = True, unresolved: bool = False,
          foreign: bool = False) -> LaneStep:
    return LaneStep(subject=subject, create=create, state=state, unresolved=unresolved,
                    foreign=foreign)


def _flight(busy: tuple[str, ...] = (), doubt: tuple[str, ...] = (),
            held: tuple[str, ...] = ()) -> InFlight:
    return InFlight(frozenset(busy), frozenset(doubt), frozenset(held))


# Issue 22: a create that ended with an attempt unresolved still counts as in flight.
FLIGHT_ROWS: list[tuple[str, list[LaneStep], InFlight]] = [
    ("nothing queued: nothing in flight", [], _flight()),
    ("a pending create is busy", [_step("a", "pending")], _flight(busy=("a",))),
    ("a processing create with an attempt out is busy, not in doubt",
     [_step("a", "processing", unresolved=True)], _flight(busy=("a",))),
    ("a retrying delete is busy", [_step("a", "retry", create=False)], _flight(busy=("a",))),
    ("a dead create with an unknown attempt is in doubt (the finding)",
     [_step("a", "dead", unresolved=True)], _flight(doubt=("a",))),
    ("a cancelled create with an unknown attempt is in doubt",
     [_step("a", "cancelled", unresolved=True)], _flight(doubt=("a",))),
    ("a create let go as succeeded (no longer desired) with one is in doubt",
     [_step("a", "succeeded", unresolved=True)], _flight(doubt=("a",))),
    ("a dead create unknown under another binding generation is held, not in doubt",
     [_step("a", "dead", unresolved=True, foreign=True)], _flight(held=("a",))),
    ("held wins over in doubt for one subject",
     [_step("a", "dead", unresolved=True, foreign=True), _step("a", "dead", unresolved=True)],
     _flight(held=("a",))),
    # negative rows
    ("a pending create under another generation is only busy (its pin fences it)",
     [_step("a", "pending", unresolved=True, foreign=True)], _flight(busy=("a",))),
    ("a dead delete unknown under another generation is not held",
     [_step("a", "dead", create=False, unresolved=True, foreign=True)], _flight()),
    ("a dead create whose attempts are all resolved is not in flight",
     [_step("a", "dead")], _flight()),
    ("a succeeded create is not in flight", [_step("a", "succeeded")], _flight()),
    ("a dead delete with an unknown attempt is not in doubt (twice is once)",
     [_step("a", "dead", create=False, unresolved=True)], _flight()),
    ("another subject's dead create holds only its own subject",
     [_step("b", "dead", unresolved=True), _step("a", "succeeded")], _flight(doubt=("b",))),
    ("a subject both retried and in doubt is busy and in doubt",
     [_step("a", "retry"), _step("a", "dead", unresolved=True)],
     _flight(busy=("a",), doubt=("a",))),
]


@pytest.mark.parametrize(("steps", "expected"),
                         [pytest.param(st, e, id=i) for i, st, e in FLIGHT_ROWS])
def test_in_flight(steps: list[LaneStep], expected: InFlight) -> None:
    assert in_flight(steps) == expected

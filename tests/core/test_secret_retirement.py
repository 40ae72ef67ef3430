"""When a rotated-out webhook secret may retire itself, table-driven, negative rows
included (daemon/core/secret_retirement.py)."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from daemon.core.secret_retirement import (
    Decision,
    Nothing,
    Retire,
    RetirementView,
    Unwatch,
    Wait,
    Watch,
    decide,
)

S = 1_000_000
W = 23 * S
NOW = 1_000 * S
BASE = RetirementView(has_previous=True, subscriptions_current=True, window_us=W)
WATCHING = attrs.evolve(BASE, state="watching", watch_since_us=NOW - W)

ROWS: list[tuple[str, RetirementView, Decision]] = [
    ("rotation over, not watched yet: watch a window from now", BASE,
     Watch(NOW, NOW + W)),
    ("watched a full window, nothing old arrived: retire", WATCHING, Retire()),
    ("watched longer than a window: retire", attrs.evolve(WATCHING,
                                                         watch_since_us=NOW - 5 * W),
     Retire()),
    ("an old-secret delivery before the window began does not hold it",
     attrs.evolve(WATCHING, last_previous_receipt_us=NOW - W - 1), Retire()),
    # Negative rows: never a retirement.
    ("the window is still open", attrs.evolve(WATCHING, watch_since_us=NOW - W + 1),
     Wait(NOW + 1, "window_open")),
    ("an old-secret delivery exactly a window ago is within it",
     attrs.evolve(WATCHING, last_previous_receipt_us=NOW - W),
     Wait(NOW + 1, "previous_secret_used")),
    ("an old-secret delivery just now: a quiet window after it",
     attrs.evolve(WATCHING, last_previous_receipt_us=NOW),
     Wait(NOW + W + 1, "previous_secret_used")),
    ("an old delivery inside a young watch: the later of the two",
     attrs.evolve(WATCHING, watch_since_us=NOW - 1, last_previous_receipt_us=NOW - W + 5),
     Wait(NOW - 1 + W, "previous_secret_used")),
    ("subscriptions not current (still rotating, missing, disabled): the watch goes",
     attrs.evolve(WATCHING, subscriptions_current=False), Unwatch()),
    ("not current and not watched: nothing", attrs.evolve(BASE, subscriptions_current=False),
     Nothing("not_current")),
    ("no previous secret configured", attrs.evolve(BASE, has_previous=False),
     Nothing("no_previous_secret")),
    ("L1 declares no redelivery schedule: an operator removes it",
     attrs.evolve(BASE, window_us=None), Nothing("no_redelivery_window")),
    ("a zero window is no window", attrs.evolve(WATCHING, window_us=0),
     Nothing("no_redelivery_window")),
    ("already retired: final, whatever else", attrs.evolve(
        WATCHING, state="retired", subscriptions_current=False, last_previous_receipt_us=NOW),
     Nothing("retired")),
    ("a watching row without its start is watched again",
     attrs.evolve(BASE, state="watching"), Watch(NOW, NOW + W)),
]


@pytest.mark.parametrize(("name", "view", "expected"), ROWS, ids=[r[0] for r in ROWS])
def test_decide(name: str, view: RetirementView, expected: Any) -> None:
    assert decide(view, NOW) == expected


def test_a_watch_retires_at_its_check_time_and_not_a_microsecond_before() -> None:
    watch = decide(BASE, NOW)
    assert isinstance(watch, Watch)
    view = attrs.evolve(BASE, state="watching", watch_since_us=watch.since_us)
    assert isinstance(decide(view, watch.check_at_us - 1), Wait)
    assert decide(view, watch.check_at_us) == Retire()


def test_a_wait_after_an_old_delivery_ends_in_a_retirement_at_its_time() -> None:
    view = attrs.evolve(WATCHING, last_previous_receipt_us=NOW)
    wait = decide(view, NOW)
    assert isinstance(wait, Wait)
    # At the time the wait names, the old delivery is out of the window.
    assert decide(view, wait.check_at_us) == Retire()

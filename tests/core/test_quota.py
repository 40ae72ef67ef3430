"""The quota schedule, row by row, and its guarantee checked by brute force."""

from __future__ import annotations

import random

import pytest

from daemon.core.quota import (
    Granted,
    QuotaPolicy,
    QuotaPolicyError,
    QuotaState,
    Wait,
    grant,
    returned,
    slot_usable,
    throttled,
)

S = 1_000_000
HUNDRED_PER_10S = QuotaPolicy(limit=100, window_us=10 * S, jitter_us=250_000)


@pytest.mark.parametrize(("limit", "window", "jitter", "interval"), [
    (100, 10 * S, 250_000, 102_500),     # (10 s + 0.25 s) / 100
    (10_000, 3600 * S, 250_000, 360_025),
    (1, S, 0, S),
    (3, 10, 0, 4),                       # rounded up, never down
    (1_000_000, 1, 0, 1),                # never below 1 us
])
def test_interval(limit: int, window: int, jitter: int, interval: int) -> None:
    policy = QuotaPolicy(limit=limit, window_us=window, jitter_us=jitter)
    assert policy.interval_us == interval
    assert policy.max_sends_in_window() <= limit


@pytest.mark.parametrize(("limit", "window", "jitter"), [
    (0, S, 0), (-5, S, 0), (10, 0, 0), (10, -S, 0), (10, S, -1),
])
def test_policies_that_cannot_be_enforced_are_refused(limit: int, window: int,
                                                      jitter: int) -> None:
    with pytest.raises(QuotaPolicyError):
        QuotaPolicy(limit=limit, window_us=window, jitter_us=jitter)


GRANTS = [
    # (state, now, count, max_wait, expected)
    (QuotaState(0, 0), 5 * S, 1, 0, Granted((5 * S,), QuotaState(5 * S + 102_500, 0))),
    (QuotaState(0, 0), 5 * S, 3, 0,
     Granted((5 * S, 5 * S + 102_500, 5 * S + 205_000), QuotaState(5 * S + 307_500, 0))),
    # TAT ahead of now, within max_wait: the slot is in the future.
    (QuotaState(6 * S, 0), 5 * S, 1, 2 * S, Granted((6 * S,), QuotaState(6 * S + 102_500, 0))),
    # TAT ahead beyond max_wait: told exactly when to come back.
    (QuotaState(6 * S, 0), 5 * S, 1, 0, Wait(6 * S)),
    (QuotaState(9 * S, 0), 5 * S, 1, S, Wait(8 * S)),
    # Blocked by a 429 for everyone.
    (QuotaState(0, 7 * S), 5 * S, 1, 0, Wait(7 * S)),
    (QuotaState(0, 7 * S), 5 * S, 1, 3 * S, Granted((7 * S,), QuotaState(7 * S + 102_500, 7 * S))),
    # A stale TAT in the past never grants a slot in the past.
    (QuotaState(S, 0), 5 * S, 1, 0, Granted((5 * S,), QuotaState(5 * S + 102_500, 0))),
]


@pytest.mark.parametrize(("state", "now", "count", "max_wait", "expected"), GRANTS)
def test_grant(state: QuotaState, now: int, count: int, max_wait: int,
               expected: Granted | Wait) -> None:
    assert grant(HUNDRED_PER_10S, state, now_us=now, count=count,
                 max_wait_us=max_wait) == expected


def test_grant_of_nothing_is_a_bug() -> None:
    with pytest.raises(ValueError, match="count must be positive"):
        grant(HUNDRED_PER_10S, QuotaState(), now_us=0, count=0)


@pytest.mark.parametrize(("state", "now", "retry_after", "blocked"), [
    (QuotaState(0, 0), 5 * S, 10 * S, 15 * S),
    (QuotaState(0, 20 * S), 5 * S, 10 * S, 20 * S),   # never moves back
    (QuotaState(0, 0), 5 * S, -3, 5 * S),             # a negative Retry-After is "now"
])
def test_throttled(state: QuotaState, now: int, retry_after: int, blocked: int) -> None:
    assert throttled(state, now_us=now, retry_after_us=retry_after).blocked_until_us == blocked


def test_unused_newest_slots_come_back_and_older_ones_do_not() -> None:
    got = grant(HUNDRED_PER_10S, QuotaState(), now_us=S, count=4)
    assert isinstance(got, Granted)
    back = returned(HUNDRED_PER_10S, got.state, got.slots[2:])
    assert back == QuotaState(got.slots[2], 0)
    # Once someone else was granted after them, they cannot come back.
    later = grant(HUNDRED_PER_10S, got.state, now_us=S, count=1, max_wait_us=10 * S)
    assert isinstance(later, Granted)
    assert returned(HUNDRED_PER_10S, later.state, got.slots[2:]) is None
    assert returned(HUNDRED_PER_10S, got.state, ()) is None
    assert returned(HUNDRED_PER_10S, got.state, (got.slots[1], got.slots[3])) is None


@pytest.mark.parametrize(("slot", "now", "usable"), [
    (S, S, True), (S, S + 249_999, True), (S, S + 250_000, False), (S, S - 1, False),
])
def test_slot_usable(slot: int, now: int, usable: bool) -> None:
    assert slot_usable(HUNDRED_PER_10S, slot, now) is usable


@pytest.mark.parametrize("seed", range(20))
def test_no_window_ever_sees_more_than_the_limit(seed: int) -> None:
    """Brute force: random replicas grant blocks, send anywhere inside each slot's jitter,
    return some; every window of the provider's length holds at most ``limit`` sends."""
    rng = random.Random(seed)
    policy = QuotaPolicy(limit=rng.choice([3, 10, 100]), window_us=rng.choice([S, 10 * S]),
                         jitter_us=rng.choice([0, 50_000, 250_000]))
    state, now = QuotaState(), 0
    sends: list[int] = []
    for _ in range(400):
        now += rng.randrange(0, policy.interval_us * 3)
        if rng.random() < 0.05:
            state = throttled(state, now_us=now, retry_after_us=rng.randrange(0, 2 * S))
        got = grant(policy, state, now_us=now, count=rng.randint(1, 4),
                    max_wait_us=rng.choice([0, S]))
        if isinstance(got, Wait):
            assert got.until_us > now
            continue
        state = got.state
        used = [s for s in got.slots if rng.random() < 0.8]
        unused = tuple(s for s in got.slots if s not in used)
        back = returned(policy, state, unused) if unused == got.slots[len(used):] else None
        if back is not None:
            state = back
        sends.extend(s + rng.randrange(0, max(1, policy.jitter_us)) for s in used)
    sends.sort()
    assert sends, "nothing was sent"
    j = 0
    for i, start in enumerate(sends):
        while j < len(sends) and sends[j] < start + policy.window_us:
            j += 1
        assert j - i <= policy.limit, (start, j - i, policy)

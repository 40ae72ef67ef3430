"""The quota schedule, row by row, and its guarantee checked by brute force."""

from __future__ import annotations

import math
import random

import attrs
import pytest

from daemon.core.quota import (
    SLOT_LOG_RESERVE,
    ClassScope,
    Granted,
    QuotaPolicy,
    QuotaPolicyError,
    QuotaState,
    ResetFormat,
    ResetIgnored,
    Wait,
    WindowKind,
    corrected,
    decode_log,
    encode_log,
    endpoint_class_key,
    grant,
    reset_at,
    reset_cap_us,
    returned,
    send_lead_us,
    slot_usable,
    throttled,
    waiting_turn,
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


# ------------------------------------------------------------------ bursts

# Up to SLOT_LOG_MAX per window a burst keeps a slot log; above it, the stretched GCRA.
SLIDING_BURST = QuotaPolicy(limit=100, window_us=10 * S, jitter_us=250_000, burst=20)
STRETCHED = QuotaPolicy(limit=2_000, window_us=200 * S, jitter_us=250_000, burst=400)
FIXED = QuotaPolicy(limit=100, window_us=10 * S, jitter_us=250_000, kind=WindowKind.FIXED)


@pytest.mark.parametrize(("policy", "interval", "tolerance"), [
    # A slot log: the even spacing (10 s + 0.25 s) / 100; a burst of 20 starts at once.
    (SLIDING_BURST, 102_500, 19 * 102_500),
    # Above SLOT_LOG_MAX: (200 s + 0.25 s) / (2000 - 400 + 1), rounded up.
    (STRETCHED, 125_079, 399 * 125_079),
    (QuotaPolicy(limit=100, window_us=10 * S, burst=1), 102_500, 0),  # no burst: as before
    (QuotaPolicy(limit=5, window_us=10, jitter_us=0, burst=5), 2, 8),  # all at once
    (FIXED, 1, 0),
])
def test_burst_interval_and_tolerance(policy: QuotaPolicy, interval: int,
                                      tolerance: int) -> None:
    assert policy.interval_us == interval
    assert policy.tolerance_us == tolerance
    assert policy.max_sends_in_window() <= policy.limit


@pytest.mark.parametrize(("fields", "message"), [
    ({"burst": 0}, "burst must be between 1 and the limit"),
    ({"burst": 101}, "burst must be between 1 and the limit"),
    ({"burst": True}, "burst must be between 1 and the limit"),
    ({"kind": WindowKind.FIXED, "window_us": 100}, "limit must be below its length"),
    ({"kind": WindowKind.FIXED, "window_us": 200_000}, "longer than the jitter"),
])
def test_burst_policies_that_cannot_be_enforced_are_refused(fields: dict[str, object],
                                                            message: str) -> None:
    base: dict[str, object] = {"limit": 100, "window_us": 10 * S, "jitter_us": 250_000}
    with pytest.raises(QuotaPolicyError, match=message):
        QuotaPolicy(**{**base, **fields})  # type: ignore[arg-type]


@pytest.mark.parametrize(("policy", "burst", "step"), [
    (SLIDING_BURST, 20, 102_500), (STRETCHED, 400, 125_079)])
def test_a_sliding_burst_starts_at_once_then_the_sustained_rate(policy: QuotaPolicy,
                                                                burst: int, step: int) -> None:
    got = grant(policy, QuotaState(), now_us=5 * S, count=burst + 2, max_wait_us=10 * S)
    assert isinstance(got, Granted)
    assert got.slots[:burst] == (5 * S,) * burst  # the burst
    assert got.slots[burst:] == (5 * S + step, 5 * S + 2 * step)  # then one per interval
    assert got.positions == tuple(5 * S + i * step for i in range(burst + 2))
    assert got.state.tat_us == 5 * S + (burst + 2) * step
    # A slot log: a new key's (all "a window before 0"), then the positions.
    assert got.state.log == (() if policy is STRETCHED else
                             (-10_250_000,) * 100 + got.positions)[-132:]
    # A burst is not a way around max_wait.
    full = grant(policy, got.state, now_us=5 * S, count=1, max_wait_us=0)
    assert full == Wait(5 * S + 3 * step)


FIXED_GRANTS = [
    # (state, now, count, max_wait, expected)
    # The first grant of a window: all at once, counted from the window's start.
    (QuotaState(0, 0), 12 * S, 3, 0,
     Granted((12 * S,) * 3, QuotaState(10 * S + 3, 0), (10 * S, 10 * S + 1, 10 * S + 2))),
    # Same window, 97 used: the last 3 still go now.
    (QuotaState(10 * S + 97, 0), 13 * S, 3, 0,
     Granted((13 * S,) * 3, QuotaState(10 * S + 100, 0),
             (10 * S + 97, 10 * S + 98, 10 * S + 99))),
    # The window is full: the next one's start, if within max_wait, else when to return.
    (QuotaState(10 * S + 100, 0), 13 * S, 1, 0, Wait(20 * S)),
    (QuotaState(10 * S + 99, 0), 13 * S, 2, 0, Wait(20 * S)),
    (QuotaState(10 * S + 100, 0), 19 * S, 1, S,
     Granted((20 * S,), QuotaState(20 * S + 1, 0), (20 * S,))),
    # Within the jitter of the window's end: it could arrive in the next window, so it
    # counts there and starts there.
    (QuotaState(10 * S + 5, 0), 20 * S - 100_000, 1, 0, Wait(20 * S - 0)),
    (QuotaState(10 * S + 5, 0), 20 * S - 100_000, 1, S,
     Granted((20 * S,), QuotaState(20 * S + 1, 0), (20 * S,))),
    # A row from an old window counts nothing now.
    (QuotaState(10 * S + 100, 0), 45 * S, 1, 0,
     Granted((45 * S,), QuotaState(40 * S + 1, 0), (40 * S,))),
    # Blocked by a 429 into a later window.
    (QuotaState(10 * S + 50, 31 * S), 13 * S, 1, 0, Wait(31 * S)),
    (QuotaState(10 * S + 50, 31 * S), 13 * S, 1, 20 * S,
     Granted((31 * S,), QuotaState(30 * S + 1, 31 * S), (30 * S,))),
]


@pytest.mark.parametrize(("state", "now", "count", "max_wait", "expected"), FIXED_GRANTS)
def test_fixed_window_grant(state: QuotaState, now: int, count: int, max_wait: int,
                            expected: Granted | Wait) -> None:
    assert grant(FIXED, state, now_us=now, count=count, max_wait_us=max_wait) == expected


def test_a_fixed_window_grant_larger_than_the_limit_is_a_bug() -> None:
    with pytest.raises(ValueError, match="exceeds the window's limit"):
        grant(FIXED, QuotaState(), now_us=S, count=101)


def test_burst_slots_come_back_by_position() -> None:
    for policy in (SLIDING_BURST, STRETCHED, FIXED):
        got = grant(policy, QuotaState(), now_us=S, count=4)
        assert isinstance(got, Granted)
        back = returned(policy, got.state, got.places[2:])
        # A slot log forgets them too.
        assert back == QuotaState(got.places[2], 0, got.state.log[:-2])
        # Send times of a burst are not positions: they do not come back.
        assert returned(policy, got.state, got.slots[2:]) is None


CORRECTIONS = [
    # (policy, state, now, remaining, expected tat or None)
    # Sliding, burst 20: the provider says 5 remain; the row would have granted 20.
    # (A slot log whose last 100 slots are long past.)
    (SLIDING_BURST, QuotaState(0, 0, (-20 * S,) * 100), 5 * S, 5,
     5 * S + 19 * 102_500 - 4 * 102_500),
    (SLIDING_BURST, QuotaState(0, 0, (-20 * S,) * 100), 5 * S, 0, 5 * S + 20 * 102_500),
    (SLIDING_BURST, QuotaState(0, 0, (-20 * S,) * 100), 5 * S, -3,
     5 * S + 20 * 102_500),  # as 0
    (STRETCHED, QuotaState(0, 0), 5 * S, 5, 5 * S + 399 * 125_079 - 4 * 125_079),
    # The row already grants no more: never moved backward.
    (SLIDING_BURST, QuotaState(0, 0), 5 * S, 20, None),
    (SLIDING_BURST, QuotaState(9 * S, 0), 5 * S, 5, None),
    # Fixed: 30 remain of 100 -> 70 counted in this window.
    (FIXED, QuotaState(10 * S + 12, 0), 13 * S, 30, 10 * S + 70),
    (FIXED, QuotaState(10 * S + 80, 0), 13 * S, 30, None),
    (FIXED, QuotaState(0, 0), 13 * S, 100, None),
]


@pytest.mark.parametrize(("policy", "state", "now", "remaining", "tat"), CORRECTIONS)
def test_remaining_count_corrects_drift_forward_only(policy: QuotaPolicy, state: QuotaState,
                                                     now: int, remaining: int,
                                                     tat: int | None) -> None:
    got = corrected(policy, state, now_us=now, remaining=remaining)
    assert (None if got is None else got.tat_us) == tat
    if got is not None:
        # After it, at most `remaining` slots start now.
        n = 0
        while True:
            g = grant(policy, got, now_us=now, count=1)
            if isinstance(g, Wait):
                break
            got, n = g.state, n + 1
        assert n == max(0, remaining)


def _worst_window(sends: list[int], policy: QuotaPolicy) -> int:
    """The most sends any window of the provider's own definition holds."""
    sends = sorted(sends)
    if policy.kind is WindowKind.FIXED:
        counts: dict[int, int] = {}
        for t in sends:
            counts[policy.window_start(t)] = counts.get(policy.window_start(t), 0) + 1
        return max(counts.values())
    worst, j = 0, 0
    for i, start in enumerate(sends):
        while j < len(sends) and sends[j] < start + policy.window_us:
            j += 1
        worst = max(worst, j - i)
    return worst


def _simulate(policy: QuotaPolicy, seed: int, schedule: object = grant) -> list[int]:
    """Random replicas grant blocks, send anywhere inside each slot's jitter, return some,
    get throttled and corrected."""
    rng = random.Random(seed)
    state, now = QuotaState(), 0
    sends: list[int] = []
    for _ in range(600):
        now += rng.randrange(0, max(2, policy.window_us // policy.limit) * 2)
        if rng.random() < 0.03:
            state = throttled(state, now_us=now, retry_after_us=rng.randrange(0, 2 * S))
        if rng.random() < 0.03:
            state = corrected(policy, state, now_us=now,
                              remaining=rng.randrange(0, policy.limit)) or state
        got = schedule(policy, state, now_us=now,  # type: ignore[operator]
                       count=rng.randint(1, min(4, policy.limit)),
                       max_wait_us=rng.choice([0, S]))
        if isinstance(got, Wait):
            assert got.until_us > now
            continue
        state = got.state
        n_used = rng.randint(0, len(got.slots))
        if n_used < len(got.slots) and rng.random() < 0.5:
            state = returned(policy, state, got.places[n_used:]) or state
        sends.extend(s + rng.randrange(0, max(1, policy.jitter_us))
                     for s in got.slots[:n_used])
    assert sends, "nothing was sent"
    return sends


@pytest.mark.parametrize("seed", range(30))
def test_no_window_of_either_kind_ever_sees_more_than_the_limit_with_bursts(seed: int) -> None:
    rng = random.Random(seed)
    limit = rng.choice([3, 10, 100, 1_500])  # 1,500: above SLOT_LOG_MAX, stretched
    policy = QuotaPolicy(limit=limit, window_us=rng.choice([S, 10 * S]),
                         jitter_us=rng.choice([0, 50_000, 250_000]),
                         kind=rng.choice(list(WindowKind)), burst=rng.randint(1, limit),
                         offset_us=rng.randrange(0, S))
    assert _worst_window(_simulate(policy, seed), policy) <= limit


def _naive_burst(policy: QuotaPolicy, state: QuotaState, *, now_us: int, count: int,
                 max_wait_us: int) -> Granted | Wait:
    """GCRA with a burst tolerance but the even spacing's interval (the textbook mistake):
    after a full burst it goes on at the full rate, so a window sees up to 2N - 1."""
    step = math.ceil((policy.window_us + policy.jitter_us) / policy.limit)
    tau = (policy.burst - 1) * step
    floor = max(now_us, state.blocked_until_us)
    if max(floor, state.tat_us - tau) - now_us > max_wait_us:
        return Wait(max(floor, state.tat_us - tau) - max_wait_us)
    base = max(state.tat_us, floor)
    positions = tuple(base + i * step for i in range(count))
    return Granted(tuple(max(floor, p - tau) for p in positions),
                   attrs.evolve(state, tat_us=base + count * step), positions)


def test_the_window_check_catches_a_burst_without_the_longer_interval() -> None:
    """Negative row: the same check fails the textbook burst, so it can fail ours."""
    policy = QuotaPolicy(limit=10, window_us=S, jitter_us=0, burst=10)
    worst = max(_worst_window(_simulate(policy, seed, _naive_burst), policy)
                for seed in range(5))
    assert worst > policy.limit


# ---- replicas' clocks ----


@pytest.mark.parametrize(("jitter", "spread", "interval", "usable_until"), [
    (250_000, 0, 102_500, S + 250_000),
    (250_000, 900_000, 111_500, S + 250_000),  # spaced for both, sent within the jitter
    (0, 50_000, 100_500, S + 1),
])
def test_the_clock_spread_widens_the_spacing_but_not_the_send_window(
        jitter: int, spread: int, interval: int, usable_until: int) -> None:
    policy = QuotaPolicy(limit=100, window_us=10 * S, jitter_us=jitter, clock_spread_us=spread)
    assert policy.interval_us == interval
    assert slot_usable(policy, S, usable_until - 1)
    assert not slot_usable(policy, S, usable_until)


@pytest.mark.parametrize("fields", [
    {"clock_spread_us": -1},
    {"kind": WindowKind.FIXED, "jitter_us": 250_000, "clock_spread_us": 750_000},
])
def test_a_clock_spread_that_cannot_be_enforced_is_refused(fields: dict[str, object]) -> None:
    with pytest.raises(QuotaPolicyError):
        QuotaPolicy(limit=10, window_us=S, **fields)  # type: ignore[arg-type]


def _skewed_sends(policy: QuotaPolicy, spread: int, seed: int) -> list[int]:
    """Replicas whose clocks are up to ``spread`` apart grant on their own clocks and send
    as a starved machine does: only at wake-ups, in pairs 990 ms apart every 3.1 s (real
    time), each slot at a wake-up its slot allows on the clock of some replica (the worst
    the gate lets through: as many sends as it can into one window; a slot no wake-up
    fits is dropped, never sent late).
    Returns the real arrival times."""
    rng = random.Random(seed)
    state, real = QuotaState(), 0
    sends: list[int] = []
    for _ in range(500):
        real += rng.randrange(0, 2 * policy.interval_us)
        got = grant(policy, state, now_us=real + rng.choice([0, spread]),
                    count=rng.randint(1, 3), max_wait_us=S)
        if isinstance(got, Wait):
            continue
        state = got.state
        for slot in got.slots:
            pair = slot // 3_100_000 * 3_100_000
            wakes = [pair + d for d in (-3_100_000, -2_110_000, 0, 990_000, 3_100_000)]
            # A clock ``offset`` ahead of real time reads real time ``at`` as at + offset;
            # the sender is the replica whose offset (0 to the spread) fits best.
            fits = [at for at in wakes
                    if slot_usable(policy, slot, at + min(max(slot - at, 0), spread))]
            if fits:
                sends.append(fits[0])
    assert sends, "nothing was sent"
    return sends


@pytest.mark.parametrize("seed", range(10))
def test_skewed_replicas_sending_late_never_exceed_the_window(seed: int) -> None:
    policy = QuotaPolicy(limit=20, window_us=S, jitter_us=250_000, clock_spread_us=900_000)
    assert _worst_window(_skewed_sends(policy, 900_000, seed), policy) <= policy.limit


def test_the_window_check_catches_a_clock_spread_folded_into_the_jitter() -> None:
    """Negative row: the spread declared as more jitter lets late senders spend it too."""
    folded = QuotaPolicy(limit=20, window_us=S, jitter_us=250_000 + 900_000)
    worst = max(_worst_window(_skewed_sends(folded, 900_000, seed), folded)
                for seed in range(10))
    assert worst > folded.limit


# ---- endpoint classes: which key, if any, a call of a class counts against ----

SEARCH_ONLY = ClassScope(applies_to=frozenset({"search"}))
PER_CLASS = ClassScope(all_apart=True)
L2_APART = ClassScope(apart=frozenset({"search"}))


@pytest.mark.parametrize(("endpoint_class", "scope", "key"), [
    ("crm_objects", ClassScope(), "p:d:o"),               # no classes: every call, one key
    ("", ClassScope(), "p:d:o"),                          # unclassified too
    ("search", SEARCH_ONLY, "p:d:o"),                     # the class it counts
    ("crm_objects", SEARCH_ONLY, None),                   # negative: another class
    ("", SEARCH_ONLY, None),                              # negative: an unclassified call
    ("search", PER_CLASS, "p:d:o:class:search"),          # a budget per class
    ("crm_objects", PER_CLASS, "p:d:o:class:crm_objects"),
    ("", PER_CLASS, "p:d:o"),                             # unclassified: the common budget
    ("search", L2_APART, "p:d:o:class:search"),           # L2 gave search its own
    ("crm_objects", L2_APART, "p:d:o"),                   # negative: not one L2 named
    ("search", attrs.evolve(SEARCH_ONLY, all_apart=True), "p:d:o:class:search"),
    ("crm_objects", attrs.evolve(SEARCH_ONLY, all_apart=True), None),
])
def test_endpoint_class_key(endpoint_class: str, scope: ClassScope, key: str | None) -> None:
    assert endpoint_class_key("p:d:o", endpoint_class, scope) == key


def test_two_classes_with_budgets_of_their_own_never_share_a_key() -> None:
    a = endpoint_class_key("p:d:o", "crm_objects", PER_CLASS)
    b = endpoint_class_key("p:d:o", "search", PER_CLASS)
    assert a is not None and b is not None and a != b


# ---- the provider's reset header ----

NOW = 1_800_000_000 * S  # an epoch time in us
CAP = 3601 * S


@pytest.mark.parametrize(("text", "fmt", "at"), [
    (None, ResetFormat.SECONDS, None),                         # no header: nothing said
    ("30", ResetFormat.SECONDS, NOW + 30 * S),
    (" 30 ", ResetFormat.SECONDS, NOW + 30 * S),
    ("1.5", ResetFormat.SECONDS, NOW + 1_500_000),
    ("0", ResetFormat.SECONDS, NOW),
    ("3601", ResetFormat.SECONDS, NOW + CAP),                  # exactly the cap
    ("1800000030", ResetFormat.EPOCH_SECONDS, NOW + 30 * S),
    ("1800000030000", ResetFormat.EPOCH_MS, NOW + 30 * S),
    ("1800000000500", ResetFormat.EPOCH_MS, NOW + 500_000),
    # Negative rows: never a block, a counted reason instead.
    ("", ResetFormat.SECONDS, ResetIgnored.MALFORMED),
    ("soon", ResetFormat.SECONDS, ResetIgnored.MALFORMED),
    ("Tue, 01 Dec 2026 19:00:00 GMT", ResetFormat.SECONDS, ResetIgnored.MALFORMED),
    ("1e3", ResetFormat.SECONDS, ResetIgnored.MALFORMED),
    ("NaN", ResetFormat.SECONDS, ResetIgnored.MALFORMED),
    ("inf", ResetFormat.SECONDS, ResetIgnored.MALFORMED),
    ("+5", ResetFormat.SECONDS, ResetIgnored.MALFORMED),
    ("5.", ResetFormat.SECONDS, ResetIgnored.MALFORMED),
    ("1" * 25, ResetFormat.SECONDS, ResetIgnored.MALFORMED),   # no huge integers
    ("-5", ResetFormat.SECONDS, ResetIgnored.NEGATIVE),
    ("-0.5", ResetFormat.EPOCH_SECONDS, ResetIgnored.NEGATIVE),
    ("-0", ResetFormat.SECONDS, NOW),                          # minus zero is zero
    ("3602", ResetFormat.SECONDS, ResetIgnored.BEYOND_CAP),
    ("1800000030", ResetFormat.SECONDS, ResetIgnored.BEYOND_CAP),  # epoch read as seconds
    ("1799999999", ResetFormat.EPOCH_SECONDS, ResetIgnored.PAST),
    ("30", ResetFormat.EPOCH_SECONDS, ResetIgnored.PAST),      # seconds read as an epoch
    ("1800000030", ResetFormat.EPOCH_MS, ResetIgnored.PAST),   # seconds read as ms
    ("1900000000", ResetFormat.EPOCH_SECONDS, ResetIgnored.BEYOND_CAP),
])
def test_reset_at(text: str | None, fmt: ResetFormat, at: int | ResetIgnored | None) -> None:
    assert reset_at(text, fmt, now_us=NOW, cap_us=CAP) == at


def test_the_reset_cap_is_one_window_and_the_headers_resolution() -> None:
    policy = QuotaPolicy(limit=10_000, window_us=3600 * S, jitter_us=250_000)
    assert reset_cap_us(policy) == 3600 * S + 250_000 + S


def test_a_reset_never_moves_a_block_back() -> None:
    state = QuotaState(0, NOW + 60 * S)
    at = reset_at("5", ResetFormat.SECONDS, now_us=NOW, cap_us=CAP)
    assert isinstance(at, int)
    assert throttled(state, now_us=NOW, retry_after_us=at - NOW) == state
def _log_without_jitter(policy: QuotaPolicy, state: QuotaState, *, now_us: int, count: int,
                        max_wait_us: int) -> Granted | Wait:
    """A slot log that forgets the jitter: slot n only a window after slot n - N."""
    return grant(attrs.evolve(policy, jitter_us=0), state, now_us=now_us, count=count,
                 max_wait_us=max_wait_us)


def test_the_window_check_catches_a_slot_log_without_the_jitter() -> None:
    """Negative row: a send may start anywhere in its slot's jitter, so a log spacing
    slot n - N and slot n by the window alone lets a window see N + 1."""
    policy = QuotaPolicy(limit=10, window_us=S, jitter_us=250_000, burst=5)
    assert policy.uses_slot_log
    worst = max(_worst_window(_simulate(policy, seed, _log_without_jitter), policy)
                for seed in range(5))
    assert worst > policy.limit


# ------------------------------------------------------------------ the slot log

# 4 per second, a burst of 2: positions every 250 ms, a slot may start 250 ms early, and
# slot n no earlier than slot n - 4's entry + 1 s.
LOGGED = QuotaPolicy(limit=4, window_us=S, jitter_us=0, burst=2)
Q = S // 4

LOG_GRANTS = [
    # (state, now, count, max_wait, expected)
    # A new key: the burst of 2 at once, then one per interval.
    (QuotaState(), 10 * S, 4, S,
     Granted((10 * S, 10 * S, 10 * S + Q, 10 * S + 2 * Q),
             QuotaState(11 * S, 0, (-S,) * 4 + tuple(10 * S + i * Q for i in range(4))),
             tuple(10 * S + i * Q for i in range(4)))),
    # Idle for a window: the burst is back.
    (QuotaState(8 * S, 0, (7 * S, 7 * S + Q, 7 * S + 2 * Q, 7 * S + 3 * Q)), 10 * S, 2, 0,
     Granted((10 * S, 10 * S),
             QuotaState(10 * S + 2 * Q, 0, (7 * S, 7 * S + Q, 7 * S + 2 * Q, 7 * S + 3 * Q,
                                            10 * S, 10 * S + Q)),
             (10 * S, 10 * S + Q))),
    # Busy the whole last window: the GCRA alone would start both now (p - tau); the log
    # holds the second until slot n - 4's entry + 1 s.
    (QuotaState(10 * S, 0, (9 * S, 9 * S + Q, 9 * S + 2 * Q, 9 * S + 3 * Q)), 10 * S, 2, S,
     Granted((10 * S, 10 * S + Q),
             QuotaState(10 * S + 2 * Q, 0, (9 * S, 9 * S + Q, 9 * S + 2 * Q, 9 * S + 3 * Q,
                                            10 * S, 10 * S + Q)),
             (10 * S, 10 * S + Q))),
    # The log says when to come back (the GCRA alone would grant at once).
    (QuotaState(10 * S + Q, 0, (9 * S + Q, 9 * S + 2 * Q, 9 * S + 3 * Q, 10 * S)), 10 * S,
     1, 0, Wait(10 * S + Q)),
    # A key with a TAT and no log (it ran another schedule, or was only corrected): the
    # log is guessed as late as max(TAT, now), so its first slot waits a window; the
    # entry is its start, not its position.
    (QuotaState(10 * S, 0), 10 * S, 1, 2 * S,
     Granted((11 * S,), QuotaState(10 * S + Q, 0, (10 * S,) * 4 + (11 * S,)), (10 * S,))),
    (QuotaState(10 * S, 0), 10 * S, 1, 0, Wait(11 * S)),
    # A 429's block holds everything, the burst included.
    (QuotaState(0, 12 * S, (0,) * 4), 10 * S, 2, 3 * S,
     Granted((12 * S, 12 * S), QuotaState(12 * S + 2 * Q, 12 * S, (0,) * 4 + (12 * S, 12 * S + Q)),
             (12 * S, 12 * S + Q))),
]


@pytest.mark.parametrize(("state", "now", "count", "max_wait", "expected"), LOG_GRANTS)
def test_slot_log_grant(state: QuotaState, now: int, count: int, max_wait: int,
                        expected: Granted | Wait) -> None:
    assert LOGGED.uses_slot_log and LOGGED.max_sends_in_window() == LOGGED.limit
    assert grant(LOGGED, state, now_us=now, count=count, max_wait_us=max_wait) == expected


def test_slot_log_keeps_the_limit_and_a_reserve_and_gives_back_only_what_it_holds() -> None:
    got = grant(LOGGED, QuotaState(), now_us=10 * S, count=40, max_wait_us=S)
    assert isinstance(got, Granted)
    assert got.state.log == got.positions[-(4 + SLOT_LOG_RESERVE):]
    # The newest 32 come back (the log still holds 4 after them) ...
    back = returned(LOGGED, got.state, got.places[-SLOT_LOG_RESERVE:])
    assert back == QuotaState(got.places[-SLOT_LOG_RESERVE], 0, got.positions[4:8])
    # ... 33 would leave 3 entries for a limit of 4: they expire instead.
    assert returned(LOGGED, got.state, got.places[-SLOT_LOG_RESERVE - 1:]) is None
    # An entry that is a start, not a position (a guessed log), does not come back.
    guessed = grant(LOGGED, QuotaState(10 * S, 0), now_us=10 * S, count=1, max_wait_us=2 * S)
    assert isinstance(guessed, Granted)
    assert returned(LOGGED, guessed.state, guessed.places) is None


@pytest.mark.parametrize(("policy", "low", "high"), [
    # HubSpot's 100 per 10 s with a burst of 10: a slot log, the even spacing's rate.
    (QuotaPolicy(limit=100, window_us=10 * S, jitter_us=250_000, burst=10), 0.97, 0.976),
    (QuotaPolicy(limit=100, window_us=10 * S, jitter_us=250_000, burst=1), 0.97, 0.976),
    (QuotaPolicy(limit=100, window_us=10 * S, jitter_us=250_000, burst=100), 0.97, 0.976),
    # The stretched GCRA (above SLOT_LOG_MAX) pays for its burst: 1601 / 2000 of it.
    (STRETCHED, 0.79, 0.81),
])
def test_sustained_use_of_the_limit(policy: QuotaPolicy, low: float, high: float) -> None:
    """Demand that never stops, one slot at a time as soon as granted, for 30 windows:
    what fraction of the provider's allowance it sends (MockClock-free: the schedule's
    own arithmetic), and no window exceeds the limit."""
    state, now = QuotaState(), 1_000 * S
    sends: list[int] = []
    end = now + 30 * policy.window_us
    while now < end:
        got = grant(policy, state, now_us=now, count=2, max_wait_us=S)
        if isinstance(got, Wait):
            now = got.until_us
            continue
        state = got.state
        sends.extend(got.slots)
        now = max(now, got.slots[-1])
    sends = [t for t in sends if t < end]
    assert _worst_window(sends, policy) <= policy.limit
    use = len(sends) / (30 * policy.limit)
    assert low <= use <= high, use


@pytest.mark.parametrize(("log", "text"), [
    ((), ""), ((5,), "5"), ((-10, -10, 0, 7), "-10,0,10,7"),
])
def test_slot_log_text(log: tuple[int, ...], text: str) -> None:
    assert encode_log(log) == text
    assert decode_log(text) == log


@pytest.mark.parametrize("text", ["1,-1", "x", "1,,2", "1,2.5"])
def test_a_slot_log_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a slot log"):
        decode_log(text)


@pytest.mark.parametrize(("cursor", "until", "interval", "expected"), [
    (0, 5_000, 100, (5_000, 5_100)),  # the first waiter: at the time the ledger said
    (5_100, 5_000, 100, (5_100, 5_200)),  # the next one told the same: one interval on
    (9_000, 5_000, 100, (9_000, 9_100)),  # behind many waiters: after them
    (4_000, 5_000, 100, (5_000, 5_100)),  # negative: a stale cursor never brings one early
    (0, 5_000, 0, (5_000, 5_001)),  # negative: an unknown interval still moves the cursor
])
def test_waiting_turns_come_back_one_interval_apart(cursor: int, until: int, interval: int,
                                                    expected: tuple[int, int]) -> None:
    assert waiting_turn(cursor, until, interval) == expected


@pytest.mark.parametrize(("samples", "cap", "expected"), [
    ([], 500_000, 0),  # nothing measured yet: ask for now
    ([100_000], 500_000, 100_000),
    (list(range(1, 11)), 500_000, 10),  # the 90th percentile of ten: the largest
    ([5] * 9 + [900_000], 500_000, 500_000),  # one slow preparation, capped
    ([10_000] * 19 + [900_000], 500_000, 10_000),  # negative: one outlier in twenty is not p90
    ([-5, -1], 500_000, 0),  # negative: a clock step back never asks for the past
])
def test_the_send_lead_is_the_recent_p90_of_preparation(samples: list[int], cap: int,
                                                        expected: int) -> None:
    assert send_lead_us(samples, cap) == expected

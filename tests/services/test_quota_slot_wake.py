"""A claim that slept until its slot sends on it (issue 20 item 4: the limit used).

After its checkpoint a claim sleeps until its slot, then checks that a send may start
(not before the slot, not past its jitter). trio's timer and the replica's clock are two
clocks: the sleep can end a moment before the slot by the replica's clock (a conversion
to microseconds that truncates, a wall clock slewed behind the monotonic one), and the
check then held the send back and the slot was lost. With CPU time free
(``sim.quota_use``: 4 replicas, 40 a second, 520 items) that alone lost 10 of 530 slots,
the limit used 0.894 (the ceiling with a 0.1 s jitter is 0.909).
"""

from __future__ import annotations

import trio
import trio.testing

from daemon.core.quota import QuotaPolicy
from daemon.services import effect_quota as quota
from daemon.services.clock import TrioClock

POLICY = QuotaPolicy(limit=40, window_us=1_000_000, jitter_us=100_000)
KEY = quota.QuotaKey("hubspot:per_second:key:bench-app", POLICY, "per_second")


async def test_a_claim_that_slept_until_its_slot_may_send_on_it(
        autojump_clock: trio.testing.MockClock) -> None:
    clock = TrioClock()
    held = []
    for ms in range(1, 200):
        slot = clock.now_us() + ms * 1000 + 500
        reserved = [quota.Reserved(KEY, slot, f"r{ms}", slot)]
        if not await quota.wait_for_slots(clock, reserved):
            held.append(ms)
        assert clock.now_us() >= slot - 1  # it slept (never long past the slot)
        assert clock.now_us() < slot + POLICY.jitter_us
    assert held == []

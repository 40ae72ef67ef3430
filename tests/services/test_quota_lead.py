"""The slot lead covers the fenced grant itself (issue 20 item 4: the limit used).

A claim asks for its slot as far ahead as it takes to be ready to send on it
(``QuotaHints.lead_us``). That preparation was measured from the grant's *answer*, so
the fenced grant's own latency was left out: measured with ``bench.effects
--provider-limit 40`` on a loaded machine (instrumented), the grant took about as long
as the checkpoint after it, the median claim was ready 95 ms *after* its slot (jitter
100 ms), and 572 of 1,072 dispatches were held back with their slots lost (limit used
18 %). Worse, a claim whose slot is already due when the grant answers never reaches
its checkpoint, so it taught the lead nothing: with a ledger slower than the jitter the
lead stayed 0 and no slot could ever be used.

Here a real SQLite ledger answers every fenced grant 200 ms late (trio's MockClock; a
slot's jitter is 50 ms). The first claim's slot is due before the answer and comes back;
from then on the lead covers the grant, and every later claim's slot is usable when the
answer comes, with ``prepared`` counting from the ask.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from daemon.core.quota import QuotaPolicy
from daemon.services import effect_quota as quota
from daemon.services.clock import TrioClock
from storage.work_store import WorkStore
from tests.support.work import T0, claim, enqueue

GRANT_US = 200_000
POLICY = QuotaPolicy(limit=10, window_us=1_000_000, jitter_us=50_000)
KEY = quota.QuotaKey("hubspot:per_app:org:install", POLICY, "per_app")


@pytest.fixture
def backend() -> str:
    """SQLite only: under MockClock's autojump a network adapter's own I/O deadlines jump
    too; what is under test is the runner's lead, not a storage statement."""
    return "sqlite"


class SlowLedger:
    """The store, with every fenced grant answered ``GRANT_US`` late (as a grant queued
    on a hot key's row under load is)."""

    def __init__(self, store: WorkStore) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def quota_reserve(self, *args: Any, **kwargs: Any) -> Any:
        got = await self._store.quota_reserve(*args, **kwargs)
        await trio.sleep(GRANT_US / 1_000_000)
        return got


async def test_a_slow_grant_teaches_the_lead_and_slots_are_met(
        store: WorkStore, autojump_clock: trio.testing.MockClock) -> None:
    await enqueue(store, 4, now=T0)
    fences = [i.fence for i in (await claim(store, now=T0, ttl=3_600_000_000)).claimed
              if i.fence is not None]
    clock, hints = TrioClock(), quota.QuotaHints()
    ledger: Any = SlowLedger(store)
    first = await quota.reserve(ledger, clock, fences[0], [KEY], hints)
    # Asked for "now": due and past its jitter before the answer came. It came back, and
    # the lead learnt what the grant costs.
    assert isinstance(first, quota.QuotaWait)
    assert hints.lead_us() >= GRANT_US
    assert len(fences) == 4
    for fence in fences[1:]:
        asked = clock.now_us()
        got = await quota.reserve(ledger, clock, fence, [KEY], hints)
        assert isinstance(got, list), got  # usable when the answer came
        (slot,) = got
        assert slot.asked_at_us == asked  # the preparation counts from the ask
        assert quota.still_usable(got, max(clock.now_us(), slot.slot_us))
        ready = clock.now_us() + 10_000  # the checkpoint
        hints.prepared(got, ready)
        assert hints.lead_us() >= GRANT_US
        await trio.sleep(max(0, slot.slot_us + POLICY.interval_us - clock.now_us())
                         / 1_000_000)

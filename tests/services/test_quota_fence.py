"""The quota grant is fenced by the claim, and a lost claim's unused slot comes back, on
every backend (issue 20 item 6; seed 5.1: a stale claimant cannot reserve distributed
quota; seed 9).

Before: :func:`reserve` granted from the shared ledger without the claim's fence and only
then bound the slot to the claim, in a second (fenced) transaction. A claimant whose item
had been reclaimed still moved the shared budget; its bind failed and the slot was never
given back, so the item's live owner was told to wait (capacity lost, never exceeded).
Now the grant, the fence and the reservation are one transaction; a claim lost later
leaves its reservation ``reserved``, and :func:`return_lost_slots` gives it back once its
in-flight window has passed, and only if no request can have left on it."""

from __future__ import annotations

import attrs
import pytest

from daemon.core.quota import QuotaPolicy, ReservationState, WindowKind
from daemon.core.work import WorkItem
from daemon.services.effect_quota import QuotaKey, QuotaWait, Reserved, reserve
from storage.port import LostLease
from storage.work_store import WorkStore
from tests.support.work import SEC, T0, claim, enqueue

KEY = "hubspot:burst:org-1:install-1"
# One send a second, 250 ms of jitter: a lost slot is plainly a lost second.
SLIDING = QuotaKey(KEY, QuotaPolicy(limit=1, window_us=SEC, jitter_us=250_000))


@attrs.frozen
class _At:
    """A clock that reads what the test says (``now_us`` at the instant of the step)."""

    at_us: int

    def now_us(self) -> int:
        return self.at_us


async def _claimed(store: WorkStore, owner: str, now: int, ttl: int) -> WorkItem:
    (item,) = (await claim(store, owner=owner, now=now, ttl=ttl)).claimed
    assert item.fence is not None
    return item


async def test_stale_claimant_quota_grant_moves_no_shared_budget(store: WorkStore) -> None:
    await enqueue(store, 1, now=T0)
    stale = await _claimed(store, "A", T0, ttl=5 * SEC)
    live = await _claimed(store, "B", T0 + 6 * SEC, ttl=60 * SEC)  # reclaimed
    assert stale.fence is not None and live.fence is not None
    with pytest.raises(LostLease):
        await reserve(store, _At(T0 + 6 * SEC + 1), stale.fence, [SLIDING])
    # The stale claimant moved nothing: no slot granted, none bound to it.
    assert [k.granted_total for k in await store.quota_keys(KEY)] in ([], [0])
    assert await store.quota_reservations(stale.work_id) == []
    # So the live owner gets the second's only slot, now.
    got = await reserve(store, _At(T0 + 6 * SEC + 2), live.fence, [SLIDING])
    assert isinstance(got, list) and [r.slot_us for r in got] == [T0 + 6 * SEC + 2], got

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
from daemon.core.work import Fence, WorkItem
from daemon.services.effect_quota import QuotaKey, QuotaWait, reserve, return_lost_slots
from storage.port import LostLease
from storage.work_store import WorkStore
from tests.support.commands import accept_pinned, attempt, draft
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


async def _claimed(store: WorkStore, owner: str, now: int, ttl: int,
                   family: str = "noop") -> WorkItem:
    (item,) = (await claim(store, owner=owner, now=now, ttl=ttl, family=family)).claimed
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


# A fixed window of one send a minute (T0 is a window's start): an unused slot that does
# not come back costs the rest of the minute, plainly.
FIXED_KEY = "hubspot:daily:org-1:install-1"
FIXED = QuotaKey(FIXED_KEY, QuotaPolicy(limit=1, window_us=60 * SEC, jitter_us=250_000,
                                        kind=WindowKind.FIXED))
MS = 1_000


async def _sweep(store: WorkStore, now: int) -> list[tuple[str, bool]]:
    settled = await return_lost_slots(store, {FIXED_KEY: FIXED}, now_us=now,
                                      clock_spread_us=0)
    return [(s.decision.value, s.returned) for s in settled]


async def _reserving(store: WorkStore, family: str = "noop") -> WorkItem:
    """A claim (100 ms lease) that reserved the minute's only slot at T0."""
    item = await _claimed(store, "A", T0, ttl=100 * MS, family=family)
    assert item.fence is not None
    got = await reserve(store, _At(T0), item.fence, [FIXED])
    assert isinstance(got, list) and [r.slot_us for r in got] == [T0]
    return item


async def _reclaimed(store: WorkStore, lost: WorkItem, family: str = "noop") -> Fence:
    """Another replica reclaims ``lost``'s item at T0 + 150 ms: the live fence."""
    live = await _claimed(store, "B", T0 + 150 * MS, ttl=60 * SEC, family=family)
    assert live.work_id == lost.work_id and live.fence is not None
    return live.fence


async def test_lost_claim_unused_slot_returns_once_its_in_flight_window_has_passed(
        store: WorkStore) -> None:
    await enqueue(store, 1, now=T0)
    lost = await _reserving(store)
    live = await _reclaimed(store, lost)
    # Within the slot's window (T0 .. T0 + 250 ms) nothing comes back (never earlier).
    assert await _sweep(store, T0 + 200 * MS) == []
    assert isinstance(await reserve(store, _At(T0 + 200 * MS), live, [FIXED]),
                      QuotaWait)
    # Passed, and the lost claim never checkpointed: refunded, given back, once.
    assert await _sweep(store, T0 + 250 * MS) == [("refund", True)]
    assert await _sweep(store, T0 + 260 * MS) == []
    (row,) = await store.quota_reservations(lost.work_id)
    assert row.state is ReservationState.RELEASED
    # So the live owner has the minute's slot now (before: it waited for the next minute).
    got = await reserve(store, _At(T0 + 300 * MS), live, [FIXED])
    assert isinstance(got, list) and [r.slot_us for r in got] == [T0 + 300 * MS], got
    (key,) = await store.quota_keys(FIXED_KEY)
    assert (key.granted_total, key.returned_total) == (2, 1)


async def test_lost_claim_slot_whose_request_may_have_left_is_spent_not_refunded(
        store: WorkStore) -> None:
    accepted = await accept_pinned(store, draft(), T0)  # every pin the checkpoint checks
    assert accepted.command_id is not None
    lost = await _reserving(store, family="external_effect")
    assert lost.fence is not None
    # It wrote its dispatch checkpoint before its claim was lost: its request may have
    # left on the slot.
    await store.effect_checkpoint(lost.fence, attempt(accepted.command_id), lambda: T0 + 10 * MS)
    live = await _reclaimed(store, lost, family="external_effect")
    assert await _sweep(store, T0 + 300 * MS) == [("spend", False)]
    (row,) = await store.quota_reservations(lost.work_id)
    assert row.state is ReservationState.SPENT_UNKNOWN
    assert isinstance(await reserve(store, _At(T0 + 300 * MS), live, [FIXED]),
                      QuotaWait)
    (key,) = await store.quota_keys(FIXED_KEY)
    assert (key.granted_total, key.returned_total) == (1, 0)

"""Conformance: a quota slot is granted only under its claim's live fence, bound to that
claim in the same transaction, and a lost claim's reservation is settled once, after its
window, as :mod:`daemon.core.lost_slots` says (issue 20 item 6), on every backend."""

from __future__ import annotations

import pytest
import trio

from daemon.core.lost_slots import LostSlot, SendGate
from daemon.core.quota import Granted, QuotaPolicy, ReservationState
from daemon.core.work import Fence
from storage.port import LostLease
from storage.quota import LostSlotSettled, SlotRelease, SlotReserved
from storage.work_store import WorkStore
from tests.support.work import SEC, T0, claim, enqueue

MS = 1_000
# Ten sends a second, 50 ms of jitter: interval 105 ms.
POLICY = QuotaPolicy(limit=10, window_us=SEC, jitter_us=50 * MS)


async def _fence(store: WorkStore, owner: str, now: int, ttl: int) -> Fence:
    (item,) = (await claim(store, owner=owner, now=now, ttl=ttl)).claimed
    assert item.fence is not None
    return item.fence


async def _reserve(store: WorkStore, fence: Fence, now: int,
                   gate: SendGate = SendGate.CHECKPOINT) -> SlotReserved:
    got = await store.quota_reserve("k", POLICY, fence=fence, gate=gate, now=lambda: now)
    assert isinstance(got, SlotReserved)
    return got


async def test_a_stale_fence_grants_nothing_and_binds_nothing(store: WorkStore) -> None:
    await enqueue(store, 1, now=T0)
    stale = await _fence(store, "A", T0, ttl=SEC)
    await _reserve(store, stale, T0)  # live: granted and bound at once
    live = await _fence(store, "B", T0 + 2 * SEC, ttl=60 * SEC)
    (before,) = await store.quota_keys("k")
    with pytest.raises(LostLease):
        await store.quota_reserve("k", POLICY, fence=stale, gate=SendGate.CHECKPOINT,
                                  now=lambda: T0 + 2 * SEC + 1)
    (after,) = await store.quota_keys("k")
    assert after == before  # the shared budget did not move
    assert len(await store.quota_reservations(stale.work_id)) == 1  # only the live one's
    got = await _reserve(store, live, T0 + 2 * SEC + 2)
    assert got.slot_us == T0 + 2 * SEC + 2 and got.expires_at_us == got.slot_us + 50 * MS
    (row,) = [r for r in await store.quota_reservations(live.work_id)
              if r.ownership_epoch == live.ownership_epoch]
    assert (row.reservation_id, row.slot_at_us, row.state) == (
        got.reservation_id, got.slot_us, ReservationState.RESERVED)


async def test_the_unfenced_grant_is_the_ledger_arithmetic_only(store: WorkStore) -> None:
    """``quota_grant`` (the racer's and the bench's) binds no claim: no reservation."""
    assert isinstance(await store.quota_grant("k", POLICY, now_us=T0), Granted)
    assert await store.quota_reservations_in_flight() == {}


@pytest.mark.parametrize(("gate", "hand_out", "expected"), [
    (SendGate.CHECKPOINT, False, LostSlot.REFUND),  # no attempt was checkpointed
    (SendGate.GRANTED, False, LostSlot.REFUND),  # a read's slot never handed out
    (SendGate.GRANTED, True, LostSlot.SPEND),  # handed to a read: it may have left
])
async def test_a_lost_claims_slot_is_settled_once_after_its_window(
        store: WorkStore, gate: SendGate, hand_out: bool, expected: LostSlot) -> None:
    await enqueue(store, 1, now=T0)
    lost = await _fence(store, "A", T0, ttl=SEC)
    slot = await _reserve(store, lost, T0, gate)
    if hand_out:
        await store.quota_hand_out(lost, [slot.reservation_id], now=lambda: T0 + 1)
    policies = {"k": POLICY}
    # Lease over but not reclaimed: the claim may still settle its own slot.
    assert await store.quota_return_lost(policies, now_us=T0 + 2 * SEC, margin_us=0) == []
    await _fence(store, "B", T0 + 2 * SEC, ttl=60 * SEC)
    # Reclaimed, but within the window plus the margin (the clock spread): kept.
    assert await store.quota_return_lost(policies, now_us=T0 + 60 * MS,
                                         margin_us=20 * MS) == []
    # Two sweeps at once (two replicas): one settles it, and it comes back once.
    settled: list[LostSlotSettled] = []

    async def sweep() -> None:
        settled.extend(await store.quota_return_lost(policies, now_us=T0 + 3 * SEC,
                                                     margin_us=20 * MS))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sweep)
        nursery.start_soon(sweep)
    (one,) = settled
    assert one.decision is expected
    (row,) = await store.quota_reservations(lost.work_id)
    assert row.state is (ReservationState.RELEASED if expected is LostSlot.REFUND
                         else ReservationState.SPENT_UNKNOWN)
    (key,) = await store.quota_keys("k")
    # It was the newest slot: a refund gives it back on the key's line.
    assert key.returned_total == (1 if expected is LostSlot.REFUND else 0)


async def test_a_live_claim_releases_its_own_slots_fenced(store: WorkStore) -> None:
    await enqueue(store, 1, now=T0)
    fence = await _fence(store, "A", T0, ttl=SEC)
    slot = await _reserve(store, fence, T0)
    stale = Fence(fence.work_id, "not-our-token", fence.ownership_epoch)
    release = [SlotRelease(
        slot.reservation_id, "k", POLICY, slot.position_us)]
    with pytest.raises(LostLease):
        await store.quota_release(stale, release, now=lambda: T0 + 1)
    (row,) = await store.quota_reservations(fence.work_id)
    assert row.state is ReservationState.RESERVED
    await store.quota_release(fence, release, now=lambda: T0 + 1)
    (row,) = await store.quota_reservations(fence.work_id)
    (key,) = await store.quota_keys("k")
    assert (row.state, key.granted_total, key.returned_total) == (
        ReservationState.RELEASED, 1, 1)

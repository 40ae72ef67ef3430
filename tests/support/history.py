"""Rows for the history tests: quota slots reserved, given back and refunded."""

from __future__ import annotations

from daemon.core.lost_slots import SendGate
from daemon.core.quota import QuotaPolicy
from daemon.core.work import Fence
from storage.quota import SlotRelease, SlotReserved
from storage.work_store import WorkStore
from tests.support.work import SEC, claim, enqueue

POLICY = QuotaPolicy(limit=600, window_us=60 * SEC, jitter_us=0)  # ten a second


async def _fence(store: WorkStore, owner: str, now: int, ttl: int) -> Fence:
    (item,) = (await claim(store, owner=owner, now=now, ttl=ttl, limit=1)).claimed
    assert item.fence is not None
    return item.fence


async def _reserve(store: WorkStore, key: str, fence: Fence, now: int) -> SlotReserved:
    got = await store.quota_reserve(key, POLICY, fence=fence, gate=SendGate.CHECKPOINT,
                                    now=lambda: now)
    assert isinstance(got, SlotReserved)
    return got


async def use_quota(a: WorkStore, b: WorkStore, t0: int) -> None:
    """In ``t0``'s minute, A reserves two slots of ``k`` (at ``t0`` and a second later)
    and gives the second back, B one of ``other``; in the next minute, a claim of A's
    is lost with its slot of ``k``, refunded by B's quota sweep."""
    await enqueue(a, 4, now=t0)
    first = await _fence(a, "A", t0, ttl=600 * SEC)
    kept = await _reserve(a, "k", first, t0)
    second = await _fence(a, "A", t0, ttl=600 * SEC)
    given = await _reserve(a, "k", second, t0 + SEC)
    await a.quota_release(second, [SlotRelease(given.reservation_id, "k", POLICY,
                                               given.position_us)], now=lambda: t0 + SEC)
    third = await _fence(b, "B", t0, ttl=600 * SEC)
    await _reserve(b, "other", third, t0 + 2 * SEC)
    later = t0 - t0 % 60_000_000 + 60_000_000 + 5 * SEC
    lost = await _fence(a, "A", later, ttl=SEC)
    await _reserve(a, "k", lost, later)
    await _fence(b, "B", later + 2 * SEC, ttl=600 * SEC)  # reclaimed by B
    (refund,) = await b.quota_return_lost({"k": POLICY}, now_us=later + 3 * SEC,
                                          margin_us=0)
    assert refund.work_id == lost.work_id
    assert kept.slot_us == t0



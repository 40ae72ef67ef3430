"""Conformance: the quota history (storage/history_quota.py) counts every slot reserved
for a claim, and every one given back unused (by the claim, or by the quota sweep for a
lost claim), once, by its slot's minute, in the transaction that writes the reservation,
on every backend; a rebuild from the reservations gives the same rows (issue 23 item 1:
quota use over time against the key's limit)."""

from __future__ import annotations

from daemon.core.lost_slots import SendGate
from daemon.core.quota import QuotaPolicy
from daemon.core.work import Fence
from storage.history import BUCKET_US, DAY_US, HOUR_US, bucket_of
from storage.history_quota import GRANTED, RELEASED, QuotaLimit, QuotaPoint
from storage.port import SqlTx
from storage.quota import SlotRelease, SlotReserved
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.work import SEC, T0, claim, enqueue

M0 = bucket_of(T0)
POLICY = QuotaPolicy(limit=600, window_us=60 * SEC, jitter_us=0)  # ten a second


async def _fence(store: WorkStore, owner: str, now: int, ttl: int) -> Fence:
    (item,) = (await claim(store, owner=owner, now=now, ttl=ttl, limit=1)).claimed
    assert item.fence is not None
    return item.fence


async def _reserve(store: WorkStore, key: str, fence: Fence, now: int) -> SlotReserved:
    got = await store.quota_reserve(key, POLICY, fence=fence, gate=SendGate.CHECKPOINT,
                                    now_us=now)
    assert isinstance(got, SlotReserved)
    return got


async def _rows(store: WorkStore) -> dict[tuple[int, int, str, str], int]:
    async def body(tx: SqlTx) -> dict[tuple[int, int, str, str], int]:
        return {(int(lv), int(b), str(k), str(m)): int(n) for lv, b, k, m, n in await tx.fetchall(
            "SELECT level_us, bucket_us, quota_key, metric, SUM(n) FROM history_quota"
            " GROUP BY level_us, bucket_us, quota_key, metric")}

    return await store.db.transact(body, name="test.quota_rows", write=False)


async def _use_some(a: WorkStore, b: WorkStore) -> None:
    """Minute 0: A reserves two slots of ``k`` and releases one, B one of ``other``;
    minute 1: a claim lost with its slot, refunded by the sweep."""
    await enqueue(a, 4, now=T0)
    first = await _fence(a, "A", T0, ttl=600 * SEC)
    kept = await _reserve(a, "k", first, T0)
    second = await _fence(a, "A", T0, ttl=600 * SEC)
    given = await _reserve(a, "k", second, T0 + SEC)
    await a.quota_release(second, [SlotRelease(given.reservation_id, "k", POLICY,
                                               given.position_us)], now_us=T0 + SEC)
    third = await _fence(b, "B", T0, ttl=600 * SEC)
    await _reserve(b, "other", third, T0 + 2 * SEC)
    later = M0 + BUCKET_US + 5 * SEC
    lost = await _fence(a, "A", later, ttl=SEC)
    await _reserve(a, "k", lost, later)
    await _fence(b, "B", later + 2 * SEC, ttl=600 * SEC)  # reclaimed by B
    (refund,) = await b.quota_return_lost({"k": POLICY}, now_us=later + 3 * SEC,
                                          margin_us=0)
    assert refund.work_id == lost.work_id
    assert kept.slot_us == T0


async def test_slots_granted_and_given_back_are_counted_once_by_their_minute(
        database: FreshDatabase) -> None:
    a, b = await database.open_store(), await database.open_store()
    await _use_some(a, b)
    M1 = M0 + BUCKET_US
    points, limits = await b.history_quota(M0, M0 + 2 * BUCKET_US, BUCKET_US)
    assert points == [
        QuotaPoint(M0, "k", GRANTED, 2), QuotaPoint(M0, "k", RELEASED, 1),
        QuotaPoint(M0, "other", GRANTED, 1),
        QuotaPoint(M1, "k", GRANTED, 1), QuotaPoint(M1, "k", RELEASED, 1),
    ]
    assert limits == [QuotaLimit("k", 600, 60 * SEC), QuotaLimit("other", 600, 60 * SEC)]
    hour = bucket_of(M0, HOUR_US)
    one, _ = await b.history_quota(M0, M0 + DAY_US, HOUR_US, "k")
    assert one == [QuotaPoint(hour, "k", GRANTED, 3), QuotaPoint(hour, "k", RELEASED, 2)]
    assert {lv for lv, *_ in await _rows(a)} == {BUCKET_US, HOUR_US, DAY_US}
    assert await b.history_quota(M0, M0 + DAY_US, HOUR_US, "none") == ([], [])
    behind = await b.history_quota_slots("k", M0, M1, limit=10)
    assert [(s.slot_at_us, s.state) for s in behind] == [
        (T0 + SEC, "released"), (T0, "reserved")]


async def test_a_quota_rebuild_from_the_reservations_equals_the_maintained_rows(
        database: FreshDatabase) -> None:
    a, b = await database.open_store(), await database.open_store()
    await _use_some(a, b)
    maintained = await _rows(a)

    async def damage(tx: SqlTx) -> None:
        await tx.execute("UPDATE history_quota SET n = n + 9 WHERE metric = 'granted'")
        await tx.execute("DELETE FROM history_quota WHERE metric = 'released'")

    await a.db.transact(damage, name="test.damage", write=True)
    assert await b.history_quota_rebuild(T0) > 0
    assert await _rows(a) == maintained
    assert await b.history_quota_rebuild() == 0  # T0's day is not whole: left as it is

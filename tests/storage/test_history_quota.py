"""Conformance: the quota history (storage/history_quota.py) counts every slot reserved
for a claim, and every one given back unused (by the claim, or by the quota sweep for a
lost claim), once, by its slot's minute, in the transaction that writes the reservation,
on every backend; a rebuild from the reservations gives the same rows (issue 23 item 1:
quota use over time against the key's limit)."""

from __future__ import annotations

from daemon.core.lost_slots import SendGate
from daemon.core.quota import QuotaPolicy
from storage.history import BUCKET_US, DAY_US, HOUR_US, bucket_of
from storage.history_quota import GRANTED, RELEASED, QuotaLimit, QuotaPoint
from storage.port import SqlTx
from storage.quota import SlotReserved
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.history import use_quota
from tests.support.work import SEC, T0, claim, enqueue

M0 = bucket_of(T0)


async def _rows(store: WorkStore) -> dict[tuple[int, int, str, str], int]:
    async def body(tx: SqlTx) -> dict[tuple[int, int, str, str], int]:
        return {(int(lv), int(b), str(k), str(m)): int(n) for lv, b, k, m, n in await tx.fetchall(
            "SELECT level_us, bucket_us, quota_key, metric, SUM(n) FROM history_quota"
            " GROUP BY level_us, bucket_us, quota_key, metric")}

    return await store.db.transact(body, name="test.quota_rows", write=False)


async def test_slots_granted_and_given_back_are_counted_once_by_their_minute(
        database: FreshDatabase) -> None:
    a, b = await database.open_store(), await database.open_store()
    await use_quota(a, b, T0)
    M1 = M0 + BUCKET_US
    points, limits = await b.history_quota(M0, M0 + 2 * BUCKET_US, BUCKET_US)
    rate = 600 / (60 * SEC)  # the limit the grants were made under, per microsecond
    assert points == [
        QuotaPoint(M0, "k", GRANTED, 2, rate), QuotaPoint(M0, "k", RELEASED, 1),
        QuotaPoint(M0, "other", GRANTED, 1, rate),
        QuotaPoint(M1, "k", GRANTED, 1, rate), QuotaPoint(M1, "k", RELEASED, 1),
    ]
    assert limits == [QuotaLimit("k", 600, 60 * SEC), QuotaLimit("other", 600, 60 * SEC)]
    hour = bucket_of(M0, HOUR_US)
    one, _ = await b.history_quota(M0, M0 + DAY_US, HOUR_US, "k")
    assert one == [QuotaPoint(hour, "k", GRANTED, 3, rate),
                   QuotaPoint(hour, "k", RELEASED, 2)]
    assert {lv for lv, *_ in await _rows(a)} == {BUCKET_US, HOUR_US, DAY_US}
    assert await b.history_quota(M0, M0 + DAY_US, HOUR_US, "none") == ([], [])
    behind = await b.history_quota_slots("k", M0, M1, limit=10)
    assert [(s.slot_at_us, s.state) for s in behind] == [
        (T0 + SEC, "released"), (T0, "reserved")]


async def test_a_quota_rebuild_from_the_reservations_equals_the_maintained_rows(
        database: FreshDatabase) -> None:
    a, b = await database.open_store(), await database.open_store()
    await use_quota(a, b, T0)
    maintained = await _rows(a)

    async def damage(tx: SqlTx) -> None:
        await tx.execute("UPDATE history_quota SET n = n + 9 WHERE metric = 'granted'")
        await tx.execute("DELETE FROM history_quota WHERE metric = 'released'")

    await a.db.transact(damage, name="test.damage", write=True)
    assert await b.history_quota_rebuild(T0) > 0
    assert await _rows(a) == maintained
    assert await b.history_quota_rebuild() == 0  # T0's day is not whole: left as it is


async def test_each_step_keeps_the_limit_in_force_then_through_a_rebuild(
        database: FreshDatabase) -> None:
    """A key's policy changes (600 a minute, then 60): each minute's grants record the
    limit they were made under, so a past step is not drawn against the latest limit;
    a rebuild, which recounts from the reservations (they hold no limit), keeps them."""
    a, b = await database.open_store(), await database.open_store()
    await use_quota(a, b, T0)  # k: 600 a minute, in minutes 0 and 1
    slower = QuotaPolicy(limit=60, window_us=60 * SEC, jitter_us=0)
    await enqueue(b, 1, now=T0 + 3 * BUCKET_US)
    (item,) = (await claim(b, owner="B", now=T0 + 3 * BUCKET_US, limit=1)).claimed
    assert item.fence is not None
    got = await b.quota_reserve("k", slower, fence=item.fence, gate=SendGate.CHECKPOINT,
                                now=lambda: T0 + 3 * BUCKET_US)
    assert isinstance(got, SlotReserved)

    async def rates() -> dict[int, float | None]:
        points, limits = await a.history_quota(M0, M0 + 4 * BUCKET_US, BUCKET_US, "k")
        assert limits == [QuotaLimit("k", 60, 60 * SEC)]  # the latest policy
        return {p.at_us - M0: p.per_us for p in points if p.metric == GRANTED}

    maintained = await rates()
    assert maintained == {0: 10 / SEC, BUCKET_US: 10 / SEC, 3 * BUCKET_US: 1 / SEC}
    # An hour's row keeps the limit of its latest grant; a step of 5 minutes (minute
    # rows) the most generous of its minutes.
    (hour,) = [p for p in (await a.history_quota(M0, M0 + HOUR_US, HOUR_US, "k"))[0]
               if p.metric == GRANTED]
    assert hour.per_us == 1 / SEC
    (five,) = [p for p in (await a.history_quota(M0, M0 + 5 * BUCKET_US, 5 * BUCKET_US,
                                                 "k"))[0] if p.metric == GRANTED]
    assert five.per_us == 10 / SEC
    assert await b.history_quota_rebuild(T0) > 0
    assert await rates() == maintained

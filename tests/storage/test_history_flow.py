"""Conformance: the effect-path history (storage/history_flow.py) counts every accepted
command and every confirmed Runtime receipt once, with its latency buckets, in the
transaction that writes the fact, on every backend; a rebuild from the rows gives the
same rows (issue 23 item 1: pressure, latency, filters per org, binding and operation)."""

from __future__ import annotations

from daemon.core.latency import bucket_of as latency_bucket
from storage.history import BUCKET_US, DAY_US, HOUR_US, bucket_of
from storage.history_flow import ACCEPTED, RECEIPTED, FlowFilter, FlowPoint
from storage.port import SqlTx
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.find import seed_receipts
from tests.support.work import SEC, T0

M0 = bucket_of(T0)
OP = "hubspot.contact.update_jobtitle"


async def _rows(store: WorkStore) -> dict[tuple[int, int, str, str, str, str, int, int], int]:
    """Every level of the rollup, summed over shards (what every reader sees)."""

    async def body(tx: SqlTx) -> dict[tuple[int, int, str, str, str, str, int, int], int]:
        rows = await tx.fetchall(
            "SELECT level_us, bucket_us, metric, org_id, binding_id, operation, answer_le,"
            " receipt_le, SUM(n) FROM history_flow GROUP BY level_us, bucket_us, metric,"
            " org_id, binding_id, operation, answer_le, receipt_le")
        return {(int(lv), int(b), str(m), str(o), str(bi), str(op), int(x), int(y)): int(n)
                for lv, b, m, o, bi, op, x, y, n in rows}

    return await store.db.transact(body, name="test.flow_rows", write=False)


async def test_accepted_and_receipted_are_counted_once_with_their_latencies(
        database: FreshDatabase) -> None:
    a, b = await database.open_store(), await database.open_store()
    await seed_receipts(a, T0)
    first = (latency_bucket(10 * SEC), latency_bucket(70 * SEC))
    third = (latency_bucket(2 * SEC), latency_bucket(3 * SEC))
    assert await b.history_flow(M0, M0 + 2 * BUCKET_US, BUCKET_US) == [
        FlowPoint(M0, ACCEPTED, 0, 0, 6),
        FlowPoint(M0, RECEIPTED, *third, 1),
        FlowPoint(M0 + BUCKET_US, RECEIPTED, *first, 1),
    ]
    # The hour and the day hold the same counts; a step of hours reads the hour rows.
    assert await b.history_flow(M0, M0 + DAY_US, HOUR_US) == sorted([
        FlowPoint(bucket_of(M0, HOUR_US), ACCEPTED, 0, 0, 6),
        FlowPoint(bucket_of(M0, HOUR_US), RECEIPTED, *first, 1),
        FlowPoint(bucket_of(M0, HOUR_US), RECEIPTED, *third, 1),
    ], key=lambda p: (p.at_us, p.metric, p.answer_le, p.receipt_le))
    levels = {lv for lv, *_ in await _rows(a)}
    assert levels == {BUCKET_US, HOUR_US, DAY_US}
    # Filters: the rows carry org, binding and operation.
    kept = FlowFilter(org="org-1", binding="hubspot-main", operation=OP)
    assert await b.history_flow(M0, M0 + BUCKET_US, BUCKET_US, kept) == [
        FlowPoint(M0, ACCEPTED, 0, 0, 6), FlowPoint(M0, RECEIPTED, *third, 1)]
    for other in (FlowFilter(org="org-2"), FlowFilter(binding="other"),
                  FlowFilter(operation="hubspot.deal.create")):
        assert await b.history_flow(M0, M0 + DAY_US, HOUR_US, other) == []
    # The commands behind a point: accepted in the bucket, or confirmed in it.
    accepted = await b.history_flow_commands(M0, M0 + BUCKET_US, ACCEPTED, kept, limit=4)
    assert [c.accepted_at_us for c in accepted] == [T0 + 5 * SEC, T0 + 4 * SEC,
                                                    T0 + 3 * SEC, T0 + 2 * SEC]
    (late,) = await b.history_flow_commands(M0 + BUCKET_US, M0 + 2 * BUCKET_US, RECEIPTED,
                                            FlowFilter(), limit=10)
    assert (late.accepted_at_us, late.answered_at_us, late.confirmed_at_us) == (
        T0, T0 + 10 * SEC, T0 + 70 * SEC)
    assert await b.history_flow_commands(M0, M0 + BUCKET_US, RECEIPTED,
                                         FlowFilter(org="org-2"), limit=10) == []


async def test_a_flow_rebuild_from_the_rows_equals_the_maintained_rollup(
        database: FreshDatabase) -> None:
    a, b = await database.open_store(), await database.open_store()
    await seed_receipts(a, T0)
    maintained = await _rows(a)

    async def damage(tx: SqlTx) -> None:
        await tx.execute("UPDATE history_flow SET n = n + 40")
        await tx.execute("DELETE FROM history_flow WHERE metric = 'receipted'")

    await a.db.transact(damage, name="test.damage", write=True)
    assert await _rows(a) != maintained
    assert await b.history_flow_rebuild(T0) > 0
    assert await _rows(a) == maintained
    # Without --from: the first whole day kept (T0's day is not whole: nothing before it
    # is rebuilt, and T0's own day is left as maintained).
    assert await b.history_flow_rebuild() == 0
    assert await _rows(a) == maintained


async def test_no_rows_no_rebuild(store: WorkStore) -> None:
    assert await store.history_flow_rebuild() == 0
    assert await store.history_flow(M0, M0 + HOUR_US, BUCKET_US) == []

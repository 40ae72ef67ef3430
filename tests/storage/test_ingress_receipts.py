"""Conformance: IngressReceipts and NormalizedEvents on every backend (dedup by unique
key, byte-identical bodies, settle-once by state CAS; pruning is
retention's: tests/storage/test_retention.py)."""

from __future__ import annotations

import trio

from daemon.core.inbound_change import INBOUND_APPLY_FAMILY
from storage.ingress.receipts import Materialization, QuarantineParams, ReceiptQuery
from storage.port import WorkQuery
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.ingress import materialization, receipt
from tests.support.work import T0


async def test_insert_keeps_the_body_byte_identical_and_dedups_by_key(
        store: WorkStore) -> None:
    first = receipt(1, body=b"\x00\xff not utf-8 \r\n")
    assert (await store.ingress_receipt_insert(first, T0)).stored
    got = await store.ingress_receipt_get(first.receipt_id)
    assert got is not None and got.body == first.body and got.state == "received"
    assert got.headers == first.headers and got.duplicates == 0

    other_copy = receipt(2, key=first.dedup_key)
    result = await store.ingress_receipt_insert(other_copy, T0)
    assert (result.stored, result.receipt_id) == (False, first.receipt_id)
    # The same receipt again (a spooled copy forwarded twice) is not a duplicate delivery.
    again = await store.ingress_receipt_insert(first, T0)
    assert (again.stored, again.receipt_id) == (True, first.receipt_id)
    (only,) = await store.ingress_receipt_list(ReceiptQuery())
    assert only.duplicates == 1
    assert (await store.ingress_counts()).duplicates == 1


async def test_concurrent_copies_of_one_delivery_make_one_receipt(store: WorkStore) -> None:
    results = []

    async def deliver(n: int) -> None:
        results.append(await store.ingress_receipt_insert(receipt(n, key="wh:r:same"), T0))

    async with trio.open_nursery() as nursery:
        for n in range(8):
            nursery.start_soon(deliver, n)
    assert sum(r.stored for r in results) == 1
    assert len({r.receipt_id for r in results}) == 1
    assert len(await store.ingress_receipt_list(ReceiptQuery())) == 1


async def test_materialize_settles_once_with_events_and_work(store: WorkStore) -> None:
    r = receipt(1)
    await store.ingress_receipt_insert(r, T0)
    plan = materialization(r, events=2)
    assert await store.ingress_materialize(plan, T0)
    assert not await store.ingress_materialize(plan, T0)   # settled: nothing written
    assert not await store.ingress_quarantine(
        QuarantineParams(receipt_id=r.receipt_id, reason="malformed", detail="x"), T0)
    events = await store.ingress_events_of(r.receipt_id)
    items = await store.work_list(WorkQuery(family=INBOUND_APPLY_FAMILY))
    assert [e.event_id for e in events] == [f"{r.receipt_id}:0", f"{r.receipt_id}:1"]
    assert sorted(e.work_id for e in events) == sorted(i.work_id for i in items)
    assert events[1].attributes == {"a": 1}
    counts = await store.ingress_counts()
    assert counts.by_state == {"received": 0, "materialized": 1, "quarantined": 0}
    assert counts.oldest_received_us is None


async def test_racing_materializers_write_once(store: WorkStore) -> None:
    r = receipt(1)
    await store.ingress_receipt_insert(r, T0)
    won = []

    async def settle() -> None:
        won.append(await store.ingress_materialize(materialization(r), T0))

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(settle)
    assert sorted(won) == [False, False, False, True]
    assert len(await store.work_list(WorkQuery(family=INBOUND_APPLY_FAMILY))) == 1


async def test_quarantine_keeps_the_receipt_with_its_reason(store: WorkStore) -> None:
    r = receipt(1)
    await store.ingress_receipt_insert(r, T0)
    assert await store.ingress_quarantine(
        QuarantineParams(receipt_id=r.receipt_id, reason="not_jsonapi", detail="no data"), T0)
    got = await store.ingress_receipt_get(r.receipt_id)
    assert got is not None
    assert (got.state, got.quarantine_reason, got.quarantine_detail, got.body) == (
        "quarantined", "not_jsonapi", "no data", r.body)
    assert await store.ingress_receipts_pending(10) == []
    assert [x.receipt_id for x in await store.ingress_receipt_list(
        ReceiptQuery(state="quarantined"))] == [r.receipt_id]


async def test_pending_oldest_first_and_list_keyset(store: WorkStore) -> None:
    for n in (3, 1, 2):
        await store.ingress_receipt_insert(receipt(n), T0)
    assert [r.receipt_id for r in await store.ingress_receipts_pending(2)] == [
        receipt(1).receipt_id, receipt(2).receipt_id]
    assert len(await store.ingress_receipts_pending(10, ["r"])) == 3
    assert await store.ingress_receipts_pending(10, ["another"]) == []
    assert await store.ingress_receipts_pending(10, []) == []
    page = await store.ingress_receipt_list(ReceiptQuery(limit=2))
    assert [r.receipt_id for r in page] == [receipt(3).receipt_id, receipt(2).receipt_id]
    rest = await store.ingress_receipt_list(ReceiptQuery(before_id=page[-1].receipt_id))
    assert [r.receipt_id for r in rest] == [receipt(1).receipt_id]
    assert (await store.ingress_counts()).oldest_received_us == receipt(1).received_at_us


async def test_a_batch_with_duplicates_falls_back_row_by_row(store: WorkStore) -> None:
    existing = receipt(1)
    await store.ingress_receipt_insert(existing, T0)
    batch = [receipt(2), receipt(3, key=existing.dedup_key), receipt(4, key="wh:r:twice"),
             receipt(5, key="wh:r:twice"), existing]
    answers = await store.ingress_receipts_insert(batch, T0)
    assert [(a.stored, a.receipt_id) for a in answers] == [  # type: ignore[union-attr]
        (True, batch[0].receipt_id), (False, existing.receipt_id),
        (True, batch[2].receipt_id), (False, batch[2].receipt_id),
        (True, existing.receipt_id)]
    rows = {r.receipt_id: r.duplicates for r in
            await store.ingress_receipt_list(ReceiptQuery())}
    assert rows == {existing.receipt_id: 1, batch[0].receipt_id: 0, batch[2].receipt_id: 1}


async def test_settle_many_in_one_transaction(store: WorkStore) -> None:
    rs = [receipt(n) for n in range(4)]
    for r in rs:
        await store.ingress_receipt_insert(r, T0)
    await store.ingress_materialize(materialization(rs[3]), T0)   # settled elsewhere first
    won = await store.ingress_settle([
        materialization(rs[0], events=2),
        QuarantineParams(receipt_id=rs[1].receipt_id, reason="malformed", detail="d"),
        materialization(rs[2]),
        materialization(rs[3]),
    ], T0)
    assert won == [True, True, True, False]
    items = await store.work_list(WorkQuery(family=INBOUND_APPLY_FAMILY))
    assert len(items) == 2 + 1 + 1   # rs[3]'s once, from the first settlement only


# ------------------------------------------------- events unique by identity (issue 10)

async def _events(store: WorkStore) -> list[tuple[str, str | None]]:
    found: list[tuple[str, str | None]] = []
    for r in await store.ingress_receipt_list(ReceiptQuery(limit=500)):
        found.extend((e.receipt_id, e.identity_key)
                     for e in await store.ingress_events_of(r.receipt_id))
    return sorted(found, key=lambda pair: (pair[0], pair[1] or ""))


async def test_an_event_an_earlier_receipt_holds_is_not_written_again(
        store: WorkStore) -> None:
    """A re-batched delivery (events already received plus new ones) creates only the new
    ones, and their WorkItems only; the others are counted on its receipt."""
    first, second = receipt(1), receipt(2)
    for r in (first, second):
        await store.ingress_receipt_insert(r, T0)
    (done,) = await store.ingress_settle_counted(
        [materialization(first, identities=["ev:1", "ev:2"])], T0)
    assert (done.won, done.duplicate_events) == (True, 0)
    (done,) = await store.ingress_settle_counted(
        [materialization(second, identities=["ev:2", "ev:3"])], T0)
    assert (done.won, done.duplicate_events) == (True, 1)
    assert await _events(store) == [(first.receipt_id, "ev:1"), (first.receipt_id, "ev:2"),
                                     (second.receipt_id, "ev:3")]
    assert len(await store.work_list(WorkQuery(family=INBOUND_APPLY_FAMILY))) == 3
    got = {r.receipt_id: (r.state, r.duplicate_events)
           for r in await store.ingress_receipt_list(ReceiptQuery())}
    assert got == {first.receipt_id: ("materialized", 0),
                   second.receipt_id: ("materialized", 1)}


async def test_overlapping_receipts_settled_together_write_each_event_once(
        store: WorkStore) -> None:
    rs = [receipt(n) for n in range(3)]
    for r in rs:
        await store.ingress_receipt_insert(r, T0)
    settled = await store.ingress_settle_counted([
        materialization(rs[0], identities=["ev:a", "ev:b"]),
        # An event twice in one receipt, and one the receipt before holds.
        materialization(rs[1], identities=["ev:c", "ev:c", "ev:a"]),
        # Events without an identity (a route that declares none) are never collapsed.
        materialization(rs[2], identities=[None, None]),
    ], T0)
    assert [(s.won, s.duplicate_events) for s in settled] == [(True, 0), (True, 2), (True, 0)]
    assert await _events(store) == [
        (rs[0].receipt_id, "ev:a"), (rs[0].receipt_id, "ev:b"), (rs[1].receipt_id, "ev:c"),
        (rs[2].receipt_id, None), (rs[2].receipt_id, None)]
    assert len(await store.work_list(WorkQuery(family=INBOUND_APPLY_FAMILY))) == 5


async def test_racing_materializers_of_overlapping_receipts_write_each_event_once(
        database: FreshDatabase) -> None:
    """Two replicas (two stores) settle two receipts that share events at the same time:
    the unique identity key judges; the loser's transaction is tried again and finds the
    winner's events. Both receipts end materialized, every event once."""
    stores = [await database.open_store(), await database.open_store()]
    pairs = [(receipt(2 * n), receipt(2 * n + 1)) for n in range(6)]
    for a, b in pairs:
        for r in (a, b):
            await stores[0].ingress_receipt_insert(r, T0)
    settled: list[int] = []

    async def settle(store: WorkStore, plans: list[Materialization]) -> None:
        for plan in plans:
            (done,) = await store.ingress_settle_counted([plan], T0)
            assert done.won
            settled.append(done.duplicate_events)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(settle, stores[0], [
            materialization(a, identities=[f"ev:{n}:1", f"ev:{n}:2"])
            for n, (a, _) in enumerate(pairs)])
        nursery.start_soon(settle, stores[1], [
            materialization(b, identities=[f"ev:{n}:2", f"ev:{n}:1", f"ev:{n}:3"])
            for n, (_, b) in enumerate(pairs)])
    events = await _events(stores[0])
    assert sorted(k or "" for _, k in events) == sorted(
        f"ev:{n}:{i}" for n in range(len(pairs)) for i in (1, 2, 3))
    assert sum(settled) == 2 * len(pairs)
    assert len(await stores[0].work_list(WorkQuery(family=INBOUND_APPLY_FAMILY))) == len(events)


async def test_counts_stop_at_their_cap_and_sample_the_newest_receipts(
        store: WorkStore) -> None:
    # issue 23: the Ingress page counted every receipt per state on every view (3.1 s at
    # 500,000 receipts). A state's count stops after cap + 1 index entries ("more than");
    # duplicates and quarantine reasons are of the newest receipts.
    for n in range(1, 5):
        await store.ingress_receipt_insert(receipt(n), T0 + n)
    await store.ingress_receipt_insert(receipt(9, key=receipt(4).dedup_key), T0 + 9)
    for n, reason in ((1, "malformed"), (2, "unknown_route"), (3, "malformed")):
        await store.ingress_quarantine(
            QuarantineParams(receipt_id=receipt(n).receipt_id, reason=reason, detail="x"), T0)
    exact = await store.ingress_counts()
    assert exact.by_state == {"received": 1, "materialized": 0, "quarantined": 3}
    assert exact.more == frozenset() and not exact.sampled
    assert exact.duplicates == 1
    assert exact.quarantined_by_reason == {"malformed": 2, "unknown_route": 1}
    bounded = await store.ingress_counts(cap=2, sample=2)
    assert bounded.by_state == {"received": 1, "materialized": 0, "quarantined": 2}
    assert bounded.more == frozenset({"quarantined"})
    assert bounded.count("quarantined").text() == "more than 2"
    assert bounded.count("received").text() == "1"
    assert bounded.sampled and bounded.reasons_sampled
    # The newest two receipts: 4 (one duplicate, received) and 3 (quarantined).
    assert bounded.duplicates == 1
    # The newest two quarantined: 3 and 2.
    assert bounded.quarantined_by_reason == {"malformed": 1, "unknown_route": 1}

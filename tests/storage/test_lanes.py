"""Conformance: source-lane ordering and target-lane serialization, enforced by the database."""

from __future__ import annotations

import trio

from daemon.core.outcomes import DeadLetter, RetryLater, Succeeded
from daemon.core.states import WorkState
from storage.port import WorkQuery
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.work import SEC, T0, claim, enqueue, finalize, spec


async def test_source_lane_runs_in_enqueue_order(store: WorkStore) -> None:
    ids = []
    for i in range(3):
        ids += await enqueue(store, subject_id=f"e{i}", source_lane="hubspot:contact:7")
    other = await enqueue(store, subject_id="x", source_lane="hubspot:contact:8")
    order = []
    now = T0
    for _ in range(3):
        result = await claim(store, limit=10, now=now)
        in_lane = [i for i in result.claimed if i.source_lane == "hubspot:contact:7"]
        assert len(in_lane) == 1, "only the head of a source lane may run"
        order.append(in_lane[0].work_id)
        for item in result.claimed:
            await finalize(store, item, Succeeded(), now=now)
        now += 1
    assert order == ids
    assert (await store.work_get(other[0])) is not None


async def test_a_retrying_head_blocks_its_lane(store: WorkStore) -> None:
    head, nxt = [
        (await enqueue(store, subject_id=s, source_lane="L"))[0] for s in ("a", "b")
    ]
    (item,) = (await claim(store)).claimed
    assert item.work_id == head
    await finalize(store, item, RetryLater("net"))
    # The head waits for its backoff; the next item must not overtake it.
    assert (await claim(store, now=T0 + SEC // 4)).claimed == []
    (again,) = (await claim(store, now=T0 + SEC)).claimed
    assert again.work_id == head
    await finalize(store, again, DeadLetter("gave up"), now=T0 + SEC)
    # A terminal head (even dead) releases the lane.
    (after,) = (await claim(store, now=T0 + SEC)).claimed
    assert after.work_id == nxt


async def test_source_sequence_is_allocated_per_lane(store: WorkStore) -> None:
    await store.work_enqueue(
        [
            spec(source_lane=lane)
            for lane in ("A", "B", "A", "A", "B")
        ],
        T0,
    )
    items = await store.work_list(WorkQuery())
    seqs: dict[str, list[int]] = {}
    for item in sorted(items, key=lambda i: i.work_id):
        assert item.source_lane is not None and item.source_seq is not None
        seqs.setdefault(item.source_lane, []).append(item.source_seq)
    assert {lane: sorted(s) for lane, s in seqs.items()} == {"A": [1, 2, 3], "B": [1, 2]}


async def test_target_lane_is_serialized_across_claimants(database: FreshDatabase) -> None:
    stores = [await database.open_store(pool_size=2) for _ in range(4)]
    await enqueue(stores[0], 6, target_lane="hubspot:contact:1")
    await enqueue(stores[0], 2, target_lane="hubspot:contact:2")
    done = 0
    now = T0
    while done < 8:
        claimed = []

        async def race(store: WorkStore, owner: str) -> None:
            claimed.extend((await claim(store, owner, now=now)).claimed)  # noqa: B023

        async with trio.open_nursery() as nursery:
            for i, s in enumerate(stores):
                nursery.start_soon(race, s, f"R{i}")
        lanes = [i.target_lane for i in claimed]
        assert len(lanes) == len(set(lanes)), f"two holders of one target lane: {lanes}"
        for item in claimed:
            assert (await finalize(stores[0], item, Succeeded(), now=now)).applied
        done += len(claimed)
        now += 1
    assert await stores[0].work_count_open() == 0


async def test_held_target_lane_is_freed_by_every_exit(store: WorkStore) -> None:
    await enqueue(store, 3, target_lane="T", max_attempts=1)
    (a,) = (await claim(store, ttl=SEC)).claimed
    assert (await claim(store, "B", now=T0 + SEC // 2)).claimed == []
    # Lease expiry with attempts spent moves it to dead and frees the lane for
    # the next claim.
    result = await claim(store, "B", now=T0 + 2 * SEC)
    assert result.expired_dead == [a.work_id]
    assert result.claimed == []
    (b,) = (await claim(store, "B", now=T0 + 2 * SEC)).claimed
    assert b.target_lane == "T" and b.work_id != a.work_id
    await finalize(store, b, Succeeded(), now=T0 + 2 * SEC)
    (c,) = (await claim(store, now=T0 + 2 * SEC)).claimed
    assert c.work_id not in (a.work_id, b.work_id)
    row = await store.work_get(a.work_id)
    assert row is not None and row.state is WorkState.DEAD

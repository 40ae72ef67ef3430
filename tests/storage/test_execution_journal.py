"""Conformance: the execution journal shows every execution, on every backend.

Finding (issue 13): a crash-killed attempt left no ``work_executions`` row, so an
item on attempt 2 listed one execution, and "0 duplicates" counted finalizations
rather than executions. A reclaim now journals the superseded epoch as
``lease_lost``, naming the replica that ran it and the one that reclaimed it.
"""

from __future__ import annotations

import trio

from daemon.core.outcomes import RetryLater, Succeeded
from daemon.core.states import WorkState
from storage.port import ExecutionSummary, Reclaim
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.work import SEC, T0, claim, enqueue, finalize


def _journal(executions: list) -> list[tuple[object, ...]]:  # type: ignore[type-arg]
    return [(e.ownership_epoch, e.attempt, e.replica, e.outcome, e.reclaimed_by)
            for e in executions]


async def test_a_crash_killed_attempt_is_journaled_when_its_lease_is_reclaimed(
    store: WorkStore,
) -> None:
    (wid,) = await enqueue(store)
    (first,) = (await claim(store, "A", ttl=5 * SEC)).claimed
    assert first.work_id == wid
    # A dies without finalizing; B reclaims once the lease has expired.
    later = T0 + 6 * SEC
    result = await claim(store, "B", now=later)
    (second,) = result.claimed
    assert (second.work_id, second.attempt, second.ownership_epoch) == (wid, 2, 2)
    assert result.reclaimed == [Reclaim(work_id=wid, superseded_epoch=1, attempt=1,
                                        previous_owner="A", dead=False)]
    assert _journal(await store.work_executions(wid)) == [(1, 1, "A", "lease_lost", "B")]
    (lost,) = await store.work_executions(wid)
    assert lost.finished_at_us == later
    assert (await finalize(store, second, Succeeded(), now=later, replica="B")).applied
    assert _journal(await store.work_executions(wid)) == [
        (1, 1, "A", "lease_lost", "B"), (2, 2, "B", "succeeded", None)]


async def test_an_expired_lease_with_attempts_spent_is_journaled_as_lease_lost(
    store: WorkStore,
) -> None:
    (wid,) = await enqueue(store, max_attempts=1)
    await claim(store, "A", ttl=SEC)
    result = await claim(store, "C", now=T0 + 2 * SEC)
    assert result.claimed == [] and result.expired_dead == [wid]
    assert result.reclaimed == [Reclaim(work_id=wid, superseded_epoch=1, attempt=1,
                                        previous_owner="A", dead=True)]
    row = await store.work_get(wid)
    assert row is not None and row.state is WorkState.DEAD
    assert _journal(await store.work_executions(wid)) == [(1, 1, "A", "lease_lost", "C")]


async def test_a_live_lease_is_not_journaled(store: WorkStore) -> None:
    (wid,) = await enqueue(store)
    await claim(store, "A", ttl=5 * SEC)
    result = await claim(store, "B", now=T0 + 5 * SEC)  # expires only after T0 + 5 s
    assert result.claimed == [] and result.reclaimed == []
    assert await store.work_executions(wid) == []


async def test_racing_sweepers_journal_one_lost_execution(database: FreshDatabase) -> None:
    stores = [await database.open_store(pool_size=2) for _ in range(4)]
    ids = await enqueue(stores[0], 6)
    await claim(stores[0], "A", ttl=SEC, limit=6)
    reclaims: list[Reclaim] = []

    async def sweep(i: int, store: WorkStore) -> None:
        result = await claim(store, f"S{i}", now=T0 + 2 * SEC, limit=6)
        reclaims.extend(result.reclaimed)

    async with trio.open_nursery() as nursery:
        for i, s in enumerate(stores):
            nursery.start_soon(sweep, i, s)
    # Each expired row was reclaimed by exactly one sweeper, which journaled it once.
    assert sorted(r.work_id for r in reclaims) == sorted(ids)
    for wid in ids:
        (lost,) = await stores[0].work_executions(wid)
        row = await stores[0].work_get(wid)
        assert row is not None and lost.outcome == "lease_lost"
        assert lost.reclaimed_by == row.lease_owner


async def test_the_summary_counts_executions_not_finalizations(store: WorkStore) -> None:
    await enqueue(store, 3)
    (ok,) = (await claim(store, "A", ttl=SEC, limit=1)).claimed
    await finalize(store, ok, Succeeded())
    retried, crashed = (await claim(store, "A", ttl=SEC, limit=2)).claimed
    await finalize(store, retried, RetryLater("net"))
    # ``crashed`` is reclaimed by B after its lease expired; ``retried`` runs again.
    again = (await claim(store, "B", now=T0 + 2 * SEC, limit=2)).claimed
    for item in again:
        await finalize(store, item, Succeeded(), now=T0 + 2 * SEC, replica="B")
    summary = await store.work_execution_summary("noop")
    assert summary == ExecutionSummary(
        executions=5, items=3, succeeded_items=3,
        by_outcome={"succeeded": 3, "retry": 1, "lease_lost": 1})
    # Five executions for three items: two more than one each, whatever their outcome.
    assert summary.repeated == 2
    assert {i.work_id for i in again} == {crashed.work_id, retried.work_id}

"""Conformance: claims, fences, leases and RunAfter, on every backend."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs
import pytest
import trio

from daemon.core.claim_spread import NO_SPREAD, claim_part, next_spread
from daemon.core.outcomes import (
    DeadLetter,
    Deferred,
    Finalization,
    Outcome,
    Released,
    RetryLater,
    Skipped,
    Succeeded,
)
from daemon.core.states import WorkEvent, WorkState
from daemon.core.work import Fence, WorkItem
from storage.port import (
    ClaimParams,
    LostLease,
    RenewGroup,
    RetryableConflict,
    SqlTx,
    WorkConflict,
)
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.work import SEC, T0, TTL, claim, enqueue, finalization, finalize


async def test_claim_installs_a_fresh_fence(store: WorkStore) -> None:
    (wid,) = await enqueue(store)
    result = await claim(store, "A")
    (item,) = result.claimed
    assert item.work_id == wid
    assert item.state is WorkState.PROCESSING
    assert item.ownership_epoch == 1
    assert item.attempt == 1
    assert item.lease_owner == "A"
    assert item.lease_until_us == T0 + TTL
    assert item.lease_token is not None and len(item.lease_token) == 32
    # A second claimant finds nothing to claim while the lease is live.
    assert (await claim(store, "B", now=T0 + TTL - 1)).claimed == []


async def test_concurrent_claims_have_one_winner(database: FreshDatabase) -> None:
    stores = [await database.open_store(pool_size=2) for _ in range(6)]
    for trial in range(15):
        ids = await enqueue(stores[0], 3, now=T0, subject_id=f"t{trial}")
        winners: dict[str, list[str]] = {}

        async def race(i: int, store: WorkStore) -> None:
            result = await claim(store, f"R{i}", limit=3)
            for item in result.claimed:
                winners.setdefault(item.work_id, []).append(f"R{i}")  # noqa: B023

        async with trio.open_nursery() as nursery:
            for i, s in enumerate(stores):
                nursery.start_soon(race, i, s)
        assert sorted(winners) == sorted(ids)
        assert all(len(w) == 1 for w in winners.values()), winners
        for wid, (owner,) in winners.items():
            item = await stores[0].work_get(wid)
            assert item is not None and item.lease_owner == owner and item.ownership_epoch == 1
            await finalize(stores[0], item, Succeeded())


async def test_run_after_holds_work_back(store: WorkStore) -> None:
    await enqueue(store, run_after_us=T0 + 10 * SEC)
    assert (await claim(store, now=T0 + 10 * SEC - 1)).claimed == []
    assert len((await claim(store, now=T0 + 10 * SEC)).claimed) == 1


async def test_families_do_not_mix(store: WorkStore) -> None:
    await enqueue(store, family="other")
    assert (await claim(store, family="noop")).claimed == []
    assert len((await claim(store, family="other")).claimed) == 1


@pytest.mark.parametrize(
    ("outcome", "state"),
    [
        (Succeeded(), WorkState.SUCCEEDED),
        (Skipped("no change"), WorkState.SKIPPED),
        (RetryLater("net"), WorkState.RETRY),
        (DeadLetter("bad"), WorkState.DEAD),
        (Released(), WorkState.RETRY),
        (Deferred("quota_wait", T0 + SEC), WorkState.PENDING),
    ],
)
async def test_owner_finalizes(store: WorkStore, outcome: object, state: WorkState) -> None:
    await enqueue(store)
    (item,) = (await claim(store)).claimed
    result = await finalize(store, item, outcome)  # type: ignore[arg-type]
    assert result.applied and result.state is state
    row = await store.work_get(item.work_id)
    assert row is not None and row.state is state
    assert row.lease_until_us is None
    assert row.ownership_epoch == 1
    executions = await store.work_executions(item.work_id)
    if isinstance(outcome, Released):
        assert row.attempt == 0  # a released attempt is refunded and not journaled
        assert executions == []
    elif isinstance(outcome, Deferred):
        assert row.attempt == 0  # refunded, but journaled with its reason
        assert [(e.ownership_epoch, e.outcome, e.replica, e.reason) for e in executions] == [
            (1, "deferred", "A", "quota_wait")
        ]
    else:
        assert [(e.ownership_epoch, e.outcome, e.replica) for e in executions] == [
            (1, state.value, "A")
        ]


async def test_retry_waits_for_backoff_then_runs_again(store: WorkStore) -> None:
    await enqueue(store)
    (item,) = (await claim(store)).claimed
    await finalize(store, item, RetryLater("net"))
    row = await store.work_get(item.work_id)
    assert row is not None and row.run_after_us == T0 + SEC // 2
    assert (await claim(store, now=T0 + SEC // 2 - 1)).claimed == []
    (again,) = (await claim(store, now=T0 + SEC // 2)).claimed
    assert (again.attempt, again.ownership_epoch) == (2, 2)


async def test_deferral_runs_at_its_exact_time_and_never_spends_an_attempt(
        store: WorkStore) -> None:
    """Deferred more often than ``max_attempts`` (2): the item is pending each time,
    runs exactly at the time it was given (not a microsecond before, no backoff),
    and its first real execution is still attempt 1; every wait is journaled."""
    await enqueue(store, max_attempts=2)
    now = T0
    for i in range(4):
        (item,) = (await claim(store, now=now)).claimed
        assert (item.attempt, item.ownership_epoch) == (1, i + 1)
        until = now + 3 * SEC + 7
        assert (await finalize(store, item, Deferred("quota_wait", until, "no slot"),
                                now=now)).applied
        row = await store.work_get(item.work_id)
        assert row is not None
        assert (row.state, row.attempt, row.run_after_us, row.failure_class) == (
            WorkState.PENDING, 0, until, "quota_wait")
        assert (await claim(store, now=until - 1)).claimed == []
        now = until
    (item,) = (await claim(store, now=now)).claimed
    assert (item.attempt, item.ownership_epoch) == (1, 5)
    await finalize(store, item, RetryLater("net"), now=now)
    executions = await store.work_executions(item.work_id)
    assert [(e.outcome, e.attempt, e.reason) for e in executions] == [
        ("deferred", 1, "quota_wait")] * 4 + [("retry", 1, "net")]


async def test_stale_claimant_can_change_nothing(store: WorkStore) -> None:
    await enqueue(store)
    (stale,) = (await claim(store, "A", ttl=5 * SEC)).claimed
    later = T0 + 6 * SEC
    (fresh,) = (await claim(store, "B", now=later)).claimed
    assert fresh.work_id == stale.work_id
    assert fresh.ownership_epoch == stale.ownership_epoch + 1
    assert fresh.attempt == 2

    renew = await store.work_renew_if_owner([stale.fence], TTL, lambda: later)  # type: ignore[list-item]
    assert renew.renewed == {} and renew.lost == [stale.fence]
    for outcome in (Succeeded(), RetryLater("x"), DeadLetter("x"), Skipped("x"), Released(),
                    Deferred("quota_wait", later)):
        result = await finalize(store, stale, outcome, now=later)
        assert not result.applied
    with pytest.raises(LostLease):
        await store.work_fenced(stale.fence, lambda: later, _write_marker, name="t")  # type: ignore[arg-type]

    row = await store.work_get(stale.work_id)
    assert row is not None
    assert (row.state, row.lease_owner, row.ownership_epoch) == (WorkState.PROCESSING, "B", 2)
    # The stale claimant journaled nothing; B's reclaim journaled its lost execution.
    assert [(e.ownership_epoch, e.outcome, e.replica, e.reclaimed_by)
            for e in await store.work_executions(stale.work_id)] == [(1, "lease_lost", "A", "B")]
    assert (await finalize(store, fresh, Succeeded(), now=later)).applied


async def _write_marker(tx: SqlTx) -> None:
    await tx.execute("UPDATE work_items SET operator_summary = 'stale write'")


async def test_expired_but_unreclaimed_lease_is_already_lost(store: WorkStore) -> None:
    await enqueue(store)
    (item,) = (await claim(store, ttl=5 * SEC)).claimed
    after = T0 + 5 * SEC + 1
    assert not (await finalize(store, item, Succeeded(), now=after)).applied
    renew = await store.work_renew_if_owner([item.fence], TTL, lambda: after)  # type: ignore[list-item]
    assert renew.lost == [item.fence]
    with pytest.raises(LostLease):
        await store.work_fenced(item.fence, lambda: after, _write_marker, name="t")  # type: ignore[arg-type]


async def test_one_renewal_renews_groups_for_their_own_ttls(store: WorkStore) -> None:
    """The lease keeper's renewal of every family at once: one statement, each group's
    fences to its own TTL, a stale fence lost without holding back the others."""
    await enqueue(store, 4)
    items = (await claim(store, ttl=TTL)).claimed
    fences = [i.fence for i in items if i.fence is not None]
    stale = Fence(fences[3].work_id, "not-the-token", fences[3].ownership_epoch)
    now = T0 + SEC
    result = await store.work_renew_groups(
        [RenewGroup((fences[0], fences[1]), 10 * SEC), RenewGroup((fences[2], stale), 40 * SEC)],
        lambda: now)
    assert result.renewed == {fences[0].work_id: now + 10 * SEC,
                              fences[1].work_id: now + 10 * SEC,
                              fences[2].work_id: now + 40 * SEC}
    assert result.lost == [stale]
    by_id = {i.work_id: i for i in await _items(store, [f.work_id for f in fences])}
    assert [by_id[f.work_id].lease_until_us for f in fences] == [
        now + 10 * SEC, now + 10 * SEC, now + 40 * SEC, T0 + TTL]
    assert (await store.work_renew_groups([], lambda: now)).renewed == {}


async def _items(store: WorkStore, ids: list[str]) -> list[WorkItem]:
    found = [await store.work_get(w) for w in ids]
    return [i for i in found if i is not None]


async def test_fenced_write_commits_with_a_live_fence(store: WorkStore) -> None:
    await enqueue(store)
    (item,) = (await claim(store)).claimed
    assert item.fence is not None

    async def body(tx: SqlTx) -> int:
        return await tx.execute(
            "UPDATE work_items SET operator_summary = 'fenced' WHERE work_id = ?",
            (item.work_id,),
        )

    assert await store.work_fenced(item.fence, lambda: T0 + SEC, body, name="t") == 1
    row = await store.work_get(item.work_id)
    assert row is not None and row.operator_summary == "fenced"


async def test_forged_fence_is_refused(store: WorkStore) -> None:
    await enqueue(store)
    (item,) = (await claim(store)).claimed
    assert item.lease_token is not None
    for forged in (
        Fence(item.work_id, "0" * 32, item.ownership_epoch),
        Fence(item.work_id, item.lease_token, item.ownership_epoch + 1),
        Fence("01NOSUCHITEM0000000000000", item.lease_token, item.ownership_epoch),
    ):
        with pytest.raises(LostLease):
            await store.work_fenced(forged, lambda: T0, _write_marker, name="t")
        (res,) = await store.work_finalize_if_owner(
            [Finalization(fence=forged, event=WorkEvent.COMPLETE)], "A", lambda: T0
        )
        assert not res.applied


async def test_renewal_extends_the_lease(store: WorkStore) -> None:
    await enqueue(store)
    (item,) = (await claim(store, ttl=5 * SEC)).claimed
    renew = await store.work_renew_if_owner([item.fence], 5 * SEC, lambda: T0 + 4 * SEC)  # type: ignore[list-item]
    assert renew.renewed == {item.work_id: T0 + 9 * SEC}
    # Past the original expiry but inside the renewed one, nobody can reclaim.
    assert (await claim(store, "B", now=T0 + 8 * SEC)).claimed == []
    assert (await finalize(store, item, Succeeded(), now=T0 + 8 * SEC)).applied


async def test_expired_lease_is_reclaimed_then_dead_when_attempts_are_spent(
    store: WorkStore,
) -> None:
    await enqueue(store, max_attempts=2)
    (first,) = (await claim(store, "A", ttl=SEC)).claimed
    (second,) = (await claim(store, "B", now=T0 + 2 * SEC, ttl=SEC)).claimed
    assert (second.ownership_epoch, second.attempt) == (2, 2)
    result = await claim(store, "C", now=T0 + 4 * SEC, ttl=SEC)
    assert result.claimed == [] and result.expired_dead == [first.work_id]
    row = await store.work_get(first.work_id)
    assert row is not None
    assert (row.state, row.failure_class, row.ownership_epoch) == (
        WorkState.DEAD, "lease_expired", 3)


async def test_batch_finalize_reports_each_item(store: WorkStore) -> None:
    await enqueue(store, 4)
    items = (await claim(store, limit=4)).claimed
    stale = items[0]
    # Steal the first item (its lease expired and another owner reclaimed it).
    await store.db.transact(
        lambda tx: tx.execute("UPDATE work_items SET lease_token = 'x' WHERE work_id = ?",
                              (stale.work_id,)),
        name="t",
    )
    fins = [finalization(i, Succeeded()) for i in items[:2]] + [
        finalization(i, RetryLater("net")) for i in items[2:]
    ]
    results = await store.work_finalize_if_owner(fins, "A", lambda: T0)
    assert [r.applied for r in results] == [False, True, True, True]
    assert [r.state for r in results] == [None, WorkState.SUCCEEDED, WorkState.RETRY,
                                          WorkState.RETRY]


async def test_terminal_rows_are_never_reopened(store: WorkStore) -> None:
    await enqueue(store)
    (item,) = (await claim(store)).claimed
    assert (await finalize(store, item, Succeeded())).applied
    # Not claimable, not finalizable again, not cancellable.
    assert (await claim(store, now=T0 + 100 * TTL)).claimed == []
    assert not (await finalize(store, item, DeadLetter("x"))).applied
    cancel = await store.work_cancel(item.work_id, T0)
    assert (cancel.disposition, cancel.state) == ("noop", WorkState.SUCCEEDED)
    row = await store.work_get(item.work_id)
    assert row is not None and row.state is WorkState.SUCCEEDED


async def test_batch_results_follow_input_order(store: WorkStore) -> None:
    await enqueue(store, 4)
    items = (await claim(store, limit=4)).claimed
    outcomes: list[Outcome] = [Succeeded(), RetryLater("net"), Succeeded(), DeadLetter("bad")]
    fins = [finalization(i, o) for i, o in zip(items, outcomes, strict=True)]
    results = await store.work_finalize_if_owner(fins, "A", lambda: T0)
    assert [r.fence.work_id for r in results] == [i.work_id for i in items]
    assert [r.state for r in results] == [WorkState.SUCCEEDED, WorkState.RETRY,
                                          WorkState.SUCCEEDED, WorkState.DEAD]


async def test_side_writes_commit_with_their_finalization_only(store: WorkStore) -> None:
    await enqueue(store, 3)
    ok, stale, broken = (await claim(store, limit=3)).claimed
    await store.db.transact(
        lambda tx: tx.execute("UPDATE work_items SET lease_token = 'x' WHERE work_id = ?",
                              (stale.work_id,)),
        name="t",
    )

    def mark(item_id: str) -> Callable[[SqlTx], Awaitable[None]]:
        async def write(tx: SqlTx) -> None:
            await tx.execute("UPDATE work_items SET operator_summary = 'side' WHERE work_id = ?",
                             (item_id,))
        return write

    async def failing(tx: SqlTx) -> None:
        await tx.execute("UPDATE work_items SET operator_summary = 'half' WHERE work_id = ?",
                         (broken.work_id,))
        raise WorkConflict("the settlement lost a race")

    fins = [finalization(i, Succeeded()) for i in (ok, stale, broken)]
    results = await store.work_finalize_if_owner(
        fins, "A", lambda: T0, side_writes={ok.work_id: mark(ok.work_id),
                                    stale.work_id: mark(stale.work_id),
                                    broken.work_id: failing})
    assert [(r.applied, r.error) for r in results] == [
        (True, None), (False, None), (False, "the settlement lost a race")]
    rows = {i.work_id: await store.work_get(i.work_id) for i in (ok, stale, broken)}
    assert rows[ok.work_id].operator_summary == "side"  # type: ignore[union-attr]
    assert rows[ok.work_id].state is WorkState.SUCCEEDED  # type: ignore[union-attr]
    assert rows[stale.work_id].operator_summary is None  # type: ignore[union-attr]
    # The failed side write took its finalization down with it: still processing.
    assert rows[broken.work_id].state is WorkState.PROCESSING  # type: ignore[union-attr]
    assert rows[broken.work_id].operator_summary is None  # type: ignore[union-attr]
    assert [e.work_id for e in await store.work_executions(ok.work_id)] == [ok.work_id]
    assert await store.work_executions(broken.work_id) == []


async def test_side_writes_that_all_succeed_cost_one_transaction(store: WorkStore) -> None:
    await enqueue(store, 4)
    items = (await claim(store, limit=4)).claimed

    def mark(item_id: str) -> Callable[[SqlTx], Awaitable[None]]:
        async def write(tx: SqlTx) -> None:
            await tx.execute("UPDATE work_items SET operator_summary = 'side' WHERE work_id = ?",
                             (item_id,))
        return write

    commits, rollbacks = store.db.stats.commits, store.db.stats.rollbacks
    results = await store.work_finalize_if_owner(
        [finalization(i, Succeeded()) for i in items], "A", lambda: T0,
        side_writes={i.work_id: mark(i.work_id) for i in items})
    assert all(r.applied for r in results)
    assert (store.db.stats.commits, store.db.stats.rollbacks) == (commits + 1, rollbacks)
    for item in items:
        row = await store.work_get(item.work_id)
        assert row is not None and (row.state, row.operator_summary) == (WorkState.SUCCEEDED,
                                                                         "side")


async def test_work_written_for_a_newer_engine_is_left_for_a_replica_that_can(
    store: WorkStore,
) -> None:
    """Finding (issue 8, item 12): the claim ignored engine_capability_version and
    payload_schema_version, so an old replica ran work written for a newer engine."""
    (newer_engine,) = await enqueue(store, engine_capability_version=2)
    (newer_schema,) = await enqueue(store, payload_schema_version=3)
    (current,) = await enqueue(store)

    def params(engine: int, schema: int, owner: str) -> ClaimParams:
        return ClaimParams(family="noop", owner=owner, limit=10, lease_ttl_us=TTL, window=40,
                           include_expired=True, engine_capability_version=engine,
                           payload_schema_version=schema)

    old = await store.work_claim(params(1, 1, "old"), T0)
    assert [i.work_id for i in old.claimed] == [current]
    assert (await finalize(store, old.claimed[0], Succeeded(), replica="old")).applied
    for wid in (newer_engine, newer_schema):
        row = await store.work_get(wid)
        assert row is not None and (row.state, row.attempt) == (WorkState.PENDING, 0)
    engine_only = await store.work_claim(params(2, 1, "mid"), T0)
    assert [i.work_id for i in engine_only.claimed] == [newer_engine]
    (expired,) = engine_only.claimed
    # An expired lease on newer work is not reclaimed by an old replica either.
    late = await store.work_claim(params(1, 1, "old"), T0 + 2 * TTL)
    assert (late.claimed, late.reclaimed) == ([], [])
    row = await store.work_get(expired.work_id)
    assert row is not None and row.lease_owner == "mid" and row.ownership_epoch == 1
    new = await store.work_claim(params(2, 3, "new"), T0 + 2 * TTL)
    assert sorted(i.work_id for i in new.claimed) == sorted([newer_schema, newer_engine])


async def test_contending_claimants_read_disjoint_batches(store: WorkStore) -> None:
    """Finding (issue 24, item 2): claimants racing at one moment read the same oldest
    window and started in one of its four strides, so eight replicas picked at most four
    distinct batches and every second one lost its race (1.2-1.4 lost races per item)."""
    await enqueue(store, 64)
    limit = 4
    # What a replica's scheduler claims with once it has lost a race.
    spread = next_spread(NO_SPREAD, limit=limit, claimed=0, contended=limit)

    async def batch(rotation: int) -> frozenset[str]:
        params = ClaimParams(family="noop", owner=f"R{rotation}", limit=limit,
                             lease_ttl_us=TTL, window=limit * 4, rotation=rotation,
                             spread=spread)

        async def body(tx: SqlTx) -> frozenset[str]:
            return frozenset(c.work_id for c in await store._pick(tx, params, T0))

        return await store.db.transact(body, name="test.pick", write=False)

    batches = [await batch(r) for r in range(8)]
    assert all(len(b) == limit for b in batches)
    assert len(frozenset().union(*batches)) == 8 * limit


async def test_a_spread_claim_takes_its_slot_and_falls_back_to_the_oldest(
    store: WorkStore,
) -> None:
    """A claim in slot k of the ready set takes the k-th batch, oldest first; when the
    ready set is shallower than its slot it takes the oldest rows instead of nothing."""
    await enqueue(store, 12, run_after_us=T0 - 1)
    oldest = await enqueue(store, 3, run_after_us=T0 - 2)

    def params(owner: str, rotation: int) -> ClaimParams:
        return ClaimParams(family="noop", owner=owner, limit=4, lease_ttl_us=TTL, window=16,
                           rotation=rotation, spread=8)

    third = await store.work_claim(params("A", 2), T0)
    assert len(third.claimed) == 4 and not set(oldest) & {i.work_id for i in third.claimed}
    # Slot 7 (28 rows deep) lies beyond the 11 ready rows left: the oldest window.
    deep = await store.work_claim(params("B", 7), T0)
    assert len(deep.claimed) == 4
    # Slot 0: the oldest batch of what is left, the oldest three first.
    head = await store.work_claim(params("C", 8), T0)
    assert len(head.claimed) == 4
    assert set(oldest) - {i.work_id for i in deep.claimed} <= {i.work_id for i in head.claimed}


class _Counting:
    """A transaction that counts the statements sent through it."""

    def __init__(self, tx: SqlTx) -> None:
        self._tx = tx
        self.statements = 0

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        self.statements += 1
        return await self._tx.execute(sql, params)

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        self.statements += 1
        return await self._tx.executemany(sql, rows)

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        self.statements += 1
        return list(await self._tx.fetchall(sql, params))


async def test_a_slot_beyond_the_ready_set_costs_two_reads_and_takes_the_halved_slot(
    store: WorkStore,
) -> None:
    """Slot 7 of 4-row batches (28 rows deep) with 11 ready rows: the claim falls back to
    slot 3 (12 deep, empty too), then slot 1 (4 deep, 7 rows), as one read per halving
    did; the shallower slots are cut from one read of the shallow ready set, so two
    statements instead of three (issue 24: the claims were the effect path's largest
    share of round trips)."""
    ids = [(await enqueue(store, 1, run_after_us=T0 - 20 + i))[0] for i in range(11)]
    params = ClaimParams(family="noop", owner="B", limit=4, lease_ttl_us=TTL, window=16,
                         rotation=7, spread=8)

    async def body(tx: SqlTx) -> tuple[list[str], int]:
        counting = _Counting(tx)
        picked = await store._pick(counting, params, T0)
        return [c.work_id for c in picked], counting.statements

    picked, statements = await store.db.transact(body, name="test.pick", write=False)
    assert picked == ids[4:8]
    assert statements == 2


async def _picked(store: WorkStore, params: ClaimParams) -> frozenset[str]:
    async def body(tx: SqlTx) -> frozenset[str]:
        return frozenset(c.work_id for c in await store._pick(tx, params, T0))

    return await store.db.transact(body, name="test.pick", write=False)


def _ranked(rank: int, claimants: int, rotation: int, spread: int) -> ClaimParams:
    return ClaimParams(family="noop", owner=f"R{rank}", limit=4, lease_ttl_us=TTL, window=16,
                       rotation=rotation, spread=spread, rank=rank, claimants=claimants)


async def test_live_claimants_start_a_burst_in_disjoint_batches(store: WorkStore) -> None:
    """Finding (issue 24 item 2): at the start of a burst every replica's spread is 1
    (the oldest window's four strides), so of eight replicas claiming at once about half
    lost their first batch. Knowing their ranks among the eight live claimants (the
    heartbeats), they start in eight different batches whatever their rotations."""
    await enqueue(store, 200)
    batches = [await _picked(store, _ranked(rank, 8, rotation, NO_SPREAD))
               for rank, rotation in enumerate((0, 1, 2, 3, 0, 1, 2, 3))]
    assert all(len(b) == 4 for b in batches)
    assert len(frozenset().union(*batches)) == 8 * 4


async def test_live_claimants_share_a_shallow_ready_set_by_rank(store: WorkStore) -> None:
    """Finding (issue 24 item 2): at the tail of a drain the claims' deep slots lay
    beyond the ready set and were halved, so they crowded its oldest batches (the last
    batches of a drain lost two to five races each). Three batches left and slots 64
    deep: ranks 0, 1 and 2 take the three different batches (3 to 5 share them by
    rank)."""
    await enqueue(store, 12)
    picks = [await _picked(store, _ranked(rank, 8, 7, 64)) for rank in range(8)]
    assert all(len(b) == 4 for b in picks)
    assert len(frozenset().union(*picks[:3])) == 12
    assert picks[3:6] == picks[:3]


def _parted(rank: int, claimants: int, limit: int = 4) -> ClaimParams:
    return ClaimParams(family="noop", owner=f"R{rank}", limit=limit, lease_ttl_us=TTL,
                       window=limit * 4, spread=NO_SPREAD, rank=rank, claimants=claimants,
                       stride=limit, parted=True)


async def test_parted_claimants_do_not_meet_when_rows_ahead_of_them_are_taken(
    store: WorkStore,
) -> None:
    """Finding (issue 24 item 2, branch claims12): in a traced 8-replica drain every
    mid-drain lost race was a slot that had moved: rank 5 read its slot (the sixth
    batch), two batches ahead of it were claimed, and rank 3, reading after them, found
    rank 5's batch in its own slot (the third). A claimant's part (work ids ending in its
    rank's characters) does not move, and reading a full part is still one statement."""
    await enqueue(store, 200)
    slot5 = await _picked(store, _ranked(5, 8, 0, NO_SPREAD))
    part5 = await _picked(store, _parted(5, 8))
    await claim(store, "X", limit=8)  # the two oldest batches, taken by another replica
    slot3 = await _picked(store, _ranked(3, 8, 0, NO_SPREAD))
    assert slot3 == slot5  # the slots met: the race the parts remove

    async def body(tx: SqlTx) -> tuple[frozenset[str], int]:
        counting = _Counting(tx)
        picked = await store._pick(counting, _parted(3, 8), T0)
        return frozenset(c.work_id for c in picked), counting.statements

    part3, statements = await store.db.transact(body, name="test.pick", write=False)
    assert len(part3) == len(part5) == 4 and not part3 & part5
    assert all(i[-1] in claim_part(3, 8) for i in part3)
    assert all(i[-1] in claim_part(5, 8) for i in part5)
    assert statements == 1


async def test_a_claimant_whose_part_runs_dry_leaves_the_next_part_its_oldest_batch(
    store: WorkStore,
) -> None:
    """The tail of a drain (branch claims12, traced): when its own part held fewer rows
    than it could take, a claimant that topped up from the oldest rows of the ready set,
    or from the newest of the next rank's part whatever its depth, took rows their owners
    were claiming at that moment and lost most of the tail's races. Now it takes its own
    rows and only those of the next rank's part beyond that part's oldest batch (its
    owner claims oldest first), however short or empty that leaves its claim; the next
    claim, not parted (its scheduler parts only after a full claim), takes the rest by
    slot, so no row waits for its owner."""
    ids = await enqueue(store, 60)
    order = {i: n for n, i in enumerate(sorted(ids))}  # one run_after: by work id
    own = sorted((i for i in ids if i[-1] in claim_part(0, 2)), key=order.__getitem__)
    nxt = sorted((i for i in ids if i[-1] in claim_part(1, 2)), key=order.__getitem__)
    assert len(own) >= 5 and len(nxt) >= 12  # 60 random ids: about 30 each
    first = await store.work_claim(_parted(0, 2, limit=len(own) - 3), T0)
    assert {i.work_id for i in first.claimed} == set(own[:-3])
    # Three of its own left, the next part deep: its three and the next part's two newest.
    topped = await store.work_claim(_parted(0, 2, limit=5), T0)
    assert {i.work_id for i in topped.claimed} == set(own[-3:] + nxt[-2:])
    # The next part's owner leaves four; a claim for five finds none of its own and no
    # more than a batch in the next part: nothing (no race with that part's owner).
    await store.work_claim(_parted(1, 2, limit=len(nxt) - 6), T0)
    empty = await store.work_claim(_parted(0, 2, limit=5), T0)
    assert empty.claimed == [] and empty.contended == 0
    # Not parted, the same claimant takes them by its slot: no row waits for its owner.
    last = await store.work_claim(attrs.evolve(_parted(0, 2, limit=5), parted=False), T0)
    assert {i.work_id for i in last.claimed} == set(nxt[-6:-2])


class _ReleaseFailsOnce:
    """A transaction whose first ``RELEASE SAVEPOINT fin_1`` fails alone (a statement
    error the transaction survives, as a lock wait timeout does): the simulation's
    storage faults reached it (seed 204, docs/simulation.md)."""

    def __init__(self, tx: SqlTx, state: dict[str, bool]) -> None:
        self._tx = tx
        self._state = state

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        if sql == "RELEASE SAVEPOINT fin_1" and not self._state["failed"]:
            self._state["failed"] = True
            raise RetryableConflict("RELEASE SAVEPOINT failed (injected)")
        return await self._tx.execute(sql, params)

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        return await self._tx.executemany(sql, rows)

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return list(await self._tx.fetchall(sql, params))


async def test_a_finalization_whose_savepoint_release_fails_leaves_no_journal_row(
    store: WorkStore,
) -> None:
    """Seed 204 of the simulation: the isolated finalization extended the execution
    journal before ``RELEASE SAVEPOINT`` had succeeded; when the release failed and the
    transaction went on, the item's finalization was rolled back but its ``succeeded``
    journal row committed (and the item ran again at the next epoch)."""
    await enqueue(store, 2)
    broken, victim = (await claim(store, limit=2)).claimed

    async def failing(tx: SqlTx) -> None:
        raise WorkConflict("the settlement lost a race")  # forces the savepoint pass

    async def fine(tx: SqlTx) -> None:
        await tx.execute("UPDATE work_items SET operator_summary = 'side' WHERE work_id = ?",
                         (victim.work_id,))

    state = {"failed": False}
    inner = store.db.transact

    async def transact(body: Callable[[SqlTx], Awaitable[Any]], *, name: str,
                       write: bool = True) -> Any:
        return await inner(lambda tx: body(_ReleaseFailsOnce(tx, state)), name=name,
                           write=write)

    store.db.transact = transact  # type: ignore[method-assign]
    results = await store.work_finalize_if_owner(
        [finalization(i, Succeeded()) for i in (broken, victim)], "A", lambda: T0,
        side_writes={broken.work_id: failing, victim.work_id: fine})
    store.db.transact = inner  # type: ignore[method-assign]
    assert state["failed"]
    assert [r.applied for r in results] == [False, False]
    row = await store.work_get(victim.work_id)
    assert row is not None and row.state is WorkState.PROCESSING
    assert row.operator_summary is None
    assert await store.work_executions(victim.work_id) == []

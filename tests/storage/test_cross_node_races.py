"""Conformance: races between stores on one database, on every backend; on Galera each
store is on a different node (issue 12), so the losers fail certification at COMMIT (1213)
and are retried as whole transactions: quota slots, refresh CAS and refresh leases must
still have exactly one winner each."""

from __future__ import annotations

import itertools

import trio

from daemon.core.lost_slots import SendGate
from daemon.core.quota import Granted, QuotaPolicy
from daemon.core.token_bundle import BundleContext, SecretText, TokenBundle, TokenKey, seal
from daemon.core.work import Fence
from storage.port import LostLease, SqlTx
from storage.quota import SlotReserved
from storage.refresh_leases import AlreadyRefreshed, LeaseBusy, LeaseWon, refresh_lease_acquire
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.work import T0, claim, enqueue

S = 1_000_000
KEY = TokenKey("k1", bytes(range(32)))
BUNDLE = TokenBundle(access_token=SecretText("at-SECRET"), refresh_token=SecretText("rt-SECRET"),
                     expires_at_us=T0 + 3600 * S)


async def _stores(database: FreshDatabase, n: int = 3) -> list[WorkStore]:
    return [await database.open_store(pool_size=2) for _ in range(n)]


async def test_quota_grants_from_every_store_never_hand_out_one_slot_twice(
        database: FreshDatabase) -> None:
    stores = await _stores(database)
    roomy = QuotaPolicy(limit=1000, window_us=S, jitter_us=0)
    slots: list[int] = []

    async def grab(store: WorkStore) -> None:
        for _ in range(8):
            got = await store.quota_grant("hot", roomy, now_us=T0, count=2, max_wait_us=60 * S)
            assert isinstance(got, Granted)
            slots.extend(got.slots)

    async with trio.open_nursery() as nursery:
        for store in stores:
            for _ in range(2):
                nursery.start_soon(grab, store)
    assert len(slots) == len(set(slots)) == 8 * 2 * 2 * len(stores)
    ordered = sorted(slots)
    assert all(b - a >= roomy.interval_us for a, b in itertools.pairwise(ordered))
    for store in stores:  # every store (node) reads the same ledger
        assert (await store.quota_keys("hot"))[0].granted_total == len(slots)


async def test_fenced_quota_reserves_from_every_store_never_hand_out_one_slot_twice(
        database: FreshDatabase) -> None:
    """The claim-fenced grant (issue 20 item 6) across nodes: the fence, the grant and the
    reservation certify together; a stale claimant racing them moves nothing."""
    stores = await _stores(database)
    roomy = QuotaPolicy(limit=1000, window_us=S, jitter_us=0)
    await enqueue(stores[0], 7, now=T0)
    stale = (await claim(stores[0], owner="A", now=T0, ttl=S, limit=1)).claimed[0].fence
    live = [i.fence for i in (await claim(stores[0], owner="B", now=T0 + 2 * S,
                                          ttl=600 * S, limit=7)).claimed]
    assert stale is not None and stale.work_id in {f.work_id for f in live if f}
    slots: list[int] = []
    refused: list[LostLease] = []

    async def grab(store: WorkStore, fence: Fence) -> None:
        for _ in range(4):
            try:
                got = await store.quota_reserve("hot", roomy, fence=fence,
                                                gate=SendGate.CHECKPOINT,
                                                now=lambda: T0 + 2 * S, max_wait_us=60 * S)
            except LostLease as exc:
                refused.append(exc)
                continue
            assert isinstance(got, SlotReserved)
            slots.append(got.slot_us)

    async with trio.open_nursery() as nursery:
        for i, fence in enumerate(live):
            assert fence is not None
            nursery.start_soon(grab, stores[i % len(stores)], fence)
        nursery.start_soon(grab, stores[-1], stale)
    assert len(refused) == 4  # every one of the stale claimant's tries
    assert len(slots) == len(set(slots)) == 4 * len(live)
    assert all(b - a >= roomy.interval_us for a, b in itertools.pairwise(sorted(slots)))
    for store in stores:
        assert (await store.quota_keys("hot"))[0].granted_total == len(slots)
    for fence in live:
        assert fence is not None
        bound = await stores[0].quota_reservations(fence.work_id)
        assert [r.ownership_epoch for r in bound] == [fence.ownership_epoch] * 4


async def test_slot_log_grants_from_every_store_never_exceed_a_window(
        database: FreshDatabase) -> None:
    """The slot log's compare-and-swap across nodes: on Galera the row lock is per node,
    so the condition on what was read is what refuses the loser."""
    stores = await _stores(database)
    burst = QuotaPolicy(limit=10, window_us=S, jitter_us=0, burst=4)
    slots: list[int] = []

    async def grab(store: WorkStore) -> None:
        for _ in range(4):
            got = await store.quota_grant("hot", burst, now_us=T0, count=2, max_wait_us=60 * S)
            assert isinstance(got, Granted)
            slots.extend(got.slots)

    async with trio.open_nursery() as nursery:
        for store in stores:
            for _ in range(2):
                nursery.start_soon(grab, store)
    ordered = sorted(slots)
    assert len(ordered) == 4 * 2 * 2 * len(stores)
    assert max(sum(1 for t in ordered if a <= t < a + S) for a in ordered) <= burst.limit
    assert max(ordered.count(t) for t in ordered) <= burst.burst
    for store in stores:
        assert (await store.quota_keys("hot"))[0].granted_total == len(slots)


async def test_refresh_cas_from_every_store_installs_each_version_once(
        database: FreshDatabase) -> None:
    stores = await _stores(database)
    await stores[0].grant_install(binding_id="b1", generation=1,
                                  sealed=seal(BUNDLE, KEY, BundleContext("b1", 1, 1)),
                                  expires_at_us=0, now_us=T0)
    rounds = 6
    for version in range(1, rounds + 1):
        won: list[int] = []

        async def replace(n: int, store: WorkStore) -> None:
            sealed = seal(BUNDLE, KEY, BundleContext("b1", 1, version + 1))  # noqa: B023
            if await store.grant_replace(binding_id="b1", generation=1,
                                         expected_version=version,  # noqa: B023
                                         sealed=sealed, expires_at_us=0, now_us=T0 + n,
                                         refreshed=True):
                won.append(n)  # noqa: B023

        async with trio.open_nursery() as nursery:
            for n, store in enumerate(stores):
                nursery.start_soon(replace, n, store)
        assert len(won) == 1, (version, won)
    for store in stores:
        got = await store.grant_get("b1", 1)
        assert got is not None and got.token_version == rounds + 1


async def test_refresh_lease_from_every_store_has_one_owner(database: FreshDatabase) -> None:
    """The lease row does not exist yet: every store INSERTs it at once (the losers'
    inserts collide or fail certification) and exactly one takes the lease."""
    stores = await _stores(database)
    await stores[0].grant_install(binding_id="b1", generation=1,
                                  sealed=seal(BUNDLE, KEY, BundleContext("b1", 1, 1)),
                                  expires_at_us=0, now_us=T0)
    outcomes: list[object] = []

    async def acquire(n: int, store: WorkStore) -> None:
        async def body(tx: SqlTx) -> object:
            return await refresh_lease_acquire(
                tx, binding_id="b1", generation=1, seen_version=1, lease_token=f"L{n}",
                work_id=f"W{n}", epoch=1, ttl_us=30 * S, now_us=T0)

        outcomes.append(await store.db.transact(body, name="test.lease"))

    async with trio.open_nursery() as nursery:
        for n, store in enumerate(stores * 2):
            nursery.start_soon(acquire, n, store)
    winners = [o for o in outcomes if isinstance(o, LeaseWon)]
    assert len(winners) == 1, outcomes
    assert all(isinstance(o, LeaseBusy | LeaseWon) for o in outcomes), outcomes
    (winner,) = winners
    assert winner.from_version == 1
    # Its refresh installs version 2 once; a late claimant that saw version 1 is told.
    assert await stores[1].refresh_activate(
        binding_id="b1", generation=1, lease_token=winner.lease_token, from_version=1,
        sealed=seal(BUNDLE, KEY, BundleContext("b1", 1, 2)), expires_at_us=0, now_us=T0 + 1)

    async def late(tx: SqlTx) -> object:
        return await refresh_lease_acquire(
            tx, binding_id="b1", generation=1, seen_version=1, lease_token="late",
            work_id="W9", epoch=1, ttl_us=30 * S, now_us=T0 + 2)

    assert await stores[2].db.transact(late, name="test.late") == AlreadyRefreshed(2)

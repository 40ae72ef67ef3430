"""A lease renewal never queues behind the work it keeps alive (issue 12, the torture run's
Galera shortfall).

A replica's handlers share its connection pool with its lease keeper. When every pooled
connection is busy (the database is slow: a loaded Galera cluster, where each read waits
for causality and each COMMIT certifies across nodes), a renewal that waits its turn in
the pool's queue arrives after the lease's local trust horizon: every claim is dropped as
untrusted and reclaimed by another replica, whose renewals then wait the same way. The
torture run saw this as a livelock that outlasted the chaos (thousands of
``work_lease_lost`` / ``work_lease_reclaimed`` pairs, the pool wait summing to ~10 s per
second of run). The MySQL-family adapter keeps a connection for renewals alone.

The SQLite adapter has one connection behind one lock (SQLite takes one writer at a
time), so there is no pool to reserve from; it is not part of this test.
"""

from __future__ import annotations

import pytest
import trio

from storage.port import SqlTx
from tests.support.backends import FreshDatabase, backend_params
from tests.support.work import SEC, T0, TTL, claim, enqueue


@pytest.fixture(params=backend_params(("mysql", "galera")))
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "galera":
        request.getfixturevalue("galera_cluster")
    return str(request.param)


async def test_a_renewal_does_not_wait_for_a_pool_exhausted_by_handlers(
        database: FreshDatabase) -> None:
    store = await database.open_store(pool_size=2)
    await enqueue(store, 3)
    claimed = (await claim(store, "A", limit=3)).claimed
    fences = [item.fence for item in claimed if item.fence is not None]
    assert len(fences) == 3
    release, pool_held = trio.Event(), trio.Event()
    holding = 0

    async def handler_transaction(tx: SqlTx) -> None:
        nonlocal holding
        await tx.fetchall("SELECT 1")
        holding += 1
        if holding == 2:  # both of the pool's connections are taken
            pool_held.set()
        await release.wait()  # a handler's transaction on a slow database

    async with trio.open_nursery() as nursery:
        for _ in range(4):  # two hold the pool's connections, two more queue behind them
            nursery.start_soon(lambda: store.db.transact(handler_transaction, name="handler",
                                                         write=False))
        await pool_held.wait()
        # Bounded only so that the failure shows as a failure, not a hang: without a
        # reserved connection the renewal waits until the handlers let go.
        with trio.move_on_after(10) as waited:
            renewed = await store.work_renew_if_owner(fences, TTL, lambda: T0 + SEC)
        release.set()
    assert not waited.cancelled_caught, "the renewal queued behind the handlers"
    assert sorted(renewed.renewed) == sorted(f.work_id for f in fences)
    assert renewed.lost == []

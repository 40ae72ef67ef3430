"""The lease keeper renews every family's due flights at once (issue 12, the Galera torture
run): one transaction on the reserved ``work.renew`` connection, not one family's after
another's, so slow renewals do not add up across families and each family's trust
horizon still counts from when its renewal was sent.

MockClock (no autojump, so a MariaDB connection's own deadlines never fire): the database
here takes ``SLOW_S`` of trio time to answer each renewal (a real adapter behind a
wrapper that advances the clock when the renewal's reply comes back).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import attrs
import trio
import trio.testing

from config.settings import FamilySettings
from daemon.services.clock import TrioClock
from daemon.services.completer import Completer
from daemon.services.families import build_registry, noop_handler
from daemon.services.lease_keeper import LeaseKeeper
from daemon.services.metrics import Metrics
from daemon.services.worker_pool import InFlight, WorkerPool
from storage.port import SqlTx
from storage.work_store import WorkStore
from tests.support.db_wrapper import DatabaseWrapper
from tests.support.harness import settings
from tests.support.work import SEC, claim, enqueue

T = TypeVar("T")
SLOW_S = 8.0
MARGIN_S = 2.0
TTLS = {"fam_a": 30.0, "fam_b": 60.0}


@attrs.define(eq=False)
class SlowRenewals(DatabaseWrapper):
    """A real database whose answers to ``work.renew`` arrive ``SLOW_S`` later."""

    clock: trio.testing.MockClock
    renewals: int = 0

    async def transact(self, body: Callable[[SqlTx], Awaitable[T]], *, name: str,
                       write: bool = True) -> T:
        result = await self.inner.transact(body, name=name, write=write)
        if name == "work.renew":
            self.renewals += 1
            self.clock.jump(SLOW_S)
        return result


async def _lease_until(store: WorkStore, work_id: str) -> int:
    async def body(tx: SqlTx) -> int:
        rows = await tx.fetchall("SELECT lease_until_us FROM work_items WHERE work_id = ?",
                                 (work_id,))
        return int(rows[0][0])

    return await store.db.transact(body, name="test.lease", write=False)


async def test_two_families_renewals_do_not_add_up(store: WorkStore,
                                                   mock_clock: trio.testing.MockClock) -> None:
    clock = TrioClock()
    cfg = settings({name: FamilySettings(lease_ttl=ttl) for name, ttl in TTLS.items()},
                   lease_margin=MARGIN_S)
    registry = build_registry(cfg, {name: noop_handler for name in TTLS})
    metrics = Metrics()
    pool = WorkerPool(store=store, registry=registry, clock=clock, metrics=metrics,
                      completer=Completer(store, clock, metrics, "replica-1",
                                          backoff_cap_s=1.0),
                      replica_id="replica-1", lease_margin_s=MARGIN_S, global_limit=10)
    claimed_at = trio.current_time()
    for name, ttl in TTLS.items():
        await enqueue(store, 2, family=name, now=clock.now_us())
        for item in (await claim(store, "replica-1", now=clock.now_us(), family=name,
                                 ttl=int(ttl * SEC))).claimed:
            assert item.fence is not None
            pool.flights[item.work_id] = InFlight(
                item=item, fence=item.fence, family=registry.get(name),
                scope=trio.CancelScope(), trusted_until=claimed_at + ttl - MARGIN_S,
                renewed_at=claimed_at)
    flights = list(pool.flights.values())
    assert len(flights) == 4
    # Another replica took one of fam_a's items over: that one is lost, the rest renew.
    taken = next(f for f in flights if f.family.name == "fam_a")
    await store.db.transact(lambda tx: tx.execute(
        "UPDATE work_items SET lease_token = 'another', ownership_epoch = ownership_epoch + 1"
        " WHERE work_id = ?", (taken.item.work_id,)), name="test.takeover")

    slow = SlowRenewals(store.db, mock_clock)
    keeper = LeaseKeeper(WorkStore(slow, store.dialect), pool, clock, metrics, MARGIN_S,
                         tick_s=1.0)
    mock_clock.jump(25.0)  # both families are due (a third of 30 s and of 60 s)
    sent_at, sent_us = trio.current_time(), clock.now_us()
    await keeper.renew_due()
    # One renewal for both families: the slow answer is paid once, not once per family.
    assert slow.renewals == 1
    assert trio.current_time() - sent_at == SLOW_S
    for flight in flights:
        if flight is taken:
            assert flight.stop_reason == "lease_lost"
            continue
        ttl = TTLS[flight.family.name]
        # The trust horizon counts from when the renewal was sent, for each family's TTL.
        assert flight.stop_reason is None
        assert (flight.renewed_at, flight.trusted_until) == (sent_at, sent_at + ttl - MARGIN_S)
        assert await _lease_until(store, flight.item.work_id) == sent_us + int(ttl * SEC)
    # Nothing is due again before a third of a TTL has passed (the stopped flight's handler
    # would have ended, and the pool forgotten it).
    del pool.flights[taken.item.work_id]
    await keeper.renew_due()
    assert slow.renewals == 1

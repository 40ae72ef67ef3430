"""The completer's group commit: a claimed batch's handlers that finish a moment apart are
finalized in one transaction, not one each (``bench.sql_tally`` counted a batch of 32
receipts finalized in about nine), and no finalization waits longer than the linger.

MockClock without autojump: the test moves time itself, a millisecond at a time, and
releases the handlers in between. On SQLite only: the completer does not depend on the
backend (its transaction is the store's, which the storage suites run everywhere), and
only an inline database lets ``wait_all_tasks_blocked`` mean "the flush is done".
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import attrs
import pytest
import trio
import trio.testing

from config.settings import FamilySettings
from daemon.core.outcomes import Outcome, Succeeded
from daemon.services.clock import TrioClock
from daemon.services.completer import Completer
from daemon.services.families import WorkContext, build_registry
from daemon.services.metrics import Metrics
from daemon.services.worker_pool import WorkerPool
from storage.port import SqlTx
from storage.work_store import WorkStore
from tests.support.db_wrapper import DatabaseWrapper
from tests.support.harness import settings
from tests.support.work import claim, enqueue

T = TypeVar("T")
FAMILY = "fam_a"
LINGER_S = 0.005
STEP_S = 0.001
pytestmark = pytest.mark.parametrize("backend", ["sqlite"])


@attrs.define(eq=False)
class CountedFinalizations(DatabaseWrapper):
    """A real database that counts the finalize transactions it commits."""

    committed_at: list[float] = attrs.field(factory=list)

    async def transact(self, body: Callable[[SqlTx], Awaitable[T]], *, name: str,
                       write: bool = True) -> T:
        result = await self.inner.transact(body, name=name, write=write)
        if name == "work.finalize":
            self.committed_at.append(trio.current_time())
        return result


async def _run(store: WorkStore, mock_clock: trio.testing.MockClock, linger_s: float,
               finish_at_ms: list[int]) -> list[int]:
    """Claims one item per entry and starts its handler, which returns at that
    millisecond. Returns the millisecond of each finalize transaction committed, once
    every item is finalized (each applied)."""
    counted = CountedFinalizations(store.db)
    counting = WorkStore(counted, store.dialect)
    clock = TrioClock()
    release = [trio.Event() for _ in finish_at_ms]
    by_work_id: dict[str, int] = {}

    async def handler(ctx: WorkContext) -> Outcome:
        await release[by_work_id[ctx.item.work_id]].wait()
        return Succeeded("done")

    cfg = settings({FAMILY: FamilySettings()}, lease_margin=2.0)
    registry = build_registry(cfg, {FAMILY: handler})
    metrics = Metrics()
    completer = Completer(counting, clock, metrics, "replica-1", linger_s=linger_s)
    pool = WorkerPool(store=counting, registry=registry, clock=clock, metrics=metrics,
                      completer=completer, replica_id="replica-1", lease_margin_s=2.0,
                      global_limit=10)
    completer.handlers_running = lambda: len(pool.flights)
    await enqueue(store, len(finish_at_ms), family=FAMILY, now=clock.now_us())
    items = (await claim(store, "replica-1", now=clock.now_us(), family=FAMILY)).claimed
    assert len(items) == len(finish_at_ms)
    started = trio.current_time()
    async with trio.open_nursery() as nursery:
        await nursery.start(completer.run)
        await nursery.start(pool.run)
        for index, item in enumerate(items):
            by_work_id[item.work_id] = index
            pool.start(item, trio.current_time())
        for ms in range(0, 20):
            for index, at in enumerate(finish_at_ms):
                if at == ms:
                    release[index].set()
            await trio.testing.wait_all_tasks_blocked()
            mock_clock.jump(STEP_S)
        await trio.testing.wait_all_tasks_blocked()
        assert not pool.flights, "every handler's finalization was answered"
        nursery.cancel_scope.cancel()
    states = await store.db.transact(lambda tx: tx.fetchall(
        "SELECT state FROM work_items WHERE family = ?", (FAMILY,)), name="test.states",
        write=False)
    assert sorted(str(row[0]) for row in states) == ["succeeded"] * len(finish_at_ms)
    return [round((at - started) * 1000) for at in counted.committed_at]


async def test_handlers_finishing_a_moment_apart_are_finalized_in_one_transaction(
        store: WorkStore, mock_clock: trio.testing.MockClock) -> None:
    # The first waited for the other two: one transaction, as soon as the last was in
    # (2 ms), not at the linger's end.
    assert await _run(store, mock_clock, LINGER_S, [0, 1, 2]) == [2]


async def test_a_finalization_waits_no_longer_than_the_linger(
        store: WorkStore, mock_clock: trio.testing.MockClock) -> None:
    # The third handler is still running at 5 ms: the two go then, the third alone (the
    # only handler running) as soon as it is in.
    assert await _run(store, mock_clock, LINGER_S, [0, 1, 12]) == [5, 12]


async def test_without_a_linger_each_finalization_goes_at_once(
        store: WorkStore, mock_clock: trio.testing.MockClock) -> None:
    assert await _run(store, mock_clock, 0.0, [0, 1, 2]) == [0, 1, 2]

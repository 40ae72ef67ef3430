"""The simulation's legacy owner outlives a storage error, as the real one does under its
supervisor (seed 17 at 70470ff: a replica frozen inside a transaction held SQLite's write
lock for the whole freeze, the legacy worker's claim met ``RetriesExhausted``, and the
run ended in the ``exception`` oracle: the world's error, not the product's).

A seed reaches that window only while the world's schedule happens to put a freeze there,
so this test places the errors itself: the legacy worker of ``sim/operators_cutover.py``
runs against a real SQLite database whose first claim and first finish fail as a stalled
database fails them. Before the fix the first error escaped the worker.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import attrs
import pytest
import trio
import trio.testing

from daemon.services.clock import TrioClock
from sandbox.legacy import store as legacy
from sim.operators_cutover import FAMILY, Cutovers
from sim.world import Options, World
from storage.port import RetriesExhausted, SqlTx
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.db_wrapper import DatabaseWrapper

T = TypeVar("T")
pytestmark = pytest.mark.parametrize("backend", ["sqlite"])  # the simulation's backend


@attrs.define(eq=False)
class StalledOnce(DatabaseWrapper):
    """A real database whose first transaction of each named kind fails as one held up
    by another writer's lock fails (nothing of it committed)."""

    stall: set[str]
    stalled: list[str] = attrs.field(factory=list)

    async def transact(self, body: Callable[[SqlTx], Awaitable[T]], *, name: str,
                       write: bool = True) -> T:
        if name in self.stall:
            self.stall.discard(name)
            self.stalled.append(name)
            raise RetriesExhausted(f"{name}: sqlite stayed busy for 30s (simulated stall)")
        return await self.inner.transact(body, name=name, write=write)


async def test_the_legacy_worker_is_started_again_and_finishes_every_event(
        database: FreshDatabase, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    store = await database.open_store()
    await legacy.install(store)
    assert database.sqlite_path is not None
    world = World(Options(seed=17), random.Random(17), tmp_path)
    world.observer = sqlite3.connect(database.sqlite_path)
    world.op_clock = TrioClock()
    cutovers = Cutovers(world, random.Random(17))
    stalled = StalledOnce(store.db, {"legacy.claim", "legacy.finish"})
    cutovers.store = WorkStore(stalled, store.dialect)
    ids = await legacy.add_events(store, FAMILY, ["{}"] * 3, world.op_clock.now_us())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(cutovers.legacy_worker)
        await trio.sleep(120)  # virtual: the worker's pauses are at most a few seconds
        nursery.cancel_scope.cancel()

    assert stalled.stalled == ["legacy.claim", "legacy.finish"]
    # Both errors ended a worker process; each time the next one started and went on.
    assert world.ops["cutover_legacy_restarts"] == 2
    # The event held when its finish failed was finished by the next process: every
    # event ran once, none is left processing under the worker's 600 s lease.
    events = {e.event_id: e for e in await legacy.events(store, FAMILY)}
    assert {e.state for e in events.values()} == {"succeeded"}, events
    assert sorted(events) == sorted(ids)
    assert {e.attempts for e in events.values()} == {1}
    assert world.violations == []

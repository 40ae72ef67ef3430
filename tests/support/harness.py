"""Run a replica's work loop in-process (no HTTP), for tests under trio's MockClock."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from config.settings import FamilySettings, ReplicaSettings, Settings, WorkSettings
from daemon.services.clock import TrioClock
from daemon.services.families import Handler, build_registry, noop_handler
from daemon.services.replica import Replica
from storage.port import CommitOutcomeUnknown, Database, DatabaseUnavailable, DbStats, SqlTx
from storage.work_store import WorkStore


def settings(families: Mapping[str, FamilySettings] | None = None, **work: Any) -> Settings:
    return Settings(
        replica=ReplicaSettings(heartbeat_interval=5.0, drain_timeout=work.pop("drain", 10.0)),
        work=WorkSettings(**{"lease_margin": 2.0, "poll_interval": 0.1, **work}),
        families=dict(families or {}),
    )


@asynccontextmanager
async def running_replica(
    store: WorkStore,
    cfg: Settings,
    handlers: Mapping[str, Handler] | None = None,
    replica_id: str = "replica-1",
) -> AsyncIterator[Replica]:
    registry = build_registry(cfg, handlers or {"noop": noop_handler})
    replica = Replica(cfg, store, registry, TrioClock(), replica_id=replica_id)
    async with trio.open_nursery() as nursery:
        await nursery.start(replica.run)
        yield replica
        replica.request_drain()
    assert replica.state == "stopped"


async def wait_for(predicate: Callable[[], Any], within_s: float = 600.0) -> None:
    """Poll an (async or sync) predicate; with MockClock, waiting costs no real time."""
    with trio.fail_after(within_s):
        while True:
            result = predicate()
            if hasattr(result, "__await__"):
                result = await result
            if result:
                return
            await trio.sleep(0.05)


@attrs.define(eq=False)
class SwitchableDatabase:
    """A real adapter behind a switch: ``down = True`` makes it unreachable.

    Not a fake: every statement still goes to the real database when up.
    """

    inner: Database
    down: bool = False
    # lose_reply(): the next write transaction of that name commits for real, its
    # "reply" is lost (CommitOutcomeUnknown), and the database stays away a while.
    _lose_reply_of: str | None = None
    _outage_s: float = 0.0
    _up_at: float | None = None

    def lose_reply(self, name: str, outage_s: float) -> None:
        self._lose_reply_of, self._outage_s = name, outage_s

    @property
    def backend(self) -> str:
        return self.inner.backend

    @property
    def max_statement_bytes(self) -> int:
        return self.inner.max_statement_bytes

    def _check_up(self, name: str) -> None:
        if self._up_at is not None and trio.current_time() >= self._up_at:
            self.down, self._up_at = False, None
        if self.down:
            raise DatabaseUnavailable(f"{name}: database unreachable (switched off)")

    @property
    def stats(self) -> DbStats:
        return self.inner.stats

    async def transact(self, body: Callable[[SqlTx], Any], *, name: str,
                       write: bool = True) -> Any:
        self._check_up(name)
        result = await self.inner.transact(body, name=name, write=write)
        if write and name == self._lose_reply_of:
            self._lose_reply_of = None
            self.down, self._up_at = True, trio.current_time() + self._outage_s
            raise CommitOutcomeUnknown(f"{name}: connection lost during COMMIT")
        return result

    async def ping(self) -> None:
        self._check_up("ping")
        await self.inner.ping()

    async def aclose(self) -> None:
        await self.inner.aclose()

"""The replica's in-flight work: start handlers, stop them, finalize them.

Theory of operation
-------------------
Each claimed item runs in its own task under a cancel scope whose deadline is
the lease's *local trust horizon*: the moment of the last successful claim or
renewal (measured when the request was sent) plus the lease TTL minus
``work.lease_margin``. If renewals stop succeeding, that deadline passes and
the handler is cancelled: past it, another replica may legitimately reclaim
the row, so this one must not keep acting. The lease keeper moves the
deadline forward after each renewal.

A handler stops early for one of four reasons, recorded on the flight:

* ``lease_lost``: renewal or a fenced write found the lease gone;
* ``lease_untrusted``: the trust horizon passed without a renewal;
* ``cancel_requested``: an operator cancelled the item; we acknowledge with a
  fenced ``processing -> cancelled``;
* ``drain``: the drain deadline passed; we release the item back to
  ``retry`` (the attempt is refunded) so another replica need not wait for
  the lease to expire.

For the first two nothing is written: the row belongs to whoever reclaims it.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import attrs
import trio

from daemon.core.outcomes import (
    CancelAcknowledged,
    Outcome,
    Released,
    RetryLater,
    decide,
)
from daemon.core.states import WorkState
from daemon.core.work import Fence, WorkItem
from daemon.services import logs
from daemon.services.clock import Clock
from daemon.services.completer import Completer
from daemon.services.families import FamilyRegistry, WorkContext, WorkFamily
from daemon.services.metrics import Metrics
from storage.port import LostLease, SqlTx
from storage.work_claims import SideWrite
from storage.work_store import WorkStore


@attrs.define(eq=False)
class InFlight:
    item: WorkItem
    fence: Fence
    family: WorkFamily
    scope: trio.CancelScope
    trusted_until: float
    renewed_at: float
    stop_reason: str | None = None
    # The handler has returned: all that is left is its fenced finalization (nothing more
    # leaves this replica for the item; the simulation's oracles tell the two apart).
    handled: bool = False

    def stop(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
        self.scope.cancel()

    def trust(self, sent_at: float, ttl_s: float, margin_s: float) -> None:
        self.renewed_at = sent_at
        self.trusted_until = sent_at + ttl_s - margin_s
        self.scope.deadline = self.trusted_until


@attrs.define(eq=False)
class WorkerPool:
    store: WorkStore
    registry: FamilyRegistry
    clock: Clock
    metrics: Metrics
    completer: Completer
    replica_id: str
    lease_margin_s: float
    global_limit: int
    # Wakes a family's local scheduler (the replica's; a no-op by default).
    wake: Callable[[str], None] = lambda family: None
    flights: dict[str, InFlight] = attrs.field(factory=dict)
    _per_family: dict[str, int] = attrs.field(factory=dict)
    _slot_freed: trio.Event = attrs.field(factory=trio.Event)
    _idle: trio.Event = attrs.field(factory=trio.Event)
    _nursery: trio.Nursery | None = None

    # ------------------------------------------------------------- capacity

    def free_slots(self, family: WorkFamily) -> int:
        used = self._per_family.get(family.name, 0)
        room = min(family.settings.concurrency - used, self.global_limit - len(self.flights))
        return max(0, room)

    def in_flight(self, family: WorkFamily) -> int:
        return self._per_family.get(family.name, 0)

    async def wait_slot_freed(self) -> None:
        await self._slot_freed.wait()

    async def wait_idle(self) -> None:
        if self.flights:
            self._idle = trio.Event()
            await self._idle.wait()

    # ---------------------------------------------------------------- tasks

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the handler nursery until cancelled (handlers end with it)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def start(self, item: WorkItem, claimed_at: float) -> None:
        """Run the handler for a freshly claimed item."""
        assert self._nursery is not None, "pool not running"
        fence = item.fence
        assert fence is not None, "claimed item without a fence"
        family = self.registry.get(item.family)
        ttl = family.settings.lease_ttl
        flight = InFlight(
            item=item,
            fence=fence,
            family=family,
            scope=trio.CancelScope(deadline=claimed_at + ttl - self.lease_margin_s),
            trusted_until=claimed_at + ttl - self.lease_margin_s,
            renewed_at=claimed_at,
        )
        self.flights[item.work_id] = flight
        self._per_family[family.name] = self._per_family.get(family.name, 0) + 1
        self.metrics.in_flight.labels(family.name).inc()
        self._nursery.start_soon(self._execute, flight)

    def stop_all(self, reason: str) -> None:
        for flight in list(self.flights.values()):
            flight.stop(reason)

    def _forget(self, flight: InFlight) -> None:
        if self.flights.pop(flight.item.work_id, None) is None:
            return
        name = flight.family.name
        self._per_family[name] -= 1
        self.metrics.in_flight.labels(name).dec()
        self._slot_freed.set()
        self._slot_freed = trio.Event()
        if not self.flights:
            self._idle.set()

    async def _execute(self, flight: InFlight) -> None:
        try:
            ctx = WorkContext(
                item=flight.item,
                fence=flight.fence,
                store=self.store,
                clock=self.clock,
                replica_id=self.replica_id,
            )
            outcome = await self._run_handler(flight, ctx)
            flight.handled = True
            if outcome is None:
                return
            item = flight.item
            family = flight.family
            finalization = decide(
                outcome,
                fence=flight.fence,
                attempt=item.attempt,
                max_attempts=item.max_attempts,
                policy=family.backoff,
                jitter_sample=random.random(),
                now_us=self.clock.now_us(),
                family=family.name,
            )
            result = await self.completer.submit(finalization, flight,
                                                 _combined(ctx.side_writes))
            if result.applied and result.state is not None:
                self.metrics.finalized.labels(family.name, result.state.value).inc()
                if result.state in (WorkState.RETRY, WorkState.DEAD):
                    # Every retry and dead item is one WARNING line an operator can act on.
                    logs.warn("work_dead" if result.state is WorkState.DEAD else "work_retry",
                              family=family.name, work_id=item.work_id,
                              attempt=item.attempt, max_attempts=item.max_attempts,
                              failure_class=finalization.failure_class or "unclassified",
                              reason=finalization.summary or "")
                for name in ctx.wakes:
                    self.wake(name)
            elif result.error is not None:
                logs.warn("work_side_write_failed", work_id=item.work_id, family=family.name,
                          epoch=flight.fence.ownership_epoch, error=result.error)
            else:
                self._lost(flight, "finalize_refused")
        finally:
            self._forget(flight)

    async def _run_handler(self, flight: InFlight, ctx: WorkContext) -> Outcome | None:
        family = flight.family
        started = trio.current_time()
        outcome: Outcome | None = None
        with flight.scope:
            try:
                outcome = await family.handler(ctx)
            except LostLease:
                flight.stop_reason = flight.stop_reason or "lease_lost"
            except Exception as exc:  # a handler bug must not take the replica down
                logs.warn(
                    "work_handler_error",
                    work_id=flight.item.work_id,
                    family=family.name,
                    epoch=flight.fence.ownership_epoch,
                    error=type(exc).__name__,
                )
                ctx.side_writes.clear()  # a failed handler's pending writes are void
                ctx.wakes.clear()
                outcome = RetryLater("handler_error", f"handler raised {type(exc).__name__}")
        self.metrics.execution_seconds.labels(family.name).observe(trio.current_time() - started)
        if outcome is not None:
            # Finished before (or despite) a stop: the fenced finalize decides.
            return outcome
        reason = flight.stop_reason
        if reason is None:
            reason = "lease_untrusted"  # the scope's deadline (trust horizon) passed
        ctx.side_writes.clear()  # stopped early: the handler's writes are void
        if reason == "cancel_requested":
            return CancelAcknowledged()
        if reason == "drain":
            return Released()
        self._lost(flight, reason)
        return None

    def _lost(self, flight: InFlight, reason: str) -> None:
        self.metrics.lease_lost.labels(flight.family.name).inc()
        logs.warn(
            "work_lease_lost",
            work_id=flight.item.work_id,
            family=flight.family.name,
            epoch=flight.fence.ownership_epoch,
            reason=reason,
        )


def _combined(writes: list[SideWrite]) -> SideWrite | None:
    if not writes:
        return None

    async def all_writes(tx: SqlTx) -> None:
        for write in writes:
            await write(tx)

    return all_writes

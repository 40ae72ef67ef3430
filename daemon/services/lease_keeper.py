"""Renew the leases of in-flight work, and stop work whose lease is gone.

Every ``tick`` the keeper renews each flight whose last renewal is older than a
third of its TTL: the due flights of every family in one transaction of one
UPDATE (each family's TTL its own arm), on the adapter's reserved ``work.renew``
connection. One renewal a tick, never one family's after another's: on a slow
database (a loaded Galera cluster) sequential renewals added up, and the last
family's was sent late enough to lose its trust horizon. The new trust horizon
counts from when the renewal was *sent* (conservative: the database may have
applied it later). Lost leases and operator cancel requests stop their handlers. If
renewals fail (database unreachable), the horizons are left alone and run
out by themselves: that is what stops a replica cut off from the database.
"""

from __future__ import annotations

import attrs
import trio

from daemon.services import logs
from daemon.services.clock import Clock
from daemon.services.metrics import Metrics
from daemon.services.worker_pool import InFlight, WorkerPool
from storage.port import RenewGroup, StorageError
from storage.work_store import WorkStore


@attrs.define(eq=False)
class LeaseKeeper:
    store: WorkStore
    pool: WorkerPool
    clock: Clock
    metrics: Metrics
    lease_margin_s: float
    tick_s: float

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await trio.sleep(self.tick_s)
            await self.renew_due()

    async def renew_due(self) -> None:
        now = trio.current_time()
        due: dict[str, list[InFlight]] = {}
        for flight in list(self.pool.flights.values()):
            ttl = flight.family.settings.lease_ttl
            if now - flight.renewed_at >= ttl / 3:
                due.setdefault(flight.family.name, []).append(flight)
        if not due:
            return
        groups = [RenewGroup(tuple(f.fence for f in flights),
                             int(flights[0].family.settings.lease_ttl * 1_000_000))
                  for flights in due.values()]
        sent_at = trio.current_time()
        try:
            result = await self.store.work_renew_groups(groups, self.clock.now_us)
        except StorageError as exc:
            self.metrics.db_errors.labels("renew").inc()
            logs.warn("work_renew_failed", families=",".join(sorted(due)),
                      items=sum(len(f) for f in due.values()), error=str(exc))
            return
        lost = {f.work_id for f in result.lost}
        cancel = {f.work_id for f in result.cancel_requested}
        for flights in due.values():
            ttl_s = flights[0].family.settings.lease_ttl
            for flight in flights:
                work_id = flight.item.work_id
                if work_id in lost:
                    flight.stop("lease_lost")
                elif work_id in result.renewed:
                    flight.trust(sent_at, ttl_s, self.lease_margin_s)
                    if work_id in cancel:
                        flight.stop("cancel_requested")

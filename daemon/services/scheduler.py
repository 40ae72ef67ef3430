"""One claim loop per work family, in every replica.

The scheduler owns fairness, cadence and admission for its family; it does
not own exclusivity (the claim CAS in the database does). It claims when it
has free slots, as many items as it can run (in batches), immediately again
while batches come back full, and otherwise waits for the poll interval or a
local wake-up (an in-process enqueue, or a slot freed after it was full).
Expired leases are swept every ``reclaim_interval``. Database errors back off
exponentially to ``db_backoff_cap`` and never crash the replica.
"""

from __future__ import annotations

import math
import random

import attrs
import trio

from daemon.core.capability import ENGINE_CAPABILITY_VERSION
from daemon.core.claim_spread import NO_SPREAD, next_spread
from daemon.services import logs
from daemon.services.claim_peers import ClaimPeers
from daemon.services.clock import Clock
from daemon.services.families import WorkFamily
from daemon.services.metrics import Metrics
from daemon.services.worker_pool import WorkerPool
from storage.port import ClaimParams, Reclaim, StorageError
from storage.work_claims import MAX_FAIR_ORGS
from storage.work_store import WorkStore

IDLE_BACKOFF = 8


@attrs.define(eq=False)
class Scheduler:
    family: WorkFamily
    store: WorkStore
    pool: WorkerPool
    clock: Clock
    metrics: Metrics
    owner: str
    poll_interval_s: float
    reclaim_interval_s: float
    db_backoff_cap_s: float
    fairness_interval_s: float = 2.0
    # The live claimants of the family (advice: where claims start). None: alone.
    peers: ClaimPeers | None = None
    _wakeup: trio.Event = attrs.field(factory=trio.Event)
    _db_ok: bool = True
    _orgs: list[str] = attrs.field(factory=list)
    _org_turn: int = 0
    _orgs_seen_at: float = -math.inf
    _spread: int = NO_SPREAD

    def wake(self) -> None:
        self._wakeup.set()

    @property
    def db_ok(self) -> bool:
        return self._db_ok

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        batch = self.family.settings.batch_size
        pause = 0.05
        last_sweep = -math.inf
        busy = False
        idle_wait = self.poll_interval_s
        while True:
            free = self.pool.free_slots(self.family)
            # With work in flight, wait for a worthwhile number of free slots
            # rather than claiming one item at a time.
            if free == 0 or (free < max(1, batch // 4) and self.pool.in_flight(self.family)):
                await self.pool.wait_slot_freed()
                continue
            limit = min(batch, free)
            now = trio.current_time()
            sweep = now - last_sweep >= self.reclaim_interval_s
            rank, claimants = (self.peers.rank(self.family.name) if self.peers is not None
                               else (0, 1))
            try:
                orgs = await self._fair_orgs(now) if busy else ()
                result = await self.store.work_claim(
                    ClaimParams(
                        family=self.family.name,
                        owner=self.owner,
                        limit=limit,
                        lease_ttl_us=self.family.lease_ttl_us,
                        window=limit * 4,
                        include_expired=sweep,
                        rotation=random.randrange(1 << 30),
                        spread=self._spread,
                        stride=batch,
                        # Busy (the last claim was full): its own part of the ready
                        # set, where no claimant with its view of the peers races it; a
                        # short claim ends that until a full one (the tail of a drain:
                        # what is left is other claimants' oldest rows, taken by slot).
                        parted=busy,
                        rank=rank,
                        claimants=claimants,
                        orgs=orgs,
                        probe_first=not busy,
                        engine_capability_version=ENGINE_CAPABILITY_VERSION,
                        payload_schema_version=self.family.payload_schema_version,
                    ),
                    self.clock.now_us(),
                )
            except StorageError as exc:
                self.metrics.db_errors.labels("claim").inc()
                if self._db_ok:
                    logs.warn("work_claim_failed", family=self.family.name, error=str(exc))
                self._db_ok = False
                await trio.sleep(pause)
                pause = min(pause * 2, self.db_backoff_cap_s)
                continue
            busy = len(result.claimed) >= limit or bool(result.contended)
            self._spread = next_spread(self._spread, limit=limit, claimed=len(result.claimed),
                                       contended=result.contended)
            if not self._db_ok:
                logs.event("work_claim_resumed", family=self.family.name)
            self._db_ok = True
            pause = 0.05
            if sweep:
                last_sweep = now
            for item in result.claimed:
                self.pool.start(item, now)
            if result.claimed:
                self.metrics.claimed.labels(self.family.name).inc(len(result.claimed))
            if result.contended:
                self.metrics.claim_contention.labels(self.family.name).inc(result.contended)
            if result.expired_dead:
                self.metrics.expired_dead.labels(self.family.name).inc(len(result.expired_dead))
            if result.reclaimed:
                self._report_reclaims(result.reclaimed)
            if len(result.claimed) >= limit or result.contended:
                await trio.lowlevel.checkpoint()
                continue
            # An idle family polls less and less often (up to IDLE_BACKOFF x the poll
            # interval); a local wake-up or claimed work brings it back at once.
            if result.claimed:
                idle_wait = self.poll_interval_s
            with trio.move_on_after(idle_wait):
                await self._wakeup.wait()
            if self._wakeup.is_set() or result.claimed:
                idle_wait = self.poll_interval_s
            else:
                idle_wait = min(idle_wait * 2, self.poll_interval_s * IDLE_BACKOFF)
            self._wakeup = trio.Event()

    def _report_reclaims(self, reclaims: list[Reclaim]) -> None:
        """One log line per superseded lease (rare: its replica died, hung or was
        partitioned) and the counter; the journal already holds the execution."""
        self.metrics.reclaimed.labels(self.family.name).inc(len(reclaims))
        for r in reclaims:
            logs.warn("work_lease_reclaimed", family=self.family.name, work_id=r.work_id,
                      superseded_epoch=r.superseded_epoch, attempt=r.attempt,
                      previous_owner=r.previous_owner, reclaimed_by=self.owner,
                      disposition="dead" if r.dead else "reclaimed")

    async def _fair_orgs(self, now: float) -> tuple[str, ...]:
        """The next few orgs with ready work, in rotation (none when only one org waits)."""
        if now - self._orgs_seen_at >= self.fairness_interval_s:
            self._orgs = await self.store.work_ready_orgs(self.family.name, self.clock.now_us())
            self._orgs_seen_at = now
        if len(self._orgs) < 2:
            return ()
        start = self._org_turn % len(self._orgs)
        self._org_turn += MAX_FAIR_ORGS
        picked = (self._orgs[start:] + self._orgs[:start])[:MAX_FAIR_ORGS]
        return tuple(picked)

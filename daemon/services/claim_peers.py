"""Who else claims a family: the live replicas from the heartbeats (advice only).

A scheduler starts its claims in the slots of its rank among the live claimants of its
family (daemon/core/claim_spread.py ``claim_slot``), so that replicas claiming at the
same moment read different rows. The view is refreshed from the ``replicas`` table
every ``interval`` (one indexed read of a few rows, whatever the traffic); a stale or
wrong view costs lost claim races, never exclusivity: the claim UPDATE's row CAS
decides, and the lane rules stay in that statement.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import attrs
import trio

from daemon.core.claim_spread import peer_rank
from daemon.services import logs
from daemon.services.clock import Clock
from storage.port import ReplicaInfo, StorageError
from storage.work_store import WorkStore

# Replicas in these states claim (or are about to).
CLAIMING_STATES = frozenset({"starting", "running"})


def claimants_of(family: str, replicas: list[ReplicaInfo]) -> list[str]:
    """The replica ids of ``replicas`` that claim ``family`` (a replica's ``families``
    is the JSON list of the families it runs; an unreadable one is left out)."""
    out: list[str] = []
    for r in replicas:
        if r.state not in CLAIMING_STATES:
            continue
        try:
            names = json.loads(r.families)
        except ValueError:
            continue
        if isinstance(names, list) and family in names:
            out.append(r.replica_id)
    return out


@attrs.define(eq=False)
class ClaimPeers:
    store: WorkStore
    clock: Clock
    # The replica's id, read at each claim: daemon/cli.py sets a configured id (the unit's
    # ``%H-%i``) after the Replica is built, and a rank by any other id is wrong.
    replica_id: Callable[[], str]
    # A heartbeat older than this is a replica gone (two heartbeat intervals).
    live_for_s: float
    interval_s: float
    _live: list[ReplicaInfo] = attrs.field(factory=list)

    def rank(self, family: str) -> tuple[int, int]:
        """(rank, claimants) of this replica among the live claimants of ``family``."""
        return peer_rank(self.replica_id(), claimants_of(family, self._live))

    async def refresh(self) -> None:
        since = self.clock.now_us() - int(self.live_for_s * 1_000_000)
        try:
            self._live = await self.store.replica_list(since)
        except StorageError as exc:  # advice: keep the last view
            logs.warn("claim_peers_read_failed", error=str(exc))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        await self.refresh()
        task_status.started()
        while True:
            await trio.sleep(self.interval_s)
            await self.refresh()

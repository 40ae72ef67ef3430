"""A busy scheduler claims its own part of the ready set, and a short claim ends that
(issue 24 item 2, branch claims12; daemon/services/scheduler.py, storage/work_claims.py).

One of two live claimants (the other a peer in the heartbeats that never claims: busy,
or about to die) drains a ready set alone. Its parted claims take its own part and what
the peer's part holds beyond its oldest batch, then come back short; the next claim,
one poll interval later, is not parted and takes the rest by slot: no row waits for its
owner. Real parts: SQLite, the worker pool, the completer and the noop handler; the peer
view is set as the heartbeats would give it. MockClock (autojump): the poll interval is
trio time.
"""

from __future__ import annotations

import json

import attrs
import pytest
import trio
import trio.testing

from config.settings import FamilySettings
from daemon.core.claim_spread import claim_part
from daemon.core.states import WorkState
from daemon.services.claim_peers import ClaimPeers
from daemon.services.clock import TrioClock
from daemon.services.completer import Completer
from daemon.services.families import build_registry, noop_handler
from daemon.services.metrics import Metrics
from daemon.services.scheduler import Scheduler
from daemon.services.worker_pool import WorkerPool
from storage.port import ClaimParams, ClaimResult, ReplicaInfo, WorkQuery
from storage.work_store import WorkStore
from tests.support.harness import settings, wait_for
from tests.support.work import enqueue

POLL_S = 0.25


@pytest.fixture
def backend() -> str:
    return "sqlite"  # autojump: a network adapter's own deadlines would jump too
BATCH = 4


@attrs.define(eq=False)
class Claim:
    at: float
    parted: bool
    limit: int
    claimed: list[str]


class RecordingStore(WorkStore):
    """The real store, recording each claim's parameters and what it took."""

    claims: list[Claim]

    async def work_claim(self, params: ClaimParams, now_us: int) -> ClaimResult:
        result = await super().work_claim(params, now_us)
        self.claims.append(Claim(trio.current_time(), params.parted, params.limit,
                                 [i.work_id for i in result.claimed]))
        return result


async def _succeeded(store: WorkStore) -> int:
    items = await store.work_list(WorkQuery(family="noop", state=WorkState.SUCCEEDED,
                                            limit=100))
    return len(items)


def _peer(replica_id: str) -> ReplicaInfo:
    return ReplicaInfo(replica_id=replica_id, hostname="h", pid=1, version="v",
                       state="running", families=json.dumps(["noop"]), started_at_us=0,
                       heartbeat_at_us=0)


async def test_a_part_its_owner_does_not_claim_is_taken_one_poll_later(
    store: WorkStore, autojump_clock: trio.testing.MockClock,
) -> None:
    clock = TrioClock()
    ids = await enqueue(store, 40, now=clock.now_us())
    mine = {i for i in ids if i[-1] in claim_part(0, 2)}
    theirs = sorted(set(ids) - mine)
    assert len(mine) >= BATCH and len(theirs) >= 2 * BATCH  # 40 random ids: about 20 each
    recording = RecordingStore(store.db, store.dialect)
    recording.claims = []
    cfg = settings({"noop": FamilySettings(batch_size=BATCH, concurrency=2 * BATCH)})
    registry = build_registry(cfg, {"noop": noop_handler})
    metrics = Metrics()
    completer = Completer(recording, clock, metrics, "r-a", backoff_cap_s=1.0)
    pool = WorkerPool(store=recording, registry=registry, clock=clock, metrics=metrics,
                      completer=completer, replica_id="r-a", lease_margin_s=2.0,
                      global_limit=2 * BATCH)
    peers = ClaimPeers(store=recording, clock=clock, replica_id=lambda: "r-a",
                       live_for_s=10.0, interval_s=1.0)
    peers._live = [_peer("r-a"), _peer("r-b")]  # as the heartbeats give it: rank 0 of 2
    scheduler = Scheduler(family=registry.get("noop"), store=recording, pool=pool,
                          clock=clock, metrics=metrics, owner="r-a",
                          poll_interval_s=POLL_S, reclaim_interval_s=60.0,
                          db_backoff_cap_s=1.0, peers=peers)
    async with trio.open_nursery() as nursery:
        await nursery.start(completer.run)
        await nursery.start(pool.run)
        await nursery.start(scheduler.run)
        started = trio.current_time()

        async def drained() -> bool:
            return await _succeeded(recording) == len(ids)

        await wait_for(drained, within_s=30)
        nursery.cancel_scope.cancel()
    claims = [c for c in recording.claims if c.claimed]
    taken = [i for c in claims for i in c.claimed]
    assert sorted(taken) == sorted(ids)  # each once: nothing waits for the absent owner
    # The first claim (idle before) is not parted; a full claim makes the next parted.
    assert not recording.claims[0].parted
    for before, after in zip(recording.claims, recording.claims[1:], strict=False):
        full = len(before.claimed) >= before.limit
        assert after.parted == full, (before, after)
    # Parted claims took only this claimant's part and the peer's newest rows; the peer's
    # oldest batch (what its owner would claim next) was left to a claim not parted, which
    # came one poll interval after the last parted one came back short.
    parted = [i for c in claims if c.parted for i in c.claimed]
    assert set(theirs[:BATCH]).isdisjoint(parted)
    short = min(c.at for c in recording.claims if c.parted and len(c.claimed) < c.limit)
    rest = [c for c in claims if not c.parted and c.at > short]
    assert rest and rest[0].at - short <= 1.5 * POLL_S
    assert trio.current_time() - started < 10 * POLL_S

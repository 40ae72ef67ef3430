"""Aimed freezes: the two stale-claimant windows the chaos's own freezes reach only by luck.

The chaos (``sim/world.py``'s ``chaos``) freezes a replica in front of a kind of
transaction drawn at random. Two windows matter for the fences of issue 20 and are narrow:

* **a stale finalization**: a replica frozen after a handler returned, in front of the
  finalization that records it, past its lease; another replica reclaims the item, runs it
  and finalizes it; the thawed one's finalization must match nothing (the fenced UPDATE).
  An effect's finalization carries its own guard besides (its attempt's outcome may be
  written once, and a reclaimer disposes the earlier attempt first), so the window that
  shows the fence alone is a finalization of an item with no side writes: a ``noop``;
* **a stale token refresh**: a replica frozen in front of a refresh's dispatch marker, past
  its WorkItem lease but within the 30 s refresh lease; another replica reclaims the item;
  the thawed one must not mark nor call the token endpoint (the marker's WorkItem fence).

Each seed with faults draws, from a generator of its own (so the world's draws, and the
seeds that draw no aimed freeze, keep their schedules), whether it aims each of them, and
when. An aimed freeze waits until no other freeze is on (one at a time, as the chaos's).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import trio

from bench import torture
from daemon.core.states import TERMINAL
from storage.port import FinalizeResult

if TYPE_CHECKING:
    from daemon.services.assembly import Assembly
    from sim.world import SimReplica, World
    from storage.work_store import WorkStore

# Families whose finalization writes nothing but the WorkItem row and its journal entry.
PLAIN_FAMILIES = ("noop",)


def rng_for(seed: int) -> random.Random:
    return random.Random(f"aim:{seed}")


def watch(world: World, r: SimReplica, parts: Assembly, store: WorkStore) -> None:
    """The replica's hooks: a plain family's handler that returns on a replica armed for a
    stale finalization arms the freeze in front of that replica's next finalization (the
    one that records it, or the batch after the one already in flight, which records it);
    and the oracle ``finalized_without_live_claim``."""
    families = parts.registry.families
    for name in PLAIN_FAMILIES:
        family = families.get(name)
        if family is None:
            continue
        inner = family.handler

        async def watched(ctx: Any, inner: Any = inner) -> Any:
            outcome = await inner(ctx)
            db = world.aim_armed.pop(r.node, None)
            if db is not None and db is r.db:  # the incarnation that was armed
                r.db.freeze_at = "work.finalize"
            return outcome

        families[name] = _evolve(family, watched)
    finalize = store.work_finalize_if_owner

    async def judged(finalizations: Any, replica: str, now: Any,
                     side_writes: Any = None) -> list[FinalizeResult]:
        results = await finalize(finalizations, replica, now, side_writes)
        finalized_without_live_claim(world, r, results)
        return results

    store.work_finalize_if_owner = judged  # type: ignore[method-assign]


def finalized_without_live_claim(world: World, r: SimReplica,
                                 results: list[FinalizeResult]) -> None:
    """The oracle, at the instant a finalization returns: an item the store says it moved
    to a terminal state under this claim's fence must carry that fence's ownership epoch
    and lease token (the fenced UPDATE changes neither; a terminal row is never claimed
    again), or the finalization matched a row another claim owned: a stale claimant
    recorded its outcome over the live one's."""
    for result in results:
        if not result.applied or result.state not in TERMINAL:
            continue
        fence = result.fence
        row = world.observer.execute(
            "SELECT ownership_epoch, lease_token, state FROM work_items WHERE work_id = ?",
            (fence.work_id,)).fetchone()
        if row is None or (int(row[0]), row[1]) != (fence.ownership_epoch, fence.lease_token):
            world.violation("finalized_without_live_claim", node=r.node,
                            work_id=fence.work_id, epoch=fence.ownership_epoch,
                            row=None if row is None else [int(row[0]), row[2]])


def _evolve(family: Any, handler: Any) -> Any:
    import attrs

    return attrs.evolve(family, handler=handler)


async def aimed_freezes(world: World) -> None:
    """During the chaos: a stale refresh, then a stale finalization, each in about half
    the seeds, early (the chaos's own freezes wait meanwhile: one freeze at a time). The
    refresh first: its marker comes only every few seconds, a noop finishes every moment."""
    rng = rng_for(world.options.seed)
    kinds = [k for k in ("stale_refresh", "stale_finalize") if rng.random() < 0.5]
    if not kinds:
        return
    await trio.sleep(rng.uniform(0.5, 3.0))
    for _ in range(120):  # a chaos freeze may be on: wait for its thaw (polled)
        if not world.frozen:
            break
        await trio.sleep(0.5)
    else:
        return
    world.frozen.add("aim")  # the chaos starts no freeze of its own meanwhile
    try:
        for kind in kinds:
            await _freeze(world, rng, kind)
            await trio.sleep(rng.uniform(0.5, 2.0))
    finally:
        world.frozen.discard("aim")


async def _freeze(world: World, rng: random.Random, kind: str) -> None:
    """Arm every live replica (while two or more live): the first to reach the window is
    frozen; the others are disarmed."""
    from sim.world import REFRESH_LEASE_S

    assert world.net is not None
    armed = [r for r in world.replicas if r.alive and r.db is not None]
    if len(armed) < 2:
        return
    frozen = trio.Event()
    victims: list[SimReplica] = []

    def stopper(victim: SimReplica) -> Any:
        def stop(name: str) -> None:
            assert world.net is not None
            if frozen.is_set():
                return
            world.trace("freeze", node=victim.node, at=name, aimed=kind)
            world.count_fault("process.freeze_aimed")
            world.frozen.add(victim.node)
            world.net.freeze(victim.node)
            victims.append(victim)
            frozen.set()
            disarm()
        return stop

    dbs = {r.node: r.db for r in armed}
    stops = {r.node: stopper(r) for r in armed}

    def disarm() -> None:
        for r in armed:
            db = dbs[r.node]
            world.aim_armed.pop(r.node, None)
            if db is not None and db.on_freeze is stops[r.node]:
                db.freeze_at = None

    for r in armed:
        db = dbs[r.node]
        assert db is not None
        db.on_freeze = stops[r.node]
        if kind == "stale_finalize":
            world.aim_armed[r.node] = db
        else:
            db.freeze_at = "refresh.dispatch"
    try:
        # A noop finishes every moment; a refresh's marker comes about every 10 s per
        # grant, on whichever replica needs a token.
        with trio.move_on_after(rng.uniform(10.0, 25.0)):
            await frozen.wait()
        if not frozen.is_set():
            world.trace("freeze_not_aimed", aimed=kind)
            return
        past = torture.LEASE_TTL_S + torture.LEASE_MARGIN_S
        if kind == "stale_finalize":
            # Past the lease, long enough for another replica to reclaim the item, run it
            # and finalize it before the thaw.
            await trio.sleep(past + rng.uniform(2.0, 6.0))
        else:
            # Past the WorkItem lease, within the refresh lease (seed 5.1's stale
            # claimant): another replica reclaims the item meanwhile.
            await trio.sleep(rng.uniform(past + 2.0, REFRESH_LEASE_S - 3.0))
    finally:
        # Also when the chaos ends first (this task is cancelled): never left frozen.
        disarm()
        for victim in victims:
            world.frozen.discard(victim.node)
            world.net.thaw(victim.node)
            world.trace("thaw", node=victim.node)

"""Which replicas the ``two_trusted_leases`` oracle counts as running an item on a trusted
lease (``sim.oracles.trusting_handlers``): a handler still running within its trust
horizon, on a live, unfrozen replica. A flight whose handler has returned only waits for
its fenced finalization and is not counted (seed 78 of a claims branch fired the oracle
for one whose finalization's answer was lost while another replica claimed the retried
item: nothing was sent). Table-driven, negative rows included."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import trio

from sim.oracles import trusting_handlers
from sim.world import Options, SimReplica, World

WORK_ID = "01WORK"
NOW = 100.0


def _replica(index: int, *, epoch: int | None, handled: bool = False,
             trusted_until: float = NOW + 5, alive: bool = True) -> SimReplica:
    r = SimReplica(index=index, config=Path(f"replica-{index}.toml"), skew_us=0)
    if alive:
        r.scope = trio.CancelScope()
    flights = {} if epoch is None else {WORK_ID: SimpleNamespace(
        handled=handled, trusted_until=trusted_until,
        fence=SimpleNamespace(ownership_epoch=epoch))}
    r.replica = SimpleNamespace(pool=SimpleNamespace(flights=flights))  # type: ignore[assignment]
    return r


@pytest.mark.parametrize(("replicas", "frozen", "expected"), [
    # Two handlers running within their horizons: both count (the violation).
    ([_replica(0, epoch=1), _replica(1, epoch=2)], set(), [("replica-0", 1), ("replica-1", 2)]),
    # The first one's handler has returned (its finalization is in doubt): only the other.
    ([_replica(0, epoch=1, handled=True), _replica(1, epoch=2)], set(), [("replica-1", 2)]),
    # Past its trust horizon, frozen, or dead: not running on a trusted lease.
    ([_replica(0, epoch=1, trusted_until=NOW), _replica(1, epoch=2)], set(),
     [("replica-1", 2)]),
    ([_replica(0, epoch=1), _replica(1, epoch=2)], {"replica-0"}, [("replica-1", 2)]),
    ([_replica(0, epoch=1, alive=False), _replica(1, epoch=2)], set(), [("replica-1", 2)]),
    # No flight of the item at all.
    ([_replica(0, epoch=None), _replica(1, epoch=2)], set(), [("replica-1", 2)]),
])
def test_trusting_handlers(replicas: list[SimReplica], frozen: set[str],
                           expected: list[tuple[str, int]], tmp_path: Path) -> None:
    world = World(Options(seed=1), random.Random(1), tmp_path)
    world.replicas = replicas
    world.frozen = set(frozen)
    assert trusting_handlers(world, WORK_ID, NOW) == expected

"""How much of a provider's limit a backlog uses, on simulated time (issue 20 item 4).

    python -m sim.quota_use [--replicas 4] [--limit 40] [--jitter 0.1] [--items 500]

Theory of operation
-------------------
On this 2-core machine, loaded by other work, the wall-clock ``bench.effects
--provider-limit`` measures how fast the replicas can prepare claims as much as what the
quota design leaves unused. Here the same production code runs on a
``MockClock(autojump_threshold=0)`` in the simulation's world (:mod:`sim.world`: the
virtual network, SQLite statements inline, the HubSpot simulator): virtual time moves only
when every task waits on a timer, so computing costs no time at all, and every slot the
provider does not see used was lost by the design itself (a wait, a poll, a lead, a turn),
never by a slow machine.

The layout is ``bench.effects --provider-limit L --provider-jitter J`` (its own
configuration, written by :func:`bench.effects.write_config`): R replicas, one reference
Runtime each (its own org), every binding counting against one provider key of ``L``
requests a second. No faults. Every Runtime changes the title of each of its Leads once,
at virtual time 0 (``items`` in all, each on its own record so no lane holds one back):
the backlog waits on the quota alone. The run ends when every intent is COMMITTED.

What the provider saw (PATCH arrivals at the simulator, by its own clock), from the
first arrival to the last (the backlog waited all that time):
``limit_use`` (arrivals / what the limit allowed in that span), ``window_counts`` (each
whole window of the span, back to back), ``windows_under_90``, ``windows_over`` (windows
of the provider's own length, one starting at each arrival, holding more than the limit)
and the ``longest_gap_s``; and where the work went (``items_by_state``, executions by
outcome and reason: a wait for quota is a ``deferred:quota_wait``, never an attempt).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import attrs
import trio
import trio.testing

from bench.effects import (
    provider_figures,
    publish_catalog,
    runtimes_for,
    secrets_env,
    seed_links,
    work_journal,
    write_config,
)
from daemon.services.clock import TrioClock
from sandbox.hubspot_sim import HubSpotSimulator
from sandbox.runtime.server import serve as serve_runtime
from sim import oracles, serving
from sim.determinism import EPOCH_US, deterministic, reseed_scheduler
from sim.net import NODE, NetFaults, VirtualNetwork
from sim.storage import StorageFaults
from sim.world import (
    Options,
    SimReplica,
    World,
    log_to_trace,
    restored_process_state,
    supervise,
)

HUBSPOT_PORT = 7301
API_PORT, RUNTIME_PORT = 7100, 7200
# How long the run may take in virtual time before it gives up (the backlog at the
# limit takes items / (limit * use) seconds).
VIRTUAL_DEADLINE_S = 600.0


@attrs.frozen(kw_only=True)
class Scenario:
    replicas: int = 4
    limit: int = 40  # requests a second, one key shared by every replica
    jitter_s: float = 0.1  # the L1 dimension's declared jitter
    items: int = 500  # title changes, all at virtual time 0, each on its own Lead
    max_attempts: int = 3
    seed: int = 1
    # A share of the database statements that take a while (10 ms to ``slow_max_s``, the
    # transaction held meanwhile: :mod:`sim.storage`), so that preparing a claim takes
    # time; 0: computing and storage cost nothing.
    slow_statements: float = 0.0
    slow_max_s: float = 0.05

    @property
    def per_runtime(self) -> int:
        return self.items // self.replicas


def _configs(s: Scenario, workdir: Path) -> list[Path]:
    """``bench.effects``' configuration with its provider limit, on the simulation's file
    (SQLite, ``synchronous = NORMAL``: COMMIT is inline) and ports."""
    url = f"sqlite:///{workdir / 'sim.db'}"
    api = [API_PORT + i for i in range(s.replicas)]
    runtime = [RUNTIME_PORT + i for i in range(s.replicas)]
    configs = []
    for i in range(s.replicas):
        cfg = write_config(workdir, url, i, s.replicas, api, runtime, HUBSPOT_PORT,
                           provider_limit=s.limit, provider_jitter_s=s.jitter_s,
                           max_attempts=s.max_attempts)
        cfg.write_text(cfg.read_text().replace(
            "pool_size = 16\n", 'pool_size = 16\nsqlite_synchronous = "NORMAL"\n'))
        configs.append(cfg)
    return configs


async def _setup(s: Scenario, workdir: Path, first_config: Path) -> None:
    url = f"sqlite:///{workdir / 'sim.db'}"
    await seed_links(url, s.replicas, s.per_runtime)
    await publish_catalog(url, first_config)


async def _main(world: World, s: Scenario, dumped: bool) -> dict[str, Any]:
    net = VirtualNetwork(world.rng, NetFaults(), world.trace, world.count_fault)
    net.enabled = False
    world.net = net
    net.install()
    serving.install()
    oracles.install(world)
    hubspot = HubSpotSimulator(tokens={"bench-hubspot-token"})
    runtimes = runtimes_for(s.replicas, [API_PORT + i for i in range(s.replicas)])
    world.replicas = [SimReplica(i, world.configs[i], skew_us=0) for i in range(s.replicas)]
    world.op_clock = TrioClock(EPOCH_US)
    url = f"sqlite:///{world.workdir / 'sim.db'}"
    result: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        NODE.set("hubspot")
        await nursery.start(hubspot.run, "127.0.0.1", HUBSPOT_PORT)
        for i, rt in enumerate(runtimes):
            NODE.set(f"runtime-{i}")
            await nursery.start(serve_runtime, rt, "127.0.0.1", RUNTIME_PORT + i)
            for k in range(s.per_runtime):
                rt.store.create_lead({"lead_id": f"lead-{k}", "title": "Engineer"})
                hubspot.add_contact(f"{i * 100000 + k}", jobtitle="Engineer")
        NODE.set("world")
        for r in world.replicas:
            await nursery.start(supervise, world, r)
        began = trio.current_time()
        for rt in runtimes:
            for k in range(s.per_runtime):
                rt.store.update_lead(f"lead-{k}", {"title": f"Title {k}"})
            rt.wakeup.set()
        total = s.per_runtime * s.replicas

        def committed_now() -> int:
            return sum(rt.store.stats()["intents_by_status"].get("COMMITTED", 0)
                       for rt in runtimes)

        with trio.move_on_after(VIRTUAL_DEADLINE_S):
            while True:  # the Runtimes' stores have no event to wait on: polled
                if committed_now() >= total:
                    break
                await trio.sleep(0.05)
        committed = committed_now()
        patches = [r for r in hubspot.requests if r.method == "PATCH"]
        result = {
            "scenario": attrs.asdict(s),
            "committed": committed, "intents": total,
            "virtual_s": round(trio.current_time() - began, 3),
            "patch_requests": len(patches),
            "duplicate_patches": sum(1 for p in patches if p.applied) - total,
            **provider_figures([p.received_at for p in patches], s.limit),
            **await work_journal(url),
            "oracle_violations": list(world.violations),
            "db_transactions_per_item": round(world.ops["db_transactions"] / max(1, total), 2),
        }
        if dumped:
            result["dump"] = {
                "reservations": world.observer.execute(
                    "SELECT position_us, slot_at_us, expires_at_us, created_at_us,"
                    " updated_at_us, state, work_id, ownership_epoch FROM quota_reservations"
                    " ORDER BY position_us").fetchall(),
                "arrivals": sorted(p.received_at for p in patches),
                "trace": world.trace_lines}
        await world.drain_replicas()
        nursery.cancel_scope.cancel()
    world.observer.close()
    return result


def run(s: Scenario, dump: Path | None = None) -> dict[str, Any]:
    """One run of the scenario, start to end: what the provider saw of its limit.
    ``dump``: a file for every reservation (by position), the arrivals and the trace's
    tail, to see where a slot went."""
    workdir = Path(tempfile.mkdtemp(prefix="integrationd-quota-use-"))
    try:
        with restored_process_state(), deterministic(s.seed) as rng:
            world = World(Options(seed=s.seed, replicas=s.replicas,
                                  faults=s.slow_statements > 0), rng, workdir)
            world.net_faults = NetFaults()
            world.storage_faults = StorageFaults(slow=s.slow_statements,
                                                 max_slow_s=s.slow_max_s)
            world.operator_links = False
            os.environ.update(secrets_env(s.replicas))
            world.configs = _configs(s, workdir)
            log_to_trace(world)
            trio.run(_setup, s, workdir, world.configs[0], clock=trio.testing.MockClock())
            reseed_scheduler(s.seed)
            result: dict[str, Any] = trio.run(
                _main, world, s, dump is not None,
                clock=trio.testing.MockClock(autojump_threshold=0))
        if dump is not None:
            dump.write_text(json.dumps(result.pop("dump")))
        return result
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    defaults = Scenario()
    parser.add_argument("--replicas", type=int, default=defaults.replicas)
    parser.add_argument("--limit", type=int, default=defaults.limit)
    parser.add_argument("--jitter", type=float, default=defaults.jitter_s)
    parser.add_argument("--items", type=int, default=defaults.items)
    parser.add_argument("--max-attempts", type=int, default=defaults.max_attempts)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--slow-statements", type=float, default=0.0,
                        help="the share of statements that take 10 ms to --slow-max")
    parser.add_argument("--slow-max", type=float, default=defaults.slow_max_s)
    parser.add_argument("--dump", type=Path, metavar="FILE",
                        help="write every reservation, the arrivals and the trace's tail")
    args = parser.parse_args()
    print(json.dumps(run(Scenario(replicas=args.replicas, limit=args.limit,
                                  jitter_s=args.jitter, items=args.items,
                                  max_attempts=args.max_attempts, seed=args.seed,
                                  slow_statements=args.slow_statements,
                                  slow_max_s=args.slow_max),
                              args.dump)))


if __name__ == "__main__":
    main()

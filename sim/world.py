"""The whole system in one trio run, driven by one seed.

Theory of operation
-------------------
:func:`run_seed` builds, inside one ``trio.run`` on a ``MockClock(autojump_threshold=0)``:

* the HubSpot, OAuth and Outreach simulators and one reference Runtime per replica
  (``bench.effects``' layout: each Runtime its own org, calling its replica's /v1 API),
  each in its own network *node*;
* R replicas, each built exactly as ``integrationd run`` builds one (``assemble`` and
  ``Replica`` from ``daemon/services``), with its own SQLite connection on one shared file
  (WAL; ``synchronous = NORMAL`` so COMMIT is inline) wrapped by
  :class:`sim.storage.FaultyDatabase`, its own wall clock (virtual time plus a skew spread
  over ``work.clock_spread``), and a new replica id at every incarnation;
* the torture run's traffic (``bench/torture.py``): Lead title changes in every Runtime
  (command -> WorkItem -> PATCH -> receipt), noop work, signed Outreach webhooks to the
  replicas' ingress listeners; and an operator replaying dead work through the same
  storage call the CLI's ``work replay`` makes;
* the fault schedule: network faults (:mod:`sim.net`), storage faults
  (:mod:`sim.storage`), crashes (a replica's sockets and connection die at once, then its
  tasks are cancelled; it restarts later with a new identity), freezes past the lease
  (every socket and statement of the replica waits; then it resumes where it was),
  partitions between a replica and a provider, and Runtime/simulator restarts.

Every probability is drawn from the seed (swarm testing: each seed enables its own mix).
After the chaos, the faults stop and every replica runs until everything settles; the
oracles (:mod:`sim.oracles`) judge the journals and the database. The trace is one line
per event (virtual time, kind, fields) and its SHA-256 is the seed's digest.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import trio
import trio.testing

from bench import torture
from bench import torture_webhooks as webhooks
from bench.effects import publish_catalog, runtimes_for, scope_of, secrets_env, seed_links
from bench.l1_copy import l1_copy
from config.catalog import load_catalog
from config.load import load_settings
from daemon.core.states import TERMINAL, WorkState
from daemon.core.work import WorkSpec
from daemon.services import logs, operator_api
from daemon.services.assembly import Assembly, assemble
from daemon.services.catalog_view import publish_current
from daemon.services.clock import TrioClock
from daemon.services.command_actions import repair_command, retire_command
from daemon.services.families import known_family_names
from daemon.services.link_operations import bind_remote_record
from daemon.services.metrics import Metrics
from daemon.services.principal_bootstrap import ensure_config_bindings
from daemon.services.replica import Replica
from daemon.services.token_refresh import TokenOwner
from sandbox.hubspot_sim import HubSpotSimulator
from sandbox.oauth_sim import OAuthSimulator
from sandbox.runtime import ReferenceRuntime
from sandbox.runtime.server import serve as serve_runtime
from sim import aim, operators_extra, oracles, serving
from sim import subscriptions as subscription_world
from sim.determinism import EPOCH_US, deterministic, reseed_scheduler
from sim.net import NODE, NetFaults, VirtualNetwork
from sim.storage import FaultyDatabase, StorageFaults
from storage.command_repair import RepairActor
from storage.effect_values import Settlement
from storage.port import StorageError
from storage.sqlite.adapter import SqliteDatabase
from storage.work_store import WorkStore

QUOTA_LIMIT = 4  # PATCHes per window per app installation (one per Runtime)
QUOTA_WINDOW_S = 1.0
QUOTA_JITTER_S = 0.25
LEADS = 50  # >= webhooks.PROSPECTS: every Prospect is linked to one of Runtime 0's Leads
PORTS = {"hubspot": 7301, "oauth": 7302, "outreach": 7303}
API_PORT, RUNTIME_PORT, INGRESS_PORT = 7100, 7200, 7400
TRACE_TAIL = 40
TERMINAL_STATES = frozenset(state.value for state in TERMINAL)
REFRESH_LEASE_S = int(attrs.fields(TokenOwner).lease_us.default or 0) / 1e6  # its refresh lease
# Transactions a freeze may land in front of ("" any).
FREEZE_POINTS = ("", "work.finalize", "work.finalize", "effect.checkpoint", "refresh.dispatch",
                 "refresh.dispatch", "refresh.dispatch", "refresh.activate",
                 "ingress.receipt", "work.renew", "work.fences_live")


@attrs.define
class Options:
    seed: int
    duration_s: float = 30.0
    replicas: int = 3
    settle_s: float = 240.0
    title_rate: float = 3.0  # title changes per simulated second, over every Runtime
    webhook_rate: float = 1.0
    faults: bool = True
    full_trace: bool = False  # keep every line (a diff of two runs), not only the tail


@attrs.define(eq=False)
class SimReplica:
    index: int
    config: Path
    skew_us: int
    incarnation: int = 0
    scope: trio.CancelScope | None = None
    db: FaultyDatabase | None = None
    replica: Replica | None = None
    parts: Assembly | None = None
    done: trio.Event = attrs.field(factory=trio.Event)

    @property
    def node(self) -> str:
        return f"replica-{self.index}"

    @property
    def alive(self) -> bool:
        return self.scope is not None and not self.done.is_set()


class Violation(Exception):
    """An oracle saw a broken promise (the run stops at once: the trace's tail shows why)."""


@attrs.define(eq=False)
class World:
    options: Options
    rng: Any
    workdir: Path
    trace_lines: list[str] = attrs.field(factory=list)
    digest: Any = attrs.field(factory=hashlib.sha256)
    faults: collections.Counter[str] = attrs.field(factory=collections.Counter)
    ops: collections.Counter[str] = attrs.field(factory=collections.Counter)
    violations: list[dict[str, Any]] = attrs.field(factory=list)
    replicas: list[SimReplica] = attrs.field(factory=list)
    net: VirtualNetwork | None = None
    frozen: set[str] = attrs.field(factory=set)
    noop_ids: list[str] = attrs.field(factory=list)
    observer: Any = None  # sqlite3 connection the continuous oracles read through
    hooks: Any = None  # bench.torture_webhooks.Webhooks
    configs: list[Path] = attrs.field(factory=list)
    net_faults: NetFaults = attrs.field(factory=NetFaults)
    storage_faults: StorageFaults = attrs.field(factory=StorageFaults)
    replayed: list[str] = attrs.field(factory=list)
    stopping: bool = False
    patch_sends: list[tuple[float, str]] = attrs.field(factory=list)  # (when, path)
    settling: bool = False
    simulated_s: float = 0.0
    # Commit order (:meth:`next_seq`): the oracles order operator actions against
    # checkpoints by it (virtual time cannot: both may happen at one instant).
    seq: int = 0
    checkpoint_began: dict[str, int] = attrs.field(factory=dict)  # attempt id -> order
    link_moves: dict[str, list[tuple[int, int]]] = attrs.field(factory=dict)  # (order, gen)
    rebound: set[tuple[int, str]] = attrs.field(factory=set)  # (Runtime, Lead) rebound
    retired: dict[str, str] = attrs.field(factory=dict)  # command id -> its settlement
    operator_commands: bool = False  # cancels, retires and repairs (drawn per seed)
    stopped: set[tuple[int, str]] = attrs.field(factory=set)  # (Runtime, Lead) retired
    to_retire: dict[str, str] = attrs.field(factory=dict)  # work id -> command id
    commands_rng: Any = None
    claims_sent: set[tuple[str, int]] = attrs.field(factory=set)  # a PATCH of it left
    op_clock: TrioClock | None = None  # the operator's wall clock (no skew)
    operator_links: bool = True  # rebinds and Catalog publishes (drawn per seed)
    aim_armed: dict[str, Any] = attrs.field(factory=dict)  # node -> its db, armed (sim.aim)
    subscriptions: Any = None  # sim.subscriptions.Subscriptions (drawn per seed) or None
    # Operators with their own generators (sim/operators_extra.py), and what they
    # watch of the replicas' commits (name, the order it began, its result).
    extra: list[Any] = attrs.field(factory=list)
    commit_hooks: list[Callable[[str, int, Any], None]] = attrs.field(factory=list)
    # Called as a replica's handler starts (family, its context), and, when an operator
    # owns the noop traffic's source (sim/operators_cutover.py), what enqueues it.
    handler_hooks: list[Callable[[str, Any], None]] = attrs.field(factory=list)
    noop_source: Callable[[int], Awaitable[None]] | None = None

    # ------------------------------------------------------------ the trace
    async def drain_replicas(self) -> None:
        """The run's end: every live replica drains (at most 30 simulated seconds each)."""
        self.stopping = True
        for r in self.replicas:
            if r.replica is not None and r.alive:
                r.replica.request_drain()
        for r in self.replicas:
            with trio.move_on_after(30):
                await r.done.wait()

    def trace(self, kind: str, **fields: Any) -> None:
        line = json.dumps([round(trio.current_time(), 6), kind, fields], sort_keys=True,
                          default=str)
        self.digest.update(line.encode() + b"\n")
        self.trace_lines.append(line)
        if len(self.trace_lines) > 4 * TRACE_TAIL and not self.options.full_trace:
            del self.trace_lines[:-TRACE_TAIL]

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def on_committed(self, name: str, began: int, result: Any) -> None:
        """A replica's transaction committed: the attempts a dispatch checkpoint wrote, with
        the order in which its transaction began."""
        oracles.on_committed(self, name)
        for hook in self.commit_hooks:
            hook(name, began, result)
        if not name.startswith("effect.checkpoint"):
            return
        for attempt_id in result if isinstance(result, list) else [result]:
            if isinstance(attempt_id, str):
                self.checkpoint_began[attempt_id] = began

    def count_transaction(self) -> None:
        self.ops["db_transactions"] += 1

    def count_fault(self, kind: str) -> None:
        self.faults[kind] += 1

    def violation(self, oracle: str, **facts: Any) -> None:
        self.trace("violation", oracle=oracle, **facts)
        self.violations.append({"oracle": oracle, **facts})

    async def gate(self, node: str) -> None:
        assert self.net is not None
        await self.net.gate(node)


class _TraceLogs(logging.Handler):
    """integrationd's structured log events, into the trace (event name and ids)."""

    def __init__(self, world: World) -> None:
        super().__init__(logging.INFO)
        self.world = world

    def emit(self, record: logging.LogRecord) -> None:
        fields = getattr(record, "fields", None) or {}
        keep = {k: v for k, v in sorted(fields.items())
                if k in ("work_id", "replica", "reason", "family", "epoch", "error",
                         "outcome", "state", "route", "binding")}
        self.world.trace("log", node=NODE.get(), event=record.getMessage(), **keep)


# ---------------------------------------------------------------- set-up


def quota_violations(sends: list[tuple[float, str]]) -> tuple[int, int]:
    """Windows of ``QUOTA_WINDOW_S`` on one app installation (Runtime *r*'s contacts are
    ``r * 100000 + i``) in which more than ``QUOTA_LIMIT`` PATCHes left the replicas, and
    the peak. Judged when they left, not when they arrived: the virtual network delays
    requests by up to 1.5 s, far past the quota's 250 ms jitter, and no sender can keep a
    delayed request from arriving with later ones (seed 22 saw 5 arrive in one window that
    left at most 4 per window)."""
    arrivals: dict[int, list[float]] = collections.defaultdict(list)
    for at, path in sends:
        arrivals[int(path.rsplit("/", 1)[1].split("?")[0]) // 100000].append(at)
    violations = peak = 0
    for times in arrivals.values():
        times.sort()
        start = 0
        for end, t in enumerate(times):
            while times[start] <= t - QUOTA_WINDOW_S:
                start += 1
            peak = max(peak, end - start + 1)
            if end - start + 1 > QUOTA_LIMIT:
                violations += 1
    return violations, peak


def _configs(world: World) -> list[Path]:
    o = world.options
    workdir = world.workdir
    url = f"sqlite:///{workdir / 'sim.db'}"
    api_ports = [API_PORT + i for i in range(o.replicas)]
    runtime_ports = [RUNTIME_PORT + i for i in range(o.replicas)]
    hooks = webhooks.Webhooks(ports=[INGRESS_PORT + i for i in range(o.replicas)],
                              spools=[workdir / f"spool-{i}" for i in range(o.replicas)],
                              rate=o.webhook_rate)
    world.hooks = hooks
    (workdir / "webhook.secret").write_text(webhooks.SECRET + "\n")
    # The run's own L1 copy: HubSpot declares a quota small enough for bursts to reach.
    quota = (f"[quota.sim]\nlimit = {QUOTA_LIMIT}\nwindow = {QUOTA_WINDOW_S}\n"
             f'scope = "app_installation"\njitter = {QUOTA_JITTER_S}\n')
    l1_copy(workdir / "l1", quota={"hubspot": quota})
    (workdir / "k1.key").write_text(torture.TOKEN_KEY.material.hex())
    (workdir / "client.secret").write_text(torture.CLIENT_SECRET + "\n")
    spread_s = 0.9 * torture.LEASE_MARGIN_S
    configs = [torture.replica_config(workdir, url, i, o.replicas, api_ports, runtime_ports,
                                      PORTS["hubspot"], PORTS["oauth"], torture.LEASE_TTL_S,
                                      spread_s, hooks, PORTS["outreach"])
               for i in range(o.replicas)]
    for cfg in configs:  # the operator the simulation acts as (replay)
        with cfg.open("a") as out:
            out.write('\n[[operators]]\nname = "sim-admin"\nrole = "admin"\n'
                      'password_hash = "$argon2id$v=19$m=65536,t=3,p=4$c2ltc2FsdHNpbQ$'
                      'AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"\n')
    return configs


async def _in_node(node: str, fn: Callable[..., Any], *args: Any,
                   task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
    """Run ``fn`` (a ``nursery.start`` target) with its sockets in ``node``."""
    NODE.set(node)
    await fn(*args, task_status=task_status)


async def supervise(world: World, r: SimReplica,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """systemd's ``Restart=always``: a replica that crashed or exited is started again,
    with a new identity, after a moment."""
    NODE.set(r.node)
    while True:
        await _replica_life(world, r, task_status)
        task_status = trio.TASK_STATUS_IGNORED
        if world.stopping:
            return
        await trio.sleep(world.rng.uniform(0.1, 3.0))


async def _replica_life(world: World, r: SimReplica,
                        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    r.incarnation += 1
    r.done = trio.Event()
    settings = load_settings(str(r.config), known_families=known_family_names())
    inner = SqliteDatabase(str(world.workdir / "sim.db"), synchronous="NORMAL",
                           retry_budget_s=settings.storage.statement_timeout)
    await inner.open()
    assert world.net is not None
    db = FaultyDatabase(inner, node=r.node, rng=world.rng, faults=world.storage_faults,
                        gate=world.gate, count=world.count_fault, trace=world.trace)
    db.enabled = world.options.faults and not world.settling
    db.on_transaction = world.count_transaction
    db.sequence = world.next_seq
    db.on_committed = world.on_committed
    store = WorkStore(db, db.dialect)
    clock = TrioClock(EPOCH_US + r.skew_us)
    metrics = Metrics()
    parts = assemble(settings, store, clock, metrics)
    oracles.watch_handlers(world, r, parts)
    aim.watch(world, r, parts, store)

    async def bindings_bootstrapped() -> None:
        await ensure_config_bindings(store, settings.bindings, clock.now_us())

    replica = Replica(settings, store, parts.registry, clock, metrics=metrics,
                      replica_id=f"sim-{r.index}.{r.incarnation}",
                      api_app=parts.api_app,
                      ingress_app=parts.ingress.app if parts.ingress else None,
                      startup_checks=(bindings_bootstrapped,),
                      abandon_hooks=(parts.credentials.abandon_at,))
    if parts.api_context is not None:
        parts.api_context.wake = replica.wake
    if parts.ingress is not None:
        parts.ingress.app.replica_id = replica.replica_id
    r.db, r.replica, r.parts = db, replica, parts
    world.trace("replica_start", node=r.node, incarnation=r.incarnation)
    try:
        with trio.CancelScope() as r.scope:
            task_status.started()
            try:
                await replica.run()
            except StorageError as exc:  # start-up met the database's faults: exit 1
                world.trace("replica_exit", node=r.node, error=type(exc).__name__)
            except BaseExceptionGroup as group:
                _, rest = group.split(StorageError)
                if rest is not None:
                    raise rest from None
                world.trace("replica_exit", node=r.node, error="StorageError")
    finally:
        r.done.set()
        with trio.CancelScope(shield=True):
            with trio.move_on_after(1):
                await parts.aclose()
            await inner.aclose()


# ---------------------------------------------------------------- process faults


def crash(world: World, r: SimReplica) -> None:
    """SIGKILL: sockets and the connection die first (no cleanup reaches anyone)."""
    assert world.net is not None and r.scope is not None and r.db is not None
    world.trace("crash", node=r.node, incarnation=r.incarnation)
    world.count_fault("process.crash")
    r.db.killed = True
    world.net.kill_node(r.node)
    world.net.thaw(r.node)
    r.scope.cancel()


async def chaos(world: World, nursery: trio.Nursery, sims: dict[str, Any],
                runtimes: list[ReferenceRuntime]) -> None:
    o = world.options
    rng = world.rng
    assert world.net is not None
    deadline = trio.current_time() + o.duration_s
    # Swarm testing: each seed enables its own subset of process faults.
    enabled = [k for k in ("crash", "freeze", "partition", "restart_runtime",
                           "restart_simulator", "none") if rng.random() < 0.7 or k == "none"]
    world.trace("chaos_mix", enabled=enabled)
    while trio.current_time() < deadline:
        await trio.sleep(rng.uniform(0.5, 2.5))
        live = [r for r in world.replicas if r.alive and r.node not in world.frozen]
        action = rng.choice(enabled)
        if action == "crash" and len(live) > 1:
            victim = rng.choice(live)
            crash(world, victim)  # its supervisor starts it again
        elif action == "freeze" and len(live) > 1 and not world.frozen:
            # In the background (one at a time): a long freeze must not hold the rest of
            # the chaos back.
            world.frozen.add("pending")
            nursery.start_soon(freeze, world, rng.choice(live), rng.choice(FREEZE_POINTS))
        elif action == "partition" and live:
            victim = rng.choice(live)
            other = rng.choice(["hubspot", "oauth", "outreach",
                                f"runtime-{victim.index}"])
            world.trace("partition", a=victim.node, b=other)
            world.count_fault("net.partition")
            world.net.partition(victim.node, other)
            await trio.sleep(rng.uniform(0.5, 6.0))
            world.net.heal(victim.node, other)
            world.trace("heal", a=victim.node, b=other)
        elif action == "restart_runtime":
            i = rng.randrange(len(runtimes))
            world.count_fault("process.restart_runtime")
            await sims["restart"](f"runtime-{i}")
        elif action == "restart_simulator":
            world.count_fault("process.restart_simulator")
            await sims["restart"](rng.choice(["hubspot", "oauth", "outreach"]))


async def freeze(world: World, victim: SimReplica, at: str) -> None:
    """SIGSTOP at an await point (the next transaction whose name starts with ``at``, or
    wherever it is after a while), past its lease (sometimes past the refresh lease too),
    then SIGCONT."""
    rng = world.rng
    assert world.net is not None and victim.db is not None
    world.frozen.discard("pending")
    frozen = trio.Event()

    def stop(name: str) -> None:
        assert world.net is not None
        world.trace("freeze", node=victim.node, at=name)
        world.count_fault("process.freeze")
        world.frozen.add(victim.node)
        world.net.freeze(victim.node)
        frozen.set()

    victim.db.on_freeze = stop
    victim.db.freeze_at = at
    # A refresh's marker comes about every 10 s per grant, on whichever replica needs a
    # token: wait longer for it than for the common transactions.
    with trio.move_on_after(rng.uniform(2.0, 25.0 if at.startswith("refresh.") else 8.0)):
        await frozen.wait()
    if not frozen.is_set():
        victim.db.freeze_at = None
        stop("anywhere")
    past = torture.LEASE_TTL_S + torture.LEASE_MARGIN_S
    if at == "refresh.dispatch" and rng.random() < 0.7:
        # In front of the refresh's dispatch marker, past the WorkItem lease but within
        # the refresh lease: another replica may reclaim the item while the refresh
        # lease lives on; the thawed owner must not call (seed 5.1's stale claimant).
        await trio.sleep(rng.uniform(past + 0.5, REFRESH_LEASE_S - 3.0))
    else:
        if at.startswith("refresh.") or rng.random() < 0.1:
            # Past the token refresh lease too (30 s), not only the work's.
            past = REFRESH_LEASE_S + torture.LEASE_MARGIN_S
        await trio.sleep(past + rng.uniform(0.5, 10.0))
    world.frozen.discard(victim.node)
    world.net.thaw(victim.node)
    world.trace("thaw", node=victim.node)


# ---------------------------------------------------------------- traffic


async def traffic(world: World, runtimes: list[ReferenceRuntime], store: WorkStore) -> None:
    rng = world.rng
    n = 0
    while True:
        rt = runtimes[n % len(runtimes)]
        # Now and then a burst on one Runtime (the quota's windows fill up).
        for _ in range(rng.randrange(6, 12) if rng.random() < 0.05 else 1):
            lead = f"lead-{rng.randrange(LEADS)}"
            rt.store.update_lead(lead, {"title": f"T{n}"})
            world.ops["title_changes"] += 1
            n += 1
        rt.wakeup.set()
        if rng.random() < 0.1:
            # A hot record: the same Lead changed again and again, moments apart (its
            # intents must reach the provider in order: the lane, the supersession).
            for _ in range(rng.randrange(2, 4)):
                await trio.sleep(rng.uniform(0.0, 0.3))
                rt.store.update_lead(lead, {"title": f"T{n}"})
                world.ops["title_changes"] += 1
                n += 1
                rt.wakeup.set()
        if n % 5 == 0 and world.noop_source is not None:
            try:
                await world.noop_source(n)
            except StorageError:
                world.trace("enqueue_failed")
        elif n % 5 == 0:
            specs = [WorkSpec(family="noop", org_id="org-sim", subject_kind="sim",
                              subject_id=f"n{n}-{k}") for k in range(3)]
            try:
                got = await store.work_enqueue(specs, EPOCH_US + int(trio.current_time() * 1e6))
                world.noop_ids.extend(e.work_id for e in got)
                world.ops["noop_enqueued"] += len(got)
            except StorageError:
                world.trace("enqueue_failed")
        await trio.sleep(rng.expovariate(world.options.title_rate))


async def operator(world: World, store: WorkStore) -> None:
    """An operator replaying dead work now and then, through the CLI's own storage call."""
    from storage.port import WorkQuery

    rng = world.rng
    while True:
        await trio.sleep(rng.uniform(3.0, 10.0))
        try:
            dead = await store.work_list(WorkQuery(state=WorkState.DEAD, limit=5))
            # And now and then an older effect that already succeeded: a replay must
            # never overtake a newer intent for the same record.
            done = await store.work_list(WorkQuery(state=WorkState.SUCCEEDED,
                                                   family="external_effect", limit=50))
        except StorageError:
            continue
        picked = list(dead)
        if done and rng.random() < 0.7:
            picked.append(rng.choice(done))
        for item in picked:
            world.trace("operator_replay", work_id=item.work_id, family=item.family)
            world.ops["operator_replays"] += 1
            await oracles.operator_replay(world, store, item)


async def operator_commands(world: World, store: WorkStore) -> None:
    """An operator stopping stuck commands, as the console and the CLI do it (in one seed
    of four; its own generator, so the other seeds' schedules are untouched): ``work
    cancel`` of an effect item waiting to retry (or dead) none of whose attempts is in
    doubt, then ``command retire`` (the operator-path table settles what the history
    proves: the success receipt when an attempt is proven applied, the no-effect receipt
    with its proof, else retired without a receipt), then ``command repair`` when it was
    retired without one (a new command answers the Runtime intent)."""
    rng = world.commands_rng
    while True:
        await trio.sleep(rng.uniform(3.0, 10.0))
        await retire_when_stopped(world, store, until_done=False)
        live = [r for r in world.replicas if r.alive and r.replica is not None
                and r.parts is not None]
        if not live or world.op_clock is None:
            continue
        r = live[0]
        assert r.replica is not None and r.parts is not None
        rows = world.observer.execute(
            "SELECT w.work_id, w.subject_id, w.state FROM work_items w"
            " JOIN external_commands c ON c.command_id = w.subject_id"
            " WHERE w.family = 'external_effect' AND w.subject_kind = 'command'"
            " AND w.state IN ('retry', 'dead') AND c.settlement = 'open'"
            " AND NOT EXISTS (SELECT 1 FROM effect_attempts a"
            "   WHERE a.command_id = c.command_id AND a.disposition IS NULL"
            "   AND (a.outcome IS NULL OR a.outcome = 'OUTCOME_UNKNOWN'))"
            " ORDER BY w.work_id").fetchall()
        if not rows:
            continue
        work_id, command_id, state = rows[rng.randrange(len(rows))]
        settings = r.replica.settings
        if state != "dead":
            try:
                cancelled = await operator_api.cancel(
                    store, settings, world.op_clock, work_id=work_id, actor="sim-admin",
                    reason="simulated cancel", rules=r.parts.registry.cancel_rules())
            except Exception as exc:  # refusals are answers
                world.trace("operator_cancel_refused", work_id=work_id,
                            error=type(exc).__name__)
                continue
            world.ops["operator_cancels"] += 1
            world.trace("operator_cancel", work_id=work_id,
                        disposition=cancelled.disposition)
            if cancelled.disposition == "requested":
                # Claimed meanwhile: its claimant stops it (or it finishes); the operator
                # comes back to retire it once it is terminal.
                world.to_retire[work_id] = command_id
                continue
            if cancelled.disposition != "cancelled":
                continue
        await operator_retire(world, store, settings, command_id)


async def retire_when_stopped(world: World, store: WorkStore, until_done: bool) -> None:
    """The operator coming back to the commands whose cancel its claimant acknowledges:
    each is retired once its item is terminal (during the chaos at each round, and through
    the settle until none is left: an open command with no live work waits for it)."""
    while True:
        for work_id, command_id in sorted(world.to_retire.items()):
            row = world.observer.execute("SELECT state FROM work_items WHERE work_id = ?",
                                         (work_id,)).fetchone()
            live = [r for r in world.replicas if r.alive and r.replica is not None]
            if row is None or row[0] not in TERMINAL_STATES or not live:
                continue
            del world.to_retire[work_id]
            await operator_retire(world, store, live[0].replica.settings,  # type: ignore[union-attr]
                                  command_id)
        if not until_done or not world.to_retire:
            return
        await trio.sleep(0.5)


async def operator_retire(world: World, store: WorkStore, settings: Any,
                          command_id: str) -> None:
    """``integrationd command retire``, then ``command repair`` after a retire that left
    the intent unanswered: ``daemon.services.command_actions``, the one shell the console
    and the CLI call, as ``sim-admin``. Refusals (the operator-path table's) are answers."""
    assert world.op_clock is not None
    who = RepairActor(actor="sim-admin", role="admin", reason="simulated retire")
    try:
        settlement = await retire_command(store, settings, command_id, who,
                                          world.op_clock.now_us())
    except Exception as exc:
        world.trace("operator_retire_refused", command_id=command_id,
                    error=type(exc).__name__)
        return
    world.ops["operator_retires"] += 1
    world.retired[command_id] = settlement.value
    row = world.observer.execute(
        "SELECT binding_id, local_id FROM external_commands WHERE command_id = ?",
        (command_id,)).fetchone()
    if row is not None and str(row[0]).startswith("hubspot-"):
        # The operator stopped this intent (the Runtime is told what its history
        # proves): the Lead's contact may rightly keep its older title.
        world.stopped.add((int(str(row[0]).rsplit("-", 1)[1]), str(row[1])))
    world.trace("operator_retired", command_id=command_id, settlement=settlement.value)
    if settlement is not Settlement.RETIRED:
        return
    try:
        new = await repair_command(store, settings, load_catalog(settings), command_id,
                                   RepairActor(actor="sim-admin", role="admin",
                                               reason="simulated repair"),
                                   world.op_clock.now_us())
    except Exception as exc:
        world.trace("operator_repair_refused", command_id=command_id,
                    error=type(exc).__name__)
        return
    world.ops["operator_repairs"] += 1
    world.trace("operator_repaired", command_id=command_id, new=new)


SPARE = 50000  # a rebind moves Lead k's link between contact r*100000+k and +SPARE


async def rebind_one(world: World, store: WorkStore, on: SimReplica | None) -> None:
    """``integrationd link bind --generation G`` (the CLI's and the console's call,
    ``link_operations.bind_remote_record``, as ``sim-admin``): a Lead whose command is
    running (on ``on``'s claims, when given) is bound to its other contact."""
    live = [x for x in world.replicas if x.alive and x.replica is not None]
    if not live or world.op_clock is None:
        return
    settings = live[0].replica.settings  # type: ignore[union-attr]
    sql = ("SELECT c.binding_id, l.local_object, l.local_id, l.remote_object, l.remote_id,"
           " l.generation, l.link_key FROM work_items w"
           " JOIN external_commands c ON c.command_id = w.subject_id"
           " JOIN remote_links l ON l.link_key = c.link_key"
           " WHERE w.state = 'processing' AND w.subject_kind = 'command'"
           " AND c.settlement = 'open' AND l.state = 'active'")
    params: tuple[Any, ...] = ()
    if on is not None and on.replica is not None:
        sql += " AND w.lease_owner = ?"
        params = (on.replica.replica_id,)
    rows = world.observer.execute(sql + " ORDER BY w.work_id", params).fetchall()
    if not rows:
        return
    binding, local_object, local_id, remote_object, remote_id, gen, key = \
        rows[world.rng.randrange(len(rows))]
    n = int(remote_id)
    other = n - SPARE if n % 100000 >= SPARE else n + SPARE
    try:
        await bind_remote_record(store, settings, world.op_clock, actor="sim-admin",
                                 binding_id=binding, local_object=local_object,
                                 local_id=local_id, remote_object=remote_object,
                                 remote_id=str(other), expected_generation=int(gen),
                                 reason="simulated rebind")
    except Exception as exc:  # refusals (unresolved attempts, moved) are answers
        world.trace("operator_rebind_refused", local_id=local_id, error=type(exc).__name__)
        return
    # Recorded after it returned: it committed before any transaction that begins later.
    world.link_moves.setdefault(key, []).append((world.next_seq(), int(gen) + 1))
    world.rebound.add((n // 100000, local_id))
    world.ops["operator_rebinds"] += 1
    world.trace("operator_rebind", local_id=local_id, remote_id=other,
                generation=int(gen) + 1, during=None if on is None else on.node)


async def operator_links(world: World, store: WorkStore) -> None:
    """An operator rebinding links and publishing the Catalog now and then, through the
    CLI's own calls. Half the rebinds are placed: they commit when a replica next begins
    a dispatch checkpoint, after its claim read the command's context (the window the
    checkpoint's pin checks close)."""
    rng = world.rng
    catalog = None
    while True:
        await trio.sleep(rng.uniform(1.0, 4.0))
        live = [r for r in world.replicas if r.alive and r.db is not None
                and r.node not in world.frozen]
        if not live:
            continue
        action = rng.random()
        if action < 0.5:
            r = rng.choice(live)
            assert r.db is not None

            async def at_checkpoint(name: str, r: SimReplica = r) -> None:
                await rebind_one(world, store, r)

            r.db.on_interleave = at_checkpoint
            r.db.interleave_at = "effect.checkpoint"
        elif action < 0.8:
            await rebind_one(world, store, None)
        else:
            # `integrationd catalog publish`: the configured Catalog again (idempotent
            # for unchanged content; pins of running commands must stay served).
            settings = live[0].replica.settings  # type: ignore[union-attr]
            if catalog is None:
                catalog = load_catalog(settings)
            assert world.op_clock is not None
            try:
                await publish_current(store, catalog, actor="sim-admin", role="admin",
                                      reason="simulated publish",
                                      now_us=world.op_clock.now_us())
                world.ops["operator_publishes"] += 1
                world.trace("operator_publish")
            except StorageError as exc:
                world.trace("operator_publish_failed", error=type(exc).__name__)


# ---------------------------------------------------------------- the run


async def _setup(world: World, oauth: OAuthSimulator) -> None:
    """The database as the torture run prepares it (its own trio run: these stores COMMIT
    durably, in worker threads)."""
    o = world.options
    url = f"sqlite:///{world.workdir / 'sim.db'}"
    await seed_links(url, o.replicas, LEADS)
    first = scope_of(0)
    await webhooks.seed_links(url, first.org_id, first.app_installation_id)
    await publish_catalog(url, world.configs[0])
    await torture.install_grants(url, o.replicas, oauth)


async def _main(world: World, oauth: OAuthSimulator) -> dict[str, Any]:
    o = world.options
    rng = world.rng
    net = VirtualNetwork(rng, world.net_faults, world.trace, world.count_fault)
    net.enabled = o.faults
    world.net = net
    net.install()
    serving.install()
    oracles.install(world)
    configs = world.configs
    url = f"sqlite:///{world.workdir / 'sim.db'}"
    hubspot = HubSpotSimulator(tokens=oauth.access_tokens)
    hooks: webhooks.Webhooks = world.hooks
    runtimes = runtimes_for(o.replicas, [API_PORT + i for i in range(o.replicas)])
    spread = int(0.9 * torture.LEASE_MARGIN_S * 1e6)
    world.replicas = [
        SimReplica(i, configs[i], skew_us=-spread // 2 + (spread * i) // max(1, o.replicas - 1))
        for i in range(o.replicas)]
    driver_db = SqliteDatabase(str(world.workdir / "sim.db"), synchronous="NORMAL")
    await driver_db.open()
    driver = WorkStore(driver_db, driver_db.dialect)
    world.op_clock = TrioClock(EPOCH_US)
    for extra in world.extra:
        extra.start(driver, oauth=oauth, hubspot=hubspot, runtimes=runtimes)
    scopes: dict[str, trio.CancelScope] = {}
    result: dict[str, Any] = {}

    async with trio.open_nursery() as nursery:

        async def serve_part(node: str, target: Callable[..., Any], *args: Any,
                             task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                             ) -> None:
            NODE.set(node)
            while True:
                with trio.CancelScope() as scopes[node]:
                    await target(*args, task_status=task_status)
                task_status = trio.TASK_STATUS_IGNORED
                await trio.sleep(rng.uniform(0.2, 2.0))  # down for a moment, then back
                world.trace("part_restarted", node=node)

        async def restart(node: str) -> None:
            world.trace("part_restart", node=node)
            net.kill_node(node)
            scopes[node].cancel()
            await trio.lowlevel.checkpoint()

        await nursery.start(serve_part, "hubspot", hubspot.run, "127.0.0.1", PORTS["hubspot"])
        await nursery.start(serve_part, "oauth", oauth.run, "127.0.0.1", PORTS["oauth"])
        await nursery.start(serve_part, "outreach", hooks.osim.run, "127.0.0.1",
                            PORTS["outreach"])
        hooks.seed()
        if world.subscriptions is not None:
            await world.subscriptions.start(nursery)
        for i, rt in enumerate(runtimes):
            await nursery.start(serve_part, f"runtime-{i}", serve_runtime, rt, "127.0.0.1",
                                RUNTIME_PORT + i)
            for k in range(LEADS):
                rt.store.create_lead({"lead_id": f"lead-{k}", "title": "Engineer"})
        seeded_ms = int((EPOCH_US / 1000) - 3_600_000)
        for rt_index in range(o.replicas):
            for k in range(LEADS):
                for spare in (0, SPARE):  # a rebind's other contact
                    hubspot.put_contact(f"{rt_index * 100000 + spare + k}",
                                        {"jobtitle": "Engineer"}, modified_ms=seeded_ms)
        for r in world.replicas:
            await nursery.start(supervise, world, r)
        world.trace("started")
        async with trio.open_nursery() as load:
            NODE.set("world")
            load.start_soon(traffic, world, runtimes, driver)
            load.start_soon(_in_node_soon, "outreach", hooks.traffic)
            load.start_soon(operator, world, driver)
            if world.operator_links:
                load.start_soon(operator_links, world, driver)
            if world.operator_commands:
                load.start_soon(operator_commands, world, driver)
            if o.faults:
                load.start_soon(aim.aimed_freezes, world)
            if world.subscriptions is not None:
                load.start_soon(world.subscriptions.drive, driver)
            for extra in world.extra:
                load.start_soon(extra.chaos)
            await chaos(world, nursery, {"restart": restart}, runtimes)
            load.cancel_scope.cancel()
        # Settle: no more faults; every replica running.
        net.enabled = False
        world.settling = True
        for r in world.replicas:
            if r.db is not None:
                r.db.enabled = False
        world.trace("settle")
        if world.operator_commands:
            nursery.start_soon(retire_when_stopped, world, driver, True)
        for extra in world.extra:
            nursery.start_soon(extra.settle)
        run = torture.Run("sqlite", [], [url], None, webhooks=hooks, log=lambda m: None)
        run.noop_ids = list(world.noop_ids)
        settle_s, drained = await torture.settle(run, runtimes, o.settle_s)
        for extra in world.extra:
            # An operator whose own settle brings work back to the replicas late (the
            # cutover's legacy owner still draining) says when it is done; the replicas
            # then settle what it handed them.
            settled = getattr(extra, "settled", None)
            if settled is not None and await settled(o.settle_s):
                more_s, drained = await torture.settle(run, runtimes, o.settle_s)
                settle_s += more_s
        world.trace("settled", drained=drained)
        # The sink's deliveries leave the sender's journal before the webhook invariants.
        seen = world.subscriptions.judge() if world.subscriptions is not None else {}
        result = await torture.invariants(run, hubspot, runtimes, oauth)
        result.update(seen)
        result["settle_s"] = round(settle_s, 1)
        result["drained"] = drained
        result["quota_violations"], result["quota_peak_per_window"] = quota_violations(
            world.patch_sends)
        for extra in world.extra:
            await extra.final(result)
        await oracles.final(world, driver, result, hubspot, runtimes)
        await world.drain_replicas()
        world.simulated_s = trio.current_time()
        nursery.cancel_scope.cancel()
    await driver_db.aclose()
    world.observer.close()
    return result


async def _in_node_soon(node: str, fn: Callable[[], Any]) -> None:
    NODE.set(node)
    await fn()


def draw_faults(rng: Any, on: bool) -> tuple[NetFaults, StorageFaults]:
    """This seed's fault probabilities (each kind on or off, then its rate)."""
    def p(high: float) -> float:
        return rng.uniform(0, high) if on and rng.random() < 0.6 else 0.0

    net = NetFaults(refuse=p(0.05), delay=p(0.1), drop_request=p(0.03),
                    reset_mid_body=p(0.03), lose_answer=p(0.03), slow_reader=p(0.05))
    db = StorageFaults(error=p(0.01), lock_timeout=p(0.01), busy=p(0.02), slow=p(0.02),
                       lost_before_commit=p(0.01), lost_after_commit=p(0.01))
    return net, db


@contextlib.contextmanager
def restored_process_state() -> Iterator[None]:
    """A run replaces the daemon logger's handlers and sets the replicas' environment:
    both as they were afterwards (the next seed, or the caller, starts clean)."""
    logger = logging.getLogger(logs.LOGGER_NAME)
    saved = (list(logger.handlers), logger.level, logger.propagate)
    env = dict(os.environ)
    try:
        yield
    finally:
        logger.handlers[:] = saved[0]
        logger.setLevel(saved[1])
        logger.propagate = saved[2]
        os.environ.clear()
        os.environ.update(env)


def log_to_trace(world: World) -> None:
    """The daemon's log lines go to the world's trace, and nowhere else."""
    logger = logging.getLogger(logs.LOGGER_NAME)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    logger.addHandler(_TraceLogs(world))
    logger.setLevel(logging.INFO)
    logger.propagate = False


def run_seed(options: Options, *, keep: Path | None = None) -> dict[str, Any]:
    """One seed, start to end: the report (oracle findings, faults, trace digest)."""
    # A directory of its own (runs of one seed may go on side by side); no path reaches
    # the trace, which the determinism test would show.
    workdir = Path(tempfile.mkdtemp(prefix=f"integrationd-sim-{options.seed}-"))
    try:
        with restored_process_state(), deterministic(options.seed) as rng:
            world = World(options, rng, workdir)
            world.net_faults, world.storage_faults = draw_faults(rng, options.faults)
            world.operator_links = options.faults and rng.random() < 0.8
            # Its own generator: a seed without it keeps the schedule it had before.
            world.commands_rng = random.Random(f"commands:{options.seed}")
            world.operator_commands = options.faults and world.commands_rng.random() < 0.25
            world.extra = operators_extra.draw(world)
            os.environ.update(secrets_env(options.replicas), **webhooks.env())
            for r in range(options.replicas):
                os.environ.pop(f"INTEGRATIOND_BINDING_HUBSPOT_{r}_TOKEN", None)
            # Paths differ per run; the trace must not: every file lives under one name.
            world.configs = _configs(world)
            world.subscriptions = subscription_world.plan(world)
            for extra in world.extra:
                extra.configure()
            log_to_trace(world)
            oauth = OAuthSimulator(client_secret=torture.CLIENT_SECRET,
                                   lifetime_s=torture.TOKEN_LIFETIME_S)
            # Its clock stands at virtual 0 (the system clock's random offset would put
            # the grants' expiry hours away: no refresh would ever run in the chaos).
            trio.run(_setup, world, oauth, clock=trio.testing.MockClock())
            reseed_scheduler(options.seed)
            result = trio.run(_main, world, oauth,
                              clock=trio.testing.MockClock(autojump_threshold=0))
    finally:
        if keep is None:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            shutil.copytree(workdir, keep, dirs_exist_ok=True)
            shutil.rmtree(workdir, ignore_errors=True)
    return {"seed": options.seed, "result": result, "world": world}

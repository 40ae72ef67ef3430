"""Subscriptions in the world: the subscription reconciler (``daemon/services/subscriptions.py``,
the family every replica runs) against the Outreach simulator, under the chaos.

Theory of operation
-------------------
In about half the seeds with faults (drawn from a generator of this module's own, so the
other seeds keep their schedules), :func:`plan` adds to every replica's configuration a
second route on the Outreach binding, ``outreach-sink``, whose ``public_url`` names a
*sink* node of the virtual network (a listener that answers 200 to anything): the route
wants one subscription per action its L1 webhook contract declares (created, updated,
destroyed), and the deliveries the provider fans out to them make no receipt. The
traffic's own subscriptions (``bench/torture_webhooks.py``, one per replica's ingress,
made outside any client) name other URLs, so the reconciler leaves them alone; the
webhook oracles judge only deliveries to those (:meth:`Subscriptions.judge` takes the
sink's out of the sender's journal first).

During the chaos an operator asks for a run now and then (``subscription_operator.
reconcile_now``, what the console and ``integrationd subscriptions reconcile`` call; a
run queues no next run, so the settle ends) and, now and then, an Outreach admin deletes
one of the sink's subscriptions behind the reconciler's back
(``OutreachSimulator.delete_subscription_behind_back``): the next run creates it again,
so creates happen all through the chaos, under its faults. The window that matters for a
create whose outcome is unknown is aimed at: at the instant a create leaves a replica,
that replica is frozen (SIGSTOP) half the time, at most twice a seed, past its WorkItem
lease but within the in-flight window, so another replica reclaims the step while the
create may still land.

Oracles:

* ``subscription_create_in_flight`` (at the instant a create, ``POST /api/v2/webhooks``,
  leaves a replica): no earlier create attempt for the same desired subscription (any
  step of that name) is unresolved with its in-flight window still open by the sender's
  clock (L1's ``max_in_flight`` + ``max_clock_skew``, from the later of its dispatch and
  its give-up, or the client deadline for a claimant that never recorded one:
  ``daemon.core.subscriptions.decide_step``'s rule);
* ``subscription_created_twice`` (same instant): the provider already holds a
  subscription of the desired shape (route URL and action) the create would double;
* ``subscriptions_doubled`` (at the end): the provider holds more than one subscription
  for one desired subscription.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import attrs
import trio

from bench import torture
from bench import torture_webhooks as webhooks
from config.catalog import load_catalog
from config.load import load_settings
from daemon.services.families import known_family_names
from daemon.services.subscription_calls import client_deadline_s
from daemon.services.subscription_items import SUBSCRIPTION_FAMILY
from daemon.services.subscription_operator import reconcile_now
from sandbox.h11_server import H11Server, Request, Response
from sim import aim_subscriptions, oracles
from sim.net import NODE

if TYPE_CHECKING:
    from sim.net import VirtualSocket
    from sim.world import World
    from storage.work_store import WorkStore

ROUTE = "outreach-sink"
SINK_NODE = "sink"
SINK_PORT = 7500
URL = f"http://127.0.0.1:{SINK_PORT}/hooks/{ROUTE}"
CREATE = "POST /api/v2/webhooks "
# Freezes at creates per seed: each holds the binding's lane (its steps run one at a time)
# for up to the in-flight window and the client deadline (about 50 s); more would hold
# the settle past its bound.
MAX_FREEZES = 2


def rng_for(seed: int) -> random.Random:
    return random.Random(f"subscriptions:{seed}")


@attrs.define(eq=False)
class Subscriptions:
    world: World
    rng: random.Random
    window_us: int = 0  # the in-flight window plus the clock skew (L1 and L2's larger)
    client_deadline_us: int = 0
    nursery: trio.Nursery | None = None
    catalog: Any = None
    freezes: int = 0  # at creates, so far
    # The aimed dead create in doubt (sim/aim_subscriptions.py; None: not this seed).
    aim: Any = None
    store: WorkStore | None = None  # the operator's (the world's driver)

    # ------------------------------------------------------------ set-up
    async def start(self, nursery: trio.Nursery) -> None:
        """The sink's listener, and the exchange hook (after the oracles' own)."""
        settings = load_settings(str(self.world.configs[0]),
                                 known_families=known_family_names())
        self.catalog = load_catalog(settings)
        hook = self.catalog.webhooks[webhooks.WEBHOOK].subscription
        binding = self.catalog.binding(webhooks.BINDING)
        self.window_us = int((max(hook.max_in_flight_s, binding.max_in_flight)
                              + max(hook.max_clock_skew_s, binding.max_clock_skew)) * 1e6)
        self.client_deadline_us = int(client_deadline_s(binding) * 1e6)
        self.nursery = nursery
        await nursery.start(_serve_sink)
        net = self.world.net
        assert net is not None
        inner = net.on_exchange

        def on_exchange(sock: VirtualSocket, data: bytes) -> None:
            inner(sock, data)
            self.on_exchange(sock, data)
            if self.aim is not None:
                self.aim.on_exchange(sock, data)

        net.on_exchange = on_exchange

    # ------------------------------------------------------------ during the chaos
    async def drive(self, store: WorkStore) -> None:
        """An operator's "reconcile now" every few seconds; before some of them an admin
        deletes one of the sink's subscriptions at the provider."""
        world, rng = self.world, self.rng
        self.store = store
        await trio.sleep(rng.uniform(0.5, 2.0))
        while True:
            osim = world.hooks.osim
            ours = sorted(s.id for s in osim.subscriptions() if s.url == URL)
            if ours and rng.random() < 0.4:
                gone = rng.choice(ours)
                osim.delete_subscription_behind_back(gone)
                world.ops["subscriptions_deleted_behind_back"] += 1
                world.trace("subscription_deleted_behind_back", id=gone)
            await self.reconcile_now("simulated reconcile")
            await trio.sleep(rng.uniform(2.0, 6.0))

    async def reconcile_now(self, reason: str) -> None:
        """One run, as an operator asks for it (console, CLI)."""
        world = self.world
        live = [r for r in world.replicas if r.alive and r.replica is not None]
        if not live or world.op_clock is None or self.store is None:
            return
        routes = live[0].replica.settings.webhook_routes  # type: ignore[union-attr]
        try:
            run = await reconcile_now(
                self.store, self.catalog, routes, webhooks.BINDING, actor="sim-admin",
                role="admin", reason=reason, now_us=world.op_clock.now_us(),
                max_attempts=live[0].replica.settings.family(  # type: ignore[union-attr]
                    SUBSCRIPTION_FAMILY).max_attempts)
            world.ops["subscription_runs"] += 1
            world.trace("subscriptions_reconcile_now", work_id=run)
        except Exception as exc:  # refusals and storage errors are answers
            world.trace("subscriptions_reconcile_refused", error=type(exc).__name__)

    def on_exchange(self, sock: VirtualSocket, data: bytes) -> None:
        if not sock.node.startswith("replica-") or oracles.dst_node(sock) != "outreach":
            return
        if not data.startswith(CREATE.encode()):
            return
        world = self.world
        world.ops["subscription_creates"] += 1
        sender = oracles.CURRENT.get()
        if sender is None or sock.froze_at_send:
            return
        fence = sender.fence
        row = world.observer.execute(
            "SELECT subject_id FROM work_items WHERE work_id = ?", (fence.work_id,)).fetchone()
        if row is None:
            return
        name = str(row[0])
        action = name.rsplit(":", 1)[-1]
        held = sorted(s.id for s in world.hooks.osim.subscriptions()
                      if s.url == URL and s.action == action)
        if held:
            world.violation("subscription_created_twice", node=sock.node,
                            work_id=fence.work_id, name=name, held=held)
        now_us = sender.clock.now_us()
        earlier = world.observer.execute(
            "SELECT a.attempt_id, a.dispatch_started_at_us, a.gave_up_at_us"
            " FROM effect_attempts a JOIN work_items w ON w.work_id = a.command_id"
            " WHERE w.family = 'subscription_reconcile' AND w.subject_id = ?"
            " AND a.method = 'POST' AND a.disposition IS NULL"
            " AND (a.outcome IS NULL OR a.outcome = 'OUTCOME_UNKNOWN')"
            " AND NOT (a.work_id = ? AND a.ownership_epoch = ?)",
            (name, fence.work_id, fence.ownership_epoch)).fetchall()
        for attempt_id, dispatched, gave_up in earlier:
            end = max(int(dispatched), int(gave_up) if gave_up is not None
                      else int(dispatched) + self.client_deadline_us)
            if now_us < end + self.window_us:
                world.violation("subscription_create_in_flight", node=sock.node,
                                work_id=fence.work_id, name=name, earlier=attempt_id,
                                open_for_us=end + self.window_us - now_us)
        if not world.frozen and self.freezes < MAX_FREEZES and self.rng.random() < 0.5:
            self.freezes += 1
            # SIGSTOP as the create leaves (its body waits for the thaw): past the
            # WorkItem lease, within the in-flight window.
            assert world.net is not None and self.nursery is not None
            world.frozen.add(sock.node)
            world.net.freeze(sock.node)
            world.count_fault("process.freeze_at_create")
            world.trace("freeze", node=sock.node, at="subscription_create")
            past = torture.LEASE_TTL_S + torture.LEASE_MARGIN_S
            self.nursery.start_soon(self._thaw, sock.node, past + self.rng.uniform(2.0, 10.0))

    async def _thaw(self, node: str, after_s: float) -> None:
        await trio.sleep(after_s)
        assert self.world.net is not None
        self.world.frozen.discard(node)
        self.world.net.thaw(node)
        self.world.trace("thaw", node=node)

    # ------------------------------------------------------------ at the end
    def judge(self) -> dict[str, Any]:
        """Before the webhook invariants: the sink's deliveries out of the sender's journal
        (they make no receipt, by design); then ``subscriptions_doubled``."""
        result: dict[str, Any] = {}
        hooks = self.world.hooks
        osim = hooks.osim
        traffic = set(hooks.subscriptions)
        kept = [d for d in osim.deliveries if d.subscription_id in traffic]
        result["sink_deliveries"] = len(osim.deliveries) - len(kept)
        osim.deliveries[:] = kept
        by_action: dict[str, list[int]] = {}
        for s in osim.subscriptions():
            if s.url == URL:
                by_action.setdefault(s.action, []).append(s.id)
        doubled = {a: sorted(ids) for a, ids in sorted(by_action.items()) if len(ids) > 1}
        result["subscriptions_at_provider"] = {a: len(ids) for a, ids in
                                               sorted(by_action.items())}
        if doubled:
            self.world.violation("subscriptions_doubled", count=len(doubled), first=doubled)
        return result


def plan(world: World) -> Subscriptions | None:
    """This seed's subscriptions (None: none in this seed): the sink route in every
    replica's configuration."""
    rng = rng_for(world.options.seed)
    if not (world.options.faults and rng.random() < 0.5):
        return None
    secret = world.workdir / "webhook.secret"
    for cfg in world.configs:
        with cfg.open("a") as out:
            out.write(f'\n[[webhook_routes]]\nroute = "{ROUTE}"\n'
                      f'binding_id = "{webhooks.BINDING}"\nwebhook = "{webhooks.WEBHOOK}"\n'
                      f'subscription_generation = 1\nsecret_file = "{secret}"\n'
                      f'public_url = "{URL}"\n'
                      # The chaos's lease, as for the other families (default 30 s): a
                      # claimant frozen past it loses the step to another replica.
                      f'\n[families.{SUBSCRIPTION_FAMILY}]\nlease_ttl = {torture.LEASE_TTL_S}\n')
    subs = Subscriptions(world, rng)
    subs.aim = aim_subscriptions.plan(subs)
    return subs


async def _answer(request: Request) -> Response:
    return Response(200)


async def _serve_sink(task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    NODE.set(SINK_NODE)
    server = H11Server(_answer)
    await server.run("127.0.0.1", SINK_PORT, task_status=task_status)

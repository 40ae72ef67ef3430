"""The RemoteSubscription reconciler against the real Outreach simulator and real storage
on every backend: create missing, recreate one deleted behind our back, replace a drifted
one, delete an orphan only under its generation, overlap a secret rotation until the new
secret is seen, and reconcile an unknown create outcome by read-back (never two)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import attrs
import pytest
import trio

from config.catalog import Catalog, build_catalog, load_definitions, load_object_binding_documents
from config.settings import BindingSettings, Secret, WebhookRoute
from daemon.core.outcomes import DeadLetter, Outcome, RetryLater, Succeeded
from daemon.core.principals import BindingEvent
from daemon.core.states import WorkState
from daemon.core.token_bundle import TokenKey
from daemon.core.work import WorkItem
from daemon.providers.executor import BoundedHttp
from daemon.services.families import WorkContext
from daemon.services.principal_bootstrap import ensure_config_bindings
from daemon.services.subscription_calls import SubscriptionCalls
from daemon.services.subscriptions import (
    SUBSCRIPTION_FAMILY,
    SubscriptionPayload,
    SubscriptionReconciler,
    item_spec,
    run_spec,
)
from sandbox.hubspot_sim.model import Fault, FaultMode
from sandbox.outreach_sim import OutreachSimulator
from storage.port import SqlTx, WorkQuery
from storage.principals import Actor
from storage.subscriptions import SubscriptionRow, read_subscriptions
from storage.work_store import WorkStore
from tests.support.work import SEC, T0, claim, finalization

TOKEN = "s2s-token-subscriptions"
BINDING = "outreach-main"
URL = "https://hooks.example.test/hooks/outreach"
ACTIONS = ("created", "updated", "destroyed")


@attrs.define
class Clock:
    now: int = T0

    def now_us(self) -> int:
        return self.now


@attrs.define(eq=False)
class Rig:
    store: WorkStore
    sim: OutreachSimulator
    reconciler: SubscriptionReconciler
    catalog: Catalog
    binding: BindingSettings
    clock: Clock
    outcomes: list[tuple[str, Outcome]] = attrs.field(factory=list)

    def route(self, **changes: object) -> None:
        (route,) = self.reconciler.routes
        self.reconciler.routes = (attrs.evolve(route, **changes),)  # type: ignore[arg-type]

    async def reconcile(self) -> None:
        """One one-off run now, then every item it queued, until the lane is idle."""
        await self.store.work_enqueue([run_spec(self.binding, self.catalog,
                                                now_us=self.clock.now, interval_s=300,
                                                chain=False, max_attempts=5)], self.clock.now)
        await self.drain()

    async def drain(self, rounds: int = 20) -> None:
        for _ in range(rounds):
            result = await claim(self.store, owner="A", now=self.clock.now,
                                 family=SUBSCRIPTION_FAMILY)
            if not result.claimed:
                self.clock.now += 60 * SEC  # past any retry backoff (not the next run)
                result = await claim(self.store, owner="A", now=self.clock.now,
                                     family=SUBSCRIPTION_FAMILY)
                if not result.claimed:
                    return
            for item in result.claimed:
                await self.run(item)

    async def run(self, item: WorkItem) -> Outcome:
        assert item.fence is not None
        ctx = WorkContext(item=item, fence=item.fence, store=self.store, clock=self.clock,
                          replica_id="A")
        outcome = await self.reconciler.handle(ctx)
        writes = list(ctx.side_writes)

        async def all_writes(tx: SqlTx) -> None:
            for write in writes:
                await write(tx)

        (done,) = await self.store.work_finalize_if_owner(
            [finalization(item, outcome, self.clock.now)], "A", lambda: self.clock.now,
            {item.work_id: all_writes} if writes else None)
        assert done.applied
        self.outcomes.append((SubscriptionPayload.from_payload(item.payload).kind, outcome))
        self.clock.now += SEC
        return outcome

    async def rows(self) -> dict[str, SubscriptionRow]:
        async def body(tx: SqlTx) -> list[SubscriptionRow]:
            return await read_subscriptions(tx, BINDING)

        return {r.name: r for r in await self.store.db.transact(body, name="t", write=False)}

    def remote(self) -> dict[tuple[str, str], list[int]]:
        out: dict[tuple[str, str], list[int]] = {}
        for s in self.sim.subscriptions():
            out.setdefault((s.action, s.url), []).append(s.id)
        return out


@pytest.fixture
async def rig(store: WorkStore, nursery: trio.Nursery) -> AsyncIterator[Rig]:
    sim = OutreachSimulator(tokens={TOKEN})
    port = await nursery.start(sim.run)
    binding = BindingSettings(binding_id=BINDING, provider="outreach", org_id="org-1",
                              app_installation_id="app-1", remote_account_id="org-77",
                              base_url=f"http://127.0.0.1:{port}", auth="static_token",
                              token=Secret(TOKEN))
    await ensure_config_bindings(store, (binding,), T0)
    _, documents = load_definitions()
    catalog = build_catalog(3, documents, (binding,), load_object_binding_documents())
    route = WebhookRoute(route="outreach", binding_id=BINDING,
                         webhook="outreach.prospect_events", public_url=URL,
                         secret=Secret("secret-one"))
    http = BoundedHttp.open(4)
    key = TokenKey("k1", os.urandom(32))
    reconciler = SubscriptionReconciler(max_attempts=5, catalog=catalog, routes=(route,),
                                        calls=SubscriptionCalls(http), keys={"k1": key},
                                        seal_key_id="k1")
    try:
        yield Rig(store, sim, reconciler, catalog, binding, Clock())
    finally:
        await http.aclose()


async def test_creates_the_missing_subscriptions_one_per_action_with_a_sealed_cleanup_token(
        rig: Rig) -> None:
    await rig.reconcile()
    remote = rig.remote()
    assert sorted(remote) == sorted((a, URL) for a in ACTIONS)
    assert all(len(ids) == 1 for ids in remote.values())
    rows = await rig.rows()
    assert sorted(rows) == sorted(f"outreach:{a}" for a in ACTIONS)
    by_id = {s.id: s for s in rig.sim.subscriptions()}
    for row in rows.values():
        assert (row.generation, row.secret_generation, row.health) == (1, 1, "active")
        assert row.cleanup is not None and row.cleanup.key_id == "k1"
        real = by_id[int(row.provider_id)]
        assert real.secret == "secret-one" and real.payload_version == 2
        # Stored sealed: the clear token is not in the row; it opens only for its row.
        assert real.cleanup_token.encode() not in row.cleanup.blob
        assert rig.reconciler.open_cleanup(row.name, 1, row.cleanup) == real.cleanup_token
        assert rig.reconciler.open_cleanup(row.name, 2, row.cleanup) is None
    # A second reconciliation changes nothing.
    await rig.reconcile()
    assert rig.remote() == remote


async def test_a_subscription_deleted_behind_our_back_is_recreated_under_the_next_generation(
        rig: Rig) -> None:
    await rig.reconcile()
    rows = await rig.rows()
    gone = int(rows["outreach:updated"].provider_id)
    rig.sim.delete_subscription_behind_back(gone)
    await rig.reconcile()
    rows = await rig.rows()
    assert rows["outreach:updated"].generation == 2
    assert int(rows["outreach:updated"].provider_id) != gone
    assert all(len(ids) == 1 for ids in rig.remote().values()) and len(rig.remote()) == 3


async def test_a_disabled_subscription_is_reported_not_recreated(rig: Rig) -> None:
    await rig.reconcile()
    rows = await rig.rows()
    rig.sim.set_subscription_active(int(rows["outreach:created"].provider_id), False)
    await rig.reconcile()
    rows = await rig.rows()
    assert rows["outreach:created"].health == "disabled"
    assert rows["outreach:created"].generation == 1
    assert len(rig.sim.subscriptions()) == 3


async def test_a_drifted_url_is_replaced_new_first_then_the_old_one_deleted(rig: Rig) -> None:
    await rig.reconcile()
    old = {s.id for s in rig.sim.subscriptions()}
    moved = "https://hooks.example.test/hooks/outreach-v2"
    rig.route(public_url=moved)
    await rig.reconcile()
    # Replaced within one reconciliation: created, then (proven active) the old deleted on
    # the next run; no moment without a live subscription per action.
    await rig.reconcile()
    remote = rig.remote()
    assert sorted(remote) == sorted((a, moved) for a in ACTIONS)
    assert not old & {s.id for s in rig.sim.subscriptions()}
    rows = await rig.rows()
    assert all(r.generation == 2 and r.url == moved and not r.retiring for r in rows.values())


async def test_an_orphan_is_deleted_and_a_stale_generations_cleanup_is_refused(
        rig: Rig) -> None:
    await rig.reconcile()
    # A subscription to our route that no row names (a crashed earlier install, say).
    orphan = rig.sim.subscribe_direct(resource="prospect", action="updated", url=URL,
                                      secret="x", payload_version=2)
    # A delete decided under generation 1 of a row that has moved on to generation 2.
    rows = await rig.rows()
    live = rows["outreach:created"]
    rig.sim.delete_subscription_behind_back(int(live.provider_id))
    await rig.reconcile()
    assert orphan not in {s.id for s in rig.sim.subscriptions()}
    rows = await rig.rows()
    assert rows["outreach:created"].generation == 2
    stale = SubscriptionPayload(kind="delete", binding=BINDING, name="outreach:created",
                                generation=1, provider_id=rows["outreach:created"].provider_id,
                                reason="replaced", binding_generation=1)
    await rig.store.work_enqueue([item_spec(rig.binding, rig.catalog, stale, key="stale",
                                           max_attempts=5)],
                                 rig.clock.now)
    rig.outcomes.clear()
    await rig.drain()
    assert [o for _, o in rig.outcomes] == [DeadLetter(
        "stale_generation", f"the delete of subscription {stale.provider_id} was decided"
        " under generation 1; the row is at 2: refused")]
    assert int(stale.provider_id) in {s.id for s in rig.sim.subscriptions()}
    assert len(rig.sim.subscriptions()) == 3


async def test_secret_rotation_keeps_the_old_subscription_until_the_new_secret_is_seen(
        rig: Rig) -> None:
    await rig.reconcile()
    first = {s.id for s in rig.sim.subscriptions()}
    rig.route(secret=Secret("secret-two"), previous_secret=Secret("secret-one"),
              secret_generation=2)
    await rig.reconcile()
    subs = rig.sim.subscriptions()
    # Both live: the old ones (old secret) and the new ones (new secret).
    assert sorted(s.secret for s in subs) == ["secret-one"] * 3 + ["secret-two"] * 3
    rows = await rig.rows()
    assert all(r.rotating and r.secret_generation == 2 for r in rows.values())
    # No delivery verified with the new secret yet: nothing is deleted.
    await rig.reconcile()
    assert first <= {s.id for s in rig.sim.subscriptions()}
    # A delivery verified with the newest secret (index 0) arrives on the route.
    await _receipt(rig, "verified:1", rig.clock.now)  # the old secret: proves nothing
    await rig.reconcile()
    assert first <= {s.id for s in rig.sim.subscriptions()}
    await _receipt(rig, "verified:0", rig.clock.now)
    await rig.reconcile()
    subs = rig.sim.subscriptions()
    assert [s.secret for s in subs] == ["secret-two"] * 3
    rows = await rig.rows()
    assert all(not r.rotating and not r.retiring and r.last_outcome == "retired"
               for r in rows.values())


async def _receipt(rig: Rig, verification: str, at_us: int) -> None:
    from storage.idgen import new_ulid

    async def body(tx: SqlTx) -> None:
        rid = new_ulid(at_us)
        await tx.execute(
            "INSERT INTO ingress_receipts (receipt_id, dedup_key, route, binding_id, webhook,"
            " subscription_generation, received_at_us, body_b64, body_sha256, body_bytes,"
            " headers_json, verification, via, replica_id, duplicates, state, row_version)"
            " VALUES (?, ?, 'outreach', ?, 'outreach.prospect_events', 1, ?, '', 'x', 0, '{}',"
            " ?, 'direct', 'A', 0, 'settled', 1)", (rid, rid, BINDING, at_us, verification))

    await rig.store.db.transact(body, name="t")


@pytest.mark.parametrize("mode", ["reset_after", "reset_before"])
async def test_an_unknown_create_outcome_is_reconciled_by_read_back_never_two(
        rig: Rig, mode: FaultMode) -> None:
    rig.sim.inject(Fault(mode, method="POST", path_prefix="/api/v2/webhooks", count=1))
    await rig.reconcile()
    remote = rig.remote()
    assert sorted(remote) == sorted((a, URL) for a in ACTIONS)
    assert all(len(ids) == 1 for ids in remote.values())
    rows = await rig.rows()
    assert len(rows) == 3
    kinds = [(k, type(o).__name__) for k, o in rig.outcomes]
    assert ("create", "RetryLater") in kinds  # the unknown outcome, retried by read-back
    adopted = [r for r in rows.values() if r.cleanup is None]
    # reset_after applied it: adopted by read-back (its cleanup token was never seen);
    # reset_before did not: created again, with its token.
    assert len(adopted) == (1 if mode == "reset_after" else 0)
    assert all(isinstance(o, Succeeded) for k, o in rig.outcomes if k == "run")


async def test_a_duplicate_copy_verified_with_the_newer_secret_is_kept_on_its_receipt(
        store: WorkStore) -> None:
    """During a rotation the old and the new subscription deliver the same event: one
    receipt (same dedup key). Whichever copy came first, the receipt says the newest
    secret was seen, or the rotation would never complete (seen on main: the old copy
    first left the receipt at verified:1 and the old subscriptions were never retired)."""
    from storage.ingress.receipts import IngressReceipt, ReceiptQuery

    def copy(receipt_id: str, verification: str) -> IngressReceipt:
        return IngressReceipt(
            receipt_id=receipt_id, dedup_key="dk-rotation", route="outreach",
            binding_id=BINDING, webhook="outreach.prospect_events",
            subscription_generation=1, received_at_us=T0, body=b"{}", body_sha256="x",
            headers={}, verification=verification, replica_id="A")

    await store.ingress_receipt_insert(copy("r1", "verified:1"), T0)
    await store.ingress_receipt_insert(copy("r2", "verified:0"), T0)
    await store.ingress_receipt_insert(copy("r3", "verified:1"), T0)  # never back
    (receipt,) = await store.ingress_receipt_list(ReceiptQuery(limit=10))
    assert (receipt.receipt_id, receipt.verification, receipt.duplicates) == (
        "r1", "verified:0", 2)


async def test_a_run_between_an_unknown_create_and_its_read_back_deletes_nothing(
        rig: Rig) -> None:
    """The subscription an unknown create made is named by no row until the step's read-back
    adopts it: a run meanwhile must not delete it as an orphan."""
    rig.sim.inject(Fault("reset_after", method="POST", path_prefix="/api/v2/webhooks",
                         count=1))
    await rig.store.work_enqueue([run_spec(rig.binding, rig.catalog, now_us=rig.clock.now,
                                           interval_s=300, chain=False, max_attempts=5)],
                                 rig.clock.now)

    async def now_claimable() -> list[WorkItem]:
        return list((await claim(rig.store, now=rig.clock.now,
                                 family=SUBSCRIPTION_FAMILY)).claimed)

    while items := await now_claimable():  # the run and each step, no clock advance
        for item in items:
            await rig.run(item)
        rig.clock.now -= SEC  # run() moves the clock; stay before the retry's backoff
    assert [type(o).__name__ for k, o in rig.outcomes if k == "create"].count(
        "RetryLater") == 1
    # The unknown one was applied; the other steps wait behind it in the lane.
    assert len(rig.sim.subscriptions()) == 1
    # A run now (runs take no lane): it sees a subscription of a desired shape no row
    # names, and must not queue its delete.
    await rig.store.work_enqueue([run_spec(rig.binding, rig.catalog, now_us=rig.clock.now,
                                           interval_s=300, chain=False, max_attempts=5)],
                                 rig.clock.now)
    (run,) = await now_claimable()
    assert SubscriptionPayload.from_payload(run.payload).kind == "run"
    await rig.run(run)
    queued = await rig.store.work_list(WorkQuery(family=SUBSCRIPTION_FAMILY, limit=100))
    assert not [i for i in queued if '"kind":"delete"' in i.payload]
    await rig.drain()
    remote = rig.remote()
    assert all(len(ids) == 1 for ids in remote.values()) and len(remote) == 3
    assert len(await rig.rows()) == 3
    assert not [o for _, o in rig.outcomes if isinstance(o, DeadLetter)]


async def test_undesired_subscriptions_are_deleted_and_come_back_when_wanted_again(
        rig: Rig) -> None:
    await rig.reconcile()
    url = URL
    rig.route(public_url="")  # an operator subscribes this route now: ours are undesired
    await rig.reconcile()
    await rig.reconcile()  # the rows go once nothing of them is left at the provider
    assert rig.sim.subscriptions() == [] and await rig.rows() == {}
    rig.route(public_url=url)
    await rig.reconcile()
    remote = rig.remote()
    assert sorted(remote) == sorted((a, URL) for a in ACTIONS)
    assert all(r.generation == 1 for r in (await rig.rows()).values())


@pytest.mark.parametrize("mode", ["reset_after", "reset_before"])
async def test_a_create_step_dead_with_an_unknown_attempt_is_read_back_never_created_twice(
        rig: Rig, mode: FaultMode) -> None:
    """Issue 22: a create step whose attempts run out while its last attempt's outcome is
    unknown ends dead, inside that attempt's in-flight window. The next run must still
    count the create as in flight: nothing is created again (nor its maybe-made
    subscription deleted as an orphan) until a read-back past the window has resolved the
    attempt. Before the fix the run no longer counted the dead step as pending and queued
    a create that was sent at once: two subscriptions of one shape (reset_after)."""
    await rig.store.work_enqueue([run_spec(rig.binding, rig.catalog, now_us=rig.clock.now,
                                           interval_s=300, chain=False, max_attempts=5)],
                                 rig.clock.now)
    (run,) = (await claim(rig.store, now=rig.clock.now, family=SUBSCRIPTION_FAMILY)).claimed
    await rig.run(run)

    async def spend_budget(tx: SqlTx) -> None:
        # The steps' attempt budget is spent by the claim that sends (five claims each
        # ending RetryLater spend it the same way, only slower).
        await tx.execute("UPDATE work_items SET max_attempts = 1 WHERE family = ?"
                         " AND dedupe_key LIKE 'subs:create:%'", (SUBSCRIPTION_FAMILY,))

    await rig.store.db.transact(spend_budget, name="t")
    rig.sim.inject(Fault(mode, method="POST", path_prefix="/api/v2/webhooks", count=1))
    (step,) = (await claim(rig.store, now=rig.clock.now, family=SUBSCRIPTION_FAMILY)).claimed
    outcome = await rig.run(step)
    assert isinstance(outcome, RetryLater) and outcome.failure_class == "outcome_unknown"
    (dead,) = await rig.store.work_list(WorkQuery(family=SUBSCRIPTION_FAMILY, limit=100,
                                                  state=WorkState.DEAD))
    assert dead.work_id == step.work_id
    # The other two steps run, then (still inside the dead step's in-flight window) a
    # run, then everything it queued, as the clock moves on.
    while items := list((await claim(rig.store, now=rig.clock.now,
                                     family=SUBSCRIPTION_FAMILY)).claimed):
        for item in items:
            await rig.run(item)
    await rig.reconcile()
    created = [r for r in rig.sim.requests
               if r.method == "POST" and r.path == "/api/v2/webhooks" and r.applied]
    assert len(created) == 3, (
        f"{len(created)} subscriptions created for 3 desired: the dead step's unknown"
        " create was made again without waiting out its window and reading it back")
    remote = rig.remote()
    assert sorted(remote) == sorted((a, URL) for a in ACTIONS)
    assert all(len(ids) == 1 for ids in remote.values())
    assert len(await rig.rows()) == 3
    (attempt,) = await rig.store.effect_attempts(step.work_id)
    assert attempt.disposition == ("proven_applied" if mode == "reset_after"
                                   else "proven_absent")
    assert not [o for k, o in rig.outcomes if k == "delete"]


async def test_a_create_dead_unknown_before_a_reconnect_holds_the_subscription(
        rig: Rig) -> None:
    """Issue 22, across a reconnect: the dead step's unknown create was sent with the
    previous binding generation's identity (maybe another account): no list the binding
    makes now reads it back. Nothing is created for that subscription (nor its maybe-made
    one deleted) until an operator records the attempt's disposition; the others go on."""
    await rig.store.work_enqueue([run_spec(rig.binding, rig.catalog, now_us=rig.clock.now,
                                           interval_s=300, chain=False, max_attempts=5)],
                                 rig.clock.now)
    (run,) = (await claim(rig.store, now=rig.clock.now, family=SUBSCRIPTION_FAMILY)).claimed
    await rig.run(run)

    async def spend_budget(tx: SqlTx) -> None:
        await tx.execute("UPDATE work_items SET max_attempts = 1 WHERE family = ?"
                         " AND dedupe_key LIKE 'subs:create:%'", (SUBSCRIPTION_FAMILY,))

    await rig.store.db.transact(spend_budget, name="t")
    rig.sim.inject(Fault("reset_after", method="POST", path_prefix="/api/v2/webhooks",
                         count=1))
    (step,) = (await claim(rig.store, now=rig.clock.now, family=SUBSCRIPTION_FAMILY)).claimed
    await rig.run(step)
    held = SubscriptionPayload.from_payload(step.payload).name
    actor = Actor("op", "admin", "test reconnect")
    await rig.store.binding_transition(BINDING, BindingEvent.DISCONNECT, actor,
                                       expected_generation=1, now_us=rig.clock.now)
    await rig.store.binding_transition(BINDING, BindingEvent.RECONNECT, actor,
                                       expected_generation=1, now_us=rig.clock.now)
    await rig.drain()  # the steps queued under generation 1 send nothing
    for _ in range(3):  # runs under generation 2, past every window
        await rig.reconcile()
    created = [r for r in rig.sim.requests
               if r.method == "POST" and r.path == "/api/v2/webhooks" and r.applied]
    assert len(created) == 3, f"{len(created)} creates: the held one was made again"
    assert sorted(await rig.rows()) == sorted(f"outreach:{a}" for a in ACTIONS
                                              if f"outreach:{a}" != held)
    assert len(rig.sim.subscriptions()) == 3  # the maybe-made one is not deleted
    (attempt,) = await rig.store.effect_attempts(step.work_id)
    assert attempt.disposition is None  # left for the operator, never assumed absent
    # A create step for it decided under generation 2 all the same (as by a run that read
    # before the attempt was recorded): its one read of the kin finds the attempt sent
    # under generation 1, and it sends nothing.
    (extra,) = await rig.store.work_enqueue([item_spec(rig.binding, rig.catalog,
        SubscriptionPayload(kind="create", binding=BINDING, name=held, generation=1,
                            reason="missing", binding_generation=2),
        key=f"subs:create:{BINDING}:{held}:1:again", max_attempts=5)], rig.clock.now)
    (again,) = (await claim(rig.store, now=rig.clock.now, family=SUBSCRIPTION_FAMILY)).claimed
    assert again.work_id == extra.work_id
    outcome = await rig.run(again)
    assert isinstance(outcome, DeadLetter), outcome
    assert outcome.failure_class == "earlier_create_unresolved"
    assert attempt.attempt_id in outcome.summary
    assert len([r for r in rig.sim.requests if r.method == "POST"
                and r.path == "/api/v2/webhooks" and r.applied]) == 3

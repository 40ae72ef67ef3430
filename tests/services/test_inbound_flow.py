"""The inbound Flow against real parts: the Outreach simulator (hydration reads), the
reference Runtime (inbound mutations, Lead lookup), and real storage on every backend.

Each change is enqueued as an ``inbound_apply`` WorkItem, claimed through the kernel,
handled, and finalized with its side writes exactly as the worker pool does.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import attrs
import pytest
import trio

from config.catalog import load_catalog
from config.settings import BindingSettings, RuntimeClient, Secret, Settings
from daemon.core.identity import integration_remote_locator_hash, integration_scope_digest
from daemon.core.inbound_change import INBOUND_APPLY_FAMILY, InboundChange
from daemon.core.outcomes import DeadLetter, Outcome, RetryLater, Succeeded
from daemon.core.work import WorkItem
from daemon.providers.executor import BoundedHttp
from daemon.services.catalog_view import CatalogView, publish_current
from daemon.services.families import WorkContext
from daemon.services.inbound_flow import InboundFlow
from daemon.services.reconcile import RECONCILE_FAMILY, CursorReconciler, RunPayload, run_spec
from sandbox.outreach_sim import OutreachSimulator
from sandbox.ports import free_port
from storage.effect_values import LinkState
from storage.inbound import read_watermark
from storage.links import read_link_by_locator
from storage.port import LostLease, SqlTx, WorkQuery
from storage.work_store import WorkStore
from tests.sandbox_runtime import (
    RESULTS_TOKEN,
    SCOPE,
    RunningRuntime,
    running_fake,
    running_runtime,
)
from tests.support.work import SEC, T0, claim, finalization

TOKEN = "s2s-token-inbound"
BINDING = "outreach-main"
ACCOUNT = "org-77"
T1 = "2030-01-01T00:00:01.000Z"
T2 = "2030-01-01T00:00:02.000Z"


@attrs.define
class Clock:
    now: int = T0

    def now_us(self) -> int:
        return self.now


@attrs.define(eq=False)
class World:
    store: WorkStore
    sim: OutreachSimulator
    rt: RunningRuntime
    flow: InboundFlow
    settings: Settings
    clock: Clock
    lost: list[tuple[str, str]] = attrs.field(factory=list)

    @property
    def scope(self) -> str:
        return integration_scope_digest(SCOPE.org_id, SCOPE.app_installation_id, "outreach",
                                        ACCOUNT)

    def change(self, kind: str = "updated", attributes: dict[str, Any] | None = None,
               updated_at: str | None = T2, origin: str = "webhook", prospect: str = "7",
               origin_id: str = "e1") -> InboundChange:
        return InboundChange(
            provider="outreach", binding=BINDING, resource_type="prospect",
            resource_id=prospect, kind=kind,
            attributes={"firstName": "Ada"} if attributes is None else attributes,
            remote_updated_at=updated_at, origin=origin, origin_id=origin_id)

    async def claimed(self, change: InboundChange, owner: str = "A") -> WorkItem:
        catalog = self.flow.catalog
        await self.store.work_enqueue([change.work_spec(
            org_id=SCOPE.org_id, catalog_revision=catalog.revision,
            catalog_digest=catalog.digest)], self.clock.now)
        result = await claim(self.store, owner=owner, now=self.clock.now,
                             family=INBOUND_APPLY_FAMILY)
        (item,) = result.claimed
        return item

    def context(self, item: WorkItem, owner: str = "A") -> WorkContext:
        assert item.fence is not None
        return WorkContext(item=item, fence=item.fence, store=self.store, clock=self.clock,
                           replica_id=owner)

    async def finish(self, ctx: WorkContext, outcome: Outcome) -> None:
        writes = list(ctx.side_writes)

        async def all_writes(tx: SqlTx) -> None:
            for write in writes:
                await write(tx)

        (done,) = await self.store.work_finalize_if_owner(
            [finalization(ctx.item, outcome, self.clock.now)], ctx.replica_id,
            lambda: self.clock.now,
            {ctx.item.work_id: all_writes} if writes else None)
        assert done.applied, done

    async def run(self, change: InboundChange) -> Outcome:
        ctx = self.context(await self.claimed(change))
        outcome = await self.flow.handle(ctx)
        await self.finish(ctx, outcome)
        self.clock.now += SEC
        return outcome

    async def lead(self, **fields: str) -> None:
        made = await self.rt.http.post("/leads", json={"lead_id": "lead-1", "title": "Eng",
                                                       "fields": fields})
        assert made.status_code == 201, made.text

    async def link(self, prospect: str = "7", lead: str = "lead-1") -> None:
        await self.store.link_adopt(self.scope, "lead", lead, "prospect", prospect,
                                    actor="test", role="admin", reason="outbound slice",
                                    now_us=self.clock.now)

    async def fields(self, lead: str = "lead-1") -> dict[str, Any]:
        doc: dict[str, Any] = (await self.rt.http.get(f"/_runtime/leads/{lead}/fields")).json()
        return dict(doc["fields"])

    async def in_tx(self, body: Callable[[SqlTx], Awaitable[Any]]) -> Any:
        return await self.store.db.transact(body, name="test.read", write=False)

    async def attempts(self, work_id: str) -> list[Any]:
        return await self.store.effect_attempts(work_id)

    def stats(self) -> dict[str, Any]:
        return self.rt.runtime.store.stats()


@pytest.fixture
async def world(store: WorkStore, nursery: trio.Nursery) -> AsyncIterator[World]:
    sim = OutreachSimulator(tokens={TOKEN})
    sim_port = await nursery.start(sim.run)
    async with running_fake() as (_, fake_url), running_runtime(fake_url) as rt:
        runtime_url = str(rt.http.base_url).rstrip("/")
        settings = Settings(
            bindings=(BindingSettings(
                binding_id=BINDING, provider="outreach", org_id=SCOPE.org_id,
                app_installation_id=SCOPE.app_installation_id, remote_account_id=ACCOUNT,
                base_url=f"http://127.0.0.1:{sim_port}", auth="static_token",
                token=Secret(TOKEN)),),
            runtimes=(RuntimeClient(
                name="crm", org_id=SCOPE.org_id, app_installation_id=SCOPE.app_installation_id,
                runtime_capability_id=SCOPE.runtime_capability_id,
                runtime_work_binding_digest=SCOPE.runtime_work_binding_digest,
                results_url=f"{runtime_url}/runtime/v1/results", token=Secret("t"),
                results_token=Secret(RESULTS_TOKEN)),),
        )
        catalog = load_catalog(settings)
        await publish_current(store, catalog, actor="test", role="admin", reason="inbound",
                              now_us=T0)
        http = BoundedHttp.open(8)
        w = World(store, sim, rt, InboundFlow(settings=settings, catalog=catalog,
                                              catalogs=CatalogView(store, catalog),
                                              provider_http=http, runtime_http=http),
                  settings, Clock())
        w.flow.on_lost_webhook = lambda provider, resource: w.lost.append((provider, resource))
        try:
            yield w
        finally:
            await http.aclose()


async def test_a_partial_update_changes_only_what_it_carries(world: World) -> None:
    await world.lead(FirstName="Old", LastName="Lovelace", Company="ACME")
    await world.link()
    change = world.change(attributes={"firstName": "Ada", "title": "CTO"})
    outcome = await world.run(change)
    assert outcome == Succeeded("applied FirstName")
    # Not blanked, not touched: LastName and Company; Title is outbound-owned.
    assert await world.fields() == {"FirstName": "Ada", "LastName": "Lovelace",
                                    "Company": "ACME"}
    assert (await world.rt.http.get("/leads/lead-1")).json()["title"] == "Eng"
    (item,) = await world.store.work_list(WorkQuery(family=INBOUND_APPLY_FAMILY))
    (attempt,) = await world.attempts(item.work_id)
    assert (attempt.outcome, attempt.method, attempt.target_path) == (
        "ACCEPTED", "POST", "/runtime/v1/inbound-mutations")
    assert attempt.idempotency_key.startswith("inb:")
    locator = integration_remote_locator_hash(world.scope, "prospect", "7")
    mark = await world.in_tx(lambda tx: read_watermark(tx, locator, world.scope,
                                                       "prospect", "7"))
    assert set(mark.field_stamps) == {"firstName"} and mark.webhook_seen_ns > 0


async def test_an_older_change_never_regresses_a_newer_one(world: World) -> None:
    await world.lead()
    await world.link()
    assert isinstance(await world.run(world.change(attributes={"firstName": "New"},
                                                   updated_at=T2, origin_id="e2")), Succeeded)
    older = await world.run(world.change(attributes={"firstName": "Old", "lastName": "L"},
                                         updated_at=T1, origin_id="e1"))
    assert older == Succeeded("applied LastName")
    assert await world.fields() == {"FirstName": "New", "LastName": "L"}
    # The same version again, from reconciliation: nothing newer, no second mutation.
    again = await world.run(world.change(kind="observed", attributes={"firstName": "New"},
                                         updated_at=T2, origin="reconcile", origin_id="r1"))
    assert again == Succeeded("no inbound-owned field is newer than what was applied")
    assert world.stats()["mutations_applied"] == 2
    assert world.lost == []


async def test_a_created_prospect_is_hydrated_matched_by_email_and_linked(
        world: World) -> None:
    await world.lead(Email="ada@example.com")
    world.sim.put_prospect({"firstName": "Ada", "lastName": "Lovelace",
                            "emails": ["ADA@example.com"]}, prospect_id=9)
    # A partial created payload: no emails, no lastName.
    outcome = await world.run(world.change(kind="created", prospect="9", updated_at=None,
                                           attributes={"firstName": "Ada"}))
    assert outcome == Succeeded("applied FirstName, LastName")
    assert await world.fields() == {"Email": "ada@example.com", "FirstName": "Ada",
                                    "LastName": "Lovelace"}
    locator = integration_remote_locator_hash(world.scope, "prospect", "9")
    link = await world.in_tx(lambda tx: read_link_by_locator(tx, locator))
    assert link is not None and link.local_id == "lead-1" and link.state is LinkState.ACTIVE
    assert [r.method for r in world.sim.requests] == ["GET"]  # one hydration read
    (adopted,) = [a for a in await world.store.audit_list(50, target_id=link.link_key)
                  if a.action == "link.adopt"]
    assert (adopted.actor, adopted.role) == ("integrationd", "inbound_flow")
    assert "Email" in adopted.reason


async def test_a_change_observed_under_another_account_is_never_applied(
        world: World) -> None:
    """Materialized (or listed) before a rebind, a change names the old account's record
    id: after the rebind it is refused before any read or mutation (binding_drift)."""
    await world.lead(Email="ada@example.com")
    world.sim.put_prospect({"firstName": "Ada", "emails": ["ada@example.com"]},
                           prospect_id=9)
    stale = attrs.evolve(world.change(kind="created", prospect="9", updated_at=None),
                         remote_account="account-before-the-rebind")
    outcome = await world.run(stale)
    assert isinstance(outcome, DeadLetter) and outcome.failure_class == "binding_drift"
    assert "account-before-the-rebind" in outcome.summary and ACCOUNT in outcome.summary
    assert world.sim.requests == [] and world.stats()["mutations_applied"] == 0
    # The same change pinned to the account the binding names is applied.
    current = attrs.evolve(stale, remote_account=ACCOUNT, origin_id="e2")
    assert await world.run(current) == Succeeded("applied FirstName")


async def test_a_hydrated_prospect_with_a_fractional_score_keeps_its_exact_text(
        world: World) -> None:
    """A provider's number with a fraction (Outreach's scores) is not a float anywhere:
    the hydrated snapshot keeps its exact decimal text and the flow goes on."""
    await world.lead(Email="ada@example.com")
    world.sim.put_prospect({"firstName": "Ada", "lastName": "Lovelace", "engagedScore": 0.1,
                            "emails": ["ada@example.com"]}, prospect_id=9)
    outcome = await world.run(world.change(kind="created", prospect="9", updated_at=None,
                                           attributes={"firstName": "Ada"}))
    assert outcome == Succeeded("applied FirstName, LastName")
    assert await world.fields() == {"Email": "ada@example.com", "FirstName": "Ada",
                                    "LastName": "Lovelace"}


@pytest.mark.parametrize(("emails", "code"), [
    (["nobody@example.com"], "no_local_match"),
    (["twin@example.com"], "several_local_matches"),
])
async def test_no_or_several_local_matches_fail_closed(world: World, emails: list[str],
                                                        code: str) -> None:
    for lead in ("lead-1", "lead-2"):
        made = await world.rt.http.post("/leads", json={
            "lead_id": lead, "title": "x", "fields": {"Email": "twin@example.com"}})
        assert made.status_code == 201
    outcome = await world.run(world.change(kind="created", prospect="9",
                                           attributes={"emails": emails}))
    assert isinstance(outcome, DeadLetter) and outcome.failure_class == code
    locator = integration_remote_locator_hash(world.scope, "prospect", "9")
    assert await world.in_tx(lambda tx: read_link_by_locator(tx, locator)) is None
    assert world.stats()["mutations_applied"] == 0
    (item,) = await world.store.work_list(WorkQuery(family=INBOUND_APPLY_FAMILY))
    assert item.state.value == "dead" and item.failure_class == code


async def test_a_lead_linked_elsewhere_is_a_conflicting_locator(world: World) -> None:
    await world.lead(Email="ada@example.com")
    await world.link(prospect="5")  # lead-1 already mirrors Prospect 5
    outcome = await world.run(world.change(kind="created", prospect="9",
                                           attributes={"emails": ["ada@example.com"]}))
    assert isinstance(outcome, DeadLetter)
    assert outcome.failure_class == "conflicting_locator"


async def test_destroyed_retires_the_link_and_keeps_the_lead(world: World) -> None:
    await world.lead(FirstName="Ada")
    await world.link()
    outcome = await world.run(world.change(kind="destroyed", attributes={}))
    assert outcome == Succeeded("remote record destroyed; link retired, local record kept")
    assert (await world.rt.http.get("/leads/lead-1")).status_code == 200
    assert await world.fields() == {"FirstName": "Ada"}
    link = await world.store.link_get(world.scope, "lead", "lead-1")
    assert link is not None and link.state is LinkState.RETIRED
    # A late, older update of the destroyed record changes nothing.
    late = await world.run(world.change(updated_at=T1, origin_id="late"))
    assert late == Succeeded("older than the observed deletion of the record")
    assert await world.fields() == {"FirstName": "Ada"}
    (retired,) = [a for a in await world.store.audit_list(50, target_id=link.link_key)
                  if a.action == "link.retire"]
    assert "observed destroyed" in retired.reason and retired.actor == "integrationd"


async def test_unknown_binding_is_drift_and_bad_payload_is_dead(world: World) -> None:
    change = attrs.evolve(world.change(), binding="gone")
    outcome = await world.run(change)
    assert isinstance(outcome, DeadLetter) and outcome.failure_class == "binding_drift"
    item = await world.claimed(world.change(origin_id="x"))
    ctx = world.context(attrs.evolve(item, payload=json.dumps({"version": 9})))
    bad = await world.flow.handle(ctx)
    assert isinstance(bad, DeadLetter) and bad.failure_class == "bad_payload"


async def test_a_stale_claimant_sends_no_mutation(world: World) -> None:
    await world.lead()
    await world.link()
    stale = await world.claimed(world.change())
    # Its lease (30 s) runs out; replica B reclaims the item.
    world.clock.now += 60 * SEC
    reclaimed = await claim(world.store, owner="B", now=world.clock.now,
                            family=INBOUND_APPLY_FAMILY)
    assert len(reclaimed.claimed) == 1
    with pytest.raises(LostLease):
        await world.flow.handle(world.context(stale))
    assert world.stats()["mutations_applied"] == 0
    assert await world.attempts(stale.work_id) == []


async def test_reconciliation_of_a_version_no_webhook_delivered_is_a_lost_webhook(
        world: World) -> None:
    await world.lead()
    await world.link()
    outcome = await world.run(world.change(kind="observed", origin="reconcile",
                                           attributes={"firstName": "Seen"}, origin_id="r1"))
    assert outcome == Succeeded("applied FirstName")
    assert world.lost == [("outreach", "prospect")]


async def test_an_unreachable_runtime_is_retried_with_the_same_mutation_key(
        world: World) -> None:
    await world.lead()
    await world.link()
    real = world.flow.settings
    (runtime,) = real.runtimes
    dead = attrs.evolve(runtime, results_url=f"http://127.0.0.1:{free_port()}/runtime/v1/r")
    world.flow.settings = attrs.evolve(real, runtimes=(dead,))
    first = await world.run(world.change())
    assert isinstance(first, RetryLater) and first.failure_class == "runtime_unavailable"
    world.flow.settings = real
    (item,) = await world.store.work_list(WorkQuery(family=INBOUND_APPLY_FAMILY))
    world.clock.now += 120 * SEC  # past the retry's backoff
    result = await claim(world.store, now=world.clock.now, family=INBOUND_APPLY_FAMILY)
    (again,) = result.claimed
    ctx = world.context(again)
    outcome = await world.flow.handle(ctx)
    await world.finish(ctx, outcome)
    assert outcome == Succeeded("applied FirstName")
    attempts = await world.attempts(item.work_id)
    assert [a.outcome for a in attempts] == ["REPLAY_SAFE_RETRY", "ACCEPTED"]
    assert attempts[0].idempotency_key == attempts[1].idempotency_key
    assert world.stats()["mutations_applied"] == 1


async def test_a_lost_webhook_is_found_by_reconciliation_and_applied(world: World) -> None:
    await world.lead(FirstName="Old")
    await world.link()
    world.sim.put_prospect({"firstName": "Old"}, prospect_id=7)
    world.sim.update_prospect(7, {}, updated_at="2026-06-01T00:00:00.000Z", notify=False)
    binding = world.flow.catalog.binding(BINDING)
    assert binding is not None
    http = BoundedHttp.open(2)
    reconciler = CursorReconciler(
        inbound_max_attempts=5, catalog=world.flow.catalog, catalogs=world.flow.catalogs,
        http=http, max_attempts=5)

    async def reconcile_then_apply() -> list[Outcome]:
        result = await claim(world.store, now=world.clock.now, family=RECONCILE_FAMILY)
        (run,) = result.claimed
        ctx = world.context(run)
        assert isinstance(await reconciler.handle(ctx), Succeeded)
        await world.finish(ctx, Succeeded())
        outcomes = []
        for item in (await claim(world.store, now=world.clock.now,
                                 family=INBOUND_APPLY_FAMILY)).claimed:
            item_ctx = world.context(item)
            outcomes.append(await world.flow.handle(item_ctx))
            await world.finish(item_ctx, outcomes[-1])
        return outcomes

    try:
        await world.store.work_enqueue([run_spec(
            world.flow.catalog, binding, RunPayload(binding=BINDING, resource="prospect"),
            number=0, max_attempts=5)], world.clock.now)
        # The initial sync: offered as a repair, nothing counted lost.
        assert await reconcile_then_apply() == [Succeeded("applied FirstName")]
        assert world.lost == []
        # Changed inside Outreach; the webhook never arrives (no subscription delivered it).
        world.sim.update_prospect(7, {"firstName": "Zed"},
                                  updated_at="2026-06-01T00:00:09.000Z", notify=False)
        world.clock.now += 301 * SEC
        assert Succeeded("applied FirstName") in await reconcile_then_apply()
    finally:
        await http.aclose()
    assert await world.fields() == {"FirstName": "Zed"}
    assert world.lost == [("outreach", "prospect")]

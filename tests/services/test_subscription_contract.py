"""The subscription family inside the effect contract (issue 21 item 3; seed 9).

The reconciler is built by the composition root (``daemon.services.assembly.assemble``,
as ``integrationd run`` builds it) and run against the real Outreach simulator with the
S2S token endpoint mounted (it accepts exactly the minted tokens), on every backend:

* subscription calls take the binding's credential from the credential service: an S2S
  binding's list and creates carry the minted token of the pinned generation (found on
  main: every run answered "the subscription list did not answer 200 (401)");
* an unknown create is never sent again within the declared in-flight window, and is then
  reconciled by listing;
* reconciliation appends a disposition to the attempt; its outcome and evidence stay
  within their enums;
* a reconnect (a new binding generation) fences the steps queued before it: none of them
  sends;
* every call takes one slot of the binding's provider quota.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
import trio

from config.settings import BindingSettings, KeysSettings, Secret, Settings, WebhookRoute
from daemon.core.effects import Evidence, OutcomeClass
from daemon.core.outcomes import Outcome
from daemon.core.principals import BindingEvent
from daemon.core.work import WorkItem
from daemon.services.assembly import Assembly, assemble
from daemon.services.families import WorkContext
from daemon.services.principal_bootstrap import ensure_config_bindings
from daemon.services.subscriptions import SUBSCRIPTION_FAMILY, SubscriptionPayload, run_spec
from sandbox.hubspot_sim.model import Fault
from sandbox.outreach_sim import OutreachSimulator
from sandbox.s2s_token_sim import S2STokenEndpoint, s2s_routes
from storage.effect_values import Disposition
from storage.port import SqlTx, WorkQuery
from storage.principals import Actor
from storage.work_store import WorkStore
from tests.support.s2s import private_pem, public_pem
from tests.support.work import SEC, claim, finalization

BINDING = "outreach-main"
APP = "s2s-app-subscriptions"
INSTALL = "install-subs"
URL = "https://hooks.example.test/hooks/outreach-main"
WEBHOOKS = "/api/v2/webhooks"
# L1's declared in-flight window of a subscription create (config/providers/outreach.toml).
IN_FLIGHT_S = 30.0
STATIC_TOKEN = "static-token-subscriptions"


@attrs.define
class Clock:
    now: int = attrs.Factory(lambda: int(time.time() * 1_000_000))

    def now_us(self) -> int:
        return self.now


@attrs.define(eq=False)
class Rig:
    store: WorkStore
    sim: OutreachSimulator
    assembly: Assembly
    settings: Settings
    clock: Clock
    outcomes: list[tuple[str, Outcome]] = attrs.field(factory=list)

    @property
    def binding(self) -> BindingSettings:
        (binding,) = self.settings.bindings
        return binding

    async def queue_run(self) -> None:
        await self.store.work_enqueue([run_spec(self.binding, self.assembly.catalog,
                                                now_us=self.clock.now, interval_s=300,
                                                chain=False, max_attempts=5)], self.clock.now)

    async def claim_now(self) -> list[WorkItem]:
        result = await claim(self.store, owner="A", now=self.clock.now,
                             family=SUBSCRIPTION_FAMILY)
        return list(result.claimed)

    async def run(self, item: WorkItem) -> Outcome:
        assert item.fence is not None
        handler = self.assembly.registry.get(SUBSCRIPTION_FAMILY).handler
        ctx = WorkContext(item=item, fence=item.fence, store=self.store, clock=self.clock,
                          replica_id="A")
        outcome = await handler(ctx)
        writes = list(ctx.side_writes)

        async def all_writes(tx: SqlTx) -> None:
            for write in writes:
                await write(tx)

        (done,) = await self.store.work_finalize_if_owner(
            [finalization(item, outcome, self.clock.now)], "A", lambda: self.clock.now,
            {item.work_id: all_writes} if writes else None)
        assert done.applied
        self.outcomes.append((SubscriptionPayload.from_payload(item.payload).kind, outcome))
        return outcome

    async def drain_now(self) -> None:
        """Every item claimable at this instant (and what they queue for now)."""
        for _ in range(20):
            items = await self.claim_now()
            if not items:
                return
            for item in items:
                await self.run(item)

    def posts(self) -> list[int]:
        return [r.seq for r in self.sim.requests if r.method == "POST" and r.path == WEBHOOKS]

    async def attempts(self) -> list[tuple[str | None, str | None, str | None]]:
        async def body(tx: SqlTx) -> list[tuple[str | None, str | None, str | None]]:
            rows = await tx.fetchall(
                "SELECT a.outcome, a.evidence, a.disposition FROM effect_attempts a"
                " JOIN work_items w ON w.work_id = a.work_id WHERE w.family = ?"
                " ORDER BY a.attempt_id", (SUBSCRIPTION_FAMILY,))
            return [(None if r[0] is None else str(r[0]), None if r[1] is None else str(r[1]),
                     None if r[2] is None else str(r[2])) for r in rows]

        return await self.store.db.transact(body, name="t", write=False)


@pytest.fixture(params=["s2s", "static_token"])
async def rig(request: pytest.FixtureRequest, store: WorkStore, nursery: trio.Nursery,
              tmp_path: Path) -> AsyncIterator[Rig]:
    """An S2S binding (as ``make run`` configures Outreach) and a static-token one (the
    sandbox's other kind)."""
    s2s = S2STokenEndpoint(app_id=APP, public_key_pem=public_pem(private_pem()),
                           installs={INSTALL})
    sim = OutreachSimulator(tokens=s2s.access_tokens, mounts=s2s_routes(s2s))
    port = await nursery.start(sim.run)
    sim_url = f"http://127.0.0.1:{port}"
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "k1.key").write_text("ab" * 32)
    binding = BindingSettings(
        binding_id=BINDING, provider="outreach", org_id="org-1",
        app_installation_id="app-1", remote_account_id="acct-1", base_url=sim_url,
        auth="s2s", s2s_app_id=APP, s2s_installation_id=INSTALL,
        s2s_private_key=Secret(private_pem().decode()),
        token_url=f"{sim_url}/api/app/installs/{{installation_id}}/actions/accessToken")
    if request.param == "static_token":
        binding = BindingSettings(
            binding_id=BINDING, provider="outreach", org_id="org-1",
            app_installation_id="app-1", remote_account_id="acct-1", base_url=sim_url,
            auth="static_token", token=Secret(STATIC_TOKEN))
        sim.tokens.add(STATIC_TOKEN)
    route = WebhookRoute(route=BINDING, binding_id=BINDING, webhook="outreach.prospect_events",
                         public_url=URL, secret=Secret("route-secret-one"))
    settings = Settings(bindings=(binding,), webhook_routes=(route,),
                        keys=KeysSettings(active="k1", dir="secrets"),
                        base_dir=str(tmp_path))
    clock = Clock()
    await ensure_config_bindings(store, settings.bindings, clock.now)
    assembly = assemble(settings, store, clock)
    try:
        yield Rig(store, sim, assembly, settings, clock)
    finally:
        await assembly.aclose()


async def test_an_s2s_bindings_subscription_run_lists_and_creates_with_its_minted_token(
        rig: Rig) -> None:
    """Seen on main: the run listed with no credential (the static token of an S2S
    binding is None) and the item went dead with "did not answer 200 (401)"."""
    await rig.queue_run()
    await rig.drain_now()
    assert [(k, type(o).__name__) for k, o in rig.outcomes if k == "run"] == [
        ("run", "Succeeded")], rig.outcomes
    assert sorted(s.action for s in rig.sim.subscriptions()) == [
        "created", "destroyed", "updated"]
    assert all(s.secret == "route-secret-one" for s in rig.sim.subscriptions())
    # Every provider call carried a minted token (the simulator answered none with 401).
    assert [r.status for r in rig.sim.requests if r.path.startswith(WEBHOOKS)
            and r.status == 401] == []


async def test_an_unknown_create_is_not_sent_again_within_the_in_flight_window(
        rig: Rig) -> None:
    """Seen on main: after a create whose answer was lost (the connection reset before
    the provider applied it), the step's next claim, a second later, listed, saw nothing
    and created again: two POSTs one second apart."""
    rig.sim.inject(Fault("reset_before", method="POST", path_prefix=WEBHOOKS, count=1))
    await rig.queue_run()
    await rig.drain_now()  # the run, then the first create (its outcome unknown)
    assert len(rig.posts()) == 1
    # Every claim the work queue allows within the window: none may send a create again
    # (the other steps wait behind this one in the binding's lane).
    for _ in range(int(IN_FLIGHT_S) - 1):
        rig.clock.now += SEC
        await rig.drain_now()
        assert len(rig.posts()) == 1, rig.outcomes
    # Past the window, the list is read back: nothing there, so it is created (once).
    for _ in range(10):
        rig.clock.now += 10 * SEC
        await rig.drain_now()
    assert sorted(s.action for s in rig.sim.subscriptions()) == [
        "created", "destroyed", "updated"]


@pytest.mark.parametrize("mode", ["reset_after", "reset_before"])
async def test_a_read_back_appends_a_disposition_and_never_rewrites_the_attempt(
        rig: Rig, mode: str) -> None:
    """Seen on main: the read-back rewrote the unknown attempt's evidence to
    "proven_applied" / "proven_absent" (values outside the evidence enum) and left no
    disposition."""
    rig.sim.inject(Fault(mode, method="POST", path_prefix=WEBHOOKS, count=1))  # type: ignore[arg-type]
    await rig.queue_run()
    for _ in range(20):
        await rig.drain_now()
        rig.clock.now += 10 * SEC
    assert len(rig.sim.subscriptions()) == 3
    attempts = await rig.attempts()
    outcomes = {o.value for o in OutcomeClass}
    evidence = {e.value for e in Evidence}
    dispositions = {d.value for d in Disposition}
    assert all(o in outcomes and (e is None or e in evidence)
               and (d is None or d in dispositions) for o, e, d in attempts), attempts
    unknown = [(e, d) for o, e, d in attempts if o == OutcomeClass.OUTCOME_UNKNOWN]
    expected = (Disposition.PROVEN_APPLIED if mode == "reset_after"
                else Disposition.PROVEN_ABSENT)
    assert unknown == [(Evidence.MAYBE_APPLIED.value, expected.value)], attempts


async def test_a_reconnect_fences_the_steps_queued_before_it(rig: Rig) -> None:
    """Seen on main: steps queued under generation 1 sent their creates after the binding
    was reconnected (generation 2), with whatever credential the binding had then."""
    await rig.queue_run()
    (item,) = await rig.claim_now()
    await rig.run(item)  # the run: three create steps queued under generation 1
    facts = await rig.store.binding_get(BINDING)
    assert facts is not None and facts.generation == 1
    actor = Actor("op", "admin", "test reconnect")
    await rig.store.binding_transition(BINDING, BindingEvent.DISCONNECT, actor,
                                       expected_generation=1, now_us=rig.clock.now)
    moved = await rig.store.binding_transition(BINDING, BindingEvent.RECONNECT, actor,
                                               expected_generation=1, now_us=rig.clock.now)
    assert moved.generation == 2
    before = len(rig.posts())
    for _ in range(5):
        await rig.drain_now()
        rig.clock.now += 10 * SEC
    assert len(rig.posts()) == before, rig.outcomes


async def test_every_subscription_call_takes_a_slot_of_the_bindings_quota(rig: Rig) -> None:
    """Seen on main: the list and the creates reserved nothing (no quota reservation
    rows), so they could exceed the provider's per-binding budget."""
    await rig.queue_run()
    await rig.drain_now()

    async def body(tx: SqlTx) -> list[tuple[str, str]]:
        rows = await tx.fetchall(
            "SELECT q.quota_key, q.state FROM quota_reservations q JOIN work_items w"
            " ON w.work_id = q.work_id WHERE w.family = ?", (SUBSCRIPTION_FAMILY,))
        return [(str(r[0]), str(r[1])) for r in rows]

    reserved = await rig.store.db.transact(body, name="t", write=False)
    calls = [r for r in rig.sim.requests if r.path.startswith(WEBHOOKS)]
    assert len(calls) == 4  # one list, three creates
    assert len(reserved) == len(calls), reserved
    assert {k for k, _ in reserved} == {f"outreach:per_user_hour:org-1:{BINDING}"}
    assert {s for _, s in reserved} == {"sent"}


async def test_a_step_whose_outcome_is_unknown_is_not_replayed_as_a_new_call(
        rig: Rig) -> None:
    """Seen on main: the family had no replay guard, so an operator's replay of a create
    whose outcome was unknown made a new WorkItem (a new command id, no attempt in doubt)
    that sent the create again, a second subscription."""
    rig.sim.inject(Fault("reset_after", method="POST", path_prefix=WEBHOOKS, count=1))
    await rig.queue_run()
    await rig.drain_now()  # the run, then the first create: applied, its answer lost
    (step,) = [i for i in await rig.store.work_list(WorkQuery(family=SUBSCRIPTION_FAMILY))
               if '"kind":"create"' in i.payload and i.attempt == 1
               and i.failure_class == "outcome_unknown"]
    guard = rig.assembly.registry.get(SUBSCRIPTION_FAMILY).replay_guard
    assert guard is not None
    refusal = await guard(rig.store, step)
    assert refusal is not None and "outcome is unknown" in refusal
    # Once the read-back has settled it (past the window), a replay is allowed again.
    for _ in range(10):
        rig.clock.now += 10 * SEC
        await rig.drain_now()
    settled = await rig.store.work_get(step.work_id)
    assert settled is not None and settled.state.value == "succeeded"
    assert await guard(rig.store, settled) is None
    assert len(rig.sim.subscriptions()) == 3

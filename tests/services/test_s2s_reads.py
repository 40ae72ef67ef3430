"""The inbound Flow's hydration GET and reconciliation's list requests with an
``auth = "s2s"`` binding (issue 10 item 7 with issue 9's mint): both take the durable
binding generation's minted token through the single-winner token owner, from the same
grant the effect path uses; a JWT the endpoint refuses marks the grant "needs
re-authorization" after one call, and the reads wait (nothing is read without a token).

Real parts: the Outreach simulator with the S2S token endpoint mounted (it accepts exactly
the minted tokens), the reference Runtime, real storage on every backend.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import attrs
import httpx
import pytest
import trio

from config.catalog import load_catalog
from config.settings import BindingSettings, KeysSettings, RuntimeClient, Secret, Settings
from daemon.core.outcomes import DeadLetter, RetryLater, Succeeded
from daemon.core.principals import BindingEvent
from daemon.core.token_bundle import TokenKey
from daemon.providers.executor import BoundedHttp
from daemon.services.catalog_view import CatalogView, publish_current
from daemon.services.clock import WallClock
from daemon.services.credentials import Credentials
from daemon.services.inbound_flow import InboundFlow
from daemon.services.principal_bootstrap import ensure_config_bindings
from daemon.services.reconcile import RECONCILE_FAMILY, CursorReconciler, RunPayload, run_spec
from daemon.services.token_refresh import TokenOwner
from sandbox.outreach_sim import OutreachSimulator
from sandbox.s2s_token_sim import S2STokenEndpoint, s2s_routes
from storage.grants import GrantState
from storage.principals import Actor
from storage.work_store import WorkStore
from tests.sandbox_runtime import RESULTS_TOKEN, SCOPE, running_fake, running_runtime
from tests.services.test_inbound_flow import ACCOUNT, BINDING, Clock, World
from tests.support.s2s import private_pem, public_pem
from tests.support.work import T0, claim

KEY = TokenKey("k1", bytes(range(32)))
APP = "s2s-app-reads"
INSTALL = "install-9"


@attrs.define(eq=False)
class S2SWorld:
    world: World
    s2s: S2STokenEndpoint
    reconciler: CursorReconciler


def _binding(sim_url: str, app_id: str) -> BindingSettings:
    return BindingSettings(
        binding_id=BINDING, provider="outreach", org_id=SCOPE.org_id,
        app_installation_id=SCOPE.app_installation_id, remote_account_id=ACCOUNT,
        base_url=sim_url, auth="s2s", s2s_app_id=app_id, s2s_installation_id=INSTALL,
        s2s_private_key=Secret(private_pem().decode()),
        token_url=f"{sim_url}/api/app/installs/{{installation_id}}/actions/accessToken")


@pytest.fixture(params=["good_key", "refused_key"])
async def s2s_world(request: pytest.FixtureRequest, store: WorkStore,
                    nursery: trio.Nursery) -> AsyncIterator[S2SWorld]:
    # "refused_key": the endpoint knows another issuer, so every app JWT is refused.
    app_seen = APP if request.param == "good_key" else "another-app"
    s2s = S2STokenEndpoint(app_id=app_seen, public_key_pem=public_pem(private_pem()),
                           installs={INSTALL})
    sim = OutreachSimulator(tokens=s2s.access_tokens, mounts=s2s_routes(s2s))
    sim_port = await nursery.start(sim.run)
    sim_url = f"http://127.0.0.1:{sim_port}"
    async with running_fake() as (_, fake_url), running_runtime(fake_url) as rt, \
            httpx.AsyncClient() as token_http:
        runtime_url = str(rt.http.base_url).rstrip("/")
        settings = Settings(
            bindings=(_binding(sim_url, APP),),
            keys=KeysSettings(active="k1"),
            runtimes=(RuntimeClient(
                name="crm", org_id=SCOPE.org_id, app_installation_id=SCOPE.app_installation_id,
                runtime_capability_id=SCOPE.runtime_capability_id,
                runtime_work_binding_digest=SCOPE.runtime_work_binding_digest,
                results_url=f"{runtime_url}/runtime/v1/results", token=Secret("t"),
                results_token=Secret(RESULTS_TOKEN)),),
        )
        catalog = load_catalog(settings)
        await publish_current(store, catalog, actor="test", role="admin", reason="s2s reads",
                              now_us=T0)
        await ensure_config_bindings(store, settings.bindings, T0)
        # The token owner runs on the wall clock: the endpoint checks the JWT's times.
        credentials = Credentials(TokenOwner(store, {"k1": KEY}, "k1", token_http,
                                             WallClock()))
        http = BoundedHttp.open(8)
        views = CatalogView(store, catalog)
        flow = InboundFlow(settings=settings, catalog=catalog, catalogs=views,
                           provider_http=http, runtime_http=http, credentials=credentials)
        reconciler = CursorReconciler(
            max_attempts=5, inbound_max_attempts=5, catalog=catalog, catalogs=views, http=http,
            credentials=credentials)
        try:
            yield S2SWorld(World(store, sim, rt, flow, settings, Clock()), s2s, reconciler)
        finally:
            await http.aclose()


async def test_hydration_and_listing_use_one_minted_token_or_wait_when_it_is_refused(
        s2s_world: S2SWorld) -> None:
    world, s2s = s2s_world.world, s2s_world.s2s
    good = s2s.app_id == APP
    await world.lead(Email="ada@example.com")
    world.sim.put_prospect({"firstName": "Ada", "lastName": "Lovelace",
                            "emails": ["ada@example.com"]}, prospect_id=9)
    # A partial created payload: the Flow hydrates the Prospect with a GET.
    outcome = await world.run(world.change(kind="created", prospect="9", updated_at=None,
                                           attributes={"firstName": "Ada"}))
    binding = world.flow.catalog.binding(BINDING)
    assert binding is not None
    await world.store.work_enqueue([run_spec(
        world.flow.catalog, binding, RunPayload(binding=BINDING, resource="prospect"),
        number=0, max_attempts=5)], world.clock.now)
    (run,) = (await claim(world.store, now=world.clock.now, family=RECONCILE_FAMILY)).claimed
    listed = await s2s_world.reconciler.handle(world.context(run))
    grant = await world.store.grant_get(BINDING, 1)
    assert grant is not None
    if good:
        assert outcome == Succeeded("applied FirstName, LastName")
        assert isinstance(listed, Succeeded)
        # One mint served both the GET and the list request.
        assert [(e["install_id"], e["answer"]) for e in s2s.journal] == [(INSTALL, "ok")]
        assert [(r.method, r.status) for r in world.sim.requests] == [("GET", 200),
                                                                       ("GET", 200)]
        assert (grant.state, grant.token_version) == (GrantState.VALID, 2)
    else:
        # Refused once; the grant needs re-authorization; nothing was read, the work waits.
        assert isinstance(outcome, RetryLater)
        assert outcome.failure_class == "needs_reauthorization"
        assert isinstance(listed, RetryLater)
        assert listed.failure_class == "needs_reauthorization"
        assert [str(e["answer"]).split(":")[0] for e in s2s.journal] == ["invalid_jwt"]
        assert world.sim.requests == []
        assert grant.state is GrantState.NEEDS_REAUTHORIZATION


async def test_the_toml_installation_only_bootstraps_the_durable_binding(
        store: WorkStore, caplog: pytest.LogCaptureFixture) -> None:
    binding = _binding("http://127.0.0.1:1", APP)
    (facts,) = (await ensure_config_bindings(store, (binding,), T0)).values()
    assert facts.identity.installation_id == INSTALL
    moved = attrs.evolve(binding, s2s_installation_id="install-edited-in-toml")
    (again,) = (await ensure_config_bindings(store, (moved,), T0)).values()
    assert again.identity.installation_id == INSTALL  # the durable row decides
    assert "binding_installation_not_from_config" in caplog.text


@pytest.mark.parametrize("s2s_world", ["good_key"], indirect=True)
async def test_the_toml_installation_is_never_a_fallback_for_the_durable_one(
        s2s_world: S2SWorld) -> None:
    """A durable binding that names no installation mints nothing, even though the TOML
    still names one: the durable fact alone decides where a token is minted."""
    world, s2s = s2s_world.world, s2s_world.s2s
    current = await world.store.binding_get(BINDING)
    assert current is not None and current.identity.installation_id == INSTALL
    cleared = await world.store.binding_transition(
        BINDING, BindingEvent.CHANGE, Actor("ada", "admin", "the app was uninstalled"),
        expected_generation=current.generation, now_us=T0,
        identity=attrs.evolve(current.identity, installation_id=""))
    assert cleared.generation == current.generation + 1
    await world.lead(Email="ada@example.com")
    world.sim.put_prospect({"firstName": "Ada", "lastName": "Lovelace",
                            "emails": ["ada@example.com"]}, prospect_id=9)
    outcome = await world.run(world.change(kind="created", prospect="9", updated_at=None,
                                           attributes={"firstName": "Ada"}))
    assert isinstance(outcome, (RetryLater, DeadLetter))
    assert outcome.failure_class == "no_installation"
    assert s2s.journal == []  # no app JWT reached the endpoint for the TOML's installation
    assert world.sim.requests == []

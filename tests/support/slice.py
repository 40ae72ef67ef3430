"""The HubSpot Lead.Title slice on one machine: simulator, reference Runtime, integrationd.

Everything is a real server on loopback; integrationd runs in this process
(its work loop and its /v1 API), on the test's database.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx
import trio

from admin_ui.app import console_factory
from admin_ui.effects import effect_extensions
from config.catalog import build_catalog, load_catalog
from config.settings import (
    AdminSettings,
    ApiSettings,
    BindingSettings,
    CatalogSettings,
    FamilySettings,
    KeysSettings,
    Operator,
    ReplicaSettings,
    RuntimeClient,
    Secret,
    Settings,
    WorkSettings,
)
from daemon.core.handoff import TrustedRuntimeWorkScope
from daemon.core.identity import integration_scope_digest
from daemon.providers.executor import BoundedHttp
from daemon.services.assembly import assemble
from daemon.services.catalog_view import publish_current
from daemon.services.clock import Clock, WallClock
from daemon.services.credentials import Credentials
from daemon.services.http_server import serve_app
from daemon.services.metrics import Metrics
from daemon.services.replica import Replica
from sandbox.hubspot_sim import HubSpotSimulator
from sandbox.ports import free_port
from sandbox.runtime import ReferenceRuntime
from sandbox.runtime.server import serve as serve_runtime
from storage.work_store import WorkStore
from tests.support.harness import wait_for
from tests.support.l1 import sandbox_definitions_dir

SCOPE = TrustedRuntimeWorkScope("org-acme", "install-1", "cap.leads", "sha256:binding-1")
RUNTIME_TOKEN = "runtime-token-5f2a"
RESULTS_TOKEN = "results-token-9c1e"
HUBSPOT_TOKEN = "hubspot-token-77aa"
REVISION = 7


def slice_settings(*, api_port: int, runtime_url: str, hubspot_url: str, url: str,
                   lease_ttl: float = 6.0, max_attempts: int = 8,
                   operators: tuple[Operator, ...] = (),
                   binding_generation: int = 1, definitions_dir: str = "",
                   drain_timeout: float = 5.0) -> Settings:
    return Settings(
        admin=AdminSettings(listen="127.0.0.1:0",
                            session_secret=Secret("slice-test-session-secret-0123456789")),
        operators=operators,
        api=ApiSettings(listen=f"127.0.0.1:{api_port}"),
        replica=ReplicaSettings(drain_timeout=drain_timeout),
        work=WorkSettings(poll_interval=0.05, lease_margin=1.0, reclaim_interval=0.5),
        families={
            "external_effect": FamilySettings(max_attempts=max_attempts, backoff_base=0.2,
                                              backoff_cap=1.0, lease_ttl=lease_ttl),
            "runtime_receipt": FamilySettings(max_attempts=1_000_000, backoff_base=0.2,
                                              backoff_cap=1.0, lease_ttl=lease_ttl),
        },
        runtimes=(RuntimeClient(
            name="crm", org_id=SCOPE.org_id, app_installation_id=SCOPE.app_installation_id,
            runtime_capability_id=SCOPE.runtime_capability_id,
            runtime_work_binding_digest=SCOPE.runtime_work_binding_digest,
            results_url=f"{runtime_url}/runtime/v1/results",
            # Receipts many to a request, as the reference Runtime serves them (the single
            # route: tests/services/test_receipt_fence.py, test_receipt_results.py).
            results_batch_url=f"{runtime_url}/runtime/v1/results/batch",
            token=Secret(RUNTIME_TOKEN), results_token=Secret(RESULTS_TOKEN),
        ),),
        bindings=(BindingSettings(
            binding_id="hubspot-main", provider="hubspot", org_id=SCOPE.org_id,
            app_installation_id=SCOPE.app_installation_id, remote_account_id="portal-1",
            base_url=hubspot_url, timeout=5.0, generation=binding_generation,
            auth="static_token", token=Secret(HUBSPOT_TOKEN),
        ),),
        # The simulator answers at once: its L1 declares a 1 s window (L2 may
        # only lengthen L1's).
        catalog=CatalogSettings(revision=REVISION,
                                definitions_dir=definitions_dir or sandbox_definitions_dir()),
    )


@attrs.frozen
class SliceGrant:
    """The slice's binding authenticates with a grant (auth = "grant"): refreshed at
    ``token_url`` as client-1 with ``client_secret``, its bundles sealed by key k1 in
    ``key_dir``; the HubSpot simulator accepts exactly the access tokens in ``tokens``
    (the OAuth simulator's own set, so a refreshed token works at once)."""

    token_url: str
    client_secret: str
    key_dir: str
    tokens: set[str]


def with_grant(settings: Settings, grant: SliceGrant) -> Settings:
    (b,) = settings.bindings
    return attrs.evolve(
        settings,
        bindings=(attrs.evolve(b, auth="grant", token=None, token_url=grant.token_url,
                               client_id="client-1",
                               client_secret=Secret(grant.client_secret)),),
        keys=KeysSettings(active="k1", dir=grant.key_dir))


LINK_SCOPE = integration_scope_digest(SCOPE.org_id, SCOPE.app_installation_id, "hubspot",
                                      "portal-1")


@attrs.define(eq=False)
class Slice:
    sim: HubSpotSimulator
    runtime: ReferenceRuntime
    runtime_url: str
    api_url: str
    store: WorkStore
    settings: Settings
    http: httpx.AsyncClient
    replica: Replica | None = None
    # The console's base URL when the slice runs with one.
    base_url: str = ""
    # The simulator's port (the binding's base URL, part of the Catalog revision).
    hubspot_port: int = 0
    # The replica's token source (a test may shorten its token owner's lease and wait).
    credentials: Credentials | None = None

    async def lead(self, lead_id: str, contact_id: str | None, *, link: bool = True,
                   title: str = "Engineer") -> None:
        """A Lead in the Runtime, its HubSpot contact, and (optionally) their remote link."""
        if contact_id is not None:
            self.sim.add_contact(contact_id, jobtitle=title, email=f"{lead_id}@example.com")
        r = await self.http.post(f"{self.runtime_url}/leads",
                                 json={"lead_id": lead_id, "title": title})
        assert r.status_code == 201, r.text
        if link and contact_id is not None:
            await self.store.link_adopt(LINK_SCOPE, "lead", lead_id, "contact", contact_id,
                                        actor="test", role="admin", reason="slice setup",
                                        now_us=WallClock().now_us())

    async def set_title(self, lead_id: str, title: str) -> str:
        r = await self.http.patch(f"{self.runtime_url}/leads/{lead_id}", json={"title": title})
        assert r.status_code == 200, r.text
        return str(r.json()["intent_id"])

    async def lead_doc(self, lead_id: str) -> dict[str, Any]:
        r = await self.http.get(f"{self.runtime_url}/leads/{lead_id}")
        assert r.status_code == 200, r.text
        doc: dict[str, Any] = r.json()
        return doc

    async def intent(self, lead_id: str, intent_id: str) -> dict[str, Any]:
        for intent in (await self.lead_doc(lead_id))["intents"]:
            if intent["intent_id"] == intent_id:
                return dict(intent)
        raise AssertionError(f"no intent {intent_id}")

    async def wait_intent(self, lead_id: str, intent_id: str, status: str,
                          within_s: float = 60.0) -> dict[str, Any]:
        async def reached() -> bool:
            return bool((await self.intent(lead_id, intent_id))["status"] == status)

        await wait_for(reached, within_s=within_s)
        return await self.intent(lead_id, intent_id)

    async def unknown_dead_effect(self, lead_id: str = "lead-1",
                                  contact_id: str = "101") -> str:
        """A PATCH whose outcome nobody can prove, dead and awaiting an operator: lost
        mid-flight, then someone else edits the contact, so the read-back shows neither
        our value nor an untouched record. Returns the dead work item's id."""
        from sandbox.hubspot_sim import Fault
        from storage.port import WorkQuery

        await self.lead(lead_id, contact_id)
        self.sim.inject(Fault(mode="reset_before", method="PATCH"))
        await self.set_title(lead_id, "CTO")
        await wait_for(lambda: any(r.method == "PATCH" for r in self.sim.requests),
                       within_s=30)
        self.sim.add_contact(contact_id, jobtitle="Changed in HubSpot by someone else")

        async def dead() -> bool:
            items = await self.store.work_list(WorkQuery(family="external_effect"))
            return bool(items) and items[0].state.value == "dead"

        await wait_for(dead, within_s=60)
        (item,) = await self.store.work_list(WorkQuery(family="external_effect"))
        return item.work_id

    def patches(self, contact_id: str) -> list[Any]:
        return [r for r in self.sim.requests
                if r.method == "PATCH" and r.contact_id == contact_id]


@asynccontextmanager
async def running_slice(store: WorkStore, url: str, *, old_runtime: bool = False,
                        with_replica: bool = True, lease_ttl: float = 6.0,
                        max_attempts: int = 8,
                        operators: tuple[Operator, ...] = (),
                        served_documents: list[Any] | None = None,
                        hubspot_port: int | None = None,
                        binding_generation: int = 1,
                        definitions_dir: str = "",
                        drain_timeout: float = 5.0,
                        grant: SliceGrant | None = None,
                        clock: Clock | None = None,
                        provider_connections: int | None = None,
                        honour_idempotency_keys: bool = False) -> AsyncIterator[Slice]:
    """The slice, its Catalog revision REVISION published. With ``served_documents``
    (L1 definition documents), the replica serves them as current revision
    REVISION + 1 (published too), while the Runtime still builds commands
    against REVISION. ``clock``: the replica's clock (a ``TrioClock`` under MockClock;
    default the wall clock); ``provider_connections``: the effect executor's connection
    limit (default the production one); ``honour_idempotency_keys``: the simulator
    honours the Idempotency-Key (for an L1 that declares it as a replay proof)."""
    sim = HubSpotSimulator(tokens=grant.tokens if grant is not None else {HUBSPOT_TOKEN},
                           honour_idempotency_keys=honour_idempotency_keys)
    api_port = free_port()
    async with trio.open_nursery() as nursery, httpx.AsyncClient(timeout=10) as http:
        # A second slice on the same database reuses the first one's simulator
        # address: the base URL is part of the pinned Catalog revision.
        sim_port = await nursery.start(sim.run, "127.0.0.1", hubspot_port or 0)
        runtime = ReferenceRuntime(
            scope=SCOPE, integration_url=f"http://127.0.0.1:{api_port}",
            integration_token=RUNTIME_TOKEN, results_token=RESULTS_TOKEN,
            catalog_revision=REVISION, accept_no_effect_format=not old_runtime,
            poll_interval_s=0.1,
        )
        runtime_scope = trio.CancelScope()

        async def run_runtime(*, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
                              ) -> None:
            with runtime_scope:
                await serve_runtime(runtime, task_status=task_status)

        runtime_port = await nursery.start(run_runtime)
        settings = slice_settings(api_port=api_port,
                                  runtime_url=f"http://127.0.0.1:{runtime_port}",
                                  hubspot_url=f"http://127.0.0.1:{sim_port}", url=url,
                                  lease_ttl=lease_ttl, max_attempts=max_attempts,
                                  operators=operators, binding_generation=binding_generation,
                                  definitions_dir=definitions_dir, drain_timeout=drain_timeout)
        if grant is not None:
            settings = with_grant(settings, grant)
        clock = clock if clock is not None else WallClock()
        metrics = Metrics()
        await publish_current(store, load_catalog(settings), actor="test", role="admin",
                              reason="slice setup", now_us=clock.now_us())
        served = None
        if served_documents is not None:
            settings = attrs.evolve(settings, catalog=attrs.evolve(settings.catalog,
                                                                   revision=REVISION + 1))
            served = build_catalog(REVISION + 1, served_documents, settings.bindings)
            await publish_current(store, served, actor="test", role="admin",
                                  reason="slice: a newer revision", now_us=clock.now_us())
        parts = assemble(settings, store, clock, metrics, catalog=served)
        if provider_connections is not None:
            await parts.executor.client.aclose()
            parts.executor.client = BoundedHttp.open(provider_connections)
        the_slice = Slice(sim, runtime, f"http://127.0.0.1:{runtime_port}",
                          f"http://127.0.0.1:{api_port}", store, settings, http,
                          hubspot_port=sim_port, credentials=parts.credentials)
        try:
            if not with_replica:
                # Only the /v1 API: commands are admitted, nothing claims them.
                assert parts.api_app is not None
                await nursery.start(serve_app, parts.api_app, settings.api.listen)
            else:
                console = console_factory(effect_extensions(parts.catalog,
                                                            parts.catalogs.pinned))
                replica = Replica(settings, store, parts.registry, clock, metrics=metrics,
                                  api_app=parts.api_app, replica_id="slice-replica",
                                  admin_app=console if operators else None)
                assert parts.api_context is not None
                parts.api_context.wake = replica.wake
                address = await nursery.start(replica.run)
                the_slice.replica = replica
                the_slice.base_url = address
            yield the_slice
            if the_slice.replica is not None:
                the_slice.replica.request_drain()
                await wait_for(lambda: the_slice.replica.state == "stopped")  # type: ignore[union-attr]
        finally:
            nursery.cancel_scope.cancel()
            await parts.aclose()

"""The Outreach Lead.Title slice on one machine: the Outreach simulator (with the S2S token
endpoint mounted), the reference Runtime, integrationd with an ``auth = "s2s"`` binding.

Everything is a real server on loopback; integrationd runs in this process (its work loop,
its /v1 API and its console), on the test's database. The Outreach simulator accepts
exactly the tokens the S2S endpoint minted; every minted token is tied to one
installation (``s2s.token_installs``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from admin_ui.app import console_factory
from admin_ui.effects import effect_extensions
from config.catalog import load_catalog
from config.settings import BindingSettings, KeysSettings, Operator, Secret, Settings
from daemon.core.identity import integration_scope_digest
from daemon.core.token_bundle import TokenKey
from daemon.services.assembly import assemble
from daemon.services.catalog_view import publish_current
from daemon.services.clock import WallClock
from daemon.services.http_server import serve_app
from daemon.services.metrics import Metrics
from daemon.services.replica import Replica
from sandbox.outreach_sim import OutreachSimulator
from sandbox.outreach_sim.model import RequestRecord
from sandbox.ports import free_port
from sandbox.runtime import ReferenceRuntime
from sandbox.runtime.server import serve as serve_runtime
from sandbox.s2s_token_sim import S2STokenEndpoint, s2s_routes
from storage.work_store import WorkStore
from tests.support.harness import wait_for
from tests.support.s2s import private_pem, public_pem
from tests.support.slice import RESULTS_TOKEN, REVISION, RUNTIME_TOKEN, SCOPE, slice_settings

OP = "outreach.prospect.update_title"
BINDING = "outreach-main"
APP_ID = "s2s-app-outreach"
INSTALL = "install-42"
ACCOUNT = "org-77"
KEY = TokenKey("k1", bytes(range(32)))
LINK_SCOPE = integration_scope_digest(SCOPE.org_id, SCOPE.app_installation_id, "outreach",
                                      ACCOUNT)


def outreach_binding(url: str) -> BindingSettings:
    return BindingSettings(
        binding_id=BINDING, provider="outreach", org_id=SCOPE.org_id,
        app_installation_id=SCOPE.app_installation_id, remote_account_id=ACCOUNT,
        base_url=url, timeout=5.0, auth="s2s", s2s_app_id=APP_ID,
        s2s_installation_id=INSTALL, s2s_private_key=Secret(private_pem().decode()),
        token_url=f"{url}/api/app/installs/{{installation_id}}/actions/accessToken")


@attrs.define(eq=False)
class OutreachSlice:
    sim: OutreachSimulator
    s2s: S2STokenEndpoint
    runtime: ReferenceRuntime
    runtime_url: str
    store: WorkStore
    settings: Settings
    http: httpx.AsyncClient
    nursery: trio.Nursery
    start: Callable[[], Awaitable[Replica]]
    replica: Replica | None = None
    base_url: str = ""  # the console of the running replica

    async def start_replica(self) -> Replica:
        assert self.replica is None
        self.replica = await self.start()
        self.base_url = self.replica_address
        return self.replica

    async def stop_replica(self) -> None:
        """Drain the replica (nothing is claimed until the next one starts; admission
        goes on: the /v1 API is served on its own)."""
        replica, self.replica = self.replica, None
        assert replica is not None
        replica.request_drain()
        await wait_for(lambda: replica.state == "stopped")

    replica_address: str = ""

    async def lead(self, lead_id: str, prospect_id: int, *, title: str = "Engineer") -> None:
        """A Lead in the Runtime, its Prospect in Outreach, and their RemoteLink."""
        self.sim.put_prospect({"title": title, "firstName": "Ada",
                               "emails": [f"{lead_id}@example.com"]}, prospect_id=prospect_id)
        r = await self.http.post(f"{self.runtime_url}/leads",
                                 json={"lead_id": lead_id, "title": title})
        assert r.status_code == 201, r.text
        await self.store.link_adopt(LINK_SCOPE, "lead", lead_id, "prospect", str(prospect_id),
                                    actor="test", role="admin", reason="outreach slice setup",
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
                          within_s: float = 20.0) -> dict[str, Any]:
        async def reached() -> bool:
            return bool((await self.intent(lead_id, intent_id))["status"] == status)

        await wait_for(reached, within_s=within_s)
        return await self.intent(lead_id, intent_id)

    def patches(self, prospect_id: int) -> list[RequestRecord]:
        return [r for r in self.sim.requests
                if r.method == "PATCH" and r.path == f"/api/v2/prospects/{prospect_id}"]


@asynccontextmanager
async def running_outreach_slice(store: WorkStore, url: str, key_dir: Path, *,
                                 max_attempts: int = 8, lease_ttl: float = 6.0,
                                 operators: tuple[Operator, ...] = (),
                                 installs: tuple[str, ...] = (INSTALL,),
                                 endpoint_app_id: str = APP_ID,
                                 definitions_dir: str = "",
                                 ) -> AsyncIterator[OutreachSlice]:
    """The slice, its Catalog revision REVISION published; ``installs`` are the
    installations the S2S endpoint knows, ``endpoint_app_id`` the app it expects (another
    than the binding's: every app JWT is refused)."""
    (key_dir / "k1.key").write_text(KEY.material.hex())
    s2s = S2STokenEndpoint(app_id=endpoint_app_id, public_key_pem=public_pem(private_pem()),
                           installs=set(installs))
    sim = OutreachSimulator(tokens=s2s.access_tokens, mounts=s2s_routes(s2s))
    api_port = free_port()
    async with trio.open_nursery() as nursery, httpx.AsyncClient(timeout=10) as http:
        sim_port = await nursery.start(sim.run, "127.0.0.1", 0)
        sim_url = f"http://127.0.0.1:{sim_port}"
        runtime = ReferenceRuntime(
            scope=SCOPE, integration_url=f"http://127.0.0.1:{api_port}",
            integration_token=RUNTIME_TOKEN, results_token=RESULTS_TOKEN,
            catalog_revision=REVISION, operation=OP, poll_interval_s=0.1)
        runtime_port = await nursery.start(serve_runtime, runtime)
        runtime_url = f"http://127.0.0.1:{runtime_port}"
        settings = slice_settings(api_port=api_port, runtime_url=runtime_url,
                                  hubspot_url=sim_url, url=url, lease_ttl=lease_ttl,
                                  max_attempts=max_attempts, operators=operators,
                                  definitions_dir=definitions_dir)
        settings = attrs.evolve(settings, bindings=(outreach_binding(sim_url),),
                                keys=KeysSettings(active="k1", dir=str(key_dir)))
        clock = WallClock()
        metrics = Metrics()
        await publish_current(store, load_catalog(settings), actor="test", role="admin",
                              reason="outreach slice setup", now_us=clock.now_us())
        parts = assemble(settings, store, clock, metrics)
        try:
            console = console_factory(effect_extensions(parts.catalog, parts.catalogs.pinned))
            assert parts.api_app is not None and parts.api_context is not None
            # The /v1 API on its own, so that admission goes on while no replica runs.
            await nursery.start(serve_app, parts.api_app, settings.api.listen)
            started = 0

            async def start() -> Replica:
                nonlocal started
                started += 1
                # A replica registers its collectors: a restarted one gets its own.
                replica = Replica(settings, store, parts.registry, clock,
                                  metrics=metrics if started == 1 else Metrics(),
                                  replica_id=f"outreach-slice-{started}",
                                  admin_app=console if operators else None)
                assert parts.api_context is not None
                parts.api_context.wake = replica.wake
                the_slice.replica_address = await nursery.start(replica.run)
                return replica

            the_slice = OutreachSlice(sim, s2s, runtime, runtime_url, store, settings, http,
                                      nursery, start)
            await the_slice.start_replica()
            yield the_slice
            if the_slice.replica is not None:
                await the_slice.stop_replica()
        finally:
            nursery.cancel_scope.cancel()
            await parts.aclose()

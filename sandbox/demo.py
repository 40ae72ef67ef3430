"""``integrationd sandbox``: the HubSpot simulator and the reference Runtime, with traffic.

Reads the same configuration as the replica, so the pieces agree: the
simulator listens where the first HubSpot binding's ``base_url`` points and
accepts that binding's token; the Runtime listens where the first
``[[runtimes]]`` entry's ``results_url`` points, calls integrationd's
``[api] listen`` with that runtime's token, and expects its results token.
It seeds ``--leads`` Leads with linked contacts (adopting the remote links in
integrationd's database) and, every ``--interval`` seconds, changes one
Lead's title, so effects flow as soon as a replica runs.
"""

from __future__ import annotations

import random
import urllib.parse

import httpx
import trio

from config.load import ConfigError
from config.settings import BindingSettings, RuntimeClient, Settings
from daemon.core.handoff import TrustedRuntimeWorkScope
from daemon.core.identity import integration_scope_digest
from daemon.services import logs
from daemon.services.clock import WallClock
from sandbox.hubspot_sim import HubSpotSimulator
from sandbox.runtime import ReferenceRuntime
from sandbox.runtime.server import serve as serve_runtime
from storage.work_store import WorkStore

TITLES = ("Engineer", "Senior Engineer", "Staff Engineer", "Engineering Manager", "Director",
          "VP Engineering", "CTO", "Founder")


class SandboxConfigError(ConfigError):
    """The sandbox cannot be placed from this configuration."""


def _pieces(settings: Settings) -> tuple[RuntimeClient, BindingSettings]:
    if not settings.runtimes:
        raise SandboxConfigError("runtimes", "the sandbox needs a [[runtimes]] entry")
    runtime = settings.runtimes[0]
    bindings = [b for b in settings.bindings if b.provider == "hubspot"]
    if not bindings:
        raise SandboxConfigError("bindings", "the sandbox needs a hubspot [[bindings]] entry")
    binding = bindings[0]
    if runtime.token is None or runtime.results_token is None or binding.token is None:
        raise SandboxConfigError("runtimes", "tokens are missing (see README, demo)")
    if not runtime.results_url:
        raise SandboxConfigError("runtimes[0].results_url", "needed to place the Runtime")
    return runtime, binding


def _host_port(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    if parts.hostname is None or parts.port is None:
        raise SandboxConfigError("url", f"{url}: expected http://host:port")
    return parts.hostname, parts.port


async def run_sandbox(settings: Settings, store: WorkStore, *, leads: int,
                      interval_s: float) -> None:
    runtime_cfg, binding = _pieces(settings)
    assert runtime_cfg.token is not None and runtime_cfg.results_token is not None
    assert binding.token is not None
    sim = HubSpotSimulator(tokens={binding.token.reveal()})
    scope = TrustedRuntimeWorkScope(runtime_cfg.org_id, runtime_cfg.app_installation_id,
                                    runtime_cfg.runtime_capability_id,
                                    runtime_cfg.runtime_work_binding_digest)
    runtime = ReferenceRuntime(
        scope=scope, integration_url=f"http://{settings.api.listen}",
        integration_token=runtime_cfg.token.reveal(),
        results_token=runtime_cfg.results_token.reveal(),
        catalog_revision=settings.catalog.revision,
    )
    sim_host, sim_port = _host_port(binding.base_url)
    rt_host, rt_port = _host_port(runtime_cfg.results_url)
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.run, sim_host, sim_port)
        await nursery.start(serve_runtime, runtime, rt_host, rt_port)
        logs.event("sandbox_listening", hubspot=binding.base_url,
                   runtime=f"http://{rt_host}:{rt_port}", leads=leads)
        base = f"http://{rt_host}:{rt_port}"
        async with httpx.AsyncClient(timeout=10) as http:
            await _seed(http, base, sim, store, binding, leads)
            if interval_s > 0:
                await _traffic(http, base, leads, interval_s)
            else:
                await trio.sleep_forever()


async def _seed(http: httpx.AsyncClient, base: str, sim: HubSpotSimulator, store: WorkStore,
                binding: BindingSettings, leads: int) -> None:
    scope = integration_scope_digest(binding.org_id, binding.app_installation_id,
                                     binding.provider, binding.remote_account_id)
    for i in range(1, leads + 1):
        lead_id, contact_id = f"lead-{i}", str(1000 + i)
        sim.add_contact(contact_id, jobtitle=TITLES[0], email=f"person{i}@example.com")
        await http.post(f"{base}/leads", json={"lead_id": lead_id, "title": TITLES[0]})
        # Idempotent: an earlier sandbox run may have adopted the same pair.
        await store.link_adopt(scope, "lead", lead_id, "contact", contact_id,
                               actor="sandbox", role="admin", reason="sandbox seed",
                               now_us=WallClock().now_us())


async def _traffic(http: httpx.AsyncClient, base: str, leads: int, interval_s: float) -> None:
    while True:
        await trio.sleep(interval_s)
        lead = f"lead-{random.randint(1, leads)}"
        try:
            await http.patch(f"{base}/leads/{lead}", json={"title": random.choice(TITLES)})
        except httpx.HTTPError as exc:
            logs.warn("sandbox_traffic_failed", error=type(exc).__name__)

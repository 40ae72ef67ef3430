"""``python -m sandbox``: the HubSpot and Outreach simulators and the reference Runtime,
with traffic both ways.

Reads the same configuration as the replica, so the pieces agree: the HubSpot simulator
listens where the first HubSpot binding's ``base_url`` points and accepts that binding's
token; the Runtime listens where the first ``[[runtimes]]`` entry's ``results_url``
points, calls integrationd's ``[api] listen`` with that runtime's token, and expects its
results token. It seeds ``--leads`` Leads with linked contacts (adopting the remote links
in integrationd's database) and, every ``--interval`` seconds, changes one Lead's title,
so effects flow out as soon as a replica runs: a HubSpot contact PATCH and, when Outreach
is configured, a JSON:API PATCH of the Lead's linked Prospect (two intents, two commands).

When the configuration also has an Outreach binding with a ``[[webhook_routes]]`` entry,
the Outreach simulator listens where that binding's ``base_url`` points (with the S2S
token endpoint mounted beside the API: an ``auth = "s2s"`` binding's minted tokens are
accepted, the public key derived from the binding's own private key file; a static-token
binding's token is accepted as it is), holds one Prospect per Lead
(linked to it in integrationd's database, as an operator adopts a link), subscribes the
route's URL (``public_url``, else ``[ingress] listen``) with the route's secret, and every
``--inbound-interval`` seconds changes one Prospect's name or company "inside Outreach":
its signed webhook flows in through the replica's ingress to the Lead.
"""

from __future__ import annotations

import random
import secrets
import urllib.parse

import attrs
import httpx
import trio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from config.load import ConfigError
from config.settings import BindingSettings, RuntimeClient, Settings, WebhookRoute
from daemon.core.handoff import TrustedRuntimeWorkScope
from daemon.core.identity import integration_scope_digest
from daemon.services import logs
from daemon.services.clock import WallClock
from sandbox.hubspot_sim import HubSpotSimulator
from sandbox.outreach_sim import JSONAPI, WEBHOOKS_PATH, OutreachSimulator
from sandbox.runtime import ReferenceRuntime
from sandbox.runtime.server import serve as serve_runtime
from sandbox.s2s_token_sim import S2STokenEndpoint, s2s_routes
from storage.work_store import WorkStore

TITLES = ("Engineer", "Senior Engineer", "Staff Engineer", "Engineering Manager", "Director",
          "VP Engineering", "CTO", "Founder")
FIRST_NAMES = ("Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Frances", "Ken")
LAST_NAMES = ("Lovelace", "Hopper", "Turing", "Dijkstra", "Liskov", "Knuth", "Allen",
              "Thompson")
COMPANIES = ("ACME", "Globex", "Initech", "Umbrella", "Hooli", "Stark Industries")
# The S2S app the mounted token endpoint knows (its key lives only in this process).
S2S_APP_ID = "sandbox-s2s-app"
# The outbound Outreach operation the Runtime also hands off for every title change.
OUTREACH_TITLE_OPERATION = "outreach.prospect.update_title"


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


@attrs.frozen
class _Outreach:
    binding: BindingSettings
    route: WebhookRoute
    hooks_url: str


def _outreach_pieces(settings: Settings) -> _Outreach | None:
    """The first Outreach binding that has a webhook route; None: no Outreach here."""
    for binding in settings.bindings:
        if binding.provider != "outreach":
            continue
        routes = [r for r in settings.webhook_routes if r.binding_id == binding.binding_id]
        if not routes:
            continue
        route = routes[0]
        if binding.auth != "s2s" and binding.token is None:
            raise SandboxConfigError(f"bindings.{binding.binding_id}.token",
                                     "the Outreach simulator needs the binding's token"
                                     " (or an auth = \"s2s\" binding)")
        if route.secret is None:
            raise SandboxConfigError(f"webhook_routes.{route.route}.secret",
                                     "the Outreach subscription needs the route's secret")
        if route.public_url:
            url = route.public_url
        elif settings.ingress.listen and not settings.ingress.listen.endswith(":0"):
            url = f"http://{settings.ingress.listen}/hooks/{route.route}"
        else:
            raise SandboxConfigError(
                f"webhook_routes.{route.route}.public_url",
                "the Outreach webhooks need the route's URL: set public_url, or a fixed"
                " port in ingress.listen")
        return _Outreach(binding, route, url)
    return None


def _host_port(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    if parts.hostname is None or parts.port is None:
        raise SandboxConfigError("url", f"{url}: expected http://host:port")
    return parts.hostname, parts.port


async def run_sandbox(settings: Settings, store: WorkStore, *, leads: int,
                      interval_s: float, inbound_interval_s: float = 3.0) -> None:
    runtime_cfg, binding = _pieces(settings)
    outreach = _outreach_pieces(settings)
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
        # With Outreach here, each title change is also an outbound PATCH of the Lead's
        # linked Prospect (its title is outbound-owned): its own intent and command.
        also_operations=(OUTREACH_TITLE_OPERATION,) if outreach is not None else (),
    )
    sim_host, sim_port = _host_port(binding.base_url)
    rt_host, rt_port = _host_port(runtime_cfg.results_url)
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.run, sim_host, sim_port)
        await nursery.start(serve_runtime, runtime, rt_host, rt_port)
        osim = None
        if outreach is not None:
            osim, admin_token = _outreach_simulator(outreach.binding)
            o_host, o_port = _host_port(outreach.binding.base_url)
            await nursery.start(osim.run, o_host, o_port)
        logs.event("sandbox_listening", hubspot=binding.base_url,
                   runtime=f"http://{rt_host}:{rt_port}", leads=leads,
                   outreach=outreach.binding.base_url if outreach is not None else "",
                   operations=[runtime.operation, *runtime.also_operations])
        base = f"http://{rt_host}:{rt_port}"
        async with httpx.AsyncClient(timeout=10) as http:
            await _seed(http, base, sim, store, binding, leads)
            if outreach is not None and osim is not None:
                await _seed_outreach(http, osim, store, outreach, leads, admin_token)
                if inbound_interval_s > 0:
                    nursery.start_soon(_outreach_traffic, osim, leads, inbound_interval_s)
            if interval_s > 0:
                await _traffic(http, base, leads, interval_s)
            else:
                await trio.sleep_forever()


def _outreach_simulator(binding: BindingSettings) -> tuple[OutreachSimulator, str]:
    """The Outreach simulator with the S2S token endpoint mounted on the same port (a
    minted token is accepted like a static one), and the token the sandbox itself uses
    for its own calls (the subscription): an S2S binding's app and installation are the
    endpoint's, its public key derived from the binding's private key; a static-token
    binding's token is accepted and used, and the endpoint gets a key of its own."""
    if binding.auth == "s2s":
        assert binding.s2s_private_key is not None  # checked when the config loaded
        private = serialization.load_pem_private_key(
            binding.s2s_private_key.reveal().encode(), password=None)
        app_id, installs = binding.s2s_app_id, {binding.s2s_installation_id}
        own = secrets.token_urlsafe(24)  # the sandbox's own, never the replica's
    else:
        assert binding.token is not None
        private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        app_id, installs = S2S_APP_ID, {binding.app_installation_id}
        own = binding.token.reveal()
    osim = OutreachSimulator(tokens={own})
    public_pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    s2s = S2STokenEndpoint(app_id=app_id, public_key_pem=public_pem, installs=installs,
                           access_tokens=osim.tokens)
    osim.mounts.extend(s2s_routes(s2s))
    return osim, own


def _lead_fields(i: int) -> dict[str, str]:
    return {"FirstName": FIRST_NAMES[i % len(FIRST_NAMES)],
            "LastName": LAST_NAMES[i % len(LAST_NAMES)],
            "Company": COMPANIES[i % len(COMPANIES)], "Email": f"person{i}@example.com"}


async def _seed(http: httpx.AsyncClient, base: str, sim: HubSpotSimulator, store: WorkStore,
                binding: BindingSettings, leads: int) -> None:
    scope = integration_scope_digest(binding.org_id, binding.app_installation_id,
                                     binding.provider, binding.remote_account_id)
    for i in range(1, leads + 1):
        lead_id, contact_id = f"lead-{i}", str(1000 + i)
        sim.add_contact(contact_id, jobtitle=TITLES[0], email=f"person{i}@example.com")
        await http.post(f"{base}/leads", json={"lead_id": lead_id, "title": TITLES[0],
                                               "fields": _lead_fields(i)})
        # Idempotent: an earlier sandbox run may have adopted the same pair.
        await store.link_adopt(scope, "lead", lead_id, "contact", contact_id,
                               actor="sandbox", role="admin", reason="sandbox seed",
                               now_us=WallClock().now_us())


async def _seed_outreach(http: httpx.AsyncClient, osim: OutreachSimulator, store: WorkStore,
                         outreach: _Outreach, leads: int, token: str) -> None:
    """One Prospect per Lead, linked as an operator adopts a link; then the subscription
    that sends every Prospect change, signed with the route's secret, to the replica."""
    binding, route = outreach.binding, outreach.route
    assert route.secret is not None
    scope = integration_scope_digest(binding.org_id, binding.app_installation_id,
                                     binding.provider, binding.remote_account_id)
    for i in range(1, leads + 1):
        fields = _lead_fields(i)
        osim.put_prospect({"firstName": fields["FirstName"], "lastName": fields["LastName"],
                           "company": fields["Company"], "title": TITLES[0],
                           "emails": [fields["Email"]]}, prospect_id=i)
        # Idempotent, like the HubSpot links: the simulator's ids are the same every run.
        await store.link_adopt(scope, "lead", f"lead-{i}", "prospect", str(i),
                               actor="sandbox", role="admin", reason="sandbox seed",
                               now_us=WallClock().now_us())
    # The simulator is a new process each run: its subscriptions start empty.
    answer = await http.post(
        f"{binding.base_url.rstrip('/')}{WEBHOOKS_PATH}",
        headers={"authorization": f"Bearer {token}", "content-type": JSONAPI},
        json={"data": {"type": "webhook", "attributes": {
            "resource": "prospect", "action": "*", "payloadVersion": 2,
            "url": outreach.hooks_url, "secret": route.secret.reveal()}}})
    if answer.status_code != 201:
        raise SandboxConfigError(f"webhook_routes.{route.route}",
                                 f"the Outreach simulator refused the subscription "
                                 f"({answer.status_code})")
    logs.event("sandbox_outreach_subscribed", route=route.route, url=outreach.hooks_url,
               prospects=leads)


async def _outreach_traffic(osim: OutreachSimulator, leads: int, interval_s: float) -> None:
    """A user edits a Prospect in Outreach: a new first or last name or company."""
    while True:
        await trio.sleep(interval_s)
        prospect = random.randint(1, leads)
        attribute, values = random.choice((("firstName", FIRST_NAMES),
                                           ("lastName", LAST_NAMES), ("company", COMPANIES)))
        current = osim.prospect(prospect)
        if current is None:  # deleted through the control API meanwhile
            logs.warn("sandbox_outreach_traffic_failed", prospect=prospect)
            continue
        choices = [v for v in values if v != current["attributes"].get(attribute)]
        osim.update_prospect(prospect, {attribute: random.choice(choices)})


async def _traffic(http: httpx.AsyncClient, base: str, leads: int, interval_s: float) -> None:
    while True:
        await trio.sleep(interval_s)
        lead = f"lead-{random.randint(1, leads)}"
        try:
            await http.patch(f"{base}/leads/{lead}", json={"title": random.choice(TITLES)})
        except httpx.HTTPError as exc:
            logs.warn("sandbox_traffic_failed", error=type(exc).__name__)

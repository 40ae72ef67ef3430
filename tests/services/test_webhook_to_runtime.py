"""Seed 13's Outreach proofs across the whole inbound path, with every part real: the Outreach
simulator's own webhook sender signs and delivers to a replica's ingress listener, the
receipt is materialized into an ``inbound_apply`` WorkItem, and the inbound Flow changes the
Lead in the reference Runtime. A partial update changes only the inbound-owned field it
carried; a destroyed Prospect retires the link and keeps the Lead."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import trio

from config.catalog import load_catalog
from config.load import parse_settings
from config.settings import Settings
from daemon.core.identity import integration_scope_digest
from daemon.core.inbound_change import INBOUND_APPLY_FAMILY
from daemon.services.catalog_view import publish_current
from daemon.services.families import known_family_names
from sandbox.outreach_sim import OutreachSimulator
from storage.effect_values import LinkState
from storage.ingress.receipts import ReceiptQuery
from storage.port import WorkQuery
from storage.work_store import WorkStore
from tests.sandbox_runtime import RESULTS_TOKEN, SCOPE, running_fake, running_runtime
from tests.support.webhooks import JSONAPI, OUTREACH_SECRET, hooks_url, ingress_replica
from tests.support.work import T0

TOKEN = "s2s-token-webhook-path"
ACCOUNT = "org-77"


def _settings(tmp_path: Path, sim_url: str, runtime_url: str) -> Settings:
    raw: dict[str, Any] = {
        "replica": {"heartbeat_interval": 1.0, "drain_timeout": 2.0},
        "work": {"poll_interval": 0.1},
        "ingress": {"listen": "127.0.0.1:0", "spool_dir": str(tmp_path / "spool"),
                    "forward_interval": 0.1, "materialize_interval": 0.05},
        "runtimes": [{
            "name": "crm", "org_id": SCOPE.org_id,
            "app_installation_id": SCOPE.app_installation_id,
            "runtime_capability_id": SCOPE.runtime_capability_id,
            "runtime_work_binding_digest": SCOPE.runtime_work_binding_digest,
            "results_url": f"{runtime_url}/runtime/v1/results"}],
        "bindings": [{
            "binding_id": "outreach-main", "provider": "outreach", "org_id": SCOPE.org_id,
            "app_installation_id": SCOPE.app_installation_id,
            "remote_account_id": ACCOUNT, "base_url": sim_url, "auth": "static_token"}],
        "webhook_routes": [{"route": "outreach-main", "binding_id": "outreach-main",
                            "webhook": "outreach.prospect_events"}],
    }
    env = {"INTEGRATIOND_WEBHOOK_OUTREACH_MAIN_SECRET": OUTREACH_SECRET,
           "INTEGRATIOND_BINDING_OUTREACH_MAIN_TOKEN": TOKEN,
           "INTEGRATIOND_RUNTIME_CRM_TOKEN": "runtime-calls-us",
           "INTEGRATIOND_RUNTIME_CRM_RESULTS_TOKEN": RESULTS_TOKEN}
    return parse_settings(raw, environ=env, known_families=known_family_names())


async def _eventually(what: str, predicate: Callable[[], Awaitable[bool]],
                      within_s: float = 60.0) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if await predicate():
            return
        await trio.sleep(0.05)
    raise AssertionError(f"not reached: {what}")


async def test_a_signed_partial_update_and_a_destroy_reach_the_lead_through_the_whole_path(
        store: WorkStore, nursery: trio.Nursery, tmp_path: Path) -> None:
    sim = OutreachSimulator(tokens={TOKEN})
    sim_port = await nursery.start(sim.run)
    sim_url = f"http://127.0.0.1:{sim_port}"
    async with running_fake() as (_, fake_url), running_runtime(fake_url) as rt:
        cfg = _settings(tmp_path, sim_url, str(rt.http.base_url).rstrip("/"))
        await publish_current(store, load_catalog(cfg), actor="test", role="admin",
                              reason="webhook path", now_us=T0)
        made = await rt.http.post("/leads", json={
            "lead_id": "lead-1", "title": "Eng",
            "fields": {"FirstName": "Old", "LastName": "Lovelace", "Company": "ACME"}})
        assert made.status_code == 201, made.text
        prospect = sim.put_prospect({"firstName": "Old", "lastName": "Lovelace",
                                     "emails": ["ada@example.test"]})
        scope = integration_scope_digest(SCOPE.org_id, SCOPE.app_installation_id,
                                         "outreach", ACCOUNT)
        await store.link_adopt(scope, "lead", "lead-1", "prospect", str(prospect.id),
                               actor="test", role="admin", reason="linked before",
                               now_us=T0)

        async def fields() -> dict[str, Any]:
            doc = (await rt.http.get("/_runtime/leads/lead-1/fields")).json()
            return dict(doc["fields"])

        async with ingress_replica(store, cfg) as replica, httpx.AsyncClient() as client:
            subscribed = await client.post(
                f"{sim_url}/api/v2/webhooks",
                headers={"authorization": f"Bearer {TOKEN}", "content-type": JSONAPI},
                json={"data": {"type": "webhook", "attributes": {
                    "resource": "prospect", "action": "*", "payloadVersion": 2,
                    "url": hooks_url(replica, "outreach-main"),
                    "secret": OUTREACH_SECRET}}})
            assert subscribed.status_code == 201, subscribed.text

            # A user changes the first name and the title in Outreach: the webhook carries
            # both (partial: nothing else); only firstName is inbound-owned.
            sim.update_prospect(prospect.id, {"firstName": "Ada", "title": "CTO"})
            await sim.wait_deliveries_settled()
            (delivery,) = sim.deliveries
            assert delivery.status == 200

            async def applied() -> bool:
                return (await fields()).get("FirstName") == "Ada"

            await _eventually("the first name on the Lead", applied)
            assert await fields() == {"FirstName": "Ada", "LastName": "Lovelace",
                                      "Company": "ACME"}
            # Title is outbound-owned: the inbound change never touches it.
            assert (await rt.http.get("/leads/lead-1")).json()["title"] == "Eng"

            # The Prospect is destroyed in Outreach: the link is retired, the Lead stays.
            sim.destroy_prospect(prospect.id)
            await sim.wait_deliveries_settled()

            async def retired() -> bool:
                link = await store.link_get(scope, "lead", "lead-1")
                return link is not None and link.state != LinkState.ACTIVE

            await _eventually("the link retired", retired)
            assert (await rt.http.get("/leads/lead-1")).status_code == 200

        receipts = await store.ingress_receipt_list(ReceiptQuery(limit=10))
        assert sorted(r.state for r in receipts) == ["materialized", "materialized"]
        items = await store.work_list(WorkQuery(family=INBOUND_APPLY_FAMILY))
        assert sorted(i.state for i in items) == ["succeeded", "succeeded"]

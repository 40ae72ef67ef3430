"""In the browser: an operator asks for a subscription reconciliation on the Subscriptions
page; the replica's reconciler subscribes the route at the Outreach simulator; a
subscription deleted behind our back is recreated under the next generation after the
next "reconcile now". Everything real: the simulator on loopback, a replica (the CLI's
assembly) with its work loop and console, Debian's Chromium."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import trio
from playwright.sync_api import Page, expect

from admin_ui.app import console_factory
from admin_ui.extensions import combine
from admin_ui.subscriptions import subscriptions_extensions
from config.load import parse_settings
from config.settings import AdminSettings, Secret
from daemon.services.assembly import assemble
from daemon.services.clock import WallClock
from daemon.services.families import known_family_names
from daemon.services.metrics import Metrics
from daemon.services.principal_bootstrap import ensure_config_bindings
from daemon.services.replica import Replica
from sandbox.outreach_sim import OutreachSimulator
from tests.support.backends import fresh_database
from tests.support.harness import wait_for
from tests.ui.support import _OPERATORS, LiveConsole, in_browser, shot, sign_in

TOKEN = "s2s-token-ui-subscriptions"


async def test_operator_reconciles_subscriptions_from_the_console(tmp_path: Path) -> None:
    sim = OutreachSimulator(tokens={TOKEN})
    async with trio.open_nursery() as nursery, fresh_database("sqlite", tmp_path) as database:
        sim_url = f"http://127.0.0.1:{await nursery.start(sim.run)}"
        raw: dict[str, Any] = {
            "replica": {"heartbeat_interval": 0.5, "drain_timeout": 1.0},
            "work": {"poll_interval": 0.05},
            "bindings": [{"binding_id": "outreach-main", "provider": "outreach",
                          "org_id": "org-ui", "app_installation_id": "inst-ui",
                          "remote_account_id": "acct-ui", "base_url": sim_url,
                          "auth": "static_token"}],
            "webhook_routes": [{"route": "outreach-main", "binding_id": "outreach-main",
                                "webhook": "outreach.prospect_events",
                                "public_url": "https://hooks.example.test/hooks/outreach-main"}],
        }
        cfg = parse_settings(raw, environ={
            "INTEGRATIOND_WEBHOOK_OUTREACH_MAIN_SECRET": "ui-webhook-secret",
            "INTEGRATIOND_BINDING_OUTREACH_MAIN_TOKEN": TOKEN},
            known_families=known_family_names())
        cfg = attrs.evolve(cfg, operators=_OPERATORS, admin=AdminSettings(
            listen="127.0.0.1:0", session_secret=Secret("ui-test-session-secret-0123456789")))
        store = await database.open_store()
        # As `integrationd run` does before its replica starts: the durable binding rows
        # (the subscription steps pin their generation).
        await ensure_config_bindings(store, cfg.bindings, WallClock().now_us())
        parts = assemble(cfg, store, WallClock(), Metrics())
        replica = Replica(cfg, store, parts.registry, WallClock(), replica_id="ui-replica",
                          admin_app=console_factory(combine(
                              subscriptions_extensions(parts.catalog))))
        address = await nursery.start(replica.run)
        base = address if address.startswith("http") else f"http://{address}"
        live = LiveConsole(base, replica, store, None, None)  # type: ignore[arg-type]

        async def subscribed(n: int) -> None:
            await wait_for(lambda: len(sim.subscriptions()) == n, within_s=60)

        def scenario(page: Page, _: LiveConsole) -> None:
            sign_in(page, "otto")
            page.goto("/admin/subscriptions")
            expect(page.locator("#observed-table")).to_contain_text(
                "No subscription has been observed yet")
            # Desired against observed, and what is missing by name.
            expect(page.locator("#count-desired")).to_have_text("3")
            expect(page.locator("#count-observed")).to_have_text("0")
            expect(page.locator("#health-missing")).to_have_text("3")
            expect(page.locator("#missing-list li")).to_have_count(3)
            expect(page.locator("#missing-list")).to_contain_text("outreach-main:updated")
            expect(page.locator("#missing-list")).to_contain_text("never created")
            page.fill("#reconcile-reason", "first subscription")
            page.click("#reconcile-submit")
            expect(page.locator("#subscriptions-notice")).to_contain_text("queued")
            trio.from_thread.run(subscribed, 3)
            page.goto("/admin/subscriptions")
            expect(page.locator("#observed-table tbody tr")).to_have_count(3)
            expect(page.locator("#observed-table")).to_contain_text("outreach-main:updated")
            expect(page.locator("#count-observed")).to_have_text("3")
            expect(page.locator("#health-missing")).to_have_text("0")
            expect(page.locator("#missing-list")).to_contain_text("Nothing")
            shot(page, "30-subscriptions-created")
            # An Outreach admin deletes one: the next reconciliation recreates it.
            gone = min(s.id for s in sim.subscriptions())
            sim.delete_subscription_behind_back(gone)
            page.fill("#reconcile-reason", "one went missing")
            page.click("#reconcile-submit")
            trio.from_thread.run(subscribed, 3)

            async def regenerated() -> None:
                await wait_for(lambda: gone not in {s.id for s in sim.subscriptions()}
                               and len(sim.subscriptions()) == 3, within_s=60)

            trio.from_thread.run(regenerated)
            page.goto("/admin/subscriptions")
            expect(page.locator("#observed-table")).to_contain_text("deleted_behind_our_back")
            shot(page, "31-subscription-recreated")
            page.goto("/admin/audit")
            expect(page.locator("body")).to_contain_text("subscriptions.reconcile")

        try:
            await in_browser(live, scenario)
        finally:
            replica.request_drain()
            await parts.aclose()
            nursery.cancel_scope.cancel()

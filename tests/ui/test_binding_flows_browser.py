"""In the browser: an operator rebinds a principal binding to another remote account from
the Bindings page (the real form: generation shown, reason, CSRF), and sees the new
generation, the new identity, the transition in the binding's history and the audit
entry. A real replica on SQLite, Debian's Chromium."""

from __future__ import annotations

import re

from playwright.sync_api import Page, expect

from daemon.core.principals import BindingIdentity, PrincipalKind, connect
from daemon.services.clock import WallClock
from storage.principals import Actor
from tests.ui.support import LiveConsole, in_browser, shot, sign_in

FACTS = connect(binding_id="crm-ui", kind=PrincipalKind.SHARED, org_id="org-ui",
                app_installation_id="inst-ui", provider="hubspot",
                identity=BindingIdentity(issuer="https://issuer.test",
                                         remote_account_id="acct-1", remote_subject="app",
                                         scopes=("read",)))


async def test_operator_rebinds_a_binding_through_the_console(live: LiveConsole) -> None:
    await live.store.binding_connect(FACTS, Actor("setup", "admin", "ui test"),
                                     WallClock().now_us())

    def scenario(page: Page, live: LiveConsole) -> None:
        sign_in(page, "otto")
        page.goto("/admin/bindings")
        row = page.locator("#connected-table tbody tr", has_text="crm-ui")
        expect(row).to_contain_text("acct-1")
        expect(row.locator("td.num").first).to_have_text("1")
        page.click("#flows-crm-ui summary")
        expect(page.locator("#rebind-remote_account_id-crm-ui")).to_have_value("acct-1")
        shot(page, "39-binding-flows")
        page.fill("#rebind-remote_account_id-crm-ui", "acct-2")
        page.fill("#rebind-reason-crm-ui", "portal moved to acct-2")
        page.click("#rebind-crm-ui")
        expect(page.locator("#notice-banner")).to_contain_text("Rebound")
        row = page.locator("#connected-table tbody tr", has_text="crm-ui")
        expect(row.locator("td.num").first).to_have_text("2")
        expect(row).to_contain_text("acct-2")
        page.click("#history-crm-ui summary")
        latest = page.locator("#history-crm-ui tbody tr").first
        expect(latest).to_contain_text("binding.rebind")
        expect(latest).to_contain_text("otto (operator)")
        expect(latest).to_contain_text(re.compile(r"1\s*→\s*2"))
        expect(latest).to_contain_text("portal moved to acct-2")
        shot(page, "40-binding-rebound")
        page.goto("/admin/audit?target=crm-ui")
        entry = page.locator('#audit-table tr[data-action="binding.rebind"]')
        expect(entry).to_have_count(1)
        expect(entry).to_contain_text("otto")
        expect(entry).to_contain_text("portal moved to acct-2")
        expect(entry).to_contain_text("acct-2")
        durable = live.call(live.store.binding_get, "crm-ui")
        assert durable is not None
        assert (durable.generation, durable.identity.remote_account_id) == (2, "acct-2")

    await in_browser(live, scenario)

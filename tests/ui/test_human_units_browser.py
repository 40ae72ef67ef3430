"""In the browser: the Quota and Bindings pages speak in human units (issue 23 item 3).
Times are UTC wall time and spans are seconds or minutes; the exact microsecond value is
on hover. No column heading says "µs". A real replica on SQLite, Debian's Chromium."""

from __future__ import annotations

import re

from playwright.sync_api import Page, expect

from daemon.core.principals import BindingIdentity, PrincipalKind, connect
from daemon.core.quota import QuotaPolicy
from daemon.services.clock import WallClock
from storage.principals import Actor
from tests.ui.support import LiveConsole, in_browser, shot, sign_in

WALL = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ$")
FACTS = connect(binding_id="crm-units", kind=PrincipalKind.SHARED, org_id="org-ui",
                app_installation_id="inst-ui", provider="hubspot",
                identity=BindingIdentity(issuer="https://issuer.test",
                                         remote_account_id="acct-1", remote_subject="app",
                                         scopes=("read",)))


async def test_quota_and_bindings_show_times_and_spans_as_people_read_them(
    live: LiveConsole,
) -> None:
    now = WallClock().now_us()
    await live.store.binding_connect(FACTS, Actor("setup", "admin", "ui test"), now)
    # A provider 429 on a key with a 10 s window: blocked for 30 s from now.
    await live.store.quota_throttle("hubspot:units", QuotaPolicy(limit=100, window_us=10_000_000),
                                    now_us=now, retry_after_us=30_000_000)

    def scenario(page: Page, live: LiveConsole) -> None:
        sign_in(page, "otto")
        page.goto("/admin/quota")
        expect(page.locator("#quota-table thead")).not_to_contain_text("µs")
        row = page.locator("#quota-table tbody tr", has_text="hubspot:units")
        cells = row.locator("td")
        expect(cells.nth(2)).to_have_text("10 s")
        expect(cells.nth(2).locator("span")).to_have_attribute("title", "10000000 µs")
        last_429, blocked = cells.nth(11).locator("time"), cells.nth(12).locator("time")
        expect(last_429).to_have_text(WALL)
        expect(last_429).to_have_attribute("title", f"{now} µs since the epoch")
        expect(blocked).to_have_text(WALL)
        expect(blocked).to_have_attribute("title", f"{now + 30_000_000} µs since the epoch")
        shot(page, "60-quota-human-units")

        page.goto("/admin/bindings")
        expect(page.locator("main")).not_to_contain_text("µs")
        page.click("#history-crm-units summary")
        first = page.locator("#history-crm-units tbody tr").first.locator("td").first
        expect(first.locator("time")).to_have_text(WALL)
        expect(first.locator("time")).to_have_attribute("title", f"{now} µs since the epoch")
        shot(page, "61-bindings-human-units")

    await in_browser(live, scenario)

"""In the browser: every table's numbers sit under their own heading (issue 23 item 3).

The Ingress totals read "Materialized" over nothing and "Quarantined 188" over the
materialized count: the cells were right-aligned under left-aligned headings. On every
page with tables, each heading and the cells of its column must agree on alignment.
A real replica on SQLite with a little of everything, Debian's Chromium."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
from playwright.sync_api import Page

from admin_ui.extensions import combine
from admin_ui.ingress import ingress_extensions
from daemon.core.principals import BindingIdentity, PrincipalKind, connect
from daemon.core.quota import QuotaPolicy
from daemon.services.clock import WallClock
from storage.ingress.receipts import QuarantineParams
from storage.principals import Actor
from tests.support.backends import fresh_database
from tests.support.ingress import materialization, receipt
from tests.support.webhooks import ingress_settings
from tests.support.work import T0
from tests.ui.support import LiveConsole, in_browser, live_console, shot, sign_in

PAGES = ("/admin/", "/admin/work", "/admin/dlq", "/admin/ingress", "/admin/quota",
         "/admin/bindings", "/admin/audit")

# For each table.data: the (column, heading, cell) whose alignments differ.
MISALIGNED = """
() => {
  const out = [];
  for (const table of document.querySelectorAll("table.data")) {
    const heads = [...table.querySelectorAll("thead tr:last-child th")];
    for (const row of table.querySelectorAll("tbody tr")) {
      const cells = [...row.children];
      if (cells.length !== heads.length) continue;  // a colspan row: "nothing here"
      cells.forEach((cell, i) => {
        const a = getComputedStyle(heads[i]).textAlign;
        const b = getComputedStyle(cell).textAlign;
        if (a !== b) out.push(`${table.id || "table"}: "${heads[i].innerText}" ${a}, cell ${b}`);
      });
    }
  }
  return [...new Set(out)];
}
"""


@pytest.fixture
async def live(tmp_path: Path) -> AsyncIterator[LiveConsole]:
    """The live console with the Ingress pages (the composition root adds them when
    webhook routes are configured)."""
    async with fresh_database("sqlite", tmp_path) as database, \
            live_console(database, combine(ingress_extensions())) as console:
        routes = ingress_settings(tmp_path).webhook_routes
        console.replica.settings = attrs.evolve(console.replica.settings, webhook_routes=routes)
        yield console


async def test_every_number_sits_under_its_own_heading(live: LiveConsole) -> None:
    good, bad = receipt(1), receipt(2, body=b"{broken")
    for r in (good, bad):
        await live.store.ingress_receipt_insert(r, T0)
    await live.store.ingress_materialize(materialization(good), T0)
    await live.store.ingress_quarantine(QuarantineParams(
        receipt_id=bad.receipt_id, reason="malformed", detail="the body is not valid JSON"), T0)
    now = WallClock().now_us()
    await live.store.binding_connect(
        connect(binding_id="crm-align", kind=PrincipalKind.SHARED, org_id="org-ui",
                app_installation_id="inst-ui", provider="hubspot",
                identity=BindingIdentity(issuer="https://issuer.test",
                                         remote_account_id="acct-1", remote_subject="app",
                                         scopes=("read",))),
        Actor("setup", "admin", "ui test"), now)
    await live.store.quota_throttle("hubspot:align", QuotaPolicy(limit=10, window_us=1_000_000),
                                    now_us=now, retry_after_us=5_000_000)
    (dead,) = await live.enqueue("flaky", 1)
    await live.wait_state(dead, "dead")
    await live.enqueue("gated", 2)

    def scenario(page: Page, live: LiveConsole) -> None:
        sign_in(page, "ada")
        found: dict[str, list[str]] = {}
        for path in PAGES:
            answer = page.goto(path)
            assert answer is not None and answer.status == 200, path
            page.wait_for_load_state("networkidle")
            assert page.locator("table.data").count() > 0, path
            misaligned = page.evaluate(MISALIGNED)
            if misaligned:
                found[path] = misaligned
        page.goto("/admin/ingress")
        shot(page, "62-ingress-totals-aligned")
        assert found == {}

    await in_browser(live, scenario)

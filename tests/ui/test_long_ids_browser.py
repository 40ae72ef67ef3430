"""In the browser: ids and JSON never wrap mid-string or spill out of their box
(issue 23 item 3).

Every unbroken string of 16 or more characters (a ULID, an event id, a digest, a JSON
line's token) on a work item's page, an ingress receipt's page and the audit log is
measured in Chromium at a laptop's width and a narrow one: its text lies on one line
(one client rect), and it stays inside its card, or inside a scrolling box that does.
A real replica on SQLite with an ingress receipt materialized into a work item (its
lineage shows the receipt and event ids), Debian's Chromium. The audit log's JSON keeps
its exact microseconds and reads them as UTC time on hover."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
from playwright.sync_api import Page

from admin_ui.extensions import combine
from admin_ui.ingress import ingress_extensions
from daemon.services.clock import WallClock
from storage.idgen import new_ulid
from storage.port import AuditEntry, SqlTx, WorkQuery
from storage.work_admin import append_audit
from tests.support.backends import fresh_database
from tests.support.ingress import materialization, receipt
from tests.support.webhooks import ingress_settings
from tests.support.work import T0
from tests.ui.support import LiveConsole, in_browser, live_console, shot, sign_in

# For each long word in the page's main text: where it breaks or spills.
BROKEN = r"""
() => {
  const out = [];
  const clipped = (el) => ["auto", "scroll", "hidden"].includes(getComputedStyle(el).overflowX);
  const walker = document.createTreeWalker(document.querySelector("main"), NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const el = node.parentElement;
    if (!el || el.closest("[hidden], details:not([open]) > :not(summary)")) continue;
    if (el.offsetParent === null && getComputedStyle(el).position !== "fixed") continue;
    const card = el.closest(".card, section") || document.querySelector("main");
    for (const m of node.data.matchAll(/\S{16,}/g)) {
      const range = document.createRange();
      range.setStart(node, m.index);
      range.setEnd(node, m.index + m[0].length);
      const rects = [...range.getClientRects()].filter((r) => r.width > 0);
      if (rects.length > 1) out.push(`wraps: ${m[0]}`);
      // Seen through its outermost scrolling box inside the card (the reader scrolls
      // it), or else directly in the card: that box must lie inside the card.
      let seen = null;
      for (let a = el; a && a !== card; a = a.parentElement) if (clipped(a)) seen = a;
      const outer = card.getBoundingClientRect();
      const edge = (seen || range).getBoundingClientRect();
      if (edge.right > outer.right + 1 || edge.left < outer.left - 1) {
        out.push(`${seen ? "its box spills" : "spills"}: ${m[0]}`);
      }
    }
  }
  return [...new Set(out)];
}
"""


@pytest.fixture
async def live(tmp_path: Path) -> AsyncIterator[LiveConsole]:
    async with fresh_database("sqlite", tmp_path) as database, \
            live_console(database, combine(ingress_extensions())) as console:
        routes = ingress_settings(tmp_path).webhook_routes
        console.replica.settings = attrs.evolve(console.replica.settings, webhook_routes=routes)
        yield console


async def test_ids_and_json_stay_whole_and_inside_their_box(live: LiveConsole) -> None:
    got = receipt(1)
    await live.store.ingress_receipt_insert(got, T0)
    await live.store.ingress_materialize(materialization(got), T0)
    (item,) = [i for i in await live.store.work_list(WorkQuery(limit=10))
               if i.family == "inbound_apply"]
    (dead,) = await live.enqueue("flaky", 1)
    await live.wait_state(dead, "dead")
    # An audit entry whose documents carry a moment and a span in microseconds.
    now = WallClock().now_us()
    entry = AuditEntry(audit_id=new_ulid(now), at_us=now, actor="ada", role="admin",
                       action="quota.unblock", target_kind="quota", target_id="hubspot:ui",
                       reason="ui test", before=json.dumps({"blocked_until_us": now}),
                       after=json.dumps({"window_us": 10_000_000}))

    async def write(tx: SqlTx) -> None:
        await append_audit(tx, entry)

    await live.store.db.transact(write, name="test.audit")

    def scenario(page: Page, live: LiveConsole) -> None:
        sign_in(page, "ada")
        page.goto(f"/admin/work/{dead}")
        page.fill("#replay-reason", "the provider is back")
        page.click("#replay")  # an audit entry whose JSON names both items
        found: dict[str, list[str]] = {}
        for width in (1280, 760):
            page.set_viewport_size({"width": width, "height": 900})
            for path in (f"/admin/work/{item.work_id}", f"/admin/ingress/{got.receipt_id}",
                         f"/admin/work/{dead}", "/admin/audit"):
                page.goto(path)
                broken = page.evaluate(BROKEN)
                if broken:
                    found[f"{width} {path}"] = broken
            page.goto(f"/admin/work/{item.work_id}")
            shot(page, f"67-lineage-ids-{width}")
        # The audit JSON keeps its exact microseconds and reads as UTC time on hover.
        page.goto("/admin/audit")
        row = page.locator(f"tr[data-audit-id='{entry.audit_id}']")
        moment, window = row.locator("pre.json span.us").all()
        assert moment.inner_text() == str(now)
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ",
                            moment.get_attribute("title") or ""), moment.get_attribute("title")
        assert (window.inner_text(), window.get_attribute("title")) == ("10000000", "10 s")
        assert found == {}, "\n".join(f"{k}: {v}" for k, v in found.items())

    await in_browser(live, scenario)

"""In the browser: an admin binds lead-1 to the HubSpot contact it really is from the Effects
page (issue 20 item 8). Without the link generation seen, the rebind is refused with its
code; naming it, the link moves to generation 2, the audit log has the entry, and the next
Title change goes to the new contact (the one before it went to the old one).

Everything is real: the HubSpot simulator and the reference Runtime on loopback, the
replica's work loop, /v1 API and console, Debian's Chromium.
"""

from __future__ import annotations

from pathlib import Path

from playwright.sync_api import Page, expect

from tests.support.backends import fresh_database
from tests.support.slice import LINK_SCOPE, Slice, running_slice
from tests.ui.support import _OPERATORS, in_browser, shot, sign_in


async def test_admin_rebinds_a_lead_to_another_contact(tmp_path: Path) -> None:
    async with fresh_database("sqlite", tmp_path) as database:
        store = await database.open_store()
        async with running_slice(store, database.url, operators=_OPERATORS) as sl:
            await sl.lead("lead-1", "101")
            sl.sim.add_contact("202", jobtitle="Engineer")
            # A first Title change lands on 101 (and makes the binding's durable row).
            first = await sl.set_title("lead-1", "VP")
            await sl.wait_intent("lead-1", first, "COMMITTED", within_s=60)

            def bind(page: Page, generation: str) -> None:
                page.fill("#bind-local-id", "lead-1")
                page.fill("#bind-remote-id", "202")
                page.fill("#bind-generation", generation)
                page.fill("#bind-reason", "the CRM says lead-1 is contact 202")
                page.click("#bind-submit")

            def scenario(page: Page, live: Slice) -> None:
                sign_in(page, "ada")
                page.goto("/admin/effects")
                bind(page, "")
                expect(page.locator("#error-banner")).to_contain_text("generation_required")
                bind(page, "1")
                expect(page.locator("#notice-banner")).to_contain_text(
                    "Bound (rebound): lead lead-1 is contact 202, link generation 2.")
                shot(page, "41-link-rebound")
                page.goto("/admin/audit")
                expect(page.locator("#audit-table tr[data-action='link.bind']")
                       ).to_contain_text("the CRM says lead-1 is contact 202")

            await in_browser(sl, scenario)  # type: ignore[arg-type]
            link = await store.link_get(LINK_SCOPE, "lead", "lead-1")
            assert link is not None and (link.remote_id, link.generation) == ("202", 2)
            intent_id = await sl.set_title("lead-1", "CTO")
            await sl.wait_intent("lead-1", intent_id, "COMMITTED", within_s=60)
            assert [p.contact_id for p in sl.sim.requests if p.method == "PATCH"] == [
                "101", "202"]

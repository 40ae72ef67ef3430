"""In the browser (issue 23 item 2): the header's search box goes straight to a failed
attempt, whose page shows what was sent and what came back (redacted); the attempts list
filtered by outcome class pages by its token; a search that finds nothing says so."""

from __future__ import annotations

from pathlib import Path

from playwright.sync_api import Page, expect

from admin_ui.effects import effect_extensions
from config.catalog import load_catalog
from daemon.services.clock import WallClock
from tests.support.backends import fresh_database
from tests.support.find import SECRETS, seed_calls
from tests.ui.support import LiveConsole, in_browser, live_console, settings, shot, sign_in


async def test_search_box_filtered_list_paging_and_attempt_page(tmp_path: Path) -> None:
    async with fresh_database("sqlite", tmp_path) as database, live_console(
            database, effect_extensions(load_catalog(settings()))) as live:
        seeded = await seed_calls(live.store, WallClock().now_us() - 60_000_000)
        throttled = [s.attempt_id for s in reversed(seeded) if s.status == 429]
        failed = seeded[1]

        def scenario(page: Page, _: LiveConsole) -> None:
            sign_in(page, "viv")  # a viewer reads all of it
            page.fill("#search-box", failed.attempt_id)
            page.press("#search-box", "Enter")
            expect(page.locator("#attempt-id")).to_have_text(failed.attempt_id)
            expect(page.locator("#request-excerpt")).to_contain_text('"jobtitle":"CTO"')
            expect(page.locator("#request-excerpt")).to_contain_text("[redacted]")
            expect(page.locator("#exchange-status")).to_have_text("429")
            expect(page.locator("#response-headers")).to_contain_text(
                "x-ratelimit-remaining: 0")
            expect(page.locator("#response-excerpt")).to_contain_text("answered 429")
            html = page.content()
            assert not any(secret in html for secret in SECRETS)
            shot(page, "find-01-attempt-exchange")

            page.goto("/admin/find/attempts")
            page.select_option("#f-outcome", "REPLAY_SAFE_RETRY")
            page.fill("#f-limit", "2")
            page.click("#apply-filters")
            rows = page.locator("#find-results tbody tr")
            expect(rows).to_have_count(2)
            assert [rows.nth(i).get_attribute("data-id") for i in range(2)] == throttled[:2]
            shot(page, "find-02-attempts-filtered")
            page.click("#next-page")
            expect(rows).to_have_count(1)
            assert rows.first.get_attribute("data-id") == throttled[2]
            expect(rows.first).to_have_attribute("data-status", "429")
            expect(page.locator("#next-page")).to_have_count(0)
            expect(page.locator("#f-outcome")).to_have_value("REPLAY_SAFE_RETRY")

            page.fill("#f-since", "yesterday-ish")
            page.click("#apply-filters")
            expect(page.locator("#error-banner, .banner-error, main")).to_contain_text(
                "ISO 8601")

            page.fill("#search-box", "nothing-has-this")
            page.press("#search-box", "Enter")
            expect(page.locator("#search-empty")).to_have_text("Nothing has this id.")
            page.fill("#search-box", failed.command_id)
            page.press("#search-box", "Enter")
            expect(page.locator("#search-results tbody tr")).to_have_count(2)
            page.locator("#search-results tr[data-kind='command'] a").click()
            expect(page).to_have_url(f"{live.base_url}/admin/effects/commands/"
                                     f"{failed.command_id}")

        await in_browser(live, scenario)

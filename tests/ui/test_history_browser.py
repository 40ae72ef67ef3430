"""In the browser: the History page (issue 23 item 1). The range picker moves between the
presets and a custom range, a range that cannot be parsed is refused with its message,
and a point of the DLQ inflow chart opens the executions behind it, each linking to its
work item. A real replica on SQLite, a viewer signed in, Debian's Chromium."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from admin_ui.extensions import combine
from admin_ui.history import history_extensions
from tests.support.backends import fresh_database
from tests.ui.support import LiveConsole, in_browser, live_console, shot, sign_in


@pytest.fixture
async def live(tmp_path: Path) -> AsyncIterator[LiveConsole]:
    async with fresh_database("sqlite", tmp_path) as database, \
            live_console(database, combine(history_extensions())) as console:
        yield console


async def test_the_range_picker_and_a_point_link(live: LiveConsole) -> None:
    dead = await live.enqueue("flaky", 2)
    for work_id in dead:
        await live.wait_state(work_id, "dead")

    def scenario(page: Page, live: LiveConsole) -> None:
        sign_in(page, "viv")
        page.click('nav a[href="/admin/history"]')
        expect(page.locator("#range-1h")).to_have_attribute("aria-current", "true")
        page.click("#range-6h")
        expect(page).to_have_url(re.compile(r"/admin/history\?range=6h$"))
        expect(page.locator("#range-6h")).to_have_attribute("aria-current", "true")
        expect(page.locator("#history-range")).to_contain_text("one point per 5 min")
        # A custom range: the last hour and a half, typed as UTC times.
        now = dt.datetime.now(dt.UTC)
        page.fill("#h-from", (now - dt.timedelta(minutes=90)).strftime("%Y-%m-%dT%H:%MZ"))
        page.fill("#h-to", (now + dt.timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%MZ"))
        page.click("#h-apply")
        expect(page.locator("#history-range")).to_contain_text("one point per 1 min")
        assert page.locator("#range-picker [aria-current]").count() == 0
        shot(page, "70-history-custom-range")
        # A point of the DLQ inflow chart: the dead executions behind it.
        point = page.locator('#chart-history-dlq a.point-link[data-series="dead"]')
        expect(point).to_have_count(1)
        point.click()
        expect(page).to_have_url(re.compile(r"/admin/history/items\?.*outcome=dead"))
        rows = page.locator("#history-items tbody tr")
        expect(rows).to_have_count(2)
        for work_id in dead:
            expect(page.locator(f'#history-items a[href="/admin/work/{work_id}"]')).to_have_count(1)
        shot(page, "71-history-point-items")
        page.click(f'#history-items a[href="/admin/work/{dead[0]}"]')
        expect(page).to_have_url(re.compile(f"/admin/work/{dead[0]}$"))
        # A custom range that cannot be parsed: refused, with the reason shown.
        page.goto("/admin/history")
        page.fill("#h-from", "yesterday")
        page.fill("#h-to", "2026-12-06T01:00Z")
        page.click("#h-apply")
        expect(page.locator("body")).to_contain_text("from must be an ISO 8601 UTC time")

    await in_browser(live, scenario)

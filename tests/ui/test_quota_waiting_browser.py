"""In the browser: the Quota page says what is waiting on each key (issue 23 item 3):
the items held until their key has a send slot, the longest waiting first, since when
(the first deferral of their current wait, from the execution journal) and when each
is tried next. A real replica on SQLite; the held items are deferred through the real
claim and finalize statements; Debian's Chromium."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

import storage.quota
from daemon.core.outcomes import Deferred
from daemon.core.quota import QuotaPolicy
from daemon.core.work import WorkSpec
from daemon.services.clock import WallClock
from daemon.services.effect_quota import waiting_summary
from tests.support.work import claim, finalize
from tests.ui.support import LiveConsole, in_browser, shot, sign_in

KEY = "hubspot:ui-wait"
SEC = 1_000_000


async def test_quota_page_lists_what_waits_on_each_key(live: LiveConsole,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    now = WallClock().now_us()
    await live.store.quota_throttle(KEY, QuotaPolicy(limit=10, window_us=10 * SEC),
                                    now_us=now, retry_after_us=30 * SEC)
    # "held" is no family of the replica: only this test claims it.
    await live.store.work_enqueue(
        [WorkSpec(family="held", org_id="org-ui", subject_kind="lead", subject_id=f"l-{i}")
         for i in range(2)], now - 300 * SEC)

    async def defer(at: int, limit: int, until: int) -> list[str]:
        items = (await claim(live.store, owner="T", now=at, family="held",
                             limit=limit)).claimed
        for item in items:
            await finalize(live.store, item, Deferred("quota_wait", until,
                                                      waiting_summary(KEY, 30.0)),
                           now=at, replica="T")
        return [i.work_id for i in items]

    # One item deferred from 240 s ago (twice), the other from 120 s ago (once).
    (first,) = await defer(now - 240 * SEC, 1, now - 200 * SEC)
    (second,) = set(await defer(now - 120 * SEC, 2, now + 30 * SEC)) - {first}

    def scenario(page: Page, live: LiveConsole) -> None:
        sign_in(page, "viv")
        page.goto("/admin/quota")
        box = page.locator(f"#quota-waiting [data-quota-key='{KEY}']")
        expect(box.locator("h3")).to_contain_text("2 waiting, the oldest for 4 min")
        rows = box.locator("tbody tr")
        expect(rows).to_have_count(2)
        expect(rows.nth(0).locator("a.id")).to_have_text(first)
        expect(rows.nth(1).locator("a.id")).to_have_text(second)
        expect(rows.nth(0).locator("td").nth(3)).to_have_text("4 min")
        expect(rows.nth(1).locator("td").nth(3)).to_have_text("2 min")
        expect(rows.nth(0).locator("td").nth(4).locator("time")).to_have_attribute(
            "title", f"{now + 30 * SEC} µs since the epoch")
        since = rows.nth(0).locator("td").nth(2).locator("time")
        expect(since).to_have_attribute("title", f"{now - 240 * SEC} µs since the epoch")
        shot(page, "68-quota-waiting")
        # A key's count stops at its cap (issue 23: it read every held item at 1M open
        # rows) and then says so; the items listed are still the longest waiting.
        monkeypatch.setattr(storage.quota, "WAITING_CAP", 1)
        page.reload()
        expect(box.locator("h3")).to_contain_text("more than 1 waiting, the oldest for 4 min")
        expect(page.locator("#quota-table tbody tr").filter(has_text=KEY).locator("td").nth(9)
               ).to_have_text("more than 1")
        expect(rows).to_have_count(2)

    await in_browser(live, scenario)

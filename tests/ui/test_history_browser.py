"""In the browser: the History page (issue 23 item 1). The range picker moves between the
presets and a custom range, a range that cannot be parsed is refused with its message,
and a point of the DLQ inflow chart opens the executions behind it, each linking to its
work item; the pressure, latency and quota charts narrow by org, binding and quota key,
and their points open the commands and slots behind them. A real replica on SQLite, a
viewer signed in, Debian's Chromium."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from admin_ui.extensions import combine
from admin_ui.history import history_extensions
from daemon.services.clock import WallClock
from storage.history import bucket_of
from tests.support.backends import fresh_database
from tests.support.find import seed_receipts
from tests.support.history import finish_effects, use_quota
from tests.support.work import SEC
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


async def test_pressure_latency_and_quota_charts_with_their_filters(live: LiveConsole) -> None:
    """The effect path's pressure and latency and the quota use, drawn from the rollups;
    the org, binding and quota key filters narrow them; a point opens the commands or the
    slots behind it; a filter that cannot be read is refused with its message."""
    # The seeds are laid out in seconds from t0 (two quota slots at t0 and a second
    # later, receipts up to 9 s after it), and the 15-minute range draws a point per
    # rollup bucket (a minute): from a t0 late in its minute they fell into two points
    # (CI: the slots page of the first point listed 1 slot, not 2). So t0 starts one.
    t0 = bucket_of(WallClock().now_us() - 3 * 60 * SEC)
    seeded = await seed_receipts(live.store, t0)
    await use_quota(live.store, live.store, t0)

    def scenario(page: Page, live: LiveConsole) -> None:
        sign_in(page, "viv")
        page.goto("/admin/history?range=15m")
        pressure = page.locator("#history-pressure")
        expect(pressure.locator('li[data-series="commands accepted"] .figure')).to_have_text("6")
        expect(pressure.locator('li[data-series="receipts confirmed"] .figure')).to_have_text("2")
        expect(page.locator("#backlog-change")).to_contain_text("4 more accepted than confirmed")
        receipts = page.locator('#latency-range tr[data-latency="receipt"] td')
        expect(receipts.nth(4)).to_have_text("2")
        expect(page.locator('#quota-keys tr[data-key="k"]')).to_contain_text("600 per")
        shot(page, "72-history-pressure-latency-quota")
        # Another org: nothing of the effect path.
        page.fill("#h-org", "org-2")
        page.click("#h-apply")
        expect(page).to_have_url(re.compile(r"org=org-2"))
        expect(pressure.locator('li[data-series="commands accepted"] .figure')).to_have_text("0")
        expect(page.locator("#chart-history-latency")).to_contain_text(
            "no receipt confirmed in this range")
        # The commands' own binding: all of them again, and a receipt's point opens the
        # commands behind it.
        page.fill("#h-org", "")
        page.fill("#h-binding", "hubspot-main")
        page.click("#h-apply")
        expect(pressure.locator('li[data-series="commands accepted"] .figure')).to_have_text("6")
        # One receipt per minute: its p99 dot (drawn last) lies on its p50 dot; both
        # open the same commands.
        point = page.locator('#chart-history-latency a.point-link[data-series="receipt p99"]')
        expect(point).to_have_count(2)
        point.first.click()
        expect(page).to_have_url(re.compile(r"/admin/history/commands\?metric=receipted"))
        expect(page.locator("#history-commands tbody tr")).to_have_count(1)
        expect(page.locator(
            f'#history-commands a[href="/admin/effects/commands/{seeded[2].command_id}"]'
        )).to_have_count(1)
        shot(page, "73-history-receipt-commands")
        # One quota key: its use, and the slots behind a point.
        page.goto("/admin/history?range=15m")
        page.fill("#h-key", "k")
        page.click("#h-apply")
        expect(page.locator("#quota-keys tbody tr")).to_have_count(1)
        page.locator('#chart-history-quota a.point-link[data-series="k"]').first.click()
        expect(page).to_have_url(re.compile(r"/admin/history/slots\?key=k"))
        expect(page.locator("#history-slots tbody tr")).to_have_count(2)
        # A filter that cannot be read: refused, with the reason shown.
        page.goto("/admin/history")
        page.fill("#h-org", "o" * 129)
        page.click("#h-apply")
        expect(page.locator("body")).to_contain_text("org is longer than 128 characters")

    await in_browser(live, scenario)


async def test_the_filter_form_keeps_the_chosen_preset(live: LiveConsole) -> None:
    """Submitting the filters after picking a preset keeps that preset (it fell back to
    1 h: the form carried no range), and typing a custom range still replaces it."""

    def scenario(page: Page, live: LiveConsole) -> None:
        sign_in(page, "viv")
        page.goto("/admin/history")
        page.click("#range-24h")
        expect(page.locator("#range-24h")).to_have_attribute("aria-current", "true")
        page.fill("#h-family", "flaky")
        page.click("#h-apply")
        expect(page).to_have_url(re.compile(r"family=flaky"))
        expect(page.locator("#range-24h")).to_have_attribute("aria-current", "true")
        expect(page.locator("#history-range")).to_contain_text("one point per 1 h")
        expect(page.locator("#h-family")).to_have_value("flaky")
        # A preset link keeps the family; a custom range typed on a preset's page wins.
        page.click("#range-7d")
        expect(page).to_have_url(re.compile(r"range=7d.*family=flaky"))
        now = dt.datetime.now(dt.UTC)
        page.fill("#h-from", (now - dt.timedelta(minutes=30)).strftime("%Y-%m-%dT%H:%MZ"))
        page.fill("#h-to", now.strftime("%Y-%m-%dT%H:%MZ"))
        page.click("#h-apply")
        expect(page.locator("#history-range")).to_contain_text("one point per 1 min")
        assert page.locator("#range-picker [aria-current]").count() == 0
        expect(page.locator("#h-family")).to_have_value("flaky")

    await in_browser(live, scenario)


async def test_executions_and_dlq_inflow_narrowed_per_binding_org_and_operation(
        live: LiveConsole) -> None:
    """The executions and DLQ inflow charts narrowed to one binding's (org's,
    operation's) effect items (issue 23 item 1, migration 0048): the legend counts
    follow the filter, a dead point opens exactly that binding's dead items, and the
    work queue's chart says it is not narrowed, and why."""
    t0 = bucket_of(WallClock().now_us() - 3 * 60 * SEC)  # a bucket's start, as above
    ids = await finish_effects(live.store, t0)

    def scenario(page: Page, live: LiveConsole) -> None:
        sign_in(page, "viv")
        page.goto("/admin/history?range=15m")
        throughput = page.locator("#history-throughput")
        expect(throughput.locator('li[data-series="dead"] .figure')).to_have_text("2")
        expect(throughput.locator('li[data-series="succeeded"] .figure')).to_have_text("4")
        expect(page.locator("#queue-not-narrowed")).to_have_count(0)
        page.fill("#h-binding", "hubspot-main")
        page.click("#h-apply")
        expect(page).to_have_url(re.compile(r"binding=hubspot-main"))
        expect(throughput.locator("h2")).to_contain_text("(narrowed)")
        expect(throughput.locator('li[data-series="succeeded"] .figure')).to_have_text("2")
        expect(throughput.locator('li[data-series="dead"]')).to_have_count(0)
        expect(page.locator("#history-dlq")).to_contain_text(
            "0 executions ended dead in this range")
        expect(page.locator("#queue-not-narrowed")).to_contain_text(
            "Not narrowed by binding: the queue is sampled once a minute per family")
        # Another binding and one org: its dead point opens exactly its dead item.
        page.fill("#h-binding", "hubspot-eu")
        page.fill("#h-org", "org-1")
        page.click("#h-apply")
        expect(throughput.locator('li[data-series="dead"] .figure')).to_have_text("1")
        expect(throughput.locator('li[data-series="succeeded"]')).to_have_count(0)
        shot(page, "74-history-executions-per-binding")
        point = page.locator('#chart-history-dlq a.point-link[data-series="dead"]')
        expect(point).to_have_count(1)
        point.click()
        expect(page).to_have_url(re.compile(
            r"/admin/history/items\?.*outcome=dead.*org=org-1.*binding=hubspot-eu"))
        rows = page.locator("#history-items tbody tr")
        expect(rows).to_have_count(1)
        expect(page.locator(f'#history-items a[href="/admin/work/{ids["lead-c"]}"]'))\
            .to_have_count(1)
        expect(page.locator("h1")).to_contain_text("binding hubspot-eu")
        # One operation: both orgs' deal.create items.
        page.goto("/admin/history?range=15m&operation=hubspot.deal.create")
        expect(throughput.locator('li[data-series="dead"] .figure')).to_have_text("1")
        expect(throughput.locator('li[data-series="succeeded"] .figure')).to_have_text("2")
        # A filter that cannot be read: refused, with the reason shown.
        page.goto("/admin/history")
        page.fill("#h-binding", "b" * 129)
        page.click("#h-apply")
        expect(page.locator("body")).to_contain_text("binding is longer than 128 characters")

    await in_browser(live, scenario)

"""The operator console in a real browser (Chromium via Playwright) against a live replica."""

from __future__ import annotations

import re

from playwright.sync_api import Page, expect

from tests.ui.support import WAIT_MS, LiveConsole, in_browser, shot, sign_in


async def test_sign_in_and_sign_out(live: LiveConsole) -> None:
    def scenario(page: Page, live: LiveConsole) -> None:
        page.goto("/admin/work")
        expect(page).to_have_url(re.compile(r"/admin/sign-in\?next=/admin/work$"))
        page.fill("#name", "ada")
        page.fill("#password", "not-the-password")
        page.click("#sign-in")
        expect(page.locator("#error-banner")).to_have_text("invalid name or password")
        shot(page, "01-sign-in-refused")
        page.fill("#password", "admin-pass-1")
        page.click("#sign-in")
        expect(page).to_have_url(re.compile(r"/admin/work$"))
        expect(page.locator("#who")).to_have_text("ada")
        expect(page.locator("#who-role")).to_have_text("admin")
        page.click("#sign-out")
        expect(page).to_have_url(re.compile(r"/admin/sign-in\?notice=signed_out$"))
        expect(page.locator("#notice-banner")).to_have_text("Signed out.")
        shot(page, "02-signed-out")
        page.goto("/admin/")
        expect(page).to_have_url(re.compile(r"/admin/sign-in"))

    await in_browser(live, scenario)


async def test_pressure_moves_as_work_flows_without_reload(live: LiveConsole) -> None:
    def scenario(page: Page, live: LiveConsole) -> None:
        sign_in(page, "viv")
        expect(page.locator("h1")).to_have_text("Overview")
        expect(page.locator("#open-depth")).to_have_text("0", timeout=WAIT_MS)
        page.evaluate("window.__sameDocument = 'yes'")
        live.call(live.enqueue, "gated", 12)
        # The gate is shut: the items are claimed and held, and the depth shows them.
        expect(page.locator("#open-depth")).to_have_text("12", timeout=WAIT_MS)
        row = page.locator('#pressure tr[data-family="gated"][data-state="processing"] .depth')
        expect(row).to_have_text("12", timeout=WAIT_MS)
        expect(page.locator('#chart-depth-gated polyline[data-series="processing"]')
               ).to_have_count(1, timeout=WAIT_MS)
        expect(page.locator('#local tr[data-family="gated"] td').nth(1)).to_have_text("12")
        shot(page, "03-overview-pressure")
        live.call(live.board.open_gate)
        expect(page.locator("#open-depth")).to_have_text("0", timeout=WAIT_MS)
        expect(page.locator("#finished-count")).to_have_text("12", timeout=WAIT_MS)
        expect(page.locator('#outcomes tr[data-family="gated"][data-outcome="succeeded"]')
               ).to_have_count(1)
        assert page.evaluate("window.__sameDocument") == "yes"  # no reload happened
        expect(page.locator("#replicas tr[data-replica='ui-replica']")).to_contain_text(
            "running")
        shot(page, "04-overview-drained")

    await in_browser(live, scenario)


async def test_find_dead_item_replay_it_and_see_lineage_and_audit(live: LiveConsole) -> None:
    (dead,) = await live.enqueue("flaky")
    await live.wait_state(dead, "dead")
    live.board.broken = False  # the provider is fixed: a replay will succeed

    def scenario(page: Page, live: LiveConsole) -> None:
        sign_in(page, "otto")
        page.goto("/admin/dlq")
        row = page.locator(f'#dlq-items tr[data-work-id="{dead}"]')
        expect(row).to_contain_text("provider_down")
        expect(row).to_contain_text("provider answered 503 (simulated outage)")
        shot(page, "05-dlq")
        row.locator("a.id").click()
        expect(page.locator("#work-id")).to_have_text(dead)
        expect(page.locator("#failure-class")).to_have_text("provider_down")
        page.fill("#replay-reason", "provider is back")
        page.click("#replay")
        expect(page.locator("#notice-banner")).to_contain_text("Replayed")
        new_id = page.locator("#work-id").inner_text()
        assert new_id != dead
        expect(page.locator("#replay-of a")).to_have_text(dead)
        expect(page.locator("#lineage-sections [data-section='effect_attempts']")).to_contain_text(
            "not applicable")
        live.call(live.wait_state, new_id, "succeeded")
        page.reload()
        expect(page.locator("#work-state")).to_have_text("succeeded")
        expect(page.locator("#executions tbody tr")).to_have_count(1)
        shot(page, "06-replayed-item")
        page.click("#replay-of a")
        expect(page.locator("#replays a")).to_have_text(new_id)
        page.goto("/admin/audit")
        entry = page.locator("#audit-table tr[data-action='work.replay']")
        expect(entry).to_have_count(1)
        expect(entry).to_contain_text("otto")
        expect(entry).to_contain_text("provider is back")
        expect(entry.locator("a.id")).to_have_text([dead, dead, new_id])
        shot(page, "07-audit-log")

    await in_browser(live, scenario)


async def test_viewer_is_refused(live: LiveConsole) -> None:
    (dead,) = await live.enqueue("flaky")
    await live.wait_state(dead, "dead")

    def scenario(page: Page, live: LiveConsole) -> None:
        sign_in(page, "viv")
        page.goto(f"/admin/work/{dead}")
        expect(page.locator("#actions-refused")).to_contain_text("may look but not replay")
        expect(page.locator("#replay-form")).to_have_count(0)
        shot(page, "08-viewer-detail")
        token = page.locator('meta[name="csrf-token"]').get_attribute("content")
        assert token
        api = page.request.post(f"/admin/api/work/{dead}/replay", data={"reason": "try"},
                                headers={"X-CSRF-Token": token})
        assert api.status == 403 and api.json()["error"] == "forbidden"
        page.goto("/admin/operators")
        expect(page.locator("#error-code")).to_have_text("forbidden")
        shot(page, "09-viewer-refused")
        assert live.call(live.store.work_replays_of, dead) == []

    await in_browser(live, scenario)


async def test_post_without_csrf_token_is_refused_and_changes_nothing(live: LiveConsole) -> None:
    (dead,) = await live.enqueue("flaky")
    await live.wait_state(dead, "dead")

    def scenario(page: Page, live: LiveConsole) -> None:
        sign_in(page, "otto")
        page.goto(f"/admin/work/{dead}")
        page.evaluate("document.querySelector('#replay-form input[name=csrf_token]').remove()")
        page.fill("#replay-reason", "forged")
        page.click("#replay")
        expect(page.locator("#error-code")).to_have_text("csrf_failed")
        expect(page.locator("#error-message")).to_contain_text("CSRF token")
        shot(page, "10-csrf-refused")
        api = page.request.post(f"/admin/api/work/{dead}/replay", data={"reason": "forged"})
        assert api.status == 403 and api.json()["error"] == "csrf_failed"
        assert live.call(live.store.work_replays_of, dead) == []
        assert live.call(live.store.audit_list) == []

    await in_browser(live, scenario)


async def test_database_down_shows_a_banner(live: LiveConsole) -> None:
    def scenario(page: Page, live: LiveConsole) -> None:
        sign_in(page, "ada")
        expect(page.locator("#db-banner")).to_be_hidden()
        live.switch.down = True
        expect(page.locator("#db-banner")).to_be_visible(timeout=WAIT_MS)
        shot(page, "11-db-down-overview")
        page.goto("/admin/work")
        expect(page.locator("#db-banner")).to_be_visible()
        expect(page.locator("#error-code")).to_have_text("database_unavailable")
        shot(page, "12-db-down-work")
        live.switch.down = False
        page.goto("/admin/work")
        expect(page.locator("#db-banner")).to_be_hidden()

    await in_browser(live, scenario)


async def test_bulk_replay_from_the_dlq(live: LiveConsole) -> None:
    dead = await live.enqueue("flaky", 3)
    for work_id in dead:
        await live.wait_state(work_id, "dead")
    live.board.broken = False

    def scenario(page: Page, live: LiveConsole) -> None:
        sign_in(page, "ada")
        page.goto("/admin/dlq")
        expect(page.locator("#dlq-classes")).to_contain_text("provider_down")
        page.select_option("#bulk-family", "flaky")
        page.fill("#bulk-class", "provider_down")
        page.fill("#bulk-reason", "outage over")
        page.click("#bulk-replay")
        expect(page.locator("#bulk-replayed")).to_have_text("3")
        expect(page.locator("#bulk-items tr[data-outcome='replayed']")).to_have_count(3)
        shot(page, "13-bulk-replay")
        page.goto("/admin/dlq?unreplayed=1")
        expect(page.locator("#dlq-items")).to_contain_text("No dead items match.")
        page.goto("/admin/audit")
        expect(page.locator("#audit-table tr[data-action='dlq.bulk_replay']")).to_have_count(1)
        expect(page.locator("#audit-table tr[data-action='work.replay']")).to_have_count(3)
        summary = page.locator("#audit-table tr[data-action='dlq.bulk_replay'] pre.json.after")
        expect(summary).to_contain_text('"bulk_id"')
        expect(summary.locator("a.id")).not_to_have_count(0)
        shot(page, "17-audit-json")

    await in_browser(live, scenario)


# Identifiers (work ids, families, replica ids) are one unit each: an inline element that
# wraps has more than one client rect.
_WRAPPED_IDS = """() => [...document.querySelectorAll('a.id, code, .id')]
    .filter((el) => el.getClientRects().length > 1).map((el) => el.textContent)"""


def _half_unit(shown: str) -> float:
    """How far a shown rate may be from its value: half the unit of the last digit the
    console keeps (admin_ui.charts.fmt_value: none from 100, one from 10, two below;
    trailing zeros are dropped, so the digits shown can be fewer)."""
    value = abs(float(shown))
    decimals = 0 if value >= 100 else 1 if value >= 10 else 2
    return 0.5 * 10.0 ** -decimals


# The finished/s card and every family's finished/s legend figure, read in one go.
_RATE_AND_LEGENDS = """() => [
  document.getElementById("throughput-rate").innerText,
  Array.from(document.querySelectorAll(
    'article.family .legend li:not([data-series="retry"]) .figure'), n => n.innerText),
]"""


async def test_charts_read_at_a_glance_and_follow_the_work(live: LiveConsole) -> None:
    dead = await live.enqueue("flaky", 2)
    for work_id in dead:
        await live.wait_state(work_id, "dead")

    def scenario(page: Page, live: LiveConsole) -> None:
        sign_in(page, "viv")
        page.evaluate("window.__sameDocument = 'yes'")
        live.call(live.enqueue, "gated", 30)
        # Each family has its own card: depth by state and executions per second, with a
        # UTC time axis, and the retry and dead lines drawn even at zero.
        gated = page.locator('article.family[data-family="gated"]')
        expect(gated.locator('#chart-depth-gated polyline[data-series="processing"]')
               ).to_have_count(1, timeout=WAIT_MS)
        for chart in ("depth", "finished"):
            for series in ("retry", "dead"):
                line = gated.locator(f'#chart-{chart}-gated [data-series="{series}"]')
                expect(line).not_to_have_count(0)
        expect(gated.locator("#chart-depth-gated text.time").first).to_have_text(
            re.compile(r"^\d\d:\d\d(:\d\d)?$"))
        expect(gated.locator('.legend li[data-series="processing"] .figure')).to_have_text(
            "30", timeout=WAIT_MS)
        flaky = page.locator('article.family[data-family="flaky"]')
        expect(flaky.locator('.legend li[data-series="dead"] .figure').first).to_have_text("2")
        expect(page.locator("#chart-flow")).to_be_visible()
        expect(page.locator("#chart-latency")).to_be_visible()
        shot(page, "14-overview-charts-busy")
        live.call(live.board.open_gate)
        # The live poll swaps in fresh charts: the gate opened, 30 succeeded (plus the two
        # dead flaky items, inside the same 60 s window).
        expect(gated.locator('.legend li[data-series="processing"] .figure')).to_have_text(
            "0", timeout=WAIT_MS)
        expect(gated.locator('#chart-finished-gated polyline[data-series="succeeded"]')
               ).to_have_count(1)
        expect(page.locator("#finished-count")).to_have_text("32", timeout=WAIT_MS)
        # One finished/s figure: the card is the window's figure, the legends sum to it,
        # within what the shown digits can say (each figure is rounded to its last digit:
        # one decimal from 10/s, two below). Card and legends are read in one script, so
        # from one fragment: read one after the other, a live swap could fall between
        # them (CI: 9.15 on the card against legends of a later, longer window, 7.79).
        rate_text, shown = page.evaluate(_RATE_AND_LEGENDS)
        rate_text = rate_text.replace(",", "")
        legend_texts = [t.removesuffix("/s").replace(",", "")
                        for t in shown if t.endswith("/s")]
        legend_total = sum(float(t) for t in legend_texts)
        rounding = sum(_half_unit(t) for t in (rate_text, *legend_texts))
        assert abs(legend_total - float(rate_text)) <= rounding + 1e-9, (
            legend_total, rate_text, rounding)
        assert page.evaluate("window.__sameDocument") == "yes"  # no reload happened
        assert page.evaluate(_WRAPPED_IDS) == []
        shot(page, "15-overview-charts-drained")

    await in_browser(live, scenario)


async def test_identifiers_never_wrap_mid_word_on_a_narrow_screen(live: LiveConsole) -> None:
    (dead,) = await live.enqueue("flaky")
    await live.wait_state(dead, "dead")
    live.board.broken = False

    def scenario(page: Page, live: LiveConsole) -> None:
        page.set_viewport_size({"width": 760, "height": 900})
        sign_in(page, "otto")
        page.goto(f"/admin/work/{dead}")
        page.fill("#replay-reason", "provider is back")
        page.click("#replay")
        expect(page.locator("#notice-banner")).to_contain_text("Replayed")
        for path in ("/admin/work", "/admin/dlq", f"/admin/work/{dead}", "/admin/audit", "/admin/"):
            page.goto(path)
            expect(page.locator("h1")).to_be_visible()
            assert page.evaluate(_WRAPPED_IDS) == [], path
        # The audit log shows before and after as JSON, with the work ids as links.
        page.goto("/admin/audit")
        entry = page.locator("#audit-table tr[data-action='work.replay']")
        expect(entry.locator("pre.json.before")).to_contain_text('"state": "dead"')
        expect(entry.locator("pre.json.after")).to_contain_text('"state": "pending"')
        expect(entry.locator("pre.json.before a.id")).to_have_text(dead)
        shot(page, "16-audit-json-narrow")

    await in_browser(live, scenario)

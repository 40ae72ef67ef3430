"""In the browser: a work item's page says what applies to it (issue 23 item 3).

An item this build wrote shows "not applicable" for a lineage section that has nothing
of that kind (it said "not recorded by this build yet", as if something were missing);
an item a newer build wrote (a higher engine capability) says so once at the top and in
each section this build cannot fill: "written by a newer build (v2); this console shows
what it knows". A real replica on SQLite, Debian's Chromium."""

from __future__ import annotations

from playwright.sync_api import Page, expect

from daemon.core.work import WorkSpec
from daemon.services.clock import WallClock
from tests.ui.support import LiveConsole, in_browser, shot, sign_in

NEWER = "written by a newer build (v2); this console shows what it knows"


async def test_sections_that_do_not_apply_and_items_of_a_newer_build(
    live: LiveConsole,
) -> None:
    (ours,) = await live.enqueue("flaky", 1)
    await live.wait_state(ours, "dead")
    (newer,) = [r.work_id for r in await live.store.work_enqueue(
        [WorkSpec(family="gated", org_id="org-ui", subject_kind="lead", subject_id="lead-v2",
                  engine_capability_version=2)], WallClock().now_us())]

    def scenario(page: Page, live: LiveConsole) -> None:
        sign_in(page, "viv")
        page.goto(f"/admin/work/{ours}")
        sections = page.locator("#lineage-sections")
        expect(sections).not_to_contain_text("not recorded by this build yet")
        expect(sections.locator("[data-section='effect_attempts']")).to_contain_text(
            "not applicable")
        expect(page.locator("#newer-build")).to_have_count(0)

        page.goto(f"/admin/work/{newer}")
        expect(page.locator("#newer-build")).to_contain_text(
            "Written by a newer build (v2); this console shows what it knows")
        expect(sections).not_to_contain_text("not recorded by this build yet")
        expect(sections.locator("[data-section='effect_attempts']")).to_contain_text(NEWER)
        shot(page, "66-newer-build-item")

    await in_browser(live, scenario)

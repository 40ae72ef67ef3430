"""In the browser: "Claims / s" is a figure as soon as the overview opens while the
replica claims (issue 23 item 3). It was "—" on every first render: the page computed
it in JavaScript from two polls' counters. Now the server reads the replica's own claim
counter, sampled with the depth history, over the throughput window. A real replica on
SQLite, Debian's Chromium."""

from __future__ import annotations

import re

from playwright.sync_api import Page, expect

from tests.support.harness import wait_for
from tests.ui.support import LiveConsole, in_browser, shot, sign_in


async def test_claims_per_second_shows_while_the_replica_claims(live: LiveConsole) -> None:
    ids = await live.enqueue("gated", 5)  # claimed, then held at the gate
    for work_id in ids:
        await live.wait_state(work_id, "processing")
    sampled = len(live.replica.history)
    # A depth sample taken after the claims.
    await wait_for(lambda: len(live.replica.history) >= sampled + 2, within_s=60)

    def scenario(page: Page, live: LiveConsole) -> None:
        sign_in(page, "viv")
        page.goto("/admin/")
        # Read at once: before the page's first poll (the old figure waited for two).
        rate = page.locator("#claim-rate").inner_text()
        assert re.fullmatch(r"\d+(\.\d+)?", rate), rate
        assert float(rate) > 0
        expect(page.locator("#claimed-count")).to_have_text("5")
        shot(page, "65-overview-claim-rate")

    await in_browser(live, scenario)

"""In the browser: an OUTCOME_UNKNOWN write, refused replay, an operator's disposition,
then a replay that settles the command; both actions in the audit log.

Everything is real: the HubSpot simulator and the reference Runtime on loopback, the
replica's work loop, /v1 API and console, Debian's Chromium.
"""

from __future__ import annotations

import trio
from playwright.sync_api import Page, expect

from daemon.core.states import WorkState
from tests.support.backends import fresh_database
from tests.support.harness import wait_for
from tests.support.slice import Slice, running_slice
from tests.ui.support import _OPERATORS, in_browser, shot, sign_in


async def test_operator_records_a_disposition_then_replays(tmp_path: object) -> None:
    async with fresh_database("sqlite", tmp_path) as database:  # type: ignore[arg-type]
        store = await database.open_store()
        async with running_slice(store, database.url, max_attempts=2,
                                 operators=_OPERATORS) as sl:
            dead_id = await sl.unknown_dead_effect()

            def scenario(page: Page, live: Slice) -> None:
                sign_in(page, "otto")
                page.goto(f"/admin/work/{dead_id}")
                attempts = page.locator("#lineage-sections [data-section='effect_attempts']")
                expect(attempts).to_contain_text("OUTCOME_UNKNOWN")
                expect(page.locator("#lineage-sections [data-section='commands']")
                       ).to_contain_text("open")
                # Replay is refused while the outcome is unknown.
                page.fill("#replay-reason", "try again")
                page.click("#replay")
                expect(page.locator("#error-banner")).to_contain_text("outcome is unknown")
                shot(page, "14-replay-refused-unknown-outcome")
                page.goto("/admin/effects")
                row = page.locator("#unknown-table tbody tr").first
                expect(row).to_contain_text("PATCH /crm/v3/objects/contacts/101")
                # How many await a disposition, by kind (each count bounded, issue 23).
                expect(page.locator("#unknown-counts")).to_contain_text("Oldest first, 1 shown.")
                expect(page.locator("#count-outcome-unknown")).to_have_text("1")
                expect(page.locator("#count-no-outcome")).to_have_text("0")
                shot(page, "15-unknown-outcomes")
                row.locator("a.id").first.click()
                page.select_option("#disposition-choice", "absent")
                page.fill("#disposition-note", "HubSpot history: our PATCH never arrived")
                page.click("#dispose-submit")
                expect(page.locator("#notice-banner")).to_contain_text("Disposition recorded")
                expect(page.locator("#disposition")).to_contain_text("operator_absent")
                shot(page, "16-disposition-recorded")
                page.goto(f"/admin/work/{dead_id}")
                page.fill("#replay-reason", "absence confirmed in HubSpot")
                page.click("#replay")
                expect(page.locator("#notice-banner")).to_contain_text("Replayed")
                new_id = page.locator("#work-id").inner_text()
                assert new_id != dead_id

                async def settled() -> bool:
                    item = await store.work_get(new_id)
                    return item is not None and item.state is WorkState.SUCCEEDED

                trio.from_thread.run(wait_for, settled)
                page.reload()
                expect(page.locator("#work-state")).to_have_text("succeeded")
                expect(page.locator("#lineage-sections [data-section='commands']")
                       ).to_contain_text("succeeded")
                page.goto("/admin/audit")
                expect(page.locator("#audit-table tr[data-action='effect.disposition']")
                       ).to_contain_text("our PATCH never arrived")
                expect(page.locator("#audit-table tr[data-action='work.replay']")
                       ).to_contain_text("absence confirmed in HubSpot")
                shot(page, "17-audit-disposition-and-replay")

            await in_browser(sl, scenario)  # type: ignore[arg-type]
            # One PATCH was lost, exactly one more was applied after the disposition.
            assert [p.applied for p in sl.patches("101")] == [False, True]
            assert sl.sim.contact("101")["properties"]["jobtitle"] == "CTO"  # type: ignore[index]

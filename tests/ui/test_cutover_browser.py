"""In the browser: the Cutover page speaks the operator's language (issue 23 item 3).

No Python reprs (``()``, ``None``, ``True``, ``('a',)``) and no snake_case keys
(``legacy_processing``, ``cutover_draining``) anywhere on it; the family is chosen
from a list of the configured families; only the next step's button is offered,
as the pure state machine (daemon/core/cutover.py) says. A real replica on SQLite,
Debian's Chromium."""

from __future__ import annotations

import re

from playwright.sync_api import Page, expect

from tests.ui.support import LiveConsole, in_browser, shot, sign_in

SNAKE = re.compile(r"\b[a-z]+_[a-z0-9_]+\b")
REPR = re.compile(r"\(\)|\(\s*'|\bNone\b|\bTrue\b|\bFalse\b|\[\]|\{\}")


def machine_words(page: Page) -> list[str]:
    # A configuration file's section name ("[[legacy_claimants]]") is what the operator
    # types: it stays as written.
    text = re.sub(r"\[\[[a-z_]+\]\]", "", page.locator("main").inner_text())
    return sorted(set(SNAKE.findall(text)) | set(REPR.findall(text)))


def buttons(page: Page) -> list[str]:
    return [b.strip() for b in
            page.locator("#cutover-steps button[type=submit]").all_inner_texts()]


async def test_cutover_page_offers_configured_families_and_only_the_next_step(
    live: LiveConsole,
) -> None:
    def scenario(page: Page, live: LiveConsole) -> None:
        sign_in(page, "ada")
        page.goto("/admin/cutover")
        options = page.locator("select#family option").all_inner_texts()
        assert {"gated", "flaky"} <= {o.strip() for o in options}, options
        page.select_option("select#family", "gated")
        page.click("#open-family")
        expect(page).to_have_url(re.compile(r"/admin/cutover/gated$"))
        assert machine_words(page) == []
        assert buttons(page) == ["Begin cutover"]
        shot(page, "63-cutover-fresh")

        page.fill("#cutover-steps input[name=reason]", "move gated to integrationd")
        page.click("#cutover-steps button[type=submit]")
        expect(page.locator("#phase")).to_contain_text("draining")
        assert machine_words(page) == []
        assert buttons(page) == ["Commit cutover"]
        shot(page, "64-cutover-draining")

    await in_browser(live, scenario)

"""The console's cutover pages: status, blockers, receipts, fences, audited steps."""

from __future__ import annotations

from collections.abc import AsyncIterator

import attrs
import pytest

from sandbox.legacy import store as legacy
from tests.admin.support import ConsoleHarness, console_harness, console_settings
from tests.support.backends import FreshDatabase
from tests.support.cutover import states


@pytest.fixture
async def console(sqlite_db: FreshDatabase) -> AsyncIterator[ConsoleHarness]:
    """The console, with the sandbox's legacy claimant declared for ``noop``."""
    settings = attrs.evolve(console_settings(),
                            legacy_claimants=(legacy.claimant_settings("noop"),))
    async with console_harness(sqlite_db, settings=settings) as harness:
        yield harness


async def test_cutover_pages_show_blockers_and_run_audited_steps(
    console: ConsoleHarness,
) -> None:
    store = console.store
    await legacy.install(store)
    await legacy.add_events(store, "noop", ["{}"], 1)
    viewer, _ = await console.sign_in("viv")
    listing = await viewer.get("/admin/cutover")
    assert listing.status_code == 200
    assert "No family is under the cutover protocol" in await listing.get_data(as_text=True)
    fresh = await (await viewer.get("/admin/cutover/noop")).get_data(as_text=True)
    assert "Not under the cutover protocol" in fresh and "cutover-steps" not in fresh
    assert (await viewer.get("/admin/cutover/bad%20name")).status_code == 404

    admin, csrf = await console.sign_in("ada")
    no_csrf = await admin.post("/admin/cutover/noop/begin", form={"reason": "move"})
    assert no_csrf.status_code == 403
    refused = await viewer.post("/admin/cutover/noop/begin",
                                form={"reason": "move", "csrf_token": csrf})
    assert refused.status_code == 403
    assert await store.owner_generation_get("noop") is None
    no_reason = await admin.post("/admin/cutover/noop/begin", form={"csrf_token": csrf})
    assert no_reason.status_code == 400

    begun = await admin.post("/admin/cutover/noop/begin",
                             form={"reason": "move noop", "csrf_token": csrf})
    assert begun.status_code == 302
    assert begun.headers["Location"] == "/admin/cutover/noop?notice=cutover_begin"
    body = await (await admin.get("/admin/cutover/noop?notice=cutover_begin")).get_data(
        as_text=True)
    assert "Cutover begin: done" in body and "cutover_draining" in body
    assert 'data-code="coverage_gap"' in body  # the event has no WorkItem yet
    assert 'data-code="admission_recently_closed"' in body

    blocked = await admin.post("/admin/cutover/noop/commit",
                               form={"reason": "go", "csrf_token": csrf})
    assert blocked.status_code == 409
    text = await blocked.get_data(as_text=True)
    assert "cutover commit blocked" in text and 'id="refused"' in text
    gen = await store.owner_generation_get("noop")
    assert gen is not None and gen.generation == 0
    assert await states(store) == {}
    entries = [e.action for e in await store.audit_list(target_id="noop")]
    assert entries == ["cutover.begin"]
    listed = await (await viewer.get("/admin/cutover")).get_data(as_text=True)
    assert 'href="/admin/cutover/noop"' in listed

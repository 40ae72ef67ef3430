"""With the database unreachable the console shows a banner, never a stack trace."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from storage.work_store import WorkStore
from tests.admin.support import ConsoleHarness, console_harness
from tests.support.backends import FreshDatabase
from tests.support.harness import SwitchableDatabase


@pytest.fixture
async def switchable(sqlite_db: FreshDatabase) -> AsyncIterator[
        tuple[ConsoleHarness, SwitchableDatabase]]:
    inner = await sqlite_db.open_store()
    switch = SwitchableDatabase(inner.db)
    store = WorkStore(switch, inner.dialect)
    async with console_harness(sqlite_db, store=store) as harness:
        yield harness, switch


async def test_database_down_banner(
    switchable: tuple[ConsoleHarness, SwitchableDatabase],
) -> None:
    console, switch = switchable
    (dead,) = await console.dead_items(1)
    client, csrf = await console.sign_in("otto")
    switch.down = True

    overview = await client.get("/admin/")
    body = await overview.get_data(as_text=True)
    assert overview.status_code == 200  # the overview still shows what is in memory
    assert '<div id="db-banner" class="banner banner-db" role="alert">' in body
    assert "Database unreachable." in body and "Traceback" not in body

    for path in ("/admin/work", f"/admin/work/{dead}", "/admin/dlq", "/admin/audit"):
        page = await client.get(path)
        text = await page.get_data(as_text=True)
        assert page.status_code == 503, path
        assert '<div id="db-banner" class="banner banner-db" role="alert">' in text
        assert "switched off" not in text and "Traceback" not in text

    for path in ("/admin/api/work", "/admin/api/dlq", "/admin/api/audit",
                 f"/admin/api/work/{dead}"):
        api = await client.get(path)
        assert api.status_code == 503
        doc = await api.get_json()
        assert doc["error"] == "database_unavailable" and "switched off" not in doc["message"]
    state = await (await client.get("/admin/api/overview")).get_json()
    assert state["database"] == "unreachable" and state["replicas"] is None

    refused = await client.post(f"/admin/api/work/{dead}/replay", json={"reason": "r"},
                                headers={"X-CSRF-Token": csrf})
    assert refused.status_code == 503
    form = await client.post(f"/admin/work/{dead}/replay",
                             form={"reason": "r", "csrf_token": csrf})
    assert form.status_code == 503

    switch.down = False
    assert await console.store.work_replays_of(dead) == []
    again = await client.get("/admin/")
    assert 'id="db-banner" class="banner banner-db" role="alert" hidden' in (
        await again.get_data(as_text=True))

"""The console's Sync page and its JSON: every reconciliation stream with its cursor, runs
and lag; a viewer may read it; its API route is in the OpenAPI document."""

from __future__ import annotations

import time

from admin_ui.app import create_app
from admin_ui.extensions import combine
from admin_ui.sync import sync_extensions
from config.catalog import build_catalog, load_definitions, load_object_binding_documents
from config.settings import BindingSettings
from daemon.core.cursor import Cursor
from storage.port import SqlTx
from storage.reconcile import StreamState, read_stream, write_stream
from tests.admin.support import ConsoleHarness
from tests.admin.test_openapi import _routes

BINDING = BindingSettings(binding_id="outreach-main", provider="outreach", org_id="org-1",
                          app_installation_id="app-1", remote_account_id="org-77",
                          base_url="http://127.0.0.1:9")


async def test_the_sync_page_shows_each_stream_and_its_lag(console: ConsoleHarness) -> None:
    _, documents = load_definitions()
    catalog = build_catalog(1, documents, (BINDING,), load_object_binding_documents())
    console.app = create_app(console.replica, combine(sync_extensions(catalog)))
    viewer, _ = await console.sign_in("viv")
    empty = await viewer.get("/admin/sync")
    assert empty.status_code == 200
    assert "No stream has run yet" in await empty.get_data(as_text=True)
    ran_at_us = int((time.time() - 100) * 1_000_000)

    async def seed(tx: SqlTx) -> None:
        state = await read_stream(tx, "outreach-main:prospect", "outreach-main", "prospect")
        await write_stream(tx, state, cursor=Cursor(updated_ns=1, updated_at=
                                                    "2026-06-01T00:00:00.000Z",
                                                    record_id="42"),
                           runs=3, last_run_at_us=ran_at_us, now_us=ran_at_us)

    await console.store.db.transact(seed, name="test.seed")
    doc = await (await viewer.get("/admin/api/sync")).get_json()
    (stream,) = doc["streams"]
    assert (stream["stream"], stream["runs"], stream["cursor_id"]) == (
        "outreach-main:prospect", 3, "42")
    # Complete through the last run less the 30 s safety lag: about 130 s behind.
    assert 129 <= stream["lag_seconds"] < 190
    # `integrationd reconcile status` gives the same lag as the page (it gave the age of
    # the newest record seen: months, for this stream).
    from admin_ui.sync import stream_json
    from daemon.reconcile_cli import _safety_lag, _stream_json

    async def read(tx: SqlTx) -> StreamState:
        return await read_stream(tx, "outreach-main:prospect", "outreach-main", "prospect")

    state = await console.store.db.transact(read, name="test.read", write=False)
    now_s = time.time()
    cli = _stream_json(state, int(now_s * 1e9), _safety_lag(catalog, state))
    assert cli["lag_seconds"] == stream_json(catalog, state, now_s)["lag_seconds"]
    assert cli["cursor_age_seconds"] > 86_400
    html = await (await viewer.get("/admin/sync")).get_data(as_text=True)
    assert "outreach-main:prospect" in html and "2026-06-01T00:00:00.000Z / 42" in html
    assert 'href="/admin/sync"' in html  # in the navigation
    documented = (await (await viewer.get("/admin/api/openapi.json")).get_json())["paths"]
    assert "/admin/api/sync" in documented
    assert ("/admin/api/sync", "get") in _routes(console)
    assert (await console.client().get("/admin/api/sync")).status_code == 401

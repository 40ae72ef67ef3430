"""The console's Sync page: every cursor reconciliation stream, how far it is behind.

Plugged in through :class:`admin_ui.extensions.ConsoleExtensions` (the composition root
adds it beside the effect pages). Read-only: a stream's runs are started and repaired with
``integrationd reconcile`` (audited). Lag here is seconds since the stream was last known
complete: its last run's time less the object binding's safety lag (as the
``integrationd_sync_lag_seconds`` gauge, but from the database, so every replica agrees).
"""

from __future__ import annotations

from typing import Any

from quart import Blueprint
from quart.wrappers import Response

from admin_ui.auth import require
from admin_ui.context import console
from admin_ui.extensions import ConsoleExtensions, NavItem
from admin_ui.render import page
from config.catalog import Catalog
from daemon.core.cursor import sync_lag_seconds
from storage.reconcile import StreamState, list_streams

ACTIONS = {"sync.read": frozenset({"viewer", "operator", "admin"})}


def stream_json(catalog: Catalog, state: StreamState, now_s: float) -> dict[str, Any]:
    binding = catalog.binding(state.binding_id)
    policy = next((o.reconcile for o in catalog.object_bindings
                   if binding is not None and o.provider == binding.provider
                   and o.resource == state.resource), None)
    cursor = state.cursor
    return {
        "stream": state.stream_key, "binding": state.binding_id, "resource": state.resource,
        "runs": state.runs,
        "cursor_updated_at": None if cursor is None else cursor.updated_at,
        "cursor_id": None if cursor is None else cursor.record_id,
        "last_run_at_us": state.last_run_at_us,
        "lag_seconds": sync_lag_seconds(state.last_run_at_us,
                                        None if policy is None else policy.safety_lag_s, now_s),
        "interval_seconds": None if policy is None else policy.interval_s,
    }


def build_blueprint(catalog: Catalog) -> Blueprint:
    bp = Blueprint("sync", __name__)

    async def streams() -> list[dict[str, Any]]:
        states = await console().view.store.db.transact(list_streams, name="console.sync",
                                                         write=False)
        now = console().view.clock.now_us() / 1_000_000
        return [stream_json(catalog, s, now) for s in states]

    @bp.get("/admin/sync")
    @require("sync.read")
    async def sync_page() -> Response:
        return await page("sync.html", streams=await streams())

    @bp.get("/admin/api/sync")
    @require("sync.read")
    async def api_sync() -> dict[str, Any]:
        return {"streams": await streams()}

    return bp


OPENAPI_PATHS: dict[str, dict[str, Any]] = {
    "/admin/api/sync": {"get": {
        "summary": "Cursor reconciliation streams: cursor, runs and sync lag",
        "responses": {"200": {"description": "ok"}, "401": {"description": "sign in"},
                      "403": {"description": "role"},
                      "503": {"description": "database unavailable"}},
    }},
}


def sync_extensions(catalog: Catalog) -> ConsoleExtensions:
    return ConsoleExtensions(blueprints=[build_blueprint(catalog)],
                             nav=[NavItem("/admin/sync", "Sync", "sync.read")],
                             actions=dict(ACTIONS), openapi_paths=OPENAPI_PATHS)

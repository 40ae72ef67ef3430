"""Webhook subscriptions in the console: what the Catalog wants, what the provider has
(the observed ``remote_subscriptions`` rows), and an audited "reconcile now".

``/admin/subscriptions`` (page) and ``/admin/api/subscriptions`` (JSON) list the desired
subscriptions (route, resource, action, URL, secret generation) and every observed row:
provider id, generation, health (active / disabled / missing), secret generation, the
subscriptions being retired, the last reconciliation's age and outcome. A cleanup token
is shown only as "sealed" with its key id. Operators and admins post
``/admin/subscriptions/reconcile`` (CSRF, a reason) to queue one run now; it is audited
as ``subscriptions.reconcile``.
"""

from __future__ import annotations

from typing import Any

from quart import Blueprint, redirect, request
from quart.wrappers import Response
from werkzeug.wrappers import Response as WerkzeugResponse

from admin_ui.auth import current_principal, require
from admin_ui.context import console
from admin_ui.errors import BadInput
from admin_ui.extensions import ConsoleExtensions, NavItem
from admin_ui.filters import reason_from
from admin_ui.render import page
from config.catalog import Catalog
from config.subscription_defs import desired_subscriptions
from daemon.services.subscriptions import NoSuchBinding, reconcile_now, row_json
from storage.port import SqlTx
from storage.subscriptions import SubscriptionRow, read_subscriptions

ACTIONS = {"subscriptions.read": frozenset({"viewer", "operator", "admin"}),
           "subscriptions.reconcile": frozenset({"operator", "admin"})}


async def subscriptions_json(catalog: Catalog) -> dict[str, Any]:
    view = console().view
    routes = view.settings.webhook_routes

    async def body(tx: SqlTx) -> list[SubscriptionRow]:
        return await read_subscriptions(tx)

    rows = await view.store.db.transact(body, name="console.subscriptions", write=False)
    now = view.clock.now_us()
    desired = desired_subscriptions(catalog.webhooks, routes)
    return {
        "desired": [{"name": d.name, "binding_id": d.binding_id, "route": d.route,
                     "resource": d.resource, "action": d.action, "url": d.url,
                     "payload_version": d.payload_version,
                     "secret_generation": d.secret_generation} for d in desired],
        "observed": [row_json(r, now) for r in rows],
        "bindings": sorted({d.binding_id for d in desired}),
        # Routes whose rotation is over (every row on the new secret generation, nothing
        # retiring) but whose previous secret the verifier still accepts.
        "previous_secret_removable": sorted(
            r.route for r in routes if r.previous_secret is not None
            and (mine := [x for x in rows if x.route == r.route])
            and all(x.secret_generation == r.secret_generation and not x.rotating
                    and not x.retiring for x in mine)),
        "health": {h: sum(1 for r in rows if r.health == h)
                   for h in ("active", "disabled", "missing")},
    }


def build_blueprint(catalog: Catalog) -> Blueprint:
    bp = Blueprint("subscriptions", __name__)

    @bp.get("/admin/subscriptions")
    @require("subscriptions.read")
    async def subscriptions_page() -> Response:
        return await page("subscriptions.html", doc=await subscriptions_json(catalog),
                          notice=request.args.get("notice"))

    @bp.get("/admin/api/subscriptions")
    @require("subscriptions.read")
    async def api_subscriptions() -> dict[str, Any]:
        return await subscriptions_json(catalog)

    @bp.post("/admin/subscriptions/reconcile")
    @require("subscriptions.reconcile")
    async def reconcile() -> Response | WerkzeugResponse:
        principal = current_principal()
        assert principal is not None
        form = await request.form
        view = console().view
        try:
            reason = reason_from(form.get("reason"))
            await reconcile_now(view.store, catalog, view.settings.webhook_routes,
                                str(form.get("binding_id", "")), actor=principal.name,
                                role=principal.role, reason=reason,
                                now_us=view.clock.now_us())
        except (BadInput, NoSuchBinding) as exc:
            return await page("subscriptions.html", status=400, error=str(exc),
                              doc=await subscriptions_json(catalog), notice=None)
        return redirect("/admin/subscriptions?notice=reconcile_queued")

    return bp


OPENAPI_PATHS: dict[str, dict[str, Any]] = {
    "/admin/api/subscriptions": {"get": {
        "summary": "Desired and observed webhook subscriptions, with health",
        "responses": {"200": {"description": "ok"}, "401": {"description": "sign in"},
                      "403": {"description": "role"},
                      "503": {"description": "database unavailable"}}}},
}


def subscriptions_extensions(catalog: Catalog) -> ConsoleExtensions:
    return ConsoleExtensions(
        blueprints=[build_blueprint(catalog)],
        nav=[NavItem("/admin/subscriptions", "Subscriptions", "subscriptions.read")],
        actions=dict(ACTIONS),
        openapi_paths=OPENAPI_PATHS,
    )

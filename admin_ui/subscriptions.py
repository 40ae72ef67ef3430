"""Webhook subscriptions in the console: what the Catalog wants, what the provider has
(the observed ``remote_subscriptions`` rows), each binding's last run and each
subscription's last step (state, outcome class and summary, from the durable WorkItems),
and an audited "reconcile now".

``/admin/subscriptions`` (page) and ``/admin/api/subscriptions`` (JSON) list the desired
subscriptions (route, resource, action, URL, secret generation) and every observed row:
provider id, generation, health (active / disabled / missing), secret generation, the
subscriptions being retired, the last reconciliation's age and outcome, and each rotated
route's previous secret (accepted, watching: retires itself after a quiet redelivery
window, or retired). A cleanup token
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
from config.settings import WebhookRoute
from daemon.services.subscription_items import SUBSCRIPTION_FAMILY
from daemon.services.subscription_operator import (
    NoSuchBinding,
    read_status,
    reconcile_now,
    status_json,
)
from storage.port import SqlTx
from storage.secret_retirements import RetirementRow, read_retirements
from storage.subscriptions import LastItem, SubscriptionRow

ACTIONS = {"subscriptions.read": frozenset({"viewer", "operator", "admin"}),
           "subscriptions.reconcile": frozenset({"operator", "admin"})}


async def subscriptions_json(catalog: Catalog) -> dict[str, Any]:
    view = console().view
    routes = view.settings.webhook_routes

    async def body(tx: SqlTx) -> tuple[list[SubscriptionRow], dict[str, LastItem],
                                       list[RetirementRow]]:
        rows, last = await read_status(tx, catalog, routes)
        return rows, last, await read_retirements(tx)

    rows, last, retirements = await view.store.db.transact(
        body, name="console.subscriptions", write=False)
    now = view.clock.now_us()
    states = {(x.route, x.secret_generation): x for x in retirements}

    def done(route: WebhookRoute) -> bool:
        mine = [x for x in rows if x.route == route.route]
        return bool(mine) and all(x.secret_generation == route.secret_generation
                                  and not x.rotating and not x.retiring for x in mine)

    def window(route: WebhookRoute) -> float | None:
        hook = catalog.webhooks.get(route.webhook)
        return None if hook is None else hook.redelivery_window_s()

    def previous(route: WebhookRoute) -> dict[str, Any]:
        x = states.get((route.route, route.secret_generation))
        state = x.state if x is not None else "accepted"
        return {"route": route.route, "secret_generation": route.secret_generation,
                "state": state, "redelivery_window_s": window(route),
                "rotation_complete": done(route),
                "retires_at_earliest_age_s": None if x is None or state != "watching"
                else round((now - x.check_at_us) / 1e6, 1),
                "retired_age_s": None if x is None or x.retired_at_us is None
                else round((now - x.retired_at_us) / 1e6, 1)}
    return {
        **status_json(catalog, routes, rows, last, now),
        # Each route with a previous secret configured: accepted (a rotation not yet
        # over), watching (over: it retires itself after a quiet redelivery window) or
        # retired (the verifier refuses it, whatever the configuration says).
        "previous_secrets": [previous(r) for r in routes if r.previous_secret is not None],
        # Routes whose rotation is over but whose L1 contract declares no redelivery
        # schedule: the previous secret cannot retire itself; an operator removes it.
        "previous_secret_removable": sorted(
            r.route for r in routes if r.previous_secret is not None and done(r)
            and window(r) is None),
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
                                now_us=view.clock.now_us(),
                                max_attempts=view.settings.family(
                                    SUBSCRIPTION_FAMILY).max_attempts)
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

"""Console pages: overview, audit log, operators, and the not-yet-configured features.

Pages are rendered on the server from the same read models as the JSON API;
``static/console.js`` then keeps the overview live by polling
``/admin/overview/live``: its figures, charts (SVG drawn on the server by
:mod:`admin_ui.charts`) and tables, rendered from one read model and swapped
in whole. ``/admin/api/overview`` is the same read model as JSON.
"""

from __future__ import annotations

from quart import Blueprint, redirect, render_template, request
from quart.wrappers import Response
from werkzeug.wrappers import Response as WerkzeugResponse

from admin_ui import queries, readmodels
from admin_ui.api import bindings_with_principals
from admin_ui.auth import require
from admin_ui.charts import fmt_value, overview_charts
from admin_ui.context import console
from admin_ui.errors import BadFilter
from admin_ui.filters import parse_audit_query
from admin_ui.jsonview import json_tokens
from admin_ui.quota import quota_json
from admin_ui.render import page

bp = Blueprint("pages", __name__)
bp.add_app_template_filter(json_tokens, "json_tokens")
# One number format for every figure on the overview (cards, legends, tables).
bp.add_app_template_filter(fmt_value, "num")


@bp.get("/admin")
async def admin_root() -> WerkzeugResponse:
    return redirect("/admin/")


@bp.get("/admin/")
@require("console.read")
async def overview() -> Response:
    view = console().view
    doc = await readmodels.overview(view)
    poll_ms = int(max(0.5, min(view.settings.work.depth_sample_interval, 10.0)) * 1000)
    return await page("overview.html", doc=doc, poll_ms=poll_ms,
                      charts=overview_charts(doc), db_down=doc["database"] != "ok")


@bp.get("/admin/overview/live")
@require("console.read")
async def overview_live() -> Response:
    """The overview's live part (figures, charts, tables) as an HTML fragment, rendered
    from one read model: the page polls it and swaps it in whole."""
    doc = await readmodels.overview(console().view)
    html = await render_template("overview_live.html", doc=doc, charts=overview_charts(doc))
    return Response(html, content_type="text/html; charset=utf-8")


@bp.get("/admin/audit")
@require("audit.read")
async def audit() -> Response:
    try:
        target, limit = parse_audit_query(request.args.items(multi=True))
    except BadFilter as exc:
        return await page("audit.html", status=400, error=exc.message, entries=[],
                          target=None, limit=100)
    doc = await queries.audit_page(console().view, target, limit)
    return await page("audit.html", entries=doc["entries"], target=target, limit=limit)


@bp.get("/admin/operators")
@require("operators.read")
async def operators() -> Response:
    settings = console().view.settings
    return await page("operators.html", operators=settings.operators,
                      proxy_header=settings.admin.proxy_user_header,
                      session_ttl=settings.admin.session_ttl)


@bp.get("/admin/bindings")
@require("console.read")
async def bindings() -> Response:
    return await page("bindings.html", doc=await bindings_with_principals(console().view))


@bp.get("/admin/quota")
@require("console.read")
async def quota() -> Response:
    view = console().view
    return await page("quota.html", doc=await quota_json(view.store, view.clock.now_us(),
                                                         view.settings))

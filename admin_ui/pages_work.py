"""Work item and DLQ pages, with the replay, cancel and bulk-replay forms.

Forms post back to these routes with the session's CSRF token; a success
redirects (post/redirect/get) to the affected item with a fixed notice, a
refusal re-renders the page with the error and its status (400, 403 comes
from the guard, 404, 409). Storage failures fall through to the app's error
handler (a "database unreachable" page, 503).
"""

from __future__ import annotations

from typing import Any

from quart import Blueprint, redirect, request
from quart.wrappers import Response
from werkzeug.wrappers import Response as WerkzeugResponse

from admin_ui import queries
from admin_ui.api import checked_work_id
from admin_ui.auth import CSRF_FIELD, current_principal, require
from admin_ui.context import console
from admin_ui.errors import BadFilter, DatabaseDown, classify
from admin_ui.filters import (
    parse_bulk_replay,
    parse_dead_query,
    parse_work_query,
    reason_from,
    work_query_args,
)
from admin_ui.render import page
from daemon.core.states import WorkState
from storage.port import DeadQuery

bp = Blueprint("work_pages", __name__)


def _states() -> list[str]:
    return [s.value for s in WorkState]


@bp.get("/admin/work")
@require("work.read")
async def work_list() -> Response:
    view = console().view
    raw = dict(request.args.items())
    try:
        query = parse_work_query(request.args.items(multi=True), view.clock.now_us())
    except BadFilter as exc:
        return await page("work_list.html", status=400, error=exc.message, items=[],
                          filters=raw, next_args=None, states=_states(),
                          families=queries.families(view))
    doc = await queries.work_page(view, query)
    next_args = None
    if doc["next_after"]:
        next_args = {**work_query_args(query), "after": doc["next_after"],
                     "limit": str(query.limit)}
    return await page("work_list.html", items=doc["items"], filters=raw, next_args=next_args,
                      states=_states(), families=queries.families(view))


async def _detail(work_id: str, status: int = 200, error: str | None = None) -> Response:
    c = console()
    doc = await queries.work_detail(c.view, work_id, c.extensions.lineage)
    return await page("work_detail.html", status=status, error=error, doc=doc,
                      item=doc["item"])


@bp.get("/admin/work/<work_id>")
@require("work.read")
async def work_detail(work_id: str) -> Response:
    return await _detail(checked_work_id(work_id))


async def _refused(work_id: str, exc: Exception) -> Response:
    """Re-render the item with a refusal the operator can act on; re-raise anything else
    (storage failures go to the app's "database unreachable" page, bugs stay bugs)."""
    err = classify(exc)
    if err is None or isinstance(err, DatabaseDown):
        raise exc
    return await _detail(work_id, err.status, err.message)


@bp.post("/admin/work/<work_id>/replay")
@require("work.replay")
async def work_replay(work_id: str) -> Response | WerkzeugResponse:
    work_id = checked_work_id(work_id)
    principal = current_principal()
    assert principal is not None
    form = await request.form
    try:
        new = await console().ops.replay_item(
            work_id=work_id, actor=principal.name, reason=reason_from(form.get("reason"))
        )
    except Exception as exc:
        return await _refused(work_id, exc)
    return redirect(f"/admin/work/{new.work_id}?notice=replayed")


@bp.post("/admin/work/<work_id>/cancel")
@require("work.cancel")
async def work_cancel(work_id: str) -> Response | WerkzeugResponse:
    work_id = checked_work_id(work_id)
    principal = current_principal()
    assert principal is not None
    form = await request.form
    try:
        result = await console().ops.cancel_item(
            work_id=work_id, actor=principal.name, reason=reason_from(form.get("reason"))
        )
    except Exception as exc:
        return await _refused(work_id, exc)
    notice = "cancelled" if result.disposition == "cancelled" else "cancel_requested"
    return redirect(f"/admin/work/{work_id}?notice={notice}")


async def _dlq(query: DeadQuery, raw: dict[str, Any], status: int = 200,
               error: str | None = None) -> Response:
    view = console().view
    doc = await queries.dlq_page(view, query)
    next_args = None
    if doc["next_after"]:
        next_args = {k: v for k, v in raw.items() if k != "after" and v}
        next_args["after"] = doc["next_after"]
    return await page("dlq.html", status=status, error=error, doc=doc, filters=raw,
                      next_args=next_args, families=queries.families(view))


@bp.get("/admin/dlq")
@require("dlq.read")
async def dlq() -> Response:
    raw = dict(request.args.items())
    try:
        query = parse_dead_query(request.args.items(multi=True))
    except BadFilter as exc:
        return await _dlq(DeadQuery(), {}, 400, exc.message)
    return await _dlq(query, raw)


@bp.post("/admin/dlq/replay")
@require("dlq.replay")
async def dlq_replay() -> Response:
    principal = current_principal()
    assert principal is not None
    form = {k: v for k, v in (await request.form).items() if k != CSRF_FIELD}
    try:
        bulk = parse_bulk_replay(form)
    except Exception as exc:
        err = classify(exc)
        if err is None or isinstance(err, DatabaseDown):
            raise
        return await _dlq(DeadQuery(), {}, err.status, err.message)
    report = await console().ops.bulk_replay(bulk, actor=principal.name)
    return await page("dlq_result.html", report=report.to_json())


"""The console's JSON API under ``/admin/api/`` (the pages poll it; scripts may too).

Same sessions and roles as the pages; every state-changing call needs the
session's CSRF token in the ``X-CSRF-Token`` header and a JSON body. Errors
are ``{"error": code, "message": text}`` with a stable code. The document at
``/admin/api/openapi.json`` describes every route (a test keeps them equal).
"""

from __future__ import annotations

from typing import Any

import attrs
from quart import Blueprint, request

from admin_ui import openapi, queries, readmodels
from admin_ui.auth import CSRF_HEADER, current_principal, may, require
from admin_ui.context import console
from admin_ui.errors import BadInput, UnsupportedMediaType
from admin_ui.filters import (
    parse_audit_query,
    parse_bulk_replay,
    parse_dead_query,
    parse_work_query,
    reason_from,
)
from admin_ui.find_openapi import FIND_PATHS
from admin_ui.principals import connected_bindings, principal_facts
from admin_ui.quota import quota_json
from admin_ui.serialize import cancel_json, work_json
from daemon.core.ids import is_ulid
from daemon.core.json_input import BadJson, parse_json
from daemon.core.principals import config_drift
from daemon.services.principal_bootstrap import bootstrap_facts
from storage.port import WorkNotFound

bp = Blueprint("api", __name__, url_prefix="/admin/api")

Json = dict[str, Any]

def checked_work_id(work_id: str) -> str:
    if not is_ulid(work_id):
        raise WorkNotFound(work_id[:40])
    return work_id


async def json_body() -> dict[str, Any]:
    if request.mimetype != "application/json":
        raise UnsupportedMediaType("send a JSON object with Content-Type: application/json")
    raw = await request.get_data(as_text=False)
    assert isinstance(raw, bytes)
    try:
        doc = parse_json(raw or b"{}")
    except BadJson as exc:
        raise BadInput(exc.message) from None
    if not isinstance(doc, dict):
        raise BadInput("the body must be a JSON object")
    return doc


@bp.get("/openapi.json")
async def openapi_document() -> Json:
    return openapi.document({**FIND_PATHS, **console().extensions.openapi_paths})


@bp.get("/session")
@require("console.read")
async def session() -> Json:
    c = console()
    principal = current_principal()
    assert principal is not None
    return {
        "operator": principal.name,
        "role": principal.role,
        "auth": c.view.settings.admin.auth,
        "csrf_header": CSRF_HEADER,
        "csrf_token": principal.csrf_token,
        "expires_in_s": round(c.codec.remaining_s(principal.session)),
        "may": {action: may(action) for action in sorted(c.actions)},
    }


@bp.get("/overview")
@require("console.read")
async def overview() -> Json:
    return await readmodels.overview(console().view)


@bp.get("/replicas")
@require("console.read")
async def replicas() -> Json:
    return {"replicas": await readmodels.replicas(console().view)}


@bp.get("/work")
@require("work.read")
async def work_list() -> Json:
    query = parse_work_query(request.args.items(multi=True), console().view.clock.now_us())
    return await queries.work_page(console().view, query)


@bp.get("/work/<work_id>")
@require("work.read")
async def work_detail(work_id: str) -> Json:
    c = console()
    return await queries.work_detail(c.view, checked_work_id(work_id), c.extensions.lineage)


@bp.post("/work/<work_id>/replay")
@require("work.replay")
async def work_replay(work_id: str) -> Json:
    body = await json_body()
    principal = current_principal()
    assert principal is not None
    new = await console().ops.replay_item(
        work_id=checked_work_id(work_id), actor=principal.name,
        reason=reason_from(body.get("reason")),
    )
    return {"replayed_from": work_id, "item": work_json(new)}


@bp.post("/work/<work_id>/cancel")
@require("work.cancel")
async def work_cancel(work_id: str) -> Json:
    body = await json_body()
    principal = current_principal()
    assert principal is not None
    result = await console().ops.cancel_item(
        work_id=checked_work_id(work_id), actor=principal.name,
        reason=reason_from(body.get("reason")),
    )
    return cancel_json(result)


@bp.get("/dlq")
@require("dlq.read")
async def dlq() -> Json:
    query = parse_dead_query(request.args.items(multi=True))
    return await queries.dlq_page(console().view, query)


@bp.post("/dlq/replay")
@require("dlq.replay")
async def dlq_replay() -> Json:
    principal = current_principal()
    assert principal is not None
    bulk = parse_bulk_replay(await json_body())
    report = await console().ops.bulk_replay(bulk, actor=principal.name)
    return report.to_json()


@bp.get("/audit")
@require("audit.read")
async def audit() -> Json:
    target, limit = parse_audit_query(request.args.items(multi=True))
    return await queries.audit_page(console().view, target, limit)


@bp.get("/operators")
@require("operators.read")
async def operators() -> Json:
    settings = console().view.settings
    return {
        "auth": settings.admin.auth,
        "operators": [{"name": o.name, "role": o.role, "password_set": bool(o.password_hash)}
                      for o in settings.operators],
    }


def bindings_json(settings: Any) -> Json:
    """The L2 bindings this replica serves: generations, never token values."""
    return {
        "configured": bool(settings.bindings),
        "catalog_revision": settings.catalog.revision,
        "items": [
            {"binding_id": b.binding_id, "provider": b.provider, "org_id": b.org_id,
             "app_installation_id": b.app_installation_id,
             "remote_account_id": b.remote_account_id, "base_url": b.base_url,
             # The TOML's generation only bootstraps the durable one ("durable" below).
             "generation": b.generation, "auth": b.auth,
             "token": "set" if b.token else "missing"}
            for b in settings.bindings
        ],
    }


async def bindings_with_principals(view: Any) -> Json:
    """The configured bindings, each with its durable generation and state and its grant's
    state, token version and last refresh (never a secret)."""
    doc = bindings_json(view.settings)
    now_us = view.clock.now_us()
    facts = await principal_facts(view.store, [b["binding_id"] for b in doc["items"]], now_us)
    durable = await view.store.binding_get_many([b["binding_id"] for b in doc["items"]])
    for item, b in zip(doc["items"], view.settings.bindings, strict=True):
        item.update(facts[item["binding_id"]])
        # Where the TOML disagrees with the durable fact, which wins (docs/identity.md).
        now = durable.get(b.binding_id)
        item["drift"] = [] if now is None else [
            attrs.asdict(d) for d in config_drift(bootstrap_facts(b), now)]
    doc["connected"] = await connected_bindings(view.store,
                                                {b["binding_id"] for b in doc["items"]},
                                                now_us)
    return doc


@bp.get("/bindings")
@require("console.read")
async def bindings() -> Json:
    return await bindings_with_principals(console().view)


@bp.get("/quota")
@require("console.read")
async def quota() -> Json:
    view = console().view
    return await quota_json(view.store, view.clock.now_us(), view.settings)

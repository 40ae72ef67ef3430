"""Webhook ingress in the console: receipts, quarantined events with their reasons, and this
replica's spool.

Theory of operation
-------------------
Plugged in through :class:`admin_ui.extensions.ConsoleExtensions` (the CLI composes it with
the effect journal's): ``/admin/ingress`` (page) and ``/admin/api/ingress`` (the same read
model as JSON) list the newest receipts (filter by state), the counts per state, and the
spool of *this* replica (depth, oldest spooled receipt: read from its metrics, as the spool
is local to the replica's disk). ``/admin/ingress/<receipt_id>`` shows one receipt with
its events and WorkItems. A work item's page gets an "Ingress receipts" lineage section.
Nothing shown carries a body, a signature or a secret: a receipt is described by its
route, size, digest and safe headers.
"""

from __future__ import annotations

import datetime
from typing import Any

from quart import Blueprint, request
from quart.wrappers import Response

from admin_ui.auth import require
from admin_ui.context import console
from admin_ui.errors import BadFilter, NotFound
from admin_ui.extensions import ConsoleExtensions, LineageRow, LineageSection, NavItem
from admin_ui.render import page
from admin_ui.view import ReplicaView
from daemon.core.inbound_change import INBOUND_APPLY_FAMILY, InboundChange
from daemon.core.ingress import QUARANTINE_SENTENCES, UNSETTLED_SENTENCES
from daemon.core.work import WorkItem
from storage.ingress.receipts import STATES, IngressReceipt, ReceiptQuery

ACTIONS = {"ingress.read": frozenset({"viewer", "operator", "admin"})}


def _fmt_us(us: int | None) -> str | None:
    if us is None:
        return None
    return datetime.datetime.fromtimestamp(us / 1e6, datetime.UTC).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


def receipt_json(r: IngressReceipt) -> dict[str, Any]:
    return {
        "receipt_id": r.receipt_id, "route": r.route, "binding_id": r.binding_id,
        "webhook": r.webhook, "subscription_generation": r.subscription_generation,
        "received_at": _fmt_us(r.received_at_us), "state": r.state, "via": r.via,
        "replica_id": r.replica_id, "bytes": len(r.body), "body_sha256": r.body_sha256,
        "verification": r.verification, "duplicates": r.duplicates,
        "duplicate_events": r.duplicate_events,
        "headers": {k: v for k, v in sorted(r.headers.items())},
        "quarantine_reason": r.quarantine_reason, "quarantine_detail": r.quarantine_detail,
        "settled_at": _fmt_us(r.settled_at_us),
    }


def spool_json(view: ReplicaView) -> dict[str, Any]:
    samples = {s.name: s.value for s in view.counter_samples("integrationd_ingress_spool")}
    oldest = samples.get("integrationd_ingress_spool_oldest_received_seconds", 0.0)
    return {
        "replica_id": view.replica_id,
        "depth": int(samples.get("integrationd_ingress_spool_depth", 0)),
        "oldest_received": _fmt_us(int(oldest * 1e6)) if oldest else None,
        "forwarded_total": int(samples.get("integrationd_ingress_spool_forwarded_total", 0)),
        "dir": view.settings.ingress.spool_dir,
    }


def settlement_json(view: ReplicaView, quarantined: dict[str, int]) -> dict[str, Any]:
    """Why receipts are not settled: this replica's materializer's latest pass (receipts it
    left ``received``, by why) and every quarantined receipt by its stable reason."""
    samples = view.counter_samples("integrationd_ingress_unsettled")
    unsettled = [{"reason": s.labels.get("reason", ""), "receipts": int(s.value),
                  "sentence": UNSETTLED_SENTENCES.get(s.labels.get("reason", ""), "")}
                 for s in samples if s.value]
    return {"replica_id": view.replica_id, "unsettled": unsettled,
            "quarantined": [{"reason": reason, "receipts": count,
                             "sentence": QUARANTINE_SENTENCES.get(reason, "")}
                            for reason, count in sorted(quarantined.items())]}


async def ingress_json(view: ReplicaView, state: str | None, limit: int = 50
                       ) -> dict[str, Any]:
    if state is not None and state not in STATES:
        raise BadFilter(f"state: expected one of {', '.join(STATES)}")
    counts = await view.store.ingress_counts()
    receipts = await view.store.ingress_receipt_list(ReceiptQuery(state=state, limit=limit))
    return {
        "configured": bool(view.settings.webhook_routes),
        "routes": [{"route": r.route, "binding_id": r.binding_id, "webhook": r.webhook,
                    "subscription_generation": r.subscription_generation,
                    "secrets": len(r.secrets())} for r in view.settings.webhook_routes],
        # Each state's count stops at counted_up_to ("more" names the states past it);
        # duplicates and quarantine reasons are of the newest receipts when sampled.
        "counts": counts.by_state, "duplicates": counts.duplicates,
        "more": sorted(counts.more), "counted_up_to": counts.counted_up_to,
        "count_text": {s: counts.count(s).text() for s in STATES},
        "duplicates_of_newest": counts.sample if counts.sampled else None,
        "reasons_of_newest": counts.sample if counts.reasons_sampled else None,
        "oldest_waiting": _fmt_us(counts.oldest_received_us),
        "spool": spool_json(view), "state": state,
        "settlement": settlement_json(view, counts.quarantined_by_reason),
        "items": [receipt_json(r) for r in receipts],
    }


async def receipt_detail(view: ReplicaView, receipt_id: str) -> dict[str, Any]:
    receipt = await view.store.ingress_receipt_get(receipt_id[:40])
    if receipt is None:
        raise NotFound(f"no ingress receipt {receipt_id[:40]}")
    events = await view.store.ingress_events_of(receipt.receipt_id)
    return {**receipt_json(receipt), "events": [
        {"event_id": e.event_id, "event_name": e.event_name, "kind": e.kind,
         "resource_type": e.resource_type, "resource_id": e.resource_id,
         "delivered_at": e.delivered_at, "remote_updated_at": e.remote_updated_at,
         "attributes": sorted(e.attributes), "work_id": e.work_id} for e in events]}


async def receipt_section(view: ReplicaView, item: WorkItem) -> LineageSection | None:
    """An inbound_apply item's event and receipt (attribute names only, never values)."""
    if item.family != INBOUND_APPLY_FAMILY:
        return None
    try:
        change = InboundChange.from_payload(item.payload)
    except ValueError:
        return None
    if change.origin != "webhook":
        return None
    receipt_id = change.origin_id.split(":")[0]
    receipt = await view.store.ingress_receipt_get(receipt_id)
    if receipt is None:
        return LineageSection("receipts", "Ingress receipts", (),
                              "the receipt is past its retention")
    return LineageSection("receipts", "Ingress receipts", (
        LineageRow("receipt", receipt.receipt_id, f"/admin/ingress/{receipt.receipt_id}"),
        LineageRow("event", change.origin_id),
        LineageRow("route", receipt.route),
        LineageRow("received", _fmt_us(receipt.received_at_us) or ""),
        LineageRow("via", receipt.via),
        LineageRow("changed attributes", ", ".join(sorted(change.attributes)) or "none"),
    ))


def build_blueprint() -> Blueprint:
    bp = Blueprint("ingress", __name__)

    def _state() -> str | None:
        return request.args.get("state") or None

    @bp.get("/admin/ingress")
    @require("ingress.read")
    async def ingress_page() -> Response:
        try:
            doc = await ingress_json(console().view, _state())
        except BadFilter as exc:
            return await page("ingress.html", status=400, error=exc.message, doc=None)
        return await page("ingress.html", doc=doc, states=STATES)

    @bp.get("/admin/ingress/<receipt_id>")
    @require("ingress.read")
    async def receipt_page(receipt_id: str) -> Response:
        return await page("ingress_receipt.html",
                          r=await receipt_detail(console().view, receipt_id))

    @bp.get("/admin/api/ingress")
    @require("ingress.read")
    async def api_ingress() -> dict[str, Any]:
        return await ingress_json(console().view, _state())

    @bp.get("/admin/api/ingress/<receipt_id>")
    @require("ingress.read")
    async def api_receipt(receipt_id: str) -> dict[str, Any]:
        return await receipt_detail(console().view, receipt_id)

    return bp


def _get(summary: str, param: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"summary": summary, "responses": {
        "200": {"description": "ok"}, "400": {"description": "bad filter"},
        "401": {"description": "sign in"}, "403": {"description": "role"},
        "404": {"description": "not found"}, "503": {"description": "database unavailable"}}}
    if param:
        spec["parameters"] = [{"name": param, "in": "path", "required": True,
                               "schema": {"type": "string"}}]
    else:
        spec["parameters"] = [{"name": "state", "in": "query", "required": False,
                               "schema": {"type": "string", "enum": list(STATES)}}]
    return {"get": spec}


OPENAPI_PATHS: dict[str, dict[str, Any]] = {
    "/admin/api/ingress": _get("Webhook receipts (newest first), counts per state and this"
                               " replica's spool"),
    "/admin/api/ingress/{receipt_id}": _get("One receipt with its events and WorkItems",
                                            "receipt_id"),
}


def ingress_extensions() -> ConsoleExtensions:
    return ConsoleExtensions(
        lineage=[receipt_section],
        blueprints=[build_blueprint()],
        nav=[NavItem("/admin/ingress", "Ingress", "ingress.read")],
        actions=dict(ACTIONS),
        openapi_paths=OPENAPI_PATHS,
    )

"""The control API under ``/_sim/``: drive the Outreach simulator from another process.

No auth (the server binds loopback by default), no journal, no faults: control requests
are the test's hands, not traffic the provider would see.

    POST   /_sim/prospects            {"id"?: 7, "attributes": {...}, "notify"?: false}
    GET    /_sim/prospects/{id}       the stored resource
    POST   /_sim/prospects/{id}       {"attributes": {...}, "updatedAt"?: "...", "notify"?: true}
                                      a change made inside Outreach (sends prospect.updated)
    DELETE /_sim/prospects/{id}       destroy it (sends prospect.destroyed unless ?notify=0)
    POST   /_sim/bulk_update          {"ids": [...], "attributes": {...}, "updatedAt": "...",
                                       "notify"?: true}   many Prospects, one updatedAt
    POST   /_sim/tokens               {"token": "..."}   accept another bearer token
    DELETE /_sim/tokens               {"token": "..."}   stop accepting it
    GET    /_sim/webhooks             subscriptions (no secrets, no cleanup tokens)
    DELETE /_sim/webhooks/{id}        an admin deletes it behind the client's back
    POST   /_sim/webhooks/{id}        {"active": false}  disable / enable it
    POST   /_sim/drop                 {"count": N}       lose the next N deliveries
    GET    /_sim/deliveries           the delivery journal; ?since=SEQ
    POST   /_sim/faults               Fault fields (hubspot_sim's Fault; path_prefix
                                      defaults to /api/v2/)
    GET    /_sim/faults, DELETE /_sim/faults
    GET    /_sim/requests             the request journal; ?since=SEQ
    POST   /_sim/reset
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import attrs

from sandbox.h11_server import Request, Response
from sandbox.hubspot_sim.model import Fault

if TYPE_CHECKING:
    from sandbox.outreach_sim.simulator import OutreachSimulator


def _json(status: int, doc: object) -> Response:
    return Response(status, json.dumps(doc, separators=(",", ":")).encode(),
                    (("content-type", "application/json"),))


def _error(status: int, message: str) -> Response:
    return _json(status, {"error": message})


def handle_control(sim: OutreachSimulator, request: Request) -> Response:
    """Route one control request; every answer is JSON; a bad one is a 400 naming why."""
    if request.body_too_large:
        return _error(413, "control request body too large")
    try:
        return _route(sim, request)
    except _Bad as exc:
        return _error(400, str(exc))
    except KeyError as exc:
        return _error(404, f"unknown {exc.args[0]}")
    except ValueError as exc:
        return _error(400, str(exc))


class _Bad(Exception):
    pass


def _body(request: Request) -> dict[str, Any]:
    try:
        doc = json.loads(request.body or b"{}")
    except (ValueError, RecursionError):
        raise _Bad("body is not valid JSON") from None
    if not isinstance(doc, dict):
        raise _Bad("body must be a JSON object")
    return doc


def _int_id(text: str, what: str) -> int:
    if not text.isdigit():
        raise _Bad(f"{what} id must be a positive integer")
    return int(text)


def _since(request: Request) -> int:
    for part in request.query.split("&"):
        name, _, value = part.partition("=")
        if name == "since":
            if not value.isdigit():
                raise _Bad("since must be a non-negative integer")
            return int(value)
    return 0


def _route(sim: OutreachSimulator, request: Request) -> Response:
    path, method = request.path, request.method
    if path == "/_sim/prospects" and method == "POST":
        doc = _body(request)
        prospect_id = doc.get("id")
        if prospect_id is not None and (not isinstance(prospect_id, int)
                                        or isinstance(prospect_id, bool)):
            raise _Bad("id must be an integer")
        prospect = sim.put_prospect(doc.get("attributes", {}), prospect_id=prospect_id,
                                    notify=bool(doc.get("notify", False)))
        return _json(200, prospect.to_resource())
    if path.startswith("/_sim/prospects/"):
        prospect_id = _int_id(path.rsplit("/", 1)[1], "prospect")
        if method == "GET":
            found = sim.prospect(prospect_id)
            return _error(404, "unknown prospect") if found is None else _json(200, found)
        if method == "POST":
            doc = _body(request)
            prospect = sim.update_prospect(prospect_id, doc.get("attributes", {}),
                                           updated_at=doc.get("updatedAt"),
                                           notify=bool(doc.get("notify", True)))
            return _json(200, prospect.to_resource())
        if method == "DELETE":
            if sim.prospect(prospect_id) is None:
                raise KeyError(f"prospect {prospect_id}")
            sim.destroy_prospect(prospect_id, notify="notify=0" not in request.query)
            return _json(200, {"destroyed": prospect_id})
    if path == "/_sim/bulk_update" and method == "POST":
        doc = _body(request)
        ids = doc.get("ids")
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            raise _Bad("ids must be a list of integers")
        updated_at = doc.get("updatedAt")
        if not isinstance(updated_at, str):
            raise _Bad("updatedAt must be an ISO 8601 UTC timestamp")
        count = sim.bulk_update(ids, doc.get("attributes", {}), updated_at=updated_at,
                                notify=bool(doc.get("notify", True)))
        return _json(200, {"updated": count})
    if path == "/_sim/tokens" and method in ("POST", "DELETE"):
        token = _body(request).get("token")
        if not isinstance(token, str) or not token:
            raise _Bad("token must be a non-empty string")
        if method == "POST":
            sim.tokens.add(token)
        else:
            sim.tokens.discard(token)
        return _json(200, {"tokens": len(sim.tokens)})
    if path == "/_sim/webhooks" and method == "GET":
        return _json(200, {"webhooks": [s.to_resource() for s in sim.subscriptions()]})
    if path.startswith("/_sim/webhooks/"):
        webhook_id = _int_id(path.rsplit("/", 1)[1], "webhook")
        if webhook_id not in {s.id for s in sim.subscriptions()}:
            raise KeyError(f"webhook {webhook_id}")
        if method == "DELETE":
            sim.delete_subscription_behind_back(webhook_id)
            return _json(200, {"deleted": webhook_id})
        if method == "POST":
            active = _body(request).get("active")
            if not isinstance(active, bool):
                raise _Bad("active must be true or false")
            sim.set_subscription_active(webhook_id, active)
            return _json(200, {"id": webhook_id, "active": active})
    if path == "/_sim/drop" and method == "POST":
        drop = _body(request).get("count")
        if not isinstance(drop, int) or isinstance(drop, bool):
            raise _Bad("count must be an integer")
        sim.drop_deliveries(drop)
        return _json(200, {"dropping": drop})
    if path == "/_sim/deliveries" and method == "GET":
        return _json(200, {"deliveries": [d.to_json() for d in sim.deliveries[_since(request):]]})
    if path == "/_sim/requests" and method == "GET":
        return _json(200, {"requests": [r.to_json() for r in sim.requests[_since(request):]]})
    if path == "/_sim/faults":
        if method == "POST":
            doc = _body(request)
            doc.setdefault("path_prefix", "/api/v2/")
            fault = Fault.from_json(doc)
            sim.inject(fault)
            return _json(201, {"armed": attrs.asdict(fault)})
        if method == "GET":
            return _json(200, {"faults": [{**attrs.asdict(f), "remaining": n}
                                          for f, n in sim.pending_faults()]})
        if method == "DELETE":
            return _json(200, {"cleared": sim.clear_faults()})
    if path == "/_sim/reset" and method == "POST":
        sim.reset()
        return _json(200, {"reset": True})
    return _error(404, "no such control route")


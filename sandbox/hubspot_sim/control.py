"""The control API under ``/_sim/``: drive the simulator from another process.

No auth (the server binds loopback by default), no journal, no faults: control
requests are the test's hands, not traffic the provider would see.

    POST   /_sim/contacts        {"id": "123", "properties": {...}}  seed/overwrite
    GET    /_sim/contacts/{id}   raw state plus "patches_applied"
    POST   /_sim/faults          Fault fields as JSON                 arm a fault
    GET    /_sim/faults          armed faults with "remaining"
    DELETE /_sim/faults          disarm all
    GET    /_sim/requests        the journal; ?since=SEQ for records after SEQ
    POST   /_sim/reset           forget contacts, faults, journal
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import attrs

from sandbox.h11_server import Request, Response
from sandbox.hubspot_sim.model import Fault, parse_properties
from sandbox.hubspot_sim.responses import error_response, json_response

if TYPE_CHECKING:
    from sandbox.hubspot_sim.simulator import HubSpotSimulator

_CONTACTS = "/_sim/contacts"


def handle_control(sim: HubSpotSimulator, request: Request) -> Response:
    """Route one control request; every answer is JSON."""
    if request.body_too_large:
        return error_response(413, "control request body too large")
    path, method = request.path, request.method
    if path == _CONTACTS:
        return _put_contact(sim, request) if method == "POST" else _not_allowed("POST")
    if path.startswith(_CONTACTS + "/"):
        if method != "GET":
            return _not_allowed("GET")
        state = sim.contact(path[len(_CONTACTS) + 1 :])
        return error_response(404, "unknown contact") if state is None else json_response(
            200, state
        )
    if path == "/_sim/faults":
        if method == "POST":
            return _arm_fault(sim, request)
        if method == "GET":
            return json_response(200, {"faults": [
                {**attrs.asdict(fault), "remaining": remaining}
                for fault, remaining in sim.pending_faults()
            ]})
        if method == "DELETE":
            return json_response(200, {"cleared": sim.clear_faults()})
        return _not_allowed("GET, POST, DELETE")
    if path == "/_sim/requests":
        return _journal(sim, request) if method == "GET" else _not_allowed("GET")
    if path == "/_sim/reset":
        if method != "POST":
            return _not_allowed("POST")
        sim.reset()
        return json_response(200, {"reset": True})
    return error_response(404, "no such control route")


def _body(request: Request) -> Any | Response:
    try:
        return json.loads(request.body)
    except (ValueError, RecursionError):
        return error_response(400, "body is not valid JSON")


def _put_contact(sim: HubSpotSimulator, request: Request) -> Response:
    doc = _body(request)
    if isinstance(doc, Response):
        return doc
    if not isinstance(doc, dict):
        return error_response(400, 'body must be {"id": "...", "properties": {...}}')
    contact_id = doc.pop("id", None)
    if not isinstance(contact_id, str):
        return error_response(400, '"id" must be a string')
    try:
        properties = parse_properties(doc if doc else {"properties": {}})
        sim.put_contact(contact_id, properties)
    except ValueError as exc:
        return error_response(400, str(exc))
    state = sim.contact(contact_id)
    return json_response(200, state)


def _arm_fault(sim: HubSpotSimulator, request: Request) -> Response:
    doc = _body(request)
    if isinstance(doc, Response):
        return doc
    try:
        fault = Fault.from_json(doc)
    except ValueError as exc:
        return error_response(400, str(exc))
    sim.inject(fault)
    return json_response(201, {"armed": attrs.asdict(fault)})


def _journal(sim: HubSpotSimulator, request: Request) -> Response:
    since = 0
    for part in request.query.split("&"):
        name, _, value = part.partition("=")
        if name == "since":
            if not value.isdigit():
                return error_response(400, "since must be a non-negative integer")
            since = int(value)
    # seq is the 1-based position in the journal, so "after seq N" is a slice.
    records = sim.requests[since:]
    return json_response(200, {"requests": [record.to_json() for record in records]})


def _not_allowed(allow: str) -> Response:
    return error_response(405, "method not allowed", (("allow", allow),))

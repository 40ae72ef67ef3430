"""The OpenAPI paths of "find anything" (``/admin/api/find/*``, ``/admin/api/search``).

Each parameter's schema is what :mod:`admin_ui.find_filters` accepts (an enum where the
parser takes a fixed set, the page token's id pattern, the integer ranges), so a value
the document forbids is refused with 400, and one it allows but the parser cannot read
(a time in another format) is a documented 400 too.
"""

from __future__ import annotations

from typing import Any

from admin_ui.find_filters import OUTCOMES, SORTS
from admin_ui.openapi import LIMIT, READ_ERRORS, _get, _q
from storage.effect_values import Settlement
from storage.find_rows import RECEIPT_STATUSES
from storage.ingress.receipts import STATES as INGRESS_STATES

Json = dict[str, Any]

_ULID = {"type": "string", "pattern": "^[0-9A-HJKMNP-TV-Z]{26}$"}
_TEXT = {"type": "string", "maxLength": 255}
_NULL_STR = {"type": ["string", "null"]}
_NULL_INT = {"type": ["integer", "null"]}
_PAGE = [
    _q("since", "rows written at or after this time: ISO 8601 (no zone: UTC) or a span"
       " back from now (90s, 15m, 6h, 7d)", {"type": "string", "maxLength": 40}),
    _q("until", "rows written before this time (same forms as since)",
       {"type": "string", "maxLength": 40}),
    _q("after", "page token: the previous page's next_after", _ULID),
    _q("sort", "newest (default) or oldest first", {"type": "string", "enum": list(SORTS)}),
    LIMIT,
]


def _page_of(item: Json) -> Json:
    return {"type": "object", "required": ["items", "next_after"], "properties": {
        "items": {"type": "array", "items": item},
        "next_after": {**_NULL_STR, "description": "the next page's after, or null"},
        "window_ended": {"type": "boolean", "description": (
            "the page stopped after examining the attempts' scan window (a filter on the"
            " operation or binding) before it filled; next_after continues further")}}}


def _list(summary: str, item: Json, params: list[Json]) -> Json:
    return {"get": _get(summary, _page_of(item), params=[*params, *_PAGE],
                        errors=(400, *READ_ERRORS))}


ATTEMPT: Json = {"type": "object", "properties": {
    "attempt_id": {"type": "string"}, "command_id": {"type": "string"},
    "work_id": {"type": "string"}, "operation": {"type": "string"},
    "binding_id": {"type": "string"}, "method": {"type": "string"},
    "target_path": {"type": "string"}, "response_status": _NULL_INT, "outcome": _NULL_STR,
    "failure_class": _NULL_STR, "evidence": _NULL_STR, "disposition": _NULL_STR,
    "unresolved": {"type": "boolean"}, "dispatch_started_at_us": {"type": "integer"},
    "finished_at_us": _NULL_INT}}
COMMAND: Json = {"type": "object", "properties": {
    "command_id": {"type": "string"}, "operation": {"type": "string"},
    "settlement": {"type": "string", "enum": [s.value for s in Settlement]},
    "local_object": {"type": "string"}, "local_id": {"type": "string"},
    "intent_id": {"type": "string"}, "binding_id": {"type": "string"},
    "binding_generation": _NULL_INT, "catalog_revision": {"type": "integer"},
    "remote_id": _NULL_STR, "repair_of": _NULL_STR, "created_at_us": {"type": "integer"}}}
RECEIPT: Json = {"type": "object", "properties": {
    "command_id": {"type": "string"}, "intent_id": {"type": "string"},
    "status": {"type": "string", "enum": list(RECEIPT_STATUSES)},
    "result_format_version": {"type": "integer"}, "remote_id": {"type": "string"},
    "last_error": _NULL_STR, "created_at_us": {"type": "integer"},
    "confirmed_at_us": _NULL_INT}}
MATCH: Json = {"type": "object", "properties": {
    "kind": {"type": "string"}, "id": {"type": "string"}, "summary": {"type": "string"},
    "href": {"type": "string"}}}

FIND_PATHS: dict[str, Json] = {
    "/admin/api/find/attempts": _list(
        "Effect attempts, cluster-wide, filtered", ATTEMPT,
        [_q("outcome", "outcome class, or none (no outcome recorded)",
            {"type": "string", "enum": list(OUTCOMES)}),
         _q("status", "HTTP status", {"type": "integer", "minimum": 100, "maximum": 599}),
         _q("operation", "provider operation", _TEXT), _q("binding", "binding id", _TEXT)]),
    "/admin/api/find/attempts/{attempt_id}": {"get": _get(
        "One attempt: what was sent and, for a failed call, a redacted, bounded excerpt of"
        " the request body and of the answer (allow-listed headers, body)",
        {"type": "object", "properties": {
            "attempt": {**ATTEMPT, "properties": {
                **ATTEMPT["properties"],
                "request_headers": {"type": "array", "items": {"type": "array"}}}},
            "exchange": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {
                "request_body": {"type": "string"},
                "response_headers": {"type": "array", "items": {"type": "array"}},
                "response_body": {"type": "string"}}}]}}},
        params=[{"name": "attempt_id", "in": "path", "required": True,
                 "schema": {"type": "string"}}],
        errors=(404, *READ_ERRORS))},
    "/admin/api/find/commands": _list(
        "Commands, cluster-wide, filtered", COMMAND,
        [_q("settlement", "settlement",
            {"type": "string", "enum": [s.value for s in Settlement]}),
         _q("operation", "provider operation", _TEXT),
         _q("object", "target object", _TEXT), _q("local_id", "target id", _TEXT),
         _q("binding", "binding id", _TEXT),
         _q("generation", "binding generation pinned",
            {"type": "integer", "minimum": 0, "maximum": 2**62}),
         _q("revision", "Catalog revision pinned",
            {"type": "integer", "minimum": 0, "maximum": 2**62})]),
    "/admin/api/find/receipts": _list(
        "Runtime result receipts: pending, refused (pending with a refused delivery),"
        " confirmed", RECEIPT,
        [_q("status", "status", {"type": "string", "enum": list(RECEIPT_STATUSES)})]),
    "/admin/api/find/ingress": _list(
        "Ingress receipts (every one, not only the newest), filtered",
        {"type": "object", "properties": {
            "receipt_id": {"type": "string"}, "route": {"type": "string"},
            "binding_id": {"type": "string"}, "state": {"type": "string"},
            "received_at": _NULL_STR, "bytes": {"type": "integer"}}},
        [_q("state", "state", {"type": "string", "enum": list(INGRESS_STATES)}),
         _q("route", "webhook route", _TEXT), _q("binding", "binding id", _TEXT)]),
    "/admin/api/find/audit": _list(
        "Audit entries, filtered", {"$ref": "#/components/schemas/AuditEntry"},
        [_q("actor", "who", _TEXT), _q("action", "action", _TEXT),
         _q("target", "target id", _TEXT)]),
    "/admin/api/search": {"get": _get(
        "Everything whose id is q (work item, command, attempt, receipt, binding, remote"
        " id, intent id)",
        {"type": "object", "properties": {"q": {"type": "string"},
                                          "matches": {"type": "array", "items": MATCH}}},
        params=[{"name": "q", "in": "query", "required": True,
                 "schema": {"type": "string", "minLength": 1, "maxLength": 255}}],
        errors=(400, *READ_ERRORS))},
}

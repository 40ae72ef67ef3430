"""The OpenAPI 3.1 document of ``/admin/api/`` (served at ``/admin/api/openapi.json``).

Written by hand next to the routes it describes; ``tests/admin/test_openapi.py``
fails when a route is missing from it or it names a route that does not exist.
"""

from __future__ import annotations

import copy
from typing import Any

Json = dict[str, Any]


def _ref(name: str) -> Json:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: Json, description: str = "OK") -> Json:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*statuses: int) -> dict[str, Json]:
    names = {400: "BadRequest", 401: "Unauthenticated", 403: "Forbidden", 404: "NotFound",
             409: "Conflict", 413: "PayloadTooLarge", 415: "UnsupportedMediaType",
             503: "DatabaseUnavailable"}
    return {str(s): {"$ref": f"#/components/responses/{names[s]}"} for s in statuses}


READ_ERRORS = (401, 403, 503)
WRITE_ERRORS = (400, 401, 403, 404, 409, 413, 415, 503)
WRITE_SECURITY: list[Json] = [
    {"sessionCookie": [], "csrfToken": []},
    {"proxyUser": [], "csrfToken": []},
]


def _get(summary: str, schema: Json, *, params: list[Json] | None = None,
         errors: tuple[int, ...] = READ_ERRORS) -> Json:
    op: Json = {"summary": summary, "responses": {"200": _json(schema), **_errors(*errors)}}
    if params:
        op["parameters"] = params
    return op


def _post(summary: str, body: Json, schema: Json) -> Json:
    return {
        "summary": summary,
        "security": WRITE_SECURITY,
        "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
        "responses": {"200": _json(schema), **_errors(*WRITE_ERRORS)},
    }


# An empty query value means "not given" (the console's filter forms send empty fields).
EMPTY: Json = {"type": "string", "maxLength": 0}


def _q(name: str, description: str, schema: Json | None = None) -> Json:
    return {"name": name, "in": "query", "required": False,
            "description": description + ("; empty: the default" if schema else ""),
            "schema": {"anyOf": [schema, EMPTY]} if schema else {"type": "string"}}


WORK_ID = {"name": "work_id", "in": "path", "required": True,
           "schema": {"type": "string", "pattern": "^[0-9A-HJKMNP-TV-Z]{26}$"}}
STATES = ["pending", "processing", "succeeded", "skipped", "retry", "dead", "cancelled",
          "awaiting_legacy_outcome", "reconciled_legacy_terminal", "legacy_outcome_unknown"]
LIMIT = _q("limit", "page size (1..200, default 50)",
           {"type": "integer", "minimum": 1, "maximum": 200})
AFTER = _q("after", "keyset page: items older than this work id")

PATHS: Json = {
    "/admin/api/openapi.json": {"get": {
        "summary": "This document", "security": [],
        "responses": {"200": _json({"type": "object"})}}},
    "/admin/api/session": {"get": _get("The signed-in operator, role, CSRF token",
                                       _ref("Session"))},
    "/admin/api/overview": {"get": _get(
        "Queue pressure, throughput, series per family, the effect path, this replica's"
        " counters, replicas seen",
        _ref("Overview"), errors=(401, 403))},
    "/admin/api/replicas": {"get": _get("Replicas seen in the last hour",
                                        {"type": "object", "properties": {"replicas": {
                                            "type": "array", "items": _ref("Replica")}}})},
    "/admin/api/work": {"get": _get(
        "Work items, newest first", _ref("WorkPage"),
        params=[_q("state", "state", {"type": "string", "enum": STATES}),
                _q("family", "work family"), _q("org", "org id"),
                _q("subject", "subject id"), _q("lane", "source or target lane"),
                _q("since", "created at or after: ISO 8601 (no zone: UTC) or a span back"
                   " from now (90s, 15m, 6h, 7d)", {"type": "string", "maxLength": 40}),
                _q("until", "created before (same forms as since)",
                   {"type": "string", "maxLength": 40}),
                AFTER, LIMIT],
        errors=(400, *READ_ERRORS))},
    "/admin/api/work/{work_id}": {"get": _get(
        "One item: fields, lineage, executions, audit, extension sections",
        _ref("WorkDetail"), params=[WORK_ID], errors=(404, *READ_ERRORS))},
    "/admin/api/work/{work_id}/replay": {"post": {
        **_post("Replay a terminal item as a new item with lineage (409 if already"
                " replayed or not terminal)", _ref("Reason"),
                {"type": "object", "properties": {"replayed_from": {"type": "string"},
                                                  "item": _ref("WorkItem")}}),
        "parameters": [WORK_ID]}},
    "/admin/api/work/{work_id}/cancel": {"post": {
        **_post("Cancel pending/retry work, or ask the claimant of processing work to stop"
                " (audited; 409 if terminal)", _ref("Reason"), _ref("CancelResult")),
        "parameters": [WORK_ID]}},
    "/admin/api/dlq": {"get": _get(
        "Dead items with failure class and summary; failure-class counts (sampled)",
        _ref("DlqPage"),
        params=[_q("family", "work family"), _q("failure_class", "failure class"),
                _q("unreplayed", "only items not yet replayed", {"type": "boolean"}),
                AFTER, LIMIT],
        errors=(400, *READ_ERRORS))},
    "/admin/api/dlq/replay": {"post": _post(
        "Replay up to `limit` not-yet-replayed dead items of one family (and failure class),"
        " each authorized and audited; per-item results", _ref("BulkReplayRequest"),
        _ref("BulkReplayReport"))},
    "/admin/api/audit": {"get": _get(
        "The append-only audit log, newest first",
        {"type": "object", "properties": {"entries": {"type": "array",
                                                      "items": _ref("AuditEntry")}}},
        params=[_q("target", "entries about this target id"),
                _q("limit", "1..1000, default 100", {"type": "integer"})],
        errors=(400, *READ_ERRORS))},
    "/admin/api/operators": {"get": _get("Configured operators and roles (admin only)",
                                         _ref("Operators"))},
    "/admin/api/bindings": {"get": _get("Integration bindings with their durable generation,"
                                        " identity and grant (state, token version, why it"
                                        " needs re-authorization; never a secret)",
                                        _ref("NotConfigured"))},
    "/admin/api/quota": {"get": _get("Provider quota keys: budget, reservations in flight,"
                                     " last 429, and what waits on each (waiting: the"
                                     " longest-waiting held items, oldest_wait_us)",
                                     _ref("NotConfigured"))},
}

_NULL_STR = {"type": ["string", "null"]}
_NULL_INT = {"type": ["integer", "null"]}

SCHEMAS: Json = {
    "Error": {"type": "object", "required": ["error", "message"], "properties": {
        "error": {"type": "string", "description": "stable code, e.g. bad_filter, conflict"},
        "message": {"type": "string"}}},
    "Reason": {"type": "object", "required": ["reason"], "properties": {
        "reason": {"type": "string", "maxLength": 500,
                   "description": "why (kept in the audit log)"}}},
    "Session": {"type": "object", "properties": {
        "operator": {"type": "string"}, "role": {"type": "string",
                                                 "enum": ["viewer", "operator", "admin"]},
        "auth": {"type": "string", "enum": ["password", "proxy"]},
        "csrf_header": {"type": "string"}, "csrf_token": {"type": "string"},
        "expires_in_s": {"type": "integer"},
        "may": {"type": "object", "additionalProperties": {"type": "boolean"}}}},
    "WorkItem": {"type": "object", "description": "A work item without its payload or"
                 " lease token (payload_bytes gives the payload's size)", "properties": {
        "work_id": {"type": "string"}, "family": {"type": "string"},
        "org_id": {"type": "string"}, "app_installation_id": {"type": "string"},
        "subject_kind": {"type": "string"}, "subject_id": {"type": "string"},
        "definition_ref": {"type": "string"}, "catalog_revision": {"type": "integer"},
        "catalog_digest": {"type": "string"}, "payload_schema_version": {"type": "integer"},
        "engine_capability_version": {"type": "integer"}, "queue_class": {"type": "string"},
        "source_lane": _NULL_STR, "source_seq": _NULL_INT, "target_lane": _NULL_STR,
        "state": {"type": "string", "enum": STATES}, "run_after_us": {"type": "integer"},
        "attempt": {"type": "integer"}, "max_attempts": {"type": "integer"},
        "lease_owner": _NULL_STR, "lease_until_us": _NULL_INT,
        "ownership_epoch": {"type": "integer"}, "cancel_requested": {"type": "boolean"},
        "rollback_execution_fence_id": _NULL_STR,
        "legacy_outcome_receipt_version": _NULL_INT,
        "legacy_outcome_receipt_digest": _NULL_STR, "terminal_outcome": _NULL_STR,
        "failure_class": _NULL_STR, "operator_summary": _NULL_STR, "dedupe_key": _NULL_STR,
        "replay_of": _NULL_STR, "replayed_as": _NULL_STR,
        "created_at_us": {"type": "integer"}, "updated_at_us": {"type": "integer"},
        "payload_bytes": {"type": "integer"}}},
    "WorkPage": {"type": "object", "properties": {
        "items": {"type": "array", "items": {"allOf": [_ref("WorkItem"), {
            "type": "object", "properties": {
                "last_attempted_at_us": _NULL_INT, "finished_at_us": _NULL_INT,
                "age_s": {"type": "number"}, "duration_s": {"type": ["number", "null"]},
                "last_error": _NULL_STR}}]}},
        "next_after": _NULL_STR}},
    "Execution": {"type": "object", "properties": {
        "work_id": {"type": "string"}, "ownership_epoch": {"type": "integer"},
        "attempt": {"type": "integer"}, "replica": {"type": "string"},
        "outcome": {"type": "string", "description": "the state its finalization produced,"
                    " lease_lost (its lease expired unfinished and was reclaimed) or deferred"
                    " (given back unstarted until a known time, its attempt refunded)"},
        "finished_at_us": {"type": "integer"},
        "reclaimed_by": {"type": ["string", "null"],
                         "description": "the replica whose claim superseded a lost lease"},
        "reason": {"type": ["string", "null"],
                   "description": "a deferral's reason (quota_wait) or the failure class"}}},
    "AuditEntry": {"type": "object", "properties": {
        "audit_id": {"type": "string"}, "at_us": {"type": "integer"},
        "actor": {"type": "string"}, "role": {"type": "string"},
        "action": {"type": "string"}, "target_kind": {"type": "string"},
        "target_id": {"type": "string"}, "reason": {"type": "string"},
        "before": {}, "after": {},
        "origin": {"type": ["object", "null"],
                   "description": "where the action came from, when recorded: the CLI writes"
                                  " {via: cli, os_user, uid, sudo_user} beside the actor"}}},
    "LineageSection": {"type": "object", "properties": {
        "key": {"type": "string"}, "title": {"type": "string"},
        "rows": {"type": "array", "items": {"type": "object", "properties": {
            "label": {"type": "string"}, "value": {"type": "string"}, "href": _NULL_STR}}},
        "empty_text": {"type": "string"}}},
    "WorkDetail": {"type": "object", "properties": {
        "item": _ref("WorkItem"),
        "hold": {"type": ["string", "null"],
                 "description": "why this build leaves the item for another replica (written"
                                " for a newer engine capability or payload schema), or null"},
        "newer_build": {"type": ["integer", "null"],
                        "description": "the engine capability of the newer build that wrote"
                                       " the item (the page shows what this build knows), or"
                                       " null"},
        "executions": {"type": "array", "items": _ref("Execution")},
        "lineage": {"type": "object", "properties": {
            "replay_of": {"type": ["object", "null"]},
            "replays": {"type": "array", "items": {"type": "object"}},
            "created_by": {"type": "array", "items": _ref("AuditEntry")}}},
        "audit": {"type": "array", "items": _ref("AuditEntry")},
        "sections": {"type": "array", "items": _ref("LineageSection")},
        "can": {"type": "object", "properties": {"replay": {"type": "boolean"},
                                                 "cancel": {"type": "boolean"}}}}},
    "CancelResult": {"type": "object", "properties": {
        "work_id": {"type": "string"},
        "disposition": {"type": "string", "enum": ["cancelled", "requested"]},
        "state": {"type": "string"}}},
    "DlqPage": {"type": "object", "properties": {
        "items": {"type": "array", "items": _ref("WorkItem")}, "next_after": _NULL_STR,
        "classes": {"type": "array", "items": {"type": "object", "properties": {
            "family": {"type": "string"}, "failure_class": _NULL_STR,
            "count": {"type": "integer"}}}},
        "classes_sample": {"type": "integer"}}},
    "BulkReplayRequest": {"type": "object", "required": ["family", "reason"], "properties": {
        "family": {"type": "string"}, "failure_class": {"type": "string"},
        "limit": {"type": "integer", "minimum": 1, "maximum": 200, "default": 50},
        "reason": {"type": "string", "maxLength": 500}}},
    "BulkReplayReport": {"type": "object", "properties": {
        "bulk_id": {"type": "string"}, "family": {"type": "string"},
        "failure_class": _NULL_STR, "selected": {"type": "integer"},
        "complete": {"type": "boolean"}, "replayed": {"type": "integer"},
        "conflicts": {"type": "integer"},
        "audit_id": {"type": ["string", "null"],
                     "description": "the dlq.bulk_replay summary audit entry, or null when"
                                    " none was written (nothing selected, or writing failed)"},
        "items": {"type": "array", "items": {"type": "object", "properties": {
            "work_id": {"type": "string"},
            "outcome": {"type": "string", "enum": ["replayed", "conflict", "refused",
                                                   "error", "unknown", "not_attempted"]},
            "new_work_id": _NULL_STR, "message": {"type": "string"}}}}}},
    "Replica": {"type": "object", "properties": {
        "replica_id": {"type": "string"}, "hostname": {"type": "string"},
        "pid": {"type": "integer"}, "version": {"type": "string"},
        "state": {"type": "string",
                  "enum": ["starting", "running", "draining", "stopped"]},
        "families": {}, "started_at_us": {"type": "integer"},
        "heartbeat_at_us": {"type": "integer"}, "heartbeat_age_s": {"type": "number"},
        "stale": {"type": "boolean"}}},
    "Overview": {"type": "object", "properties": {
        "replica": {"type": "object"},
        "database": {"type": "string", "enum": ["ok", "unreachable"]},
        "now_us": {"type": "integer"}, "sample": {"type": "object"},
        "pressure": {"type": "array", "items": {"type": "object", "properties": {
            "family": {"type": "string"}, "state": {"type": "string"},
            "depth": {"type": "integer"},
            "depth_capped": {"type": "boolean", "description": "the sampler stopped counting"
                             " at its cap: at least depth items"},
            "oldest_age_s": {"type": ["number", "null"]}}}},
        "throughput": {"type": "object"},
        "series": {"type": "array", "items": {"type": "object"}},
        "families": {"type": "array", "description": "per family: states and outcomes"
                     " drawn, depth now, rates over the throughput window, and per sample"
                     " depth by state and executions per second by outcome",
                     "items": {"type": "object", "properties": {
                         "family": {"type": "string"},
                         "states": {"type": "array", "items": {"type": "string"}},
                         "outcomes": {"type": "array", "items": {"type": "string"}},
                         "depth_now": {"type": "object"}, "per_s_window": {"type": "object"},
                         "series": {"type": "array", "items": {"type": "object"}}}}},
        "flow": {"type": "object", "description": "the effect path (cluster-wide): commands"
                 " accepted, provider answers by outcome class and receipts confirmed per"
                 " second, end-to-end latency p50/p99 in ms (accept -> provider response,"
                 " accept -> receipt confirmed), over the window and per sample",
                 "properties": {
                     "window_s": {"type": "number"}, "accepted_per_s": {"type": "number"},
                     "effects_per_s": {"type": "object"},
                     "receipts_per_s": {"type": "number"},
                     "latency": {"type": "object"},
                     "outcomes": {"type": "array", "items": {"type": "string"}},
                     "series": {"type": "array", "items": {"type": "object"}}}},
        "local": {"type": "object", "description": "this replica's counters since start"},
        "claims": {"type": "object", "description": "items this replica claimed over the"
                   " throughput window (claimed, window_s) and per second (per_s: null"
                   " before the first sample)", "properties": {
                       "claimed": {"type": "integer"}, "window_s": {"type": "number"},
                       "per_s": {"type": ["number", "null"]}}},
        "replicas": {"type": ["array", "null"], "items": _ref("Replica")},
        "retention": {"type": ["object", "null"], "description": "the pruner's last pass"
                      " (cluster-wide, from its lease row): when, by which replica, result,"
                      " rows pruned and lag (s past retention) per table, and who holds the"
                      " lease now; null before the first pass or when the database is"
                      " unreachable",
                      "properties": {
                          "enabled": {"type": "boolean"},
                          "holder": {"type": ["string", "null"]},
                          "last_pass_at_us": {"type": ["integer", "null"]},
                          "last_pass_age_s": {"type": ["number", "null"]},
                          "last_pass_by": {"type": ["string", "null"]},
                          "result": {"type": ["string", "null"]},
                          "tables": {"type": "object"}}}}},
    "Operators": {"type": "object", "properties": {
        "auth": {"type": "string"},
        "operators": {"type": "array", "items": {"type": "object", "properties": {
            "name": {"type": "string"}, "role": {"type": "string"},
            "password_set": {"type": "boolean"}}}}}},
    "NotConfigured": {"type": "object", "properties": {
        "configured": {"type": "boolean"}, "items": {"type": "array", "items": {}},
        "message": {"type": "string"}}},
}


def _error_response(description: str) -> Json:
    return _json(_ref("Error"), description)


RESPONSES: Json = {
    "BadRequest": _error_response(
        "Malformed input (codes: bad_request, bad_filter); a body that is not UTF-8 JSON or"
        " nests deeper than 32 levels is bad_request"),
    "Unauthenticated": _error_response("Not signed in (code: unauthenticated)"),
    "Forbidden": _error_response("Role does not allow it, or CSRF check failed"
                                 " (codes: forbidden, csrf_failed); nothing changed"),
    "NotFound": _error_response("No such item (code: not_found)"),
    "Conflict": _error_response("Lost to another transition or not legal now (codes:"
                                " conflict, family_not_runnable)"),
    "PayloadTooLarge": _error_response("Body over 64 KiB (code: payload_too_large)"),
    "UnsupportedMediaType": _error_response("Body is not JSON"
                                            " (code: unsupported_media_type)"),
    "DatabaseUnavailable": _error_response(
        "Database unreachable (codes: database_unavailable, commit_outcome_unknown,"
        " database_error)"),
}


def document(extra_paths: dict[str, Json] | None = None) -> Json:
    """The whole document, plus an extension's paths."""
    paths = copy.deepcopy(PATHS)
    for path, item in (extra_paths or {}).items():
        if path in paths:
            raise ValueError(f"extension redefines API path {path}")
        paths[path] = item
    return {
        "openapi": "3.1.0",
        "info": {"title": "integrationd operator console API", "version": "1",
                 "description": "Same sessions, roles and CSRF rules as the console pages."
                                " Errors are {error, message} with a stable code."},
        "servers": [{"url": "/"}],
        "security": [{"sessionCookie": []}, {"proxyUser": []}],
        "paths": paths,
        "components": {
            "schemas": copy.deepcopy(SCHEMAS),
            "responses": copy.deepcopy(RESPONSES),
            "securitySchemes": {
                "sessionCookie": {"type": "apiKey", "in": "cookie",
                                  "name": "integrationd_session",
                                  "description": "set by signing in at /admin/sign-in"},
                "proxyUser": {"type": "apiKey", "in": "header", "name": "X-Remote-User",
                              "description": "proxy mode: the header named by"
                                             " admin.proxy_user_header"},
                "csrfToken": {"type": "apiKey", "in": "header", "name": "X-CSRF-Token",
                              "description": "GET /admin/api/session -> csrf_token"},
            },
        },
    }

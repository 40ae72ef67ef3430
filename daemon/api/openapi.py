"""The OpenAPI 3.1 document of the service API (``/v1/``)."""

from __future__ import annotations

from typing import Any

_ERROR = {"$ref": "#/components/schemas/Error"}
_HANDOFF_PROPS: dict[str, Any] = {
    "effect_handoff_key": {
        "type": "string", "maxLength": 512,
        "description": "ehk1:<org>:<app_installation>:<runtime_capability>:"
                       "<runtime_work_binding_digest>:<intent_id>, percent-encoded components;"
                       " the scope must equal the authenticated caller's",
    },
    "payload_digest": {"type": "string", "pattern": "^sha256:[0-9a-f]{64}$"},
    "runtime_outbox_id": {"type": "string", "minLength": 1, "maxLength": 255},
}


def _errors(*codes: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for c in codes:
        out[str(c)] = {"description": "error",
                       "content": {"application/json": {"schema": _ERROR}}}
        if c == 401:
            out[str(c)]["headers"] = {"WWW-Authenticate": {
                "description": 'Bearer realm="integrationd" (with error="invalid_token" when'
                               " a token was presented)",
                "required": True, "schema": {"type": "string"}}}
    return out


OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "integrationd service API", "version": "1"},
    "components": {
        "securitySchemes": {"runtimeBearer": {"type": "http", "scheme": "bearer"}},
        "schemas": {
            "Error": {
                "type": "object", "required": ["error", "message"],
                "properties": {"error": {"type": "string"}, "message": {"type": "string"}},
            },
            "Handoff": {
                "type": "object", "required": list(_HANDOFF_PROPS),
                "properties": _HANDOFF_PROPS, "additionalProperties": False,
            },
            "Command": {
                "type": "object",
                "required": ["intent_id", "intent_kind", "operation", "logical_target",
                             "catalog_revision", "request"],
                "additionalProperties": False,
                "properties": {
                    "intent_id": {"type": "string", "minLength": 1, "maxLength": 255},
                    "intent_kind": {"type": "string", "enum": ["UPSERT", "DELETE", "CREATE"]},
                    "operation": {"type": "string", "minLength": 1, "maxLength": 128},
                    "logical_target": {
                        "type": "object", "required": ["object"],
                        "minProperties": 2, "maxProperties": 2,
                        "properties": {"object": {"type": "string"}},
                        "additionalProperties": {"type": "string", "minLength": 1,
                                                 "maxLength": 255},
                        "description": "exactly {object, <object>_id}, e.g."
                                       ' {"object": "lead", "lead_id": "lead-1"}; the object'
                                       " is the operation's local object",
                    },
                    "catalog_revision": {"type": "integer"},
                    "request": {"type": "object",
                                "description": "holds the field map (names to strings or"
                                               " null) where the operation's L1 definition"
                                               " says (command_fields, a JSON pointer)"},
                },
            },
            "CommandRequest": {
                "type": "object",
                "required": [*_HANDOFF_PROPS, "command"],
                "additionalProperties": False,
                "properties": {**_HANDOFF_PROPS,
                               "command": {"$ref": "#/components/schemas/Command"}},
            },
            "Admission": {
                "type": "object", "required": ["admission"],
                "properties": {
                    "admission": {"type": "string",
                                  "enum": ["COMMAND_ACCEPTED", "HANDOFF_REJECTED"]},
                    "command_id": {"type": "string"},
                    "effect_handoff_key": {"type": "string"},
                    "receipt": {"type": "object", "description": "versioned rejection receipt"},
                },
            },
        },
    },
    "security": [{"runtimeBearer": []}],
    "paths": {
        "/v1/commands": {
            "post": {
                "summary": "Accept a command exactly once (idempotent after a lost response)",
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/CommandRequest"}}}},
                "responses": {
                    "200": {"description": "COMMAND_ACCEPTED", "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/Admission"}}}},
                    "409": {"description": "HANDOFF_REJECTED (tombstone), quarantined, or"
                                           " catalog_revision_not_published",
                            "content": {"application/json": {"schema": {}}}},
                    **_errors(400, 401, 403, 413, 415, 422, 503),
                },
            }
        },
        "/v1/commands/batch": {
            "post": {
                "summary": "Accept many commands in one request and one transaction",
                "description": "Each entry is answered exactly as POST /v1/commands would"
                               " answer it alone, with that HTTP status in `status`. An entry"
                               " that fails validation gets its error; nothing is written for"
                               " it. At most `api.max_batch_commands` entries.",
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"type": "object", "required": ["commands"],
                               "additionalProperties": False, "properties": {
                                   "commands": {"type": "array", "minItems": 1, "items": {
                                       "description": "a POST /v1/commands body"
                                                      " (CommandRequest); an entry that is"
                                                      " not is answered with its error in"
                                                      " `results`, not by refusing the batch"
                                   }}}}}}},
                "responses": {
                    "200": {"description": "one answer per entry, in order",
                            "content": {"application/json": {"schema": {
                                "type": "object", "required": ["results"], "properties": {
                                    "results": {"type": "array", "items": {
                                        "type": "object", "required": ["status"],
                                        "properties": {"status": {"type": "integer"}},
                                        "description": "status plus the Admission or Error"
                                                       " body of POST /v1/commands",
                                    }}}}}}},
                    **_errors(400, 401, 413, 415, 503),
                },
            }
        },
        "/v1/handoffs/reject": {
            "post": {
                "summary": "RejectIfUnaccepted: the accepted command, or a durable tombstone",
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/Handoff"}}}},
                "responses": {
                    "200": {"description": "HANDOFF_REJECTED receipt, or the accepted command",
                            "content": {"application/json": {
                                "schema": {"$ref": "#/components/schemas/Admission"}}}},
                    **_errors(400, 401, 403, 409, 413, 415, 503),
                },
            }
        },
        "/v1/handoffs": {
            "get": {
                "summary": "Read the admission fact; 404 is NOT evidence of rejection",
                "parameters": [{"name": "effect_handoff_key", "in": "query", "required": True,
                                "schema": {"type": "string"}}],
                "responses": {
                    "200": {"description": "the admission fact", "content": {"application/json":
                            {"schema": {"$ref": "#/components/schemas/Admission"}}}},
                    **_errors(400, 401, 403, 404, 503),
                },
            }
        },
        "/v1/openapi.json": {
            "get": {"summary": "This document", "security": [],
                    "responses": {"200": {"description": "OpenAPI 3.1"}}}
        },
    },
}

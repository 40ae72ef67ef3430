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
                    "user_id": {"type": "string", "minLength": 1, "maxLength": 255,
                                "description": "a per-user command: the user whose"
                                               " principal binding (connected through"
                                               " /v1/bindings/.../connect, kind per_user)"
                                               " it runs under; a user with no binding"
                                               " is HANDOFF_REJECTED with reason"
                                               " no_user_binding"},
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


# ------------------------------------------------- the Runtime's connect flows (seed 8.1)

_ID = {"type": "string", "minLength": 1, "maxLength": 255}
_TOKEN = {"type": "string", "minLength": 1, "maxLength": 8192, "writeOnly": True,
          "description": "sealed at once under the active token key; never stored in the"
                         " clear, logged or echoed"}
_SCOPES = {"type": "array", "maxItems": 256, "items": _ID}
_IDENTITY_PROPS: dict[str, Any] = {
    "issuer": _ID, "remote_account_id": _ID, "remote_subject": _ID, "installation_id": _ID,
    "scopes": _SCOPES,
}
_FLOW_DOCS = {
    "disconnect": "Stop dispatch under the binding; the generation stays, its grant is"
                  " revoked (no grant in the body)",
    "reconnect": "Authorize again (from connected or disconnected): the generation moves and"
                 " the grant handed over is the new generation's",
    "change_issuer": "Another issuer or remote subject: the generation moves (with the new"
                     " grant) when either changes",
    "reinstall": "The app was uninstalled and installed again, or its installation id"
                 " changed: the generation always moves",
    "rebind": "Another remote tenant/account (or subject): the generation moves when it"
              " changes",
    "change_scopes": "Another scope set: adding or replacing a scope moves the generation;"
                     " a strict subset keeps it (a grant, if any, is the next token version)",
}
OPENAPI["components"]["schemas"].update({
    "OAuthGrant": {
        "type": "object", "required": ["type", "access_token", "expires_in"],
        "additionalProperties": False,
        "description": "the token endpoint's answer to the authorization-code exchange",
        "properties": {"type": {"const": "oauth_code_exchange"}, "access_token": _TOKEN,
                       "refresh_token": _TOKEN,
                       "expires_in": {"type": "integer", "minimum": 1,
                                      "maximum": 366 * 24 * 3600},
                       "scopes": _SCOPES},
    },
    "S2SGrant": {
        "type": "object", "required": ["type"], "additionalProperties": False,
        "description": "an app installation: integrationd mints its access tokens",
        "properties": {"type": {"const": "s2s_installation"}},
    },
    "Grant": {"oneOf": [{"$ref": "#/components/schemas/OAuthGrant"},
                        {"$ref": "#/components/schemas/S2SGrant"}]},
    "ConnectRequest": {
        "type": "object", "required": ["idempotency_key", "provider", "identity", "grant"],
        "additionalProperties": False,
        "properties": {
            "idempotency_key": _ID,
            "reason": {"type": "string", "minLength": 1, "maxLength": 500},
            "kind": {"type": "string", "enum": ["shared", "per_user"],
                     "description": "per_user: one user's grant (user_id required)"},
            "user_id": _ID,
            "provider": {"type": "string", "minLength": 1, "maxLength": 64},
            "identity": {"type": "object", "additionalProperties": False,
                         "required": ["issuer", "remote_account_id", "remote_subject"],
                         "properties": _IDENTITY_PROPS},
            "grant": {"$ref": "#/components/schemas/Grant"},
        },
    },
    "FlowRequest": {
        "type": "object", "required": ["idempotency_key", "expected_generation"],
        "additionalProperties": False,
        "properties": {
            "idempotency_key": _ID,
            "expected_generation": {"type": "integer", "minimum": 1, "maximum": 2**62,
                                    "description": "the generation the Runtime saw (CAS)"},
            "reason": {"type": "string", "minLength": 1, "maxLength": 500},
            "identity": {"type": "object", "additionalProperties": False,
                         "description": "the identity fields this flow changes",
                         "properties": _IDENTITY_PROPS},
            "grant": {"$ref": "#/components/schemas/Grant"},
        },
    },
    "FlowAnswer": {
        "type": "object",
        "required": ["binding_id", "generation", "state", "generation_bumped",
                     "token_version", "replayed"],
        "properties": {
            "binding_id": {"type": "string"}, "kind": {"type": "string"},
            "provider": {"type": "string"}, "user_id": {"type": ["string", "null"]},
            "generation": {"type": "integer"},
            "state": {"type": "string", "enum": ["connected", "disconnected"]},
            "generation_bumped": {"type": "boolean"},
            "token_version": {"type": ["integer", "null"]},
            "replayed": {"type": "boolean",
                         "description": "true: answered from the idempotency record"},
            "identity": {"type": "object"},
        },
    },
    "BindingState": {
        "type": "object", "required": ["binding_id", "generation", "state"],
        "properties": {
            "binding_id": {"type": "string"}, "kind": {"type": "string"},
            "provider": {"type": "string"}, "user_id": {"type": ["string", "null"]},
            "generation": {"type": "integer"}, "state": {"type": "string"},
            "grant_state": {"type": ["string", "null"]},
            "token_version": {"type": ["integer", "null"]},
        },
    },
})
_BINDING_ID = {"name": "binding_id", "in": "path", "required": True,
               "schema": {"type": "string", "minLength": 1, "maxLength": 128,
                          "pattern": "^[A-Za-z0-9._-]+$"}}


def _flow_path(summary: str, schema: str) -> dict[str, Any]:
    return {"post": {
        "summary": summary,
        "description": "Idempotent by idempotency_key (a retry with the same body gets the"
                       " same answer, another body under the same key is 409"
                       " idempotency_key_reused); audited with the Runtime as actor."
                       " Refusals: 404 unknown_binding, 409 stale_generation,"
                       " binding_exists, binding_disconnected; 400 field_not_allowed,"
                       " grant_required, grant_not_allowed, invalid_token_field; 409"
                       " no_token_keys (no [keys] active). A refusal writes nothing.",
        "parameters": [_BINDING_ID],
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{schema}"}}}},
        "responses": {
            "200": {"description": "applied, or answered from the idempotency record",
                    "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/FlowAnswer"}}}},
            **_errors(400, 401, 404, 409, 413, 415, 503),
        },
    }}


OPENAPI["paths"]["/v1/bindings/{binding_id}"] = {"get": {
    "summary": "A binding's current generation and grant state (never a secret)",
    "parameters": [_BINDING_ID],
    "responses": {
        "200": {"description": "the binding", "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/BindingState"}}}},
        **_errors(401, 404, 503),
    },
}}
OPENAPI["paths"]["/v1/bindings/{binding_id}/connect"] = _flow_path(
    "Connect a new binding (generation 1) with the grant the Runtime obtained",
    "ConnectRequest")
for _flow, _summary in _FLOW_DOCS.items():
    OPENAPI["paths"][f"/v1/bindings/{{binding_id}}/{_flow}"] = _flow_path(_summary,
                                                                          "FlowRequest")

"""Validation of ``/v1/`` request bodies (pure): shape, handoff key, scope, digest.

Every failure is an :class:`ApiError` with an HTTP status, a stable error
code and a message that never echoes payload values or another scope's data.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from config.catalog import Catalog, OperationDefinition
from daemon.core.canonical import NotCanonical, canonical_bytes, canonical_digest, is_digest
from daemon.core.field_ownership import Ownership, OwnershipRefusal, outbound_refusal
from daemon.core.handoff import BadHandoffKey, EffectHandoffKey, TrustedRuntimeWorkScope
from daemon.providers.executor import BadRequestForOperation, desired_fields

MAX_ID_CHARS = 255


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})


@attrs.frozen
class HandoffFields:
    key: EffectHandoffKey
    key_text: str
    payload_digest: str
    runtime_outbox_id: str


@attrs.frozen(kw_only=True)
class ValidCommand:
    handoff: HandoffFields
    operation: OperationDefinition
    intent_kind: str
    local_id: str
    catalog_revision: int
    frozen_request: str
    # A per-user command: whose principal it runs under ("": the scope's shared one).
    user_id: str = ""


def _string(doc: Mapping[str, Any], name: str, max_chars: int = MAX_ID_CHARS) -> str:
    value = doc.get(name)
    if not isinstance(value, str) or not value or len(value) > max_chars:
        raise ApiError(400, "invalid_request",
                       f"{name} must be a non-empty string of at most {max_chars} characters")
    return value


def only_fields(doc: Mapping[str, Any], allowed: Iterable[str], where: str) -> None:
    """Refuse fields the OpenAPI document does not allow (``additionalProperties: false``)."""
    extra = sorted(str(k)[:64] for k in set(doc) - set(allowed))
    if extra:
        more = f" and {len(extra) - 5} more" if len(extra) > 5 else ""
        raise ApiError(400, "invalid_request",
                       f"unknown field(s) in {where}: {', '.join(extra[:5])}{more}")


HANDOFF_FIELDS = ("effect_handoff_key", "payload_digest", "runtime_outbox_id")
COMMAND_FIELDS = ("intent_id", "intent_kind", "operation", "logical_target",
                  "catalog_revision", "request", "user_id")


def handoff_fields(doc: Any, caller: TrustedRuntimeWorkScope,
                   also: tuple[str, ...] = ()) -> HandoffFields:
    """The three handoff arguments (and no other fields but ``also``), with the key's scope
    checked against the caller's."""
    if not isinstance(doc, Mapping):
        raise ApiError(400, "invalid_request", "the body must be a JSON object")
    only_fields(doc, (*HANDOFF_FIELDS, *also), "the body")
    key_text = _string(doc, "effect_handoff_key", 512)
    try:
        key = EffectHandoffKey.parse(key_text)
    except BadHandoffKey as exc:
        raise ApiError(400, "bad_handoff_key", str(exc)) from None
    if key.scope != caller:
        # Same answer whichever component differs, and nothing is read: no disclosure.
        raise ApiError(403, "scope_mismatch",
                       "the handoff key does not belong to the authenticated work scope")
    digest = _string(doc, "payload_digest", 80)
    if not is_digest(digest):
        raise ApiError(400, "invalid_request", "payload_digest must be sha256:<64 hex>")
    return HandoffFields(key, key_text, digest, _string(doc, "runtime_outbox_id"))


def requested_revision(doc: Any) -> int | None:
    """The Catalog revision a command body names, if it names one as an integer
    (anything else is left for :func:`command_body` to refuse)."""
    command = doc.get("command") if isinstance(doc, Mapping) else None
    revision = command.get("catalog_revision") if isinstance(command, Mapping) else None
    if isinstance(revision, int) and not isinstance(revision, bool):
        return revision
    return None


def command_body(doc: Any, caller: TrustedRuntimeWorkScope,
                 catalog: Catalog | None) -> ValidCommand:
    """Validate a command against the published revision it names (``catalog``:
    that revision, None when it is not published)."""
    handoff = handoff_fields(doc, caller, also=("command",))
    command = doc.get("command")
    if not isinstance(command, Mapping):
        raise ApiError(400, "invalid_request", "command must be a JSON object")
    only_fields(command, COMMAND_FIELDS, "command")
    try:
        digest = canonical_digest(command)
    except NotCanonical as exc:
        raise ApiError(400, "invalid_request", f"command is not canonical JSON: {exc}") from None
    if digest != handoff.payload_digest:
        raise ApiError(400, "payload_digest_mismatch",
                       "payload_digest is not the digest of the canonical command")
    intent_id = _string(command, "intent_id")
    if intent_id != handoff.key.handoff_id:
        raise ApiError(400, "invalid_request", "command.intent_id must match the handoff key")
    revision = command.get("catalog_revision")
    if not isinstance(revision, int) or isinstance(revision, bool):
        raise ApiError(400, "invalid_request", "command.catalog_revision must be an integer")
    if catalog is None or revision != catalog.revision:
        raise ApiError(409, "catalog_revision_not_published",
                       f"catalog revision {revision} is not published")
    name = _string(command, "operation", 128)
    operation = catalog.operation(name)
    if operation is None:
        raise ApiError(422, "unknown_operation",
                       f"operation {name!r} is not in catalog revision {revision}")
    kind = _string(command, "intent_kind", 32)
    if kind not in operation.intent_kinds:
        raise ApiError(422, "invalid_request", f"{name} does not accept intent kind {kind!r}")
    target = command.get("logical_target")
    if not isinstance(target, Mapping) or target.get("object") != operation.local_object:
        raise ApiError(422, "invalid_request",
                       f"logical_target.object must be {operation.local_object!r}")
    local_id = _string(target, f"{operation.local_object}_id")
    only_fields(target, ("object", f"{operation.local_object}_id"), "logical_target")
    request = command.get("request")
    if not isinstance(request, Mapping):
        raise ApiError(422, "invalid_request", "request must be a JSON object")
    try:
        desired_fields(operation, request)
    except BadRequestForOperation as exc:
        raise ApiError(422, "invalid_request", str(exc)) from None
    # Nothing but the path to the field map: an extra field would be frozen into the
    # command without ever being sent (the OpenAPI document forbids it).
    level: Any = request
    where = "request"
    for part in operation.command_fields.parts:
        if not isinstance(level, Mapping):
            break
        only_fields(level, (part,), where)
        level, where = level.get(part), f"{where}.{part}"
    user_id = _string(command, "user_id") if "user_id" in command else ""
    return ValidCommand(
        handoff=handoff, operation=operation, intent_kind=kind, local_id=local_id,
        catalog_revision=revision, frozen_request=canonical_bytes(dict(request)).decode(),
        user_id=user_id,
    )


def requested_user(doc: Any) -> str:
    """The user a command body names for a per-user principal ("" when none, or not a
    string: :func:`command_body` refuses that)."""
    command = doc.get("command") if isinstance(doc, Mapping) else None
    user = command.get("user_id") if isinstance(command, Mapping) else None
    return user if isinstance(user, str) else ""


def ownership_refusal(catalog: Catalog, valid: ValidCommand) -> OwnershipRefusal | None:
    """The pinned revision's object binding for this operation's (provider, remote
    object, local object) decides which fields the command may send; none: only L1's
    ``allowed_fields`` apply."""
    op = valid.operation
    binding = next((o for o in catalog.object_bindings
                    if (o.provider, o.resource, o.local_object)
                    == (op.provider, op.remote_object, op.local_object)), None)
    if binding is None:
        return None
    ownership = Ownership(
        inbound=frozenset(f.remote for f in binding.fields if f.direction == "inbound"),
        outbound=frozenset(f.remote for f in binding.fields if f.direction == "outbound"))
    fields = desired_fields(op, json.loads(valid.frozen_request))
    return outbound_refusal(fields, ownership)

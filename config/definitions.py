"""L1 provider definitions: one parsed TOML document -> definition values (pure).

Theory of operation
-------------------
:func:`parse_provider` is a pure function from one provider document (the
dict ``tomllib`` returns for ``config/providers/<provider>.toml``) to its
:class:`OperationDefinition` values. It reads no file and no clock, so the
Catalog loader and durable Catalog revisions can both use it on the same
content. Every problem is a :class:`CatalogError` naming the full key
(``providers.<p>.operations.<op>.request.body.data.id: unknown placeholder``),
which the CLI prints as one line and exits 2.

A document declares (see ``config/providers/*.toml`` for two real ones)::

    provider = "<name>"                       # must match the file name
    [auth.<scheme>]                           # how a token is presented
    header = "Authorization"
    prefix = "Bearer "
    [operations."<op>"]
    intent_kinds, local_object, remote_object, allowed_fields,
    command_fields = "/properties"            # where the command's request holds them
    not_applied_statuses, replay_safe, default_retry_after, max_in_flight, max_clock_skew
    [operations."<op>".request]               # what is sent
    method, path, content_type, auth, body, idempotency_header (optional)
    [operations."<op>".response]              # what a response proves
    identity (pointer, optional), evidence_headers, evidence_fields
    [operations."<op>".read]                  # the read-back (optional)
    method, path, fields, id, updated_at (pointers), absent_statuses

The executor (``daemon/providers/executor.py``) interprets these values; no
provider name appears in code.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs

from daemon.core.effects import OperationContract
from daemon.core.ingress import BadPayloadSpec, PayloadSpec
from daemon.core.webhook_signature import BadSignatureSpec, SignatureSpec
from daemon.providers.template import BodyTemplate, PathTemplate, Pointer, TemplateError

METHODS = ("GET", "POST", "PATCH", "PUT", "DELETE")
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP header name (RFC 9110 token)
_MEDIA_TYPE = re.compile(r"^[\w.+-]+/[\w.+-]+(\s*;.*)?$")


class CatalogError(Exception):
    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


@attrs.frozen(kw_only=True)
class AuthScheme:
    """How a credential is presented: ``<header>: <prefix><token>``."""

    name: str
    header: str
    prefix: str = ""


@attrs.frozen(kw_only=True)
class RequestDefinition:
    method: str
    path: PathTemplate
    content_type: str
    auth: AuthScheme
    body: BodyTemplate
    # Sent with the command id when the provider honours one; "" sends none.
    idempotency_header: str = ""


@attrs.frozen(kw_only=True)
class ResponseDefinition:
    # Where a 2xx response names the record it changed; None: it does not say.
    identity: Pointer | None = None
    # Response headers and body values that are safe to keep as evidence.
    evidence_headers: tuple[str, ...] = ()
    evidence_fields: tuple[tuple[str, Pointer], ...] = ()


@attrs.frozen(kw_only=True)
class ReadDefinition:
    method: str
    path: PathTemplate
    auth: AuthScheme
    fields: Pointer
    id: Pointer | None = None
    updated_at: Pointer | None = None
    absent_statuses: frozenset[int] = frozenset({404})


@attrs.frozen(kw_only=True)
class OperationDefinition:
    name: str
    provider: str
    intent_kinds: frozenset[str]
    local_object: str
    remote_object: str
    allowed_fields: frozenset[str]
    # Where the command's frozen request holds the field map.
    command_fields: Pointer
    request: RequestDefinition
    response: ResponseDefinition
    contract: OperationContract
    read: ReadDefinition | None = None

    @property
    def method(self) -> str:
        return self.request.method


_OPERATION_KEYS = frozenset({
    "intent_kinds", "local_object", "remote_object", "allowed_fields", "command_fields",
    "not_applied_statuses", "replay_safe", "default_retry_after", "max_in_flight",
    "max_clock_skew", "request", "response", "read",
})
_REQUEST_KEYS = frozenset({"method", "path", "content_type", "auth", "body",
                           "idempotency_header"})
_RESPONSE_KEYS = frozenset({"identity", "evidence_headers", "evidence_fields"})
_READ_KEYS = frozenset({"method", "path", "auth", "fields", "id", "updated_at",
                        "absent_statuses"})


def _table(key: str, value: Any, known: frozenset[str] | None = None) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise CatalogError(key, "expected a table")
    if known is not None:
        unknown = sorted(set(value) - known)
        if unknown:
            raise CatalogError(f"{key}.{unknown[0]}", "unknown key")
    return value


def _req(key: str, table: Mapping[str, Any], name: str, kind: type[Any]) -> Any:
    if name not in table:
        raise CatalogError(f"{key}.{name}", "missing")
    value = table[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise CatalogError(f"{key}.{name}", f"expected {kind.__name__}")
    return value


def _strings(key: str, value: Any, *, non_empty: bool = True) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise CatalogError(key, "expected a list of non-empty strings")
    if non_empty and not value:
        raise CatalogError(key, "expected at least one entry")
    return tuple(value)


def _statuses(key: str, value: Any) -> frozenset[int]:
    if not isinstance(value, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) and 100 <= s <= 599 for s in value):
        raise CatalogError(key, "expected a list of HTTP status codes")
    return frozenset(value)


def _number(key: str, table: Mapping[str, Any], name: str, default: float) -> float:
    value = table.get(name, default)
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise CatalogError(f"{key}.{name}", "expected a non-negative number")
    return float(value)


def _compiled(key: str, compile_: Any, value: Any) -> Any:
    try:
        return compile_(value)
    except TemplateError as exc:
        raise CatalogError(f"{key}.{exc.where}" if exc.where else key, exc.message) from None


def _pointer(key: str, table: Mapping[str, Any], name: str, *, required: bool) -> Pointer | None:
    if name not in table:
        if required:
            raise CatalogError(f"{key}.{name}", "missing")
        return None
    return _compiled(f"{key}.{name}", Pointer.compile, table[name])  # type: ignore[no-any-return]


def _method(key: str, table: Mapping[str, Any]) -> str:
    method = _req(key, table, "method", str)
    if method not in METHODS:
        raise CatalogError(f"{key}.method", f"expected one of {', '.join(METHODS)}")
    return str(method)


def _auth_ref(key: str, table: Mapping[str, Any], schemes: Mapping[str, AuthScheme],
              default: AuthScheme | None = None) -> AuthScheme:
    if "auth" not in table and default is not None:
        return default
    name = _req(key, table, "auth", str)
    if name not in schemes:
        raise CatalogError(f"{key}.auth", f"no auth scheme {name!r} in this definition"
                           f" (declared: {', '.join(sorted(schemes)) or 'none'})")
    return schemes[name]


def _auth_schemes(provider: str, value: Any) -> dict[str, AuthScheme]:
    key = f"providers.{provider}.auth"
    schemes: dict[str, AuthScheme] = {}
    for name, raw in _table(key, value).items():
        table = _table(f"{key}.{name}", raw, frozenset({"header", "prefix"}))
        header = _req(f"{key}.{name}", table, "header", str)
        if not _TOKEN.match(header):
            raise CatalogError(f"{key}.{name}.header", "expected an HTTP header name")
        prefix = table.get("prefix", "")
        if not isinstance(prefix, str) or any(c in prefix for c in "\r\n"):
            raise CatalogError(f"{key}.{name}.prefix", "expected a single-line string")
        schemes[name] = AuthScheme(name=name, header=header, prefix=prefix)
    return schemes


def _request(key: str, raw: Any, schemes: Mapping[str, AuthScheme]) -> RequestDefinition:
    table = _table(key, raw, _REQUEST_KEYS)
    content_type = _req(key, table, "content_type", str)
    if not _MEDIA_TYPE.match(content_type):
        raise CatalogError(f"{key}.content_type", "expected a media type such as"
                           " application/json")
    header = table.get("idempotency_header", "")
    if not isinstance(header, str) or (header and not _TOKEN.match(header)):
        raise CatalogError(f"{key}.idempotency_header", "expected an HTTP header name")
    if "body" not in table:
        raise CatalogError(f"{key}.body", "missing")
    return RequestDefinition(
        method=_method(key, table),
        path=_compiled(f"{key}.path", PathTemplate.compile, _req(key, table, "path", str)),
        content_type=content_type,
        auth=_auth_ref(key, table, schemes),
        body=_compiled(f"{key}.body", BodyTemplate.compile, table["body"]),
        idempotency_header=header,
    )


def _response(key: str, raw: Any) -> ResponseDefinition:
    table = _table(key, raw, _RESPONSE_KEYS)
    headers = _strings(f"{key}.evidence_headers", table.get("evidence_headers", []),
                       non_empty=False)
    for h in headers:
        if not _TOKEN.match(h):
            raise CatalogError(f"{key}.evidence_headers", f"{h!r} is not a header name")
    fields_raw = _table(f"{key}.evidence_fields", table.get("evidence_fields", {}))
    fields = tuple(
        (name, _compiled(f"{key}.evidence_fields.{name}", Pointer.compile, ptr))
        for name, ptr in sorted(fields_raw.items())
    )
    return ResponseDefinition(
        identity=_pointer(key, table, "identity", required=False),
        evidence_headers=tuple(h.lower() for h in headers),
        evidence_fields=fields,
    )


def _read(key: str, raw: Any, default_auth: AuthScheme,
          schemes: Mapping[str, AuthScheme]) -> ReadDefinition:
    table = _table(key, raw, _READ_KEYS)
    fields = _pointer(key, table, "fields", required=True)
    assert fields is not None
    return ReadDefinition(
        method=_method(key, table),
        path=_compiled(f"{key}.path", PathTemplate.compile, _req(key, table, "path", str)),
        auth=_auth_ref(key, table, schemes, default_auth),
        fields=fields,
        id=_pointer(key, table, "id", required=False),
        updated_at=_pointer(key, table, "updated_at", required=False),
        absent_statuses=_statuses(f"{key}.absent_statuses",
                                  table.get("absent_statuses", [404])),
    )


def _operation(provider: str, name: str, raw: Any,
               schemes: Mapping[str, AuthScheme]) -> OperationDefinition:
    key = f"providers.{provider}.operations.{name}"
    table = _table(key, raw, _OPERATION_KEYS)
    if "request" not in table:
        raise CatalogError(f"{key}.request", "missing")
    request = _request(f"{key}.request", table["request"], schemes)
    kinds = _strings(f"{key}.intent_kinds", _req(key, table, "intent_kinds", list))
    command_fields = _pointer(key, table, "command_fields", required=True)
    assert command_fields is not None
    read = None
    if "read" in table:
        read = _read(f"{key}.read", table["read"], request.auth, schemes)
    return OperationDefinition(
        name=name,
        provider=provider,
        intent_kinds=frozenset(kinds),
        local_object=_req(key, table, "local_object", str),
        remote_object=_req(key, table, "remote_object", str),
        allowed_fields=frozenset(_strings(f"{key}.allowed_fields",
                                          _req(key, table, "allowed_fields", list))),
        command_fields=command_fields,
        request=request,
        response=_response(f"{key}.response", table.get("response", {})),
        contract=OperationContract(
            not_applied_statuses=_statuses(f"{key}.not_applied_statuses",
                                           table.get("not_applied_statuses", [429])),
            replay_safe=_bool(f"{key}.replay_safe", table.get("replay_safe", False)),
            default_retry_after_s=_number(key, table, "default_retry_after", 5.0),
            max_in_flight_s=_number(key, table, "max_in_flight", 30.0),
            max_clock_skew_s=_number(key, table, "max_clock_skew", 2.0),
        ),
        read=read,
    )


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise CatalogError(key, "expected true or false")
    return value


def parse_provider(doc: Mapping[str, Any], source: str = "") -> dict[str, OperationDefinition]:
    """Every operation of one provider document, validated (pure).

    ``source`` is the file name the document came from, if any: it must be
    ``<provider>.toml``.
    """
    provider = doc.get("provider")
    if not isinstance(provider, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", provider):
        raise CatalogError(f"providers/{source or '?'}.provider",
                           "expected a lower-case provider name")
    if source and source != f"{provider}.toml":
        raise CatalogError(f"providers/{source}", "provider must match the file name")
    unknown = sorted(set(doc) - {"provider", "auth", "operations", "webhooks"})
    if unknown:
        raise CatalogError(f"providers.{provider}.{unknown[0]}", "unknown key")
    schemes = _auth_schemes(provider, doc.get("auth", {}))
    operations = _table(f"providers.{provider}.operations", doc.get("operations", {}))
    return {name: _operation(provider, name, table, schemes)
            for name, table in operations.items()}


# ------------------------------------------------------------------ webhook routes

REDELIVERY = ("network_failure_only", "until_2xx")


@attrs.frozen(kw_only=True)
class WebhookDefinition:
    """One L1 webhook route contract: how a provider signs, shapes and redelivers."""

    name: str
    provider: str
    content_types: tuple[str, ...]
    signature: SignatureSpec
    payload: PayloadSpec
    payload_version: int
    # Seconds the provider waits for our answer, and when it sends again:
    # "network_failure_only" (any HTTP status counts as delivered: an error loses the
    # event) or "until_2xx" (it retries non-2xx answers).
    response_window_s: float
    redelivery: str


_WEBHOOK_KEYS = frozenset({"content_types", "payload_version", "response_window",
                           "redelivery", "signature", "payload"})
_SIGNATURE_KEYS = frozenset({"header", "algorithm", "encoding", "signed", "timestamp_header",
                             "timestamp_unit", "tolerance"})
_PAYLOAD_KEYS = frozenset({"format", "batch", "event_name", "resource_type", "resource_id",
                           "delivered_at", "attributes", "updated_at", "events",
                           "delivery_id_header", "delivery_id_stable", "max_depth",
                           "resource_type_fixed"})


def _header_name(key: str, value: Any) -> str:
    if not isinstance(value, str) or not _TOKEN.match(value):
        raise CatalogError(key, "expected an HTTP header name")
    return value.lower()


def _signature(key: str, raw: Any) -> SignatureSpec:
    table = _table(key, raw, _SIGNATURE_KEYS)
    timestamp_header = table.get("timestamp_header", "")
    try:
        return SignatureSpec(
            header=_header_name(f"{key}.header", _req(key, table, "header", str)),
            algorithm=_req(key, table, "algorithm", str),
            encoding=_req(key, table, "encoding", str),
            signed=_strings(f"{key}.signed", _req(key, table, "signed", list)),
            timestamp_header=(_header_name(f"{key}.timestamp_header", timestamp_header)
                              if timestamp_header else ""),
            timestamp_unit=str(table.get("timestamp_unit", "s")),
            tolerance_s=_number(key, table, "tolerance", 300.0),
        )
    except BadSignatureSpec as exc:
        field, _, message = str(exc).partition(": ")
        raise CatalogError(f"{key}.{field}", message) from None


def _payload(key: str, raw: Any) -> PayloadSpec:
    table = _table(key, raw, _PAYLOAD_KEYS)
    events = _table(f"{key}.events", _req(key, table, "events", dict))
    kwargs: dict[str, Any] = {}
    for name in ("format", "event_name", "resource_type", "resource_id", "delivered_at",
                 "attributes", "updated_at", "resource_type_fixed"):
        if name in table:
            kwargs[name] = _req(key, table, name, str)
    if "delivery_id_header" in table:
        kwargs["delivery_id_header"] = _header_name(f"{key}.delivery_id_header",
                                                    table["delivery_id_header"])
    for name in ("batch", "delivery_id_stable"):
        if name in table:
            kwargs[name] = _bool(f"{key}.{name}", table[name])
    if "max_depth" in table:
        kwargs["max_depth"] = _req(key, table, "max_depth", int)
    for event, kind in events.items():
        if not isinstance(kind, str):
            raise CatalogError(f"{key}.events.{event}", "expected created, updated or"
                               " destroyed")
    try:
        return PayloadSpec(events=dict(events), **kwargs)
    except BadPayloadSpec as exc:
        field, _, message = str(exc).partition(": ")
        raise CatalogError(f"{key}.{field}", message) from None


def _webhook(provider: str, name: str, raw: Any) -> WebhookDefinition:
    key = f"providers.{provider}.webhooks.{name}"
    table = _table(key, raw, _WEBHOOK_KEYS)
    types = _strings(f"{key}.content_types", _req(key, table, "content_types", list))
    for media in types:
        if not _MEDIA_TYPE.match(media):
            raise CatalogError(f"{key}.content_types", f"{media!r} is not a media type")
    redelivery = _req(key, table, "redelivery", str)
    if redelivery not in REDELIVERY:
        raise CatalogError(f"{key}.redelivery", f"expected one of {', '.join(REDELIVERY)}")
    window = _number(key, table, "response_window", 5.0)
    if window <= 0:
        raise CatalogError(f"{key}.response_window", "must be positive")
    version = table.get("payload_version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CatalogError(f"{key}.payload_version", "expected a positive integer")
    if "signature" not in table:
        raise CatalogError(f"{key}.signature", "missing")
    if "payload" not in table:
        raise CatalogError(f"{key}.payload", "missing")
    return WebhookDefinition(
        name=name, provider=provider,
        content_types=tuple(t.split(";")[0].strip().lower() for t in types),
        signature=_signature(f"{key}.signature", table["signature"]),
        payload=_payload(f"{key}.payload", table["payload"]),
        payload_version=version, response_window_s=window, redelivery=redelivery,
    )


def parse_webhooks(doc: Mapping[str, Any]) -> dict[str, WebhookDefinition]:
    """Every webhook route contract of one provider document (``[webhooks."<name>"]``),
    validated (pure). Call :func:`parse_provider` first: it checks the document's shape."""
    provider = str(doc.get("provider"))
    webhooks = _table(f"providers.{provider}.webhooks", doc.get("webhooks", {}))
    return {name: _webhook(provider, name, table) for name, table in webhooks.items()}

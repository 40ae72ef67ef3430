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
    endpoint_classes = ["crm_objects", "search"]  # optional: groups of endpoints it limits
    keep_alive = 60.0                         # optional: seconds its servers keep an idle
                                              # connection open (our pool lets go at half;
                                              # undeclared: 4 s, below common servers' 5 s)
    [quota.<name>]                            # a provider limit (optional, many)
    limit = 100, window = 10.0, scope = "app_installation" | "binding" | "org"
    kind = "sliding" | "fixed", burst = 20 (sliding), offset = 0.0 (fixed, seconds),
    jitter = 0.25 (seconds a send may start late / arrive later)
    remaining_header = "x-ratelimit-remaining"  # optional: the provider's own count
    reset_header = "x-ratelimit-reset"        # optional: when its window resets, in
    reset_format = "seconds" | "epoch_seconds" | "epoch_ms"  # this format (then required)
    endpoint_classes = ["search"]             # optional: only calls of these classes count
    per_endpoint_class = true                 # optional: each class has its own budget
    [auth.<scheme>]                           # how a token is presented
    header = "Authorization"
    prefix = "Bearer "
    [operations."<op>"]
    intent_kinds, local_object, remote_object, allowed_fields,
    command_fields = "/properties"            # where the command's request holds them
    accepted_statuses, not_applied_statuses, rejected_statuses,   # status semantics,
                                              # each required ([] for none)
    replay_safe, default_retry_after, max_in_flight, max_clock_skew
    endpoint_class = "crm_objects"            # optional: one of the declared classes
    [operations."<op>".replay_proof]          # required exactly when replay_safe = true
    idempotency_header = "Idempotency-Key"    # the provider honours it (the request's
    key_retention = 86400.0                   # idempotency_header); seconds it does
    [operations."<op>".request]               # what is sent
    method, path, content_type, auth, body, idempotency_header (optional)
    [operations."<op>".response]              # what a response proves
    identity (pointer, optional), evidence_headers, evidence_fields,
    updated_at (pointer, optional: the record's new last-modified time)
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

from config.subscription_defs import SubscriptionDefinition, parse_subscription
from daemon.core.effects import OperationContract, ReplayProof
from daemon.core.ingress import BadPayloadSpec, PayloadSpec
from daemon.core.quota import ClassScope, QuotaPolicy, QuotaPolicyError, ResetFormat, WindowKind
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


# What a quota dimension is counted per: the binding's app installation, or the binding
# (one principal: per user for a per-user binding), or the org. An L2 binding may
# override it, or name an explicit provider quota key ("provider_key", with `key`).
QUOTA_SCOPES = ("app_installation", "binding", "org")
QUOTA_KINDS = ("sliding", "fixed")
RESET_FORMATS = tuple(f.value for f in ResetFormat)
# An endpoint class's name (L1 declares them; operations and quota dimensions name them).
_CLASS_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


@attrs.frozen(kw_only=True)
class QuotaDimension:
    """One provider limit (L1): ``limit`` requests per ``window_s``, counted per ``scope``."""

    name: str
    limit: int
    window_s: float
    scope: str = "app_installation"
    # How the provider counts its window (daemon/core/quota.py): any interval of its
    # length ("sliding") or windows aligned to offset + k * window ("fixed").
    kind: str = "sliding"
    # Sliding: how many requests may start at once (1: evenly spaced).
    burst: int = 1
    offset_s: float = 0.0
    # How late a send may start after its slot, and how much later the provider may count
    # its arrival (the schedule keeps every window at the limit within this spread).
    jitter_s: float = 0.25
    # A response header with the provider's count of requests left (lower-case), if any.
    remaining_header: str = ""
    # A response header saying when the provider's window resets (lower-case), if any,
    # and how ("seconds" until it, or an epoch time in "epoch_seconds" / "epoch_ms"):
    # used when a 429 has no Retry-After, and when a 2xx says none remain.
    reset_header: str = ""
    reset_format: str = ""
    # The endpoint classes this dimension counts (empty: every call), and whether each
    # class has a budget of its own (the quota key then names the class).
    endpoint_classes: frozenset[str] = frozenset()
    per_endpoint_class: bool = False

    def class_scope(self, apart: frozenset[str] = frozenset()) -> ClassScope:
        """L1's class scope, with the classes an L2 binding gives budgets of their own."""
        return ClassScope(applies_to=self.endpoint_classes, all_apart=self.per_endpoint_class,
                          apart=apart)


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
    # Where a 2xx names the changed record's new last-modified time (the read-back's
    # ``updated_at``, same format). Declaring it says the provider gives every change of
    # a record a strictly later time, so a read-back that still shows this time proves a
    # later dispatch was not applied (daemon/core/effects.py: reconcile). None: not said.
    updated_at: Pointer | None = None


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
    # The provider's quota dimensions: every call of every operation counts against each
    # (a dimension limited to some endpoint classes: the calls of those classes).
    quotas: tuple[QuotaDimension, ...] = ()
    # Which group of the provider's endpoints this call belongs to ("": none), and every
    # class the provider's L1 declares (what an L2 override may name).
    endpoint_class: str = ""
    provider_classes: frozenset[str] = frozenset()
    # Seconds the provider's servers keep an idle kept-alive connection open (the
    # provider's top-level ``keep_alive``; None: not declared). Our pooled connections to
    # it expire well before (daemon/providers/executor.py, keepalive_below).
    keep_alive_s: float | None = None

    @property
    def method(self) -> str:
        return self.request.method


_OPERATION_KEYS = frozenset({
    "intent_kinds", "local_object", "remote_object", "allowed_fields", "command_fields",
    "accepted_statuses", "not_applied_statuses", "rejected_statuses", "replay_safe",
    "replay_proof", "default_retry_after", "max_in_flight", "max_clock_skew", "request",
    "response", "read", "endpoint_class",
})
_REPLAY_PROOF_KEYS = frozenset({"idempotency_header", "key_retention"})
_REQUEST_KEYS = frozenset({"method", "path", "content_type", "auth", "body",
                           "idempotency_header"})
_RESPONSE_KEYS = frozenset({"identity", "evidence_headers", "evidence_fields", "updated_at"})
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


# An operation's declared status semantics: three disjoint sets, each a list of
# status codes (429) and status classes ("4xx"). An exact code wins over a class
# ("4xx" in rejected_statuses with 429 in not_applied_statuses rejects every 4xx
# but 429); the same code, or the same class, in two sets is an error. Each set is
# required (an empty list says "none"): what a status means is the operation's
# contract, and L0 assumes no meaning for any status, not even a 429 (seed 6, 8).
_STATUS_SETS: tuple[str, ...] = ("accepted_statuses", "not_applied_statuses",
                                 "rejected_statuses")
_STATUS_CLASS = re.compile(r"^[1-5]xx$")


def _status_entries(key: str, value: Any) -> tuple[set[int], set[int]]:
    """(exact codes, class digits) of one declared status set."""
    if not isinstance(value, list):
        raise CatalogError(key, 'expected a list of HTTP status codes (100-599) or classes'
                           ' such as "4xx"')
    codes: set[int] = set()
    classes: set[int] = set()
    for entry in value:
        if isinstance(entry, int) and not isinstance(entry, bool) and 100 <= entry <= 599:
            codes.add(entry)
        elif isinstance(entry, str) and _STATUS_CLASS.match(entry):
            classes.add(int(entry[0]))
        else:
            raise CatalogError(key, f"{entry!r} is not an HTTP status code (100-599) or a"
                               ' class such as "4xx"')
    return codes, classes


def _status_semantics(key: str, table: Mapping[str, Any]) -> dict[str, frozenset[int]]:
    for name in _STATUS_SETS:
        if name not in table:
            raise CatalogError(f"{key}.{name}", "missing: an operation declares what each"
                               " status means to it (accepted_statuses, not_applied_statuses,"
                               " rejected_statuses; [] for none); L0 assumes no meaning for"
                               " any status, a 429 included")
    declared = {name: _status_entries(f"{key}.{name}", table[name]) for name in _STATUS_SETS}
    exact: dict[int, str] = {}
    by_class: dict[int, str] = {}
    for name, (codes, classes) in declared.items():
        for code in sorted(codes):
            if code in exact:
                raise CatalogError(f"{key}.{name}", f"status {code} is also in"
                                   f" {exact[code]}: a status has one meaning")
            exact[code] = name
        for digit in sorted(classes):
            if digit in by_class:
                raise CatalogError(f"{key}.{name}", f"status class {digit}xx is also in"
                                   f" {by_class[digit]}: a status has one meaning")
            by_class[digit] = name
    out: dict[str, frozenset[int]] = {}
    for name, (codes, classes) in declared.items():
        implied = {s for d in classes for s in range(d * 100, d * 100 + 100) if s not in exact}
        out[name] = frozenset(codes | implied)
    return out


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
        updated_at=_pointer(key, table, "updated_at", required=False),
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
               schemes: Mapping[str, AuthScheme],
               classes: frozenset[str] = frozenset()) -> OperationDefinition:
    key = f"providers.{provider}.operations.{name}"
    table = _table(key, raw, _OPERATION_KEYS)
    endpoint_class = table.get("endpoint_class", "")
    if endpoint_class != "" and endpoint_class not in classes:
        raise CatalogError(f"{key}.endpoint_class", _unknown_class(endpoint_class, classes))
    if "request" not in table:
        raise CatalogError(f"{key}.request", "missing")
    request = _request(f"{key}.request", table["request"], schemes)
    kinds = _strings(f"{key}.intent_kinds", _req(key, table, "intent_kinds", list))
    command_fields = _pointer(key, table, "command_fields", required=True)
    assert command_fields is not None
    read = None
    if "read" in table:
        read = _read(f"{key}.read", table["read"], request.auth, schemes)
    statuses = _status_semantics(key, table)
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
            accepted_statuses=statuses["accepted_statuses"],
            not_applied_statuses=statuses["not_applied_statuses"],
            rejected_statuses=statuses["rejected_statuses"],
            replay=_replay_proof(key, table, request),
            default_retry_after_s=_number(key, table, "default_retry_after", 5.0),
            max_in_flight_s=_number(key, table, "max_in_flight", 30.0),
            max_clock_skew_s=_number(key, table, "max_clock_skew", 2.0),
        ),
        read=read,
        endpoint_class=endpoint_class,
        provider_classes=classes,
    )


def _unknown_class(name: object, classes: frozenset[str]) -> str:
    return (f"unknown endpoint class {name!r} (the provider's endpoint_classes:"
            f" {', '.join(sorted(classes)) or 'none'})")


def _keep_alive(provider: str, raw: Any) -> float:
    """The top-level ``keep_alive``: seconds the provider keeps an idle connection open."""
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 1 <= raw <= 3600:
        raise CatalogError(f"providers.{provider}.keep_alive",
                           "expected seconds from 1 to 3600 (how long the provider keeps an"
                           " idle connection open)")
    return float(raw)


def _endpoint_classes(provider: str, raw: Any) -> frozenset[str]:
    """The top-level ``endpoint_classes``: the groups of endpoints the provider limits."""
    key = f"providers.{provider}.endpoint_classes"
    names = _strings(key, raw)
    for n in names:
        if not _CLASS_NAME.fullmatch(n):
            raise CatalogError(key, f"{n!r}: expected a lower-case name ([a-z][a-z0-9_]*)")
    if len(set(names)) != len(names):
        raise CatalogError(key, "a class is named twice")
    return frozenset(names)


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise CatalogError(key, "expected true or false")
    return value


def _replay_proof(key: str, table: Mapping[str, Any],
                  request: RequestDefinition) -> ReplayProof | None:
    """``replay_safe = true`` is a claim; ``[operations."<op>".replay_proof]`` is the
    mechanism that proves it, which L0 checks on every exchange: the idempotency
    header the provider honours (the request must carry it) and how long it honours
    a key. A claim without its mechanism, or a mechanism without the claim, is an
    error naming the key."""
    claimed = _bool(f"{key}.replay_safe", table.get("replay_safe", False))
    if "replay_proof" not in table:
        if claimed:
            raise CatalogError(f"{key}.replay_safe", "claims replay safety without a"
                               " mechanism L0 can check: declare replay_proof with the"
                               " idempotency_header the provider honours and its"
                               " key_retention (seconds)")
        return None
    where = f"{key}.replay_proof"
    proof = _table(where, table["replay_proof"], _REPLAY_PROOF_KEYS)
    if not claimed:
        raise CatalogError(where, "a replay proof without replay_safe = true: declare"
                           " both, or neither")
    header = _req(where, proof, "idempotency_header", str)
    if not _TOKEN.match(header):
        raise CatalogError(f"{where}.idempotency_header", "expected an HTTP header name")
    if request.idempotency_header.lower() != header.lower():
        raise CatalogError(f"{key}.request.idempotency_header", f"the replay proof names"
                           f" {header}; the request must carry the command's idempotency"
                           f" key in it (it carries {request.idempotency_header or 'none'})")
    retention = proof.get("key_retention")
    if not isinstance(retention, int | float) or isinstance(retention, bool) \
            or retention <= 0:
        raise CatalogError(f"{where}.key_retention", "expected a positive number of seconds"
                           " (how long the provider honours an idempotency key)")
    return ReplayProof(header=header, retention_s=float(retention))


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
    unknown = sorted(set(doc) - {"provider", "auth", "operations", "resources", "quota",
                                 "webhooks", "endpoint_classes", "keep_alive"})
    if unknown:
        raise CatalogError(f"providers.{provider}.{unknown[0]}", "unknown key")
    schemes = _auth_schemes(provider, doc.get("auth", {}))
    classes = (_endpoint_classes(provider, doc["endpoint_classes"])
               if "endpoint_classes" in doc else frozenset())
    quotas = _quotas(provider, doc.get("quota", {}), classes)
    keep_alive = (_keep_alive(provider, doc["keep_alive"]) if "keep_alive" in doc else None)
    operations = _table(f"providers.{provider}.operations", doc.get("operations", {}))
    parse_resources(doc)  # a bad resource is an error of this document too
    return {name: attrs.evolve(_operation(provider, name, table, schemes, classes),
                               quotas=quotas, keep_alive_s=keep_alive)
            for name, table in operations.items()}


# ---- L1 resources: what a provider's record is, how to read one and how to list them ----

EVENT_KINDS = frozenset({"created", "updated", "destroyed"})
ID_KINDS = frozenset({"integer", "string"})
_RESOURCE_KEYS = frozenset({"type", "id_kind", "fields", "events", "get", "list"})
_GET_KEYS = frozenset({"method", "path", "auth", "accept", "attributes", "id", "updated_at",
                       "absent_statuses"})
_LIST_KEYS = frozenset({"method", "path", "auth", "accept", "items", "item_id",
                        "item_attributes", "item_updated_at", "next", "since_param",
                        "since_format", "query", "page_size_param", "page_size",
                        "max_page_size"})


@attrs.frozen(kw_only=True)
class ResourceGet:
    """Read one record: its attributes, id and last-modified time (JSON pointers)."""

    method: str
    path: PathTemplate
    auth: AuthScheme
    accept: str
    attributes: Pointer
    id: Pointer
    updated_at: Pointer
    absent_statuses: frozenset[int]


@attrs.frozen(kw_only=True)
class ResourceList:
    """List records changed since a time, oldest first, one page after another.

    The request is ``path?<since_param>=<since_format with {since}>&<query>&
    <page_size_param>=<n>``; each page holds its records at ``items`` and the next page's
    absolute URL at ``next`` (absent or null on the last page).
    """

    method: str
    path: str
    auth: AuthScheme
    accept: str
    items: Pointer
    item_id: Pointer
    item_attributes: Pointer
    item_updated_at: Pointer
    next: Pointer
    since_param: str
    since_format: str
    query: tuple[tuple[str, str], ...]
    page_size_param: str
    page_size: int
    max_page_size: int


@attrs.frozen(kw_only=True)
class ResourceDefinition:
    """One remote record type (``[resources.<name>]`` of an L1 document)."""

    name: str
    provider: str
    type: str  # the provider's type name on the wire (a JSON:API ``type``)
    id_kind: str  # "integer" or "string": how the wire spells an id
    fields: frozenset[str]  # every attribute an L2 binding may map
    events: tuple[tuple[str, str], ...]  # (provider event name, one of EVENT_KINDS)
    get: ResourceGet
    list: ResourceList | None = None

    def event_kind(self, event_name: str) -> str | None:
        return dict(self.events).get(event_name)


def _media(key: str, value: Any) -> str:
    if not isinstance(value, str) or not _MEDIA_TYPE.match(value):
        raise CatalogError(key, "expected a media type such as application/json")
    return value


def _required_pointer(key: str, table: Mapping[str, Any], name: str) -> Pointer:
    pointer = _pointer(key, table, name, required=True)
    assert pointer is not None
    return pointer


def _resource_get(key: str, raw: Any, schemes: Mapping[str, AuthScheme]) -> ResourceGet:
    table = _table(key, raw, _GET_KEYS)
    return ResourceGet(
        method=_method(key, table),
        path=_compiled(f"{key}.path", PathTemplate.compile, _req(key, table, "path", str)),
        auth=_auth_ref(key, table, schemes),
        accept=_media(f"{key}.accept", table.get("accept", "application/json")),
        attributes=_required_pointer(key, table, "attributes"),
        id=_required_pointer(key, table, "id"),
        updated_at=_required_pointer(key, table, "updated_at"),
        absent_statuses=_statuses(f"{key}.absent_statuses",
                                  table.get("absent_statuses", [404])),
    )


def _positive_int(key: str, table: Mapping[str, Any], name: str, default: int) -> int:
    value = table.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise CatalogError(f"{key}.{name}", "expected a positive integer")
    return value


def _resource_list(key: str, raw: Any, schemes: Mapping[str, AuthScheme]) -> ResourceList:
    table = _table(key, raw, _LIST_KEYS)
    path = _req(key, table, "path", str)
    if not path.startswith("/") or "{" in path or "?" in path:
        raise CatalogError(f"{key}.path", "expected a plain path starting with / (the query"
                           " comes from since_param, query and page_size_param)")
    since_format = table.get("since_format", "{since}")
    if not isinstance(since_format, str) or since_format.count("{since}") != 1 or (
            since_format.replace("{since}", "").count("{")):
        raise CatalogError(f"{key}.since_format", "expected text holding {since} once")
    query_raw = _table(f"{key}.query", table.get("query", {}))
    for name, value in query_raw.items():
        if not isinstance(value, str):
            raise CatalogError(f"{key}.query.{name}", "expected a string")
    page_size = _positive_int(key, table, "page_size", 50)
    max_page_size = _positive_int(key, table, "max_page_size", page_size)
    if page_size > max_page_size:
        raise CatalogError(f"{key}.page_size", f"{page_size} is above max_page_size"
                           f" {max_page_size}")
    return ResourceList(
        method=_method(key, table),
        path=path,
        auth=_auth_ref(key, table, schemes),
        accept=_media(f"{key}.accept", table.get("accept", "application/json")),
        items=_required_pointer(key, table, "items"),
        item_id=_required_pointer(key, table, "item_id"),
        item_attributes=_required_pointer(key, table, "item_attributes"),
        item_updated_at=_required_pointer(key, table, "item_updated_at"),
        next=_required_pointer(key, table, "next"),
        since_param=_req(key, table, "since_param", str),
        since_format=since_format,
        query=tuple(sorted(query_raw.items())),
        page_size_param=_req(key, table, "page_size_param", str),
        page_size=page_size,
        max_page_size=max_page_size,
    )


def _resource(provider: str, name: str, raw: Any,
              schemes: Mapping[str, AuthScheme]) -> ResourceDefinition:
    key = f"providers.{provider}.resources.{name}"
    table = _table(key, raw, _RESOURCE_KEYS)
    id_kind = table.get("id_kind", "string")
    if id_kind not in ID_KINDS:
        raise CatalogError(f"{key}.id_kind", f"expected one of {', '.join(sorted(ID_KINDS))}")
    events_raw = _table(f"{key}.events", table.get("events", {}))
    for event, kind in events_raw.items():
        if kind not in EVENT_KINDS:
            raise CatalogError(f"{key}.events.{event}",
                               f"expected one of {', '.join(sorted(EVENT_KINDS))}")
    if "get" not in table:
        raise CatalogError(f"{key}.get", "missing")
    return ResourceDefinition(
        name=name,
        provider=provider,
        type=_req(key, table, "type", str),
        id_kind=str(id_kind),
        fields=frozenset(_strings(f"{key}.fields", _req(key, table, "fields", list))),
        events=tuple(sorted(events_raw.items())),
        get=_resource_get(f"{key}.get", table["get"], schemes),
        list=_resource_list(f"{key}.list", table["list"], schemes) if "list" in table
        else None,
    )


def parse_resources(doc: Mapping[str, Any]) -> dict[str, ResourceDefinition]:
    """Every ``[resources.<name>]`` of one (already checked) provider document (pure)."""
    provider = str(doc.get("provider"))
    schemes = _auth_schemes(provider, doc.get("auth", {}))
    resources = _table(f"providers.{provider}.resources", doc.get("resources", {}))
    return {name: _resource(provider, name, table, schemes)
            for name, table in resources.items()}


# ---- L2 object bindings: a local object bound to one remote resource, field by field ----

DIRECTIONS = ("inbound", "outbound")
_OBJECT_BINDING_KEYS = frozenset({"name", "provider", "resource", "local_object",
                                  "inbound", "outbound", "match", "reconcile"})
_RECONCILE_KEYS = frozenset({"interval", "overlap", "safety_lag", "page_size"})


@attrs.frozen(kw_only=True)
class ReconcilePolicy:
    """L2 operational policy of cursor reconciliation for one object binding (seconds)."""

    interval_s: float = 300.0  # between incremental runs
    overlap_s: float = 120.0  # each run re-lists this far behind the cursor
    safety_lag_s: float = 30.0  # records newer than now - lag wait for the next run
    page_size: int = 0  # 0: the L1 list definition's page_size


@attrs.frozen(kw_only=True)
class FieldMapping:
    """One mapped field and the one direction that owns it (no last-writer-wins field)."""

    remote: str
    local: str
    direction: str  # "inbound": the provider owns it; "outbound": the local side owns it


@attrs.frozen(kw_only=True)
class ObjectBinding:
    """An L2 object binding: which local object mirrors which remote resource, and which
    side owns each mapped field. ``match`` names the one (remote, local) field pair used to
    find the local record of a remote record created with no link (see
    docs/inbound-flow.md); empty: such a record is a reconciliation item."""

    name: str
    provider: str
    resource: str
    local_object: str
    fields: tuple[FieldMapping, ...]
    match: tuple[str, str] | None = None
    reconcile: ReconcilePolicy = ReconcilePolicy()

    def owned(self, direction: str) -> tuple[FieldMapping, ...]:
        return tuple(f for f in self.fields if f.direction == direction)

    def inbound_remote(self) -> dict[str, str]:
        """remote attribute -> local field, for the inbound-owned fields only."""
        return {f.remote: f.local for f in self.fields if f.direction == "inbound"}


def _field_names(key: str, raw: Any) -> dict[str, str]:
    table = _table(key, raw)
    for name, value in table.items():
        if not isinstance(value, str) or not value:
            raise CatalogError(f"{key}.{name}", "expected the local field name")
    return dict(table)


def parse_object_binding(doc: Mapping[str, Any], source: str = "",
                         resources: Mapping[str, ResourceDefinition] | None = None,
                         operations: Mapping[str, OperationDefinition] | None = None,
                         ) -> ObjectBinding:
    """One L2 object-binding document (pure). With ``resources`` (keyed
    ``<provider>.<resource>``) and ``operations``, every remote field must be one the L1
    resource declares and every outbound one must be writable by an operation of that
    provider on that resource; a field owned by both directions is an error either way."""
    name = doc.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise CatalogError(f"bindings/{source or '?'}.name",
                           "expected a lower-case object binding name")
    if source and source != f"{name}.toml":
        raise CatalogError(f"bindings/{source}", "name must match the file name")
    key = f"object_bindings.{name}"
    table = _table(key, doc, _OBJECT_BINDING_KEYS)
    provider = _req(key, table, "provider", str)
    resource_name = _req(key, table, "resource", str)
    local_object = _req(key, table, "local_object", str)
    resource = None
    if resources is not None:
        resource = resources.get(f"{provider}.{resource_name}")
        if resource is None:
            raise CatalogError(f"{key}.resource",
                               f"no L1 resource {resource_name!r} for provider {provider!r}")
    inbound = _field_names(f"{key}.inbound", table.get("inbound", {}))
    outbound = _field_names(f"{key}.outbound", table.get("outbound", {}))
    fields: list[FieldMapping] = []
    for direction, mapping in (("inbound", inbound), ("outbound", outbound)):
        other = outbound if direction == "inbound" else inbound
        for remote, local in sorted(mapping.items()):
            where = f"{key}.{direction}.{remote}"
            if remote in other:
                raise CatalogError(where, "mapped in both directions: one field has one"
                                   " owner (inbound or outbound)")
            if local in other.values():
                raise CatalogError(where, f"local field {local!r} is mapped in both"
                                   " directions")
            if resource is not None and remote not in resource.fields:
                raise CatalogError(where, f"unknown field of {provider}.{resource_name}"
                                   f" (declared: {', '.join(sorted(resource.fields))})")
            fields.append(FieldMapping(remote=remote, local=local, direction=direction))
    locals_ = [f.local for f in fields]
    duplicate = sorted({x for x in locals_ if locals_.count(x) > 1})
    if duplicate:
        raise CatalogError(f"{key}", f"local field {duplicate[0]!r} is mapped twice")
    if operations is not None:
        for mapping_ in (f for f in fields if f.direction == "outbound"):
            if not any(op.provider == provider and op.remote_object == resource_name
                       and mapping_.remote in op.allowed_fields for op in operations.values()):
                raise CatalogError(f"{key}.outbound.{mapping_.remote}",
                                   f"no {provider} operation on {resource_name} may write it")
    match = None
    if "match" in table:
        match_table = _table(f"{key}.match", table["match"], frozenset({"remote", "local"}))
        pair = (_req(f"{key}.match", match_table, "remote", str),
                _req(f"{key}.match", match_table, "local", str))
        if resource is not None and pair[0] not in resource.fields:
            raise CatalogError(f"{key}.match.remote", f"unknown field of {provider}."
                               f"{resource_name}")
        match = pair
    policy = ReconcilePolicy()
    if "reconcile" in table:
        rkey = f"{key}.reconcile"
        rtable = _table(rkey, table["reconcile"], _RECONCILE_KEYS)
        page_size = rtable.get("page_size", 0)
        if not isinstance(page_size, int) or isinstance(page_size, bool) or page_size < 0:
            raise CatalogError(f"{rkey}.page_size", "expected a non-negative integer")
        if resource is not None and resource.list is not None and (
                page_size > resource.list.max_page_size):
            raise CatalogError(f"{rkey}.page_size", f"{page_size} is above the L1"
                               f" max_page_size {resource.list.max_page_size}")
        policy = ReconcilePolicy(
            interval_s=_number(rkey, rtable, "interval", 300.0),
            overlap_s=_number(rkey, rtable, "overlap", 120.0),
            safety_lag_s=_number(rkey, rtable, "safety_lag", 30.0),
            page_size=page_size)
        if policy.interval_s <= 0:
            raise CatalogError(f"{rkey}.interval", "expected a positive number")
    return ObjectBinding(name=name, provider=provider, resource=resource_name,
                         local_object=local_object, fields=tuple(fields), match=match,
                         reconcile=policy)


def _quotas(provider: str, raw: Any,
            classes: frozenset[str] = frozenset()) -> tuple[QuotaDimension, ...]:
    """``[quota.<name>]`` tables: ``limit`` (a positive integer), ``window`` (seconds,
    positive), ``scope``, ``kind``, ``burst``, ``offset``, ``remaining_header``,
    ``reset_header`` with ``reset_format``, ``endpoint_classes`` (of the provider's
    declared ``classes``), ``per_endpoint_class``. A zero or negative limit could never
    be enforced: refused, as is any policy the schedule could not keep
    (daemon/core/quota.py decides)."""
    out = []
    for name, fields in _table(f"providers.{provider}.quota", raw).items():
        key = f"providers.{provider}.quota.{name}"
        table = _table(key, fields, frozenset({"limit", "window", "scope", "kind", "burst",
                                               "offset", "jitter", "remaining_header",
                                               "reset_header", "reset_format",
                                               "endpoint_classes", "per_endpoint_class"}))
        limit = _req(key, table, "limit", int)
        if isinstance(limit, bool) or limit <= 0:
            raise CatalogError(f"{key}.limit", f"must be a positive integer, got {limit}")
        window = table.get("window")
        if not isinstance(window, int | float) or isinstance(window, bool) or window <= 0:
            raise CatalogError(f"{key}.window", "expected a positive number of seconds")
        scope = table.get("scope", "app_installation")
        if scope not in QUOTA_SCOPES:
            raise CatalogError(f"{key}.scope", f"expected one of {', '.join(QUOTA_SCOPES)}")
        kind = table.get("kind", "sliding")
        if kind not in QUOTA_KINDS:
            raise CatalogError(f"{key}.kind", f"expected one of {', '.join(QUOTA_KINDS)}")
        burst = table.get("burst", limit if kind == "fixed" else 1)
        if isinstance(burst, bool) or not isinstance(burst, int) or not 1 <= burst <= limit:
            raise CatalogError(f"{key}.burst", f"expected an integer from 1 to the limit"
                               f" ({limit}), got {burst!r}")
        offset = table.get("offset", 0.0)
        if not isinstance(offset, int | float) or isinstance(offset, bool) or offset < 0:
            raise CatalogError(f"{key}.offset", "expected a non-negative number of seconds")
        jitter = table.get("jitter", 0.25)
        if not isinstance(jitter, int | float) or isinstance(jitter, bool) or jitter < 0:
            raise CatalogError(f"{key}.jitter", "expected a non-negative number of seconds")
        header = table.get("remaining_header", "")
        if not isinstance(header, str):
            raise CatalogError(f"{key}.remaining_header", "expected a header name")
        reset_header = table.get("reset_header", "")
        if not isinstance(reset_header, str) or (reset_header and not _TOKEN.match(reset_header)):
            raise CatalogError(f"{key}.reset_header", "expected a header name")
        reset_format = table.get("reset_format", "")
        if reset_header and reset_format not in RESET_FORMATS:
            raise CatalogError(f"{key}.reset_format", f"expected one of"
                               f" {', '.join(RESET_FORMATS)}, got {reset_format!r}")
        if reset_format and not reset_header:
            raise CatalogError(f"{key}.reset_format", "names the format of no reset_header")
        only = table.get("endpoint_classes", [])
        if "endpoint_classes" in table:
            _strings(f"{key}.endpoint_classes", only)
        for cls in only:
            if cls not in classes:
                raise CatalogError(f"{key}.endpoint_classes", _unknown_class(cls, classes))
        apart = table.get("per_endpoint_class", False)
        if not isinstance(apart, bool):
            raise CatalogError(f"{key}.per_endpoint_class", "expected true or false")
        dim = QuotaDimension(name=name, limit=limit, window_s=float(window), scope=scope,
                             kind=kind, burst=burst, offset_s=float(offset),
                             jitter_s=float(jitter), remaining_header=header.lower(),
                             reset_header=reset_header.lower(), reset_format=reset_format,
                             endpoint_classes=frozenset(only), per_endpoint_class=apart)
        try:
            policy_of(dim)
        except QuotaPolicyError as exc:
            raise CatalogError(key, str(exc)) from None
        out.append(dim)
    # By name: a stored Catalog revision's content (canonical JSON, keys sorted) parses
    # back to the same tuple as the TOML file it came from.
    return tuple(sorted(out, key=lambda d: d.name))


def policy_of(dim: QuotaDimension, clock_spread_us: int = 0) -> QuotaPolicy:
    """The schedule's policy for one L1 dimension, on replicas whose clocks may be
    ``clock_spread_us`` apart (``work.clock_spread``)."""
    return QuotaPolicy(limit=dim.limit, window_us=int(dim.window_s * 1_000_000),
                       jitter_us=int(dim.jitter_s * 1_000_000),
                       clock_spread_us=clock_spread_us, kind=WindowKind(dim.kind),
                       burst=dim.burst if dim.kind == "sliding" else 1,
                       offset_us=int(dim.offset_s * 1_000_000))


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
    # How many times, and how far apart, the provider sends a delivery again (0: not
    # declared). Their product with the response window bounds how long after its first
    # sending a delivery can still arrive: the window a retired secret must stay quiet
    # for before the verifier stops accepting it (docs/subscriptions.md).
    redelivery_attempts: int = 0
    redelivery_interval_s: float = 0.0
    # How integrationd subscribes a route to these deliveries (None: an operator does).
    subscription: SubscriptionDefinition | None = None

    def redelivery_window_s(self) -> float | None:
        """Seconds after a delivery's first sending within which a copy of it may still
        arrive (every attempt waiting the response window, then the interval); None when
        L1 does not declare the redelivery schedule."""
        if self.redelivery_attempts <= 0:
            return None
        return (self.redelivery_attempts + 1) * self.response_window_s + (
            self.redelivery_attempts * self.redelivery_interval_s)


_WEBHOOK_KEYS = frozenset({"content_types", "payload_version", "response_window",
                           "redelivery", "redelivery_attempts", "redelivery_interval",
                           "signature", "payload", "subscription"})
_SIGNATURE_KEYS = frozenset({"header", "algorithm", "encoding", "signed", "timestamp_header",
                             "timestamp_unit", "tolerance"})
_PAYLOAD_KEYS = frozenset({"format", "batch", "event_name", "resource_type", "resource_id",
                           "delivered_at", "attributes", "updated_at", "events",
                           "delivery_id_header", "delivery_id_stable", "max_depth",
                           "resource_type_fixed", "event_identity", "attempt_fields"})


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
    for name in ("event_identity", "attempt_fields"):
        if name in table:
            kwargs[name] = _strings(f"{key}.{name}", table[name])
    for event, kind in events.items():
        if not isinstance(kind, str):
            raise CatalogError(f"{key}.events.{event}", "expected created, updated or"
                               " destroyed")
    try:
        return PayloadSpec(events=dict(events), **kwargs)
    except BadPayloadSpec as exc:
        field, _, message = str(exc).partition(": ")
        raise CatalogError(f"{key}.{field}", message) from None


def _webhook(provider: str, name: str, raw: Any,
             schemes: Mapping[str, AuthScheme] | None = None) -> WebhookDefinition:
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
    attempts = table.get("redelivery_attempts", 0)
    if not isinstance(attempts, int) or isinstance(attempts, bool) or not 0 <= attempts <= 100:
        raise CatalogError(f"{key}.redelivery_attempts", "expected an integer from 0 to 100")
    interval = _number(key, table, "redelivery_interval", 0.0)
    if interval < 0 or (attempts > 0) != ("redelivery_interval" in table):
        raise CatalogError(f"{key}.redelivery_interval", "expected a non-negative number of"
                           " seconds, given exactly when redelivery_attempts is")
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
        redelivery_attempts=attempts, redelivery_interval_s=interval,
        subscription=None if "subscription" not in table else parse_subscription(
            f"{key}.subscription", table["subscription"], schemes or {}),
    )


def parse_webhooks(doc: Mapping[str, Any]) -> dict[str, WebhookDefinition]:
    """Every webhook route contract of one provider document (``[webhooks."<name>"]``),
    validated (pure). Call :func:`parse_provider` first: it checks the document's shape."""
    provider = str(doc.get("provider"))
    webhooks = _table(f"providers.{provider}.webhooks", doc.get("webhooks", {}))
    schemes = _auth_schemes(provider, doc.get("auth", {}))
    return {name: _webhook(provider, name, table, schemes) for name, table in webhooks.items()}

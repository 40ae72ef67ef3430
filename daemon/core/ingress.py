"""Webhook ingress decisions (pure): the dedup identity of a delivery, and a receipt's
body -> the events it carries, or why it is quarantined.

Theory of operation
-------------------
Ingress keeps every verified delivery as an ``IngressReceipt`` before it answers 200;
the materializer later turns one receipt into its ``NormalizedEvent`` values. Both steps
use the L1 route contract's :class:`PayloadSpec` (where the event name, the resource
type and id, the delivered-at value and the attributes are: RFC 6901 pointers).

Dedup identity (seed 7, :func:`dedup_key`): the provider's delivery id only when L1
declares it *stable across redeliveries*; else, when L1 declares a per-event identity
(``event_identity``: pointers whose values name one event across redeliveries), a digest
over the route, the subscription generation and the sorted set of the delivery's event
identities; otherwise a digest over the subscription generation, event name, resource
type, resource id, delivered-at value and the SHA-256 of the raw body. A redelivery with
a new per-request id, or with per-attempt fields changed (``attempt_fields``: a batch
provider that counts its attempts in every event), therefore collapses to the same key.
The key is computed from a best-effort read of the body (:func:`identity_fields`,
:func:`delivery_identities`): a body that is not JSON, or an event without its identity,
falls back to the raw hash, which still tells it apart (the receipt is kept either way;
the materializer then quarantines an event without its identity, ``missing_field``).

Event identity (:func:`event_key`): a route that declares ``event_identity`` gives every
event a key over the route, the subscription generation and the event's identity; the
materializer keeps one event per key, so a re-batched delivery that repeats events
already received creates only the new ones (the others are counted as duplicate events).

Normalization (:func:`normalize`) is strict, and everything it refuses has a stable
reason, so a quarantined receipt says why: ``not_utf8``, ``malformed``, ``too_deep``,
``duplicate_keys``, ``not_jsonapi``, ``unknown_event``, ``missing_field``,
``unsupported_number`` (a number, integer or not, whose exact decimal text would be longer
than :data:`~daemon.core.json_input.MAX_DECIMAL_CHARS`), ``not_utf8`` also for a lone
UTF-16 surrogate escape in a string or key (it has no UTF-8 form), ``control_character``
for a NUL (``\\u0000``) in a string or key (never stored nor applied to a record). A
fractional number is kept as its exact decimal text, a string: the InboundChange payload
is canonical JSON, which has no floats (amounts travel as strings or integers). A batch
route (a JSON array of events) yields one event per element.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from typing import Any, Final

import attrs
import jsonpointer

from daemon.core.json_input import MAX_DECIMAL_CHARS, MAX_DEPTH, NotExact, decimal_text, depth

KEY_PREFIX: Final = "wh"
QUARANTINE_REASONS: Final = frozenset({
    "not_utf8", "malformed", "too_deep", "duplicate_keys", "not_jsonapi", "unknown_event",
    "missing_field", "unsupported_number", "too_many_events",
    # Settling, not normalizing: a row of its events/WorkItems the database cannot take
    # (larger than one statement may be; a value the server refuses).
    "too_large_to_store", "refused_by_database", "control_character",
})
# One sentence per reason (the console's legend; each quarantine's own detail says more).
QUARANTINE_SENTENCES: Final = {
    "not_utf8": "the body is not valid UTF-8",
    "malformed": "the body is not one JSON document",
    "too_deep": "the JSON nests deeper than the limit",
    "duplicate_keys": "a JSON object repeats a key",
    "not_jsonapi": "the body is not the JSON:API document the route's contract declares",
    "unknown_event": "the event name is not one the route's contract maps",
    "missing_field": "a field the route's contract requires is missing or of the wrong type",
    "unsupported_number": "a number is longer than its exact decimal text may be",
    "control_character": "a string or key holds a NUL character (\\u0000)",
    "too_many_events": "the batch holds more events than the limit",
    "too_large_to_store": "one of its rows is larger than the database takes in one"
                          " statement (max_allowed_packet)",
    "refused_by_database": "the database refused a value of its events or WorkItems",
}
# Why a settlement left receipts ``received`` (integrationd_ingress_unsettled{reason}),
# each with what it means, for the console.
UNSETTLED_SENTENCES: Final = {
    "database_unavailable": "the database did not answer (they are settled once it does)",
    "commit_unknown": "the connection was lost during COMMIT (the next pass finds out)",
    "contention": "other transactions kept conflicting with the settlement",
    "storage_error": "the database failed the settlement with an error of its own",
}
UNSETTLED_REASONS: Final = tuple(UNSETTLED_SENTENCES)
FORMATS: Final = frozenset({"jsonapi", "json"})
MAX_BATCH_EVENTS: Final = 1000


class BadPayloadSpec(ValueError):
    """An L1 payload contract that cannot be used (names the field)."""


def _check_pointer(name: str, text: str) -> None:
    try:
        jsonpointer.JsonPointer(text)
    except jsonpointer.JsonPointerException:
        raise BadPayloadSpec(f"{name}: malformed JSON pointer {text!r}") from None


def _within(inner: str, outer: str) -> bool:
    """Whether pointer ``inner`` names ``outer`` or something inside it."""
    return inner == outer or inner.startswith(outer + "/")


def _check_event_pointers(name: str, pointers: tuple[str, ...]) -> None:
    for text in pointers:
        if not text:
            raise BadPayloadSpec(f"{name}: the empty pointer names the whole event, not one"
                                 " field of it")
        _check_pointer(name, text)
    if len(set(pointers)) != len(pointers):
        raise BadPayloadSpec(f"{name}: a pointer is listed twice")


@attrs.frozen(kw_only=True)
class PayloadSpec:
    """Where one provider's webhook body holds what the materializer needs (L1 data)."""

    format: str = "jsonapi"           # jsonapi: data.type/data.id must be present
    batch: bool = False               # the body is a JSON array of events
    event_name: str = "/meta/eventName"
    resource_type: str = "/data/type"
    resource_id: str = "/data/id"
    delivered_at: str = "/meta/deliveredAt"
    attributes: str = "/data/attributes"  # "" = the events carry no attributes
    updated_at: str = ""              # "" = not carried
    # A resource type every event of the route has (when the body does not name one).
    resource_type_fixed: str = ""
    # event name -> InboundChange kind (created | updated | destroyed)
    events: Mapping[str, str] = attrs.field(factory=dict)
    # The provider's delivery id header, and whether a redelivery repeats it.
    delivery_id_header: str = ""
    delivery_id_stable: bool = False
    # Per event: the pointers whose values together identify one event across
    # redeliveries (a batch provider's event id); () = the route declares none.
    event_identity: tuple[str, ...] = ()
    # Per event: the pointers whose values change from one delivery attempt to the next
    # (an attempt counter). Never part of the identity; a route declaring them needs one.
    attempt_fields: tuple[str, ...] = ()
    max_depth: int = MAX_DEPTH

    def __attrs_post_init__(self) -> None:
        if self.format not in FORMATS:
            raise BadPayloadSpec(f"format: {self.format!r} is not one of {sorted(FORMATS)}")
        for name in ("event_name", "resource_type", "resource_id", "delivered_at",
                     "attributes", "updated_at"):
            if getattr(self, name):
                _check_pointer(name, getattr(self, name))
        for name in ("event_name", "resource_id", "delivered_at"):
            if not getattr(self, name):
                raise BadPayloadSpec(f"{name}: required")
        if not self.resource_type and not self.resource_type_fixed:
            raise BadPayloadSpec("resource_type: required (or resource_type_fixed)")
        if not self.events:
            raise BadPayloadSpec("events: expected at least one event name")
        for event, kind in self.events.items():
            if kind not in ("created", "updated", "destroyed"):
                raise BadPayloadSpec(f"events.{event}: {kind!r} is not created, updated or"
                                     " destroyed")
        if self.delivery_id_stable and not self.delivery_id_header:
            raise BadPayloadSpec("delivery_id_stable: needs delivery_id_header")
        _check_event_pointers("event_identity", self.event_identity)
        _check_event_pointers("attempt_fields", self.attempt_fields)
        for identity in self.event_identity:
            for attempt in self.attempt_fields:
                if _within(identity, attempt) or _within(attempt, identity):
                    raise BadPayloadSpec(f"event_identity: {identity} changes per attempt"
                                         f" (attempt_fields lists {attempt})")
        if self.attempt_fields and not self.event_identity and not self.delivery_id_stable:
            raise BadPayloadSpec("attempt_fields: events that change per attempt need"
                                 " event_identity (a redelivery would never be recognised)")


@attrs.frozen
class IdentityFields:
    event_name: str = ""
    resource_type: str = ""
    resource_id: str = ""
    delivered_at: str = ""


@attrs.frozen(kw_only=True)
class EventDraft:
    """One event a receipt carries, before it is a stored NormalizedEvent."""

    index: int
    event_name: str
    kind: str
    resource_type: str
    resource_id: str
    delivered_at: str
    attributes: dict[str, Any]
    remote_updated_at: str | None
    # The values at the route's event_identity pointers; () when it declares none.
    identity: tuple[str, ...] = ()


@attrs.frozen
class Quarantine:
    reason: str     # one of QUARANTINE_REASONS
    detail: str     # one sentence; never payload values


class _DuplicateKey(ValueError):
    pass


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _exact(literal: str) -> str:
    try:
        return decimal_text(literal)
    except NotExact as exc:
        raise _Inexact(str(exc)) from None


class _Inexact(ValueError):
    pass


def _integer(literal: str) -> int:
    # Python's int() refuses more than 4,300 digits with a ValueError of its own (which
    # read as "malformed"); the documented bound is the exact text's length, as for
    # fractions.
    if len(literal) > MAX_DECIMAL_CHARS:
        raise _Inexact(f"an integer of {len(literal)} characters")
    return int(literal)


def _strings(value: Any) -> Iterator[str]:
    """Every string of ``value``, object keys included, without recursion."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            yield from item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _text_problem(value: Any) -> Quarantine | None:
    """A string that is not text the Flow may apply: a lone UTF-16 surrogate (only a
    ``\\uD800``-``\\uDFFF`` escape makes one: it has no UTF-8 form, so the body is
    not UTF-8 text in effect) or a NUL (only ``\\u0000`` makes one: the CRM's records
    and most stores treat it as an end of string, so it is never applied)."""
    for text in _strings(value):
        if "\x00" in text:
            return Quarantine("control_character",
                              "a string in the body holds a NUL character (\\u0000)")
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                return Quarantine("not_utf8", "a string in the body holds a lone UTF-16"
                                  " surrogate escape, which is not text")
    return None


def parse_body(raw: bytes, max_depth: int = MAX_DEPTH) -> Any | Quarantine:
    """The JSON value of a webhook body, or why it is refused (strict: UTF-8, no
    duplicate keys, bounded nesting, no lone surrogate and no NUL in any string or key;
    a fractional number becomes its exact decimal text,
    :func:`daemon.core.json_input.decimal_text`; a number, integer or not, whose exact
    text is longer than :data:`MAX_DECIMAL_CHARS` is ``unsupported_number``)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return Quarantine("not_utf8", "the body is not valid UTF-8")
    try:
        value = json.loads(text, object_pairs_hook=_pairs, parse_constant=_refuse_constant,
                           parse_float=_exact, parse_int=_integer)
    except _DuplicateKey:
        return Quarantine("duplicate_keys", "an object in the body repeats a key")
    except _Inexact:
        return Quarantine("unsupported_number",
                          "the body holds a number too long to write out exactly")
    except RecursionError:
        return Quarantine("too_deep", f"the body nests deeper than {max_depth} levels")
    except ValueError:
        return Quarantine("malformed", "the body is not valid JSON")
    if depth(value) > max_depth:
        return Quarantine("too_deep", f"the body nests deeper than {max_depth} levels")
    # Both come only from a \\u escape (raw bytes that are not UTF-8 fail the decode, and
    # JSON refuses a raw control character in a string): most bodies need no walk.
    if "\\u" in text and (problem := _text_problem(value)) is not None:
        return problem
    return value


def _find(doc: Any, pointer: str) -> Any:
    try:
        return jsonpointer.resolve_pointer(doc, pointer, None)
    except (jsonpointer.JsonPointerException, TypeError):
        return None


def _text(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return ""
    if isinstance(value, int | str):
        return str(value)
    return ""


def identity_fields(spec: PayloadSpec, raw: bytes) -> IdentityFields:
    """Best-effort: what the dedup key needs, empty where the body does not say."""
    if spec.batch:
        # A batch is identified by its events' identities (delivery_identities) or,
        # when its route declares none, by its raw body (and generation): nothing here
        # needs parsing it.
        return IdentityFields()
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return IdentityFields()
    return IdentityFields(
        event_name=_text(_find(doc, spec.event_name)),
        resource_type=_resource_type(spec, doc),
        resource_id=_text(_find(doc, spec.resource_id)),
        delivered_at=_text(_find(doc, spec.delivered_at)),
    )


def _resource_type(spec: PayloadSpec, doc: Any) -> str:
    if spec.resource_type_fixed:
        return spec.resource_type_fixed
    return _text(_find(doc, spec.resource_type))


def event_identity(spec: PayloadSpec, event: Any) -> tuple[str, ...] | None:
    """The values at the route's ``event_identity`` pointers in one event (integers and
    strings, as text); None when one is missing or of another type: nothing then tells
    this event's redelivery apart from a new event."""
    values = tuple(_text(_find(event, pointer)) for pointer in spec.event_identity)
    return None if not all(values) else values


def delivery_identities(spec: PayloadSpec, raw: bytes) -> list[tuple[str, ...]] | None:
    """Best-effort: the identity of every event one body carries (read as strictly as
    :func:`normalize` reads it); None when the route declares none, the body cannot be
    read, or one event has no identity (the key then falls back to the raw body)."""
    if not spec.event_identity:
        return None
    doc = parse_body(raw, spec.max_depth)
    if isinstance(doc, Quarantine):
        return None
    events = doc if spec.batch else [doc]
    if not isinstance(events, list) or not events or len(events) > MAX_BATCH_EVENTS:
        return None
    identities = [event_identity(spec, e) for e in events]
    found = [i for i in identities if i is not None]
    return found if len(found) == len(identities) else None


def event_key(*, route: str, subscription_generation: int, identity: tuple[str, ...]) -> str:
    """The unique key of one event of a route that declares ``event_identity`` (at most
    100 characters): the same event in any later delivery, re-batched or not, has it."""
    material = ["event", route, str(subscription_generation), *identity]
    digest = hashlib.sha256(json.dumps(material).encode()).hexdigest()
    return f"ev:{route[:30]}:{digest}"


def dedup_key(spec: PayloadSpec, *, route: str, subscription_generation: int, raw: bytes,
              delivery_id: str = "") -> str:
    """The unique identity of one delivery (seed 7), at most 100 characters."""
    if spec.delivery_id_stable:
        if not delivery_id:
            raise ValueError("a stable delivery id was declared but none was supplied")
        material = ["id", str(subscription_generation), delivery_id]
    elif (identities := delivery_identities(spec, raw)) is not None:
        # The set of events, not the bytes: a redelivery whose per-attempt fields (or
        # whose order of events) changed is the same delivery.
        material = ["events", route, str(subscription_generation),
                    *sorted({json.dumps(list(i)) for i in identities})]
    else:
        fields = identity_fields(spec, raw)
        material = ["derived", str(subscription_generation), fields.event_name,
                    fields.resource_type, fields.resource_id, fields.delivered_at,
                    hashlib.sha256(raw).hexdigest()]
    digest = hashlib.sha256(json.dumps(material).encode()).hexdigest()
    return f"{KEY_PREFIX}:{route[:30]}:{digest}"


def _event(spec: PayloadSpec, doc: Any, index: int) -> EventDraft | Quarantine:
    where = f"event {index}: " if spec.batch else ""
    if not isinstance(doc, dict):
        return Quarantine("not_jsonapi" if spec.format == "jsonapi" else "malformed",
                          f"{where}the event is not a JSON object")
    if spec.format == "jsonapi":
        data = doc.get("data")
        if not isinstance(data, dict) or not isinstance(data.get("type"), str) or not (
                isinstance(data.get("id"), str | int) and not isinstance(data.get("id"), bool)):
            return Quarantine("not_jsonapi",
                              f"{where}the body has no JSON:API resource object"
                              " (data with type and id)")
    name = _find(doc, spec.event_name)
    if not isinstance(name, str) or not name:
        return Quarantine("missing_field", f"{where}no event name at {spec.event_name}")
    kind = spec.events.get(name)
    if kind is None:
        return Quarantine("unknown_event",
                          f"{where}event {name[:80]!r} is not declared for this route")
    values: dict[str, str] = {"resource_type": _resource_type(spec, doc)}
    if not values["resource_type"]:
        return Quarantine("missing_field", f"{where}no resource_type at {spec.resource_type}")
    for field in ("resource_id", "delivered_at"):
        pointer = getattr(spec, field)
        value = _text(_find(doc, pointer))
        if not value:
            return Quarantine("missing_field", f"{where}no {field} at {pointer}")
        values[field] = value
    attributes = _find(doc, spec.attributes) if spec.attributes else None
    if attributes is None:
        attributes = {}
    if not isinstance(attributes, dict):
        return Quarantine("missing_field", f"{where}the attributes at {spec.attributes}"
                          " are not an object")
    identity = event_identity(spec, doc) if spec.event_identity else ()
    if identity is None:
        missing = next(p for p in spec.event_identity if not _text(_find(doc, p)))
        return Quarantine("missing_field", f"{where}no event identity at {missing}")
    updated = _find(doc, spec.updated_at) if spec.updated_at else None
    return EventDraft(
        index=index, event_name=name, kind=kind, attributes=attributes,
        remote_updated_at=updated if isinstance(updated, str) else None, identity=identity,
        **values)


def normalize(spec: PayloadSpec, raw: bytes) -> list[EventDraft] | Quarantine:
    """Every event one receipt's body carries, or why the receipt is quarantined.

    All or nothing: one bad event in a batch quarantines the receipt."""
    doc = parse_body(raw, spec.max_depth)
    if isinstance(doc, Quarantine):
        return doc
    if not spec.batch:
        one = _event(spec, doc, 0)
        return one if isinstance(one, Quarantine) else [one]
    if not isinstance(doc, list) or not doc:
        return Quarantine("malformed", "the body is not a non-empty JSON array of events")
    if len(doc) > MAX_BATCH_EVENTS:
        return Quarantine("too_many_events",
                          f"the batch holds more than {MAX_BATCH_EVENTS} events")
    drafts: list[EventDraft] = []
    for i, item in enumerate(doc):
        event = _event(spec, item, i)
        if isinstance(event, Quarantine):
            return event
        drafts.append(event)
    return drafts

"""Dedup identity and normalization of webhook bodies (pure), table-driven over the
shipped L1 payload contracts, with negative rows for every quarantine reason."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import attrs
import pytest

from config.definitions import parse_webhooks
from daemon.core.ingress import (
    QUARANTINE_REASONS,
    BadPayloadSpec,
    EventDraft,
    PayloadSpec,
    Quarantine,
    dedup_key,
    delivery_identities,
    event_identity,
    event_key,
    normalize,
)

PROVIDERS = Path(__file__).resolve().parents[2] / "config" / "providers"


def _payload(provider: str) -> PayloadSpec:
    doc = tomllib.loads((PROVIDERS / f"{provider}.toml").read_text())
    (webhook,) = parse_webhooks(doc).values()
    return webhook.payload


OUTREACH = _payload("outreach")
HUBSPOT = _payload("hubspot")


def outreach_body(event: str = "prospect.updated", pid: Any = 42,
                  delivered: str = "2026-12-01T10:00:00.123Z", **attributes: Any) -> bytes:
    return json.dumps({
        "data": {"type": "prospect", "id": pid,
                 "attributes": {"title": "CTO", "updatedAt": "2026-12-01T10:00:00.000Z",
                                **attributes},
                 "relationships": {}},
        "meta": {"eventName": event, "deliveredAt": delivered},
    }).encode()


def hubspot_event(event_id: Any = 1001, object_id: int = 101, *, attempt: int = 0,
                  subscription_type: str = "contact.propertyChange",
                  **fields: Any) -> dict[str, Any]:
    """One HubSpot v3 webhook event with every field the v3 payload carries."""
    return {"eventId": event_id, "subscriptionId": 4711, "portalId": 62515, "appId": 1160452,
            "occurredAt": 1764580000000 + object_id, "subscriptionType": subscription_type,
            "attemptNumber": attempt, "objectId": object_id, "changeSource": "CRM_UI",
            "propertyName": "jobtitle", "propertyValue": "CTO", **fields}


def batch(*events: dict[str, Any]) -> bytes:
    return json.dumps(list(events)).encode()


def without(event: dict[str, Any], field: str) -> dict[str, Any]:
    return {k: v for k, v in event.items() if k != field}


def test_outreach_v2_partial_update_normalizes_to_one_event() -> None:
    (event,) = normalize(OUTREACH, outreach_body())  # type: ignore[misc]
    assert event == EventDraft(
        index=0, event_name="prospect.updated", kind="updated", resource_type="prospect",
        resource_id="42", delivered_at="2026-12-01T10:00:00.123Z",
        attributes={"title": "CTO", "updatedAt": "2026-12-01T10:00:00.000Z"},
        remote_updated_at="2026-12-01T10:00:00.000Z")


def test_a_fractional_attribute_is_kept_as_its_exact_decimal_text() -> None:
    """Outreach sends numbers with fractions (scores); the event keeps each as the exact
    decimal text of the body, never a binary float (a float is not canonical)."""
    (event,) = normalize(OUTREACH, outreach_body(score=1.5, ratio=0.1))  # type: ignore[misc]
    assert isinstance(event, EventDraft)
    assert event.attributes["score"] == "1.5" and event.attributes["ratio"] == "0.1"


@pytest.mark.parametrize(("event", "kind"), [
    ("prospect.created", "created"), ("prospect.updated", "updated"),
    ("prospect.destroyed", "destroyed"),
])
def test_declared_events_map_to_kinds(event: str, kind: str) -> None:
    (draft,) = normalize(OUTREACH, outreach_body(event))  # type: ignore[misc]
    assert draft.kind == kind


def test_hubspot_batch_yields_one_event_per_element() -> None:
    body = batch(hubspot_event(1001, 101),
                 hubspot_event(1002, 102, subscription_type="contact.deletion"))
    drafts = normalize(HUBSPOT, body)
    assert isinstance(drafts, list)
    assert [(d.index, d.resource_type, d.resource_id, d.kind, d.attributes) for d in drafts] \
        == [(0, "contact", "101", "updated", {}), (1, "contact", "102", "destroyed", {})]
    # The L1 identity: portal, subscription, event id, object, time of the change.
    assert [d.identity for d in drafts] == [
        ("62515", "4711", "1001", "101", "1764580000101"),
        ("62515", "4711", "1002", "102", "1764580000102")]


def test_a_route_without_event_identity_has_events_without_one() -> None:
    (event,) = normalize(OUTREACH, outreach_body())  # type: ignore[misc]
    assert event.identity == ()
    assert delivery_identities(OUTREACH, outreach_body()) is None


DEEP = b'{"data": {"type": "prospect", "id": 1}, "meta": ' + b"[" * 40 + b"]" * 40 + b"}"


@pytest.mark.parametrize(("name", "spec", "body", "reason"), [
    ("invalid UTF-8", OUTREACH, b'{"data": "\xff\xfe"}', "not_utf8"),
    ("not JSON", OUTREACH, b"{not json", "malformed"),
    ("empty", OUTREACH, b"", "malformed"),
    ("NaN", OUTREACH, b'{"a": NaN}', "malformed"),
    ("too deep", OUTREACH, DEEP, "too_deep"),
    ("very deep (recursion)", OUTREACH, b"[" * 100_000 + b"]" * 100_000, "too_deep"),
    ("duplicate keys", OUTREACH,
     b'{"data": {"type": "prospect", "id": 1, "id": 2}, "meta": {}}', "duplicate_keys"),
    ("a number too long to write out", OUTREACH,
     outreach_body().replace(b'"title"', b'"score": 1e999999, "title"'), "unsupported_number"),
    # Issue 21, item 2: the reasons the docs give. A 100,000-digit integer was
    # "malformed" (Python's int() refuses more than 4,300 digits, a ValueError), a lone
    # surrogate escape normalized fine and failed later as "missing_field" with a Python
    # error text, a NUL was stored and applied to the Lead.
    ("a 100,000-digit integer", OUTREACH,
     outreach_body().replace(b'"title"', b'"score": ' + b"7" * 100_000 + b', "title"'),
     "unsupported_number"),
    ("a 49-digit negative integer", OUTREACH,
     outreach_body().replace(b'"title"', b'"score": -' + b"1" * 49 + b', "title"'),
     "unsupported_number"),
    ("a lone surrogate escape in a value", OUTREACH,
     outreach_body().replace(b'"CTO"', b'"C\\ud800TO"'), "not_utf8"),
    ("a lone low surrogate escape in a key", OUTREACH,
     outreach_body().replace(b'"title"', b'"ti\\udc00tle"'), "not_utf8"),
    ("a NUL escape in a value", OUTREACH,
     outreach_body().replace(b'"CTO"', b'"C\\u0000TO"'), "control_character"),
    ("a NUL escape in a key", OUTREACH,
     outreach_body().replace(b'"title"', b'"ti\\u0000tle"'), "control_character"),
    ("a NUL escape deep in a batch", HUBSPOT,
     batch(hubspot_event(1, 1), {**hubspot_event(2, 2), "propertyValue": "a\u0000b"}),
     "control_character"),
    ("not an object", OUTREACH, b"[1, 2]", "not_jsonapi"),
    ("no data", OUTREACH, b'{"meta": {"eventName": "prospect.updated"}}', "not_jsonapi"),
    ("data without id", OUTREACH, b'{"data": {"type": "prospect"}, "meta": {}}',
     "not_jsonapi"),
    ("boolean id", OUTREACH, b'{"data": {"type": "prospect", "id": true}, "meta": {}}',
     "not_jsonapi"),
    ("no event name", OUTREACH, b'{"data": {"type": "prospect", "id": 1}, "meta": {}}',
     "missing_field"),
    ("unknown event", OUTREACH, outreach_body("sequence.created"), "unknown_event"),
    ("no deliveredAt", OUTREACH,
     b'{"data": {"type": "prospect", "id": 1}, "meta": {"eventName": "prospect.updated"}}',
     "missing_field"),
    ("attributes not an object", OUTREACH,
     b'{"data": {"type": "prospect", "id": 1, "attributes": [1]}, "meta": '
     b'{"eventName": "prospect.updated", "deliveredAt": "x"}}', "missing_field"),
    ("batch not an array", HUBSPOT, b'{"objectId": 1}', "malformed"),
    ("empty batch", HUBSPOT, b"[]", "malformed"),
    ("one bad event quarantines the batch", HUBSPOT,
     batch(hubspot_event(1, 1), hubspot_event(2, 2, subscription_type="deal.creation")),
     "unknown_event"),
    ("too many events", HUBSPOT,
     batch(*(hubspot_event(i, i) for i in range(1001))), "too_many_events"),
    # Without its identity an event's redelivery cannot be told from a new event: the
    # batch is quarantined (kept, visible), never materialized on a guess.
    ("an event without its eventId", HUBSPOT,
     batch(hubspot_event(1, 1), without(hubspot_event(2, 2), "eventId")), "missing_field"),
    ("an eventId of null", HUBSPOT, batch(hubspot_event(None, 1)), "missing_field"),
    ("an eventId of true", HUBSPOT, batch(hubspot_event(True, 1)), "missing_field"),
    ("an eventId that is an object", HUBSPOT, batch(hubspot_event({"id": 1}, 1)),
     "missing_field"),
    ("an empty eventId", HUBSPOT, batch(hubspot_event("", 1)), "missing_field"),
    ("an event without its subscriptionId", HUBSPOT,
     batch(without(hubspot_event(1, 1), "subscriptionId")), "missing_field"),
])
def test_quarantine_reasons(name: str, spec: PayloadSpec, body: bytes, reason: str) -> None:
    result = normalize(spec, body)
    assert isinstance(result, Quarantine), name
    assert result.reason == reason and result.reason in QUARANTINE_REASONS, name
    assert result.detail and "CTO" not in result.detail


@pytest.mark.parametrize(("name", "body", "title"), [
    ("a 48-digit integer is kept exactly", b'"score": ' + b"9" * 48, "CTO"),
    ("a surrogate pair escape is one character", b'"emoji": "\\ud83d\\ude00"', "CTO"),
    ("a tab, a newline and U+0001 escapes are text", b'"note": "a\\tb\\nc\\u0001"',
     "CTO"),
    ("an escaped backslash before u0000 is not a NUL", b'"note": "\\\\u0000"', "CTO"),
])
def test_edge_values_that_are_not_quarantined(name: str, body: bytes, title: str) -> None:
    result = normalize(OUTREACH, outreach_body().replace(b'"title"', body + b', "title"'))
    assert not isinstance(result, Quarantine), (name, result)
    (event,) = result
    assert event.attributes["title"] == title


def test_dedup_key_collapses_a_redelivery_with_a_new_request_id() -> None:
    body = outreach_body()
    a = dedup_key(OUTREACH, route="o", subscription_generation=1, raw=body,
                  delivery_id="uuid-1")
    b = dedup_key(OUTREACH, route="o", subscription_generation=1, raw=body,
                  delivery_id="uuid-2")
    assert a == b and len(a) <= 100


@pytest.mark.parametrize(("name", "kwargs"), [
    ("another generation", {"subscription_generation": 2}),
    ("another route", {"route": "p"}),
    ("another body", {"raw": outreach_body(delivered="2026-12-01T10:00:01.000Z")}),
    ("another resource", {"raw": outreach_body(pid=43)}),
    ("same fields, other bytes", {"raw": outreach_body().replace(b": ", b":")}),
])
def test_dedup_key_tells_deliveries_apart(name: str, kwargs: dict[str, Any]) -> None:
    base: dict[str, Any] = {"route": "o", "subscription_generation": 1, "raw": outreach_body()}
    assert dedup_key(OUTREACH, **base) != dedup_key(OUTREACH, **{**base, **kwargs}), name


def test_a_stable_delivery_id_is_the_identity_when_declared() -> None:
    spec = PayloadSpec(events={"e": "created"}, delivery_id_header="x-id",
                       delivery_id_stable=True)
    a = dedup_key(spec, route="r", subscription_generation=1, raw=b"one", delivery_id="d1")
    assert a == dedup_key(spec, route="r", subscription_generation=1, raw=b"two",
                          delivery_id="d1")
    assert a != dedup_key(spec, route="r", subscription_generation=1, raw=b"one",
                          delivery_id="d2")
    with pytest.raises(ValueError, match="stable delivery id"):
        dedup_key(spec, route="r", subscription_generation=1, raw=b"one")


def _key(body: bytes, *, route: str = "h", generation: int = 1,
         spec: PayloadSpec = HUBSPOT) -> str:
    return dedup_key(spec, route=route, subscription_generation=generation, raw=body)


FIRST = batch(hubspot_event(1, 101), hubspot_event(2, 102))


@pytest.mark.parametrize(("name", "body"), [
    ("the next attempt (attemptNumber + 1), re-serialized",
     batch(hubspot_event(1, 101, attempt=1), hubspot_event(2, 102, attempt=1))),
    ("the attempt after, other whitespace",
     json.dumps([hubspot_event(1, 101, attempt=2), hubspot_event(2, 102, attempt=2)],
                separators=(",", ":")).encode()),
    ("the same events in another order", batch(hubspot_event(2, 102), hubspot_event(1, 101))),
    ("a field that is not part of the identity changed",
     batch(hubspot_event(1, 101, changeSource="API"), hubspot_event(2, 102))),
])
def test_a_batch_redelivery_is_the_same_delivery(name: str, body: bytes) -> None:
    assert _key(body) == _key(FIRST), name
    assert len(_key(FIRST)) <= 100


@pytest.mark.parametrize(("name", "body", "kwargs"), [
    ("another event id", batch(hubspot_event(1, 101), hubspot_event(3, 102)), {}),
    ("another portal", batch(hubspot_event(1, 101, portalId=1), hubspot_event(2, 102)), {}),
    ("another subscription",
     batch(hubspot_event(1, 101, subscriptionId=1), hubspot_event(2, 102)), {}),
    ("one event fewer", batch(hubspot_event(1, 101)), {}),
    ("re-batched with a new event",
     batch(hubspot_event(1, 101), hubspot_event(2, 102), hubspot_event(3, 103)), {}),
    ("another subscription generation", FIRST, {"generation": 2}),
    ("another route", FIRST, {"route": "h2"}),
])
def test_batch_keys_tell_deliveries_apart(name: str, body: bytes,
                                          kwargs: dict[str, Any]) -> None:
    assert _key(body, **kwargs) != _key(FIRST), name


@pytest.mark.parametrize(("name", "body"), [
    ("an event without its eventId", batch(hubspot_event(1, 101),
                                           without(hubspot_event(2, 102), "eventId"))),
    ("not JSON", b"[{not json"),
    ("not an array", json.dumps(hubspot_event(1, 101)).encode()),
    ("an empty batch", b"[]"),
    ("duplicate keys", b'[{"eventId": 1, "eventId": 2}]'),
    ("an event that is not an object", b"[1]"),
])
def test_without_every_identity_the_batch_key_is_its_raw_body(name: str, body: bytes) -> None:
    """Best effort before the 200: the receipt is kept under the raw-body key (the
    materializer then quarantines it, missing_field or malformed); nothing is lost."""
    assert delivery_identities(HUBSPOT, body) is None, name
    undeclared = attrs.evolve(HUBSPOT, event_identity=(), attempt_fields=())
    assert _key(body) == _key(body, spec=undeclared), name
    assert _key(body) != _key(body + b" "), name


@pytest.mark.parametrize(("name", "event", "identity"), [
    ("integers", hubspot_event(7, 101), ("62515", "4711", "7", "101", "1764580000101")),
    ("a string event id", hubspot_event("e-7", 101),
     ("62515", "4711", "e-7", "101", "1764580000101")),
    ("an event id of 0", hubspot_event(0, 101), ("62515", "4711", "0", "101", "1764580000101")),
    ("no eventId", without(hubspot_event(7, 101), "eventId"), None),
    ("a null eventId", hubspot_event(None, 101), None),
    ("a boolean eventId", hubspot_event(False, 101), None),
    ("a list eventId", hubspot_event([7], 101), None),
    ("not an object", [7], None),
])
def test_event_identity(name: str, event: Any, identity: tuple[str, ...] | None) -> None:
    assert event_identity(HUBSPOT, event) == identity, name


@pytest.mark.parametrize(("name", "kwargs"), [
    ("another route", {"route": "h2"}),
    ("a route sharing the first 30 characters", {"route": "h" * 30 + "-other"}),
    ("another generation", {"subscription_generation": 2}),
    ("another event id", {"identity": ("62515", "4711", "8", "101", "1")}),
    ("identity parts shifted", {"identity": ("62515", "4711", "7", "1011", "")}),
])
def test_event_keys_tell_events_apart(name: str, kwargs: dict[str, Any]) -> None:
    base: dict[str, Any] = {"route": "h" * 30, "subscription_generation": 1,
                            "identity": ("62515", "4711", "7", "101", "1")}
    assert len(event_key(**base)) <= 100
    assert event_key(**base) == event_key(**dict(base))
    assert event_key(**base) != event_key(**{**base, **kwargs}), name


def test_an_unparseable_body_still_has_a_key_by_its_hash() -> None:
    a = dedup_key(OUTREACH, route="o", subscription_generation=1, raw=b"\xff")
    assert a != dedup_key(OUTREACH, route="o", subscription_generation=1, raw=b"\xfe")


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"format": "xml"}, "format"),
    ({"event_name": "meta"}, "event_name"),
    ({"events": {}}, "events"),
    ({"events": {"e": "merged"}}, "events.e"),
    ({"delivery_id_stable": True}, "delivery_id_stable"),
    ({"resource_type": ""}, "resource_type"),
    ({"resource_id": ""}, "resource_id"),
    ({"event_identity": ("eventId",)}, "event_identity"),
    ({"event_identity": ("/a~2",)}, "event_identity"),
    ({"event_identity": ("",)}, "event_identity"),
    ({"event_identity": ("/eventId", "/eventId")}, "event_identity"),
    ({"event_identity": ("/eventId", "/attemptNumber"), "attempt_fields": ("/attemptNumber",)},
     "event_identity"),
    ({"event_identity": ("/meta",), "attempt_fields": ("/meta/attempt",)}, "event_identity"),
    ({"event_identity": ("/meta/attempt/n",), "attempt_fields": ("/meta/attempt",)},
     "event_identity"),
    ({"event_identity": ("/id",), "attempt_fields": ("attempt",)}, "attempt_fields"),
    ({"attempt_fields": ("/attemptNumber",)}, "attempt_fields"),
])
def test_a_payload_contract_that_cannot_be_used_is_refused(kwargs: dict[str, Any],
                                                           field: str) -> None:
    with pytest.raises(BadPayloadSpec, match=f"^{field}:"):
        PayloadSpec(**{"events": {"e": "created"}, **kwargs})

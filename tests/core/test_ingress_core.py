"""Dedup identity and normalization of webhook bodies (pure), table-driven over the
shipped L1 payload contracts, with negative rows for every quarantine reason."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from config.definitions import parse_webhooks
from daemon.core.ingress import (
    QUARANTINE_REASONS,
    BadPayloadSpec,
    EventDraft,
    PayloadSpec,
    Quarantine,
    dedup_key,
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
    body = json.dumps([
        {"objectId": 101, "subscriptionType": "contact.propertyChange",
         "occurredAt": 1764580000000, "propertyName": "jobtitle", "propertyValue": "CTO"},
        {"objectId": 102, "subscriptionType": "contact.deletion", "occurredAt": 1764580000001},
    ]).encode()
    drafts = normalize(HUBSPOT, body)
    assert isinstance(drafts, list)
    assert [(d.index, d.resource_type, d.resource_id, d.kind, d.attributes) for d in drafts] \
        == [(0, "contact", "101", "updated", {}), (1, "contact", "102", "destroyed", {})]


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
     b'[{"objectId": 1, "subscriptionType": "contact.creation", "occurredAt": 1},'
     b' {"objectId": 2, "subscriptionType": "deal.creation", "occurredAt": 1}]',
     "unknown_event"),
    ("too many events", HUBSPOT,
     json.dumps([{"objectId": i, "subscriptionType": "contact.creation", "occurredAt": 1}
                 for i in range(1001)]).encode(), "too_many_events"),
])
def test_quarantine_reasons(name: str, spec: PayloadSpec, body: bytes, reason: str) -> None:
    result = normalize(spec, body)
    assert isinstance(result, Quarantine), name
    assert result.reason == reason and result.reason in QUARANTINE_REASONS, name
    assert result.detail and "CTO" not in result.detail


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
])
def test_a_payload_contract_that_cannot_be_used_is_refused(kwargs: dict[str, Any],
                                                           field: str) -> None:
    with pytest.raises(BadPayloadSpec, match=f"^{field}:"):
        PayloadSpec(**{"events": {"e": "created"}, **kwargs})

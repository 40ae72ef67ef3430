"""The InboundChange contract: round trip, lane, dedupe key, and every malformed payload."""

from __future__ import annotations

import json

import pytest

from daemon.core.inbound_change import INBOUND_APPLY_FAMILY, BadInboundChange, InboundChange


def change(**overrides: object) -> InboundChange:
    fields: dict[str, object] = dict(
        provider="prov", binding="leads", resource_type="prospect", resource_id="42",
        kind="updated", attributes={"title": "CTO"}, remote_updated_at="2026-12-01T10:00:00.123Z",
        origin="webhook", origin_id="evt-1", subscription_generation=3,
    )
    fields.update(overrides)
    return InboundChange(**fields)  # type: ignore[arg-type]


def test_round_trip_is_exact_and_canonical() -> None:
    original = change()
    text = original.to_payload()
    assert InboundChange.from_payload(text) == original
    assert text == json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))


def test_the_pinned_account_round_trips_and_its_absence_keeps_the_old_bytes() -> None:
    pinned = change(remote_account="acct-1")
    assert InboundChange.from_payload(pinned.to_payload()) == pinned
    assert '"remote_account":"acct-1"' in pinned.to_payload()
    # A change queued before the account was pinned reads back without one, byte for byte.
    assert "remote_account" not in change().to_payload()
    assert InboundChange.from_payload(change().to_payload()).remote_account is None


def test_lane_is_the_remote_record_and_dedupe_is_the_origin() -> None:
    a = change(origin_id="evt-1")
    b = change(origin_id="evt-2", kind="destroyed", attributes={})
    other = change(resource_id="43")
    assert a.source_lane == b.source_lane != other.source_lane
    assert a.dedupe_key != b.dedupe_key
    spec = a.work_spec(org_id="org", catalog_revision=2, catalog_digest="sha256:" + "0" * 64)
    assert (spec.family, spec.source_lane, spec.dedupe_key) == (
        INBOUND_APPLY_FAMILY, a.source_lane, a.dedupe_key)
    assert InboundChange.from_payload(spec.payload) == a


@pytest.mark.parametrize(("overrides", "message"), [
    ({"kind": "merged"}, "kind"),
    ({"origin": "guess"}, "origin"),
    ({"resource_id": ""}, "resource_id"),
    ({"provider": ""}, "provider"),
    ({"origin_id": ""}, "origin_id"),
])
def test_invalid_values_are_refused(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(BadInboundChange, match=message):
        change(**overrides)


def _payload(**edits: object) -> str:
    data = json.loads(change().to_payload())
    for key, value in edits.items():
        if value is KeyError:
            del data[key]
        else:
            data[key] = value
    return json.dumps(data)


@pytest.mark.parametrize(("text", "message"), [
    ("not json", "not JSON"),
    ("[]", "not an object"),
    (_payload(version=2), "version"),
    (_payload(version=KeyError), "version"),
    (_payload(attributes=[1]), "attributes"),
    (_payload(subscription_generation="3"), "subscription_generation"),
    (_payload(subscription_generation=True), "subscription_generation"),
    (_payload(remote_updated_at=5), "remote_updated_at"),
    (_payload(remote_account=""), "remote_account"),
    (_payload(remote_account=7), "remote_account"),
    (_payload(resource_id=42), "resource_id"),
    (_payload(kind=KeyError), "kind"),
    (_payload(kind="merged"), "kind"),
])
def test_malformed_payloads_are_refused_by_name(text: str, message: str) -> None:
    with pytest.raises(BadInboundChange, match=message):
        InboundChange.from_payload(text)

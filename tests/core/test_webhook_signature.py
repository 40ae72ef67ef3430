"""The webhook verifier (pure), table-driven over the two shipped L1 contracts, with
negative rows: a re-serialized body under the original signature is refused."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from config.definitions import parse_webhooks
from daemon.core.webhook_signature import (
    BadSignatureSpec,
    SignatureSpec,
    digest,
    encode_digest,
    signed_bytes,
    verify,
)

PROVIDERS = Path(__file__).resolve().parents[2] / "config" / "providers"
NOW_US = 1_800_000_000_000_000
SECRET = b"s3cret-current"
OLD = b"s3cret-previous"


def _spec(provider: str) -> SignatureSpec:
    doc = tomllib.loads((PROVIDERS / f"{provider}.toml").read_text())
    (webhook,) = parse_webhooks(doc).values()
    return webhook.signature


OUTREACH = _spec("outreach")
HUBSPOT = _spec("hubspot")
BODY = b'{"data": {"type": "prospect", "id": 7}, "meta": {"eventName": "prospect.updated"}}'
URI = "https://hooks.example/hooks/outreach-main"


def _headers(spec: SignatureSpec, secret: bytes, body: bytes, *, ts_ms: int | None = None,
             method: str = "POST", uri: str = URI) -> dict[str, str]:
    timestamp = str(ts_ms if ts_ms is not None else NOW_US // 1000)
    message = signed_bytes(spec, method=method, uri=uri, body=body,
                           timestamp=timestamp if spec.timestamp_header else "")
    headers = {spec.header: encode_digest(spec, digest(spec, secret, message))}
    if spec.timestamp_header:
        headers[spec.timestamp_header] = timestamp
    return headers


def _verify(spec: SignatureSpec, headers: dict[str, str], body: bytes = BODY,
            secrets: tuple[bytes, ...] = (SECRET,), uri: str = URI) -> tuple[bool, str, int]:
    v = verify(spec, secrets, method="POST", uri=uri, body=body, headers=headers,
               now_us=NOW_US)
    return v.ok, v.reason, v.secret_index


def test_shipped_contracts_say_what_the_providers_document() -> None:
    assert (OUTREACH.header, OUTREACH.encoding, OUTREACH.signed, OUTREACH.timestamp_header) \
        == ("outreach-webhook-signature", "hex", ("body",), "")
    assert (HUBSPOT.header, HUBSPOT.encoding, HUBSPOT.signed, HUBSPOT.timestamp_header,
            HUBSPOT.timestamp_unit, HUBSPOT.tolerance_s) == (
        "x-hubspot-signature-v3", "base64", ("method", "uri", "body", "timestamp"),
        "x-hubspot-request-timestamp", "ms", 300.0)


def test_outreach_signature_is_hex_hmac_of_the_raw_body_alone() -> None:
    import hashlib
    import hmac
    expected = hmac.new(SECRET, BODY, hashlib.sha256).hexdigest()
    assert _headers(OUTREACH, SECRET, BODY)[OUTREACH.header] == expected
    assert _verify(OUTREACH, {OUTREACH.header: expected}) == (True, "", 0)


def test_hubspot_signature_is_base64_over_method_uri_body_timestamp() -> None:
    import base64
    import hashlib
    import hmac
    ts = str(NOW_US // 1000)
    expected = base64.b64encode(hmac.new(
        SECRET, b"POST" + URI.encode() + BODY + ts.encode(), hashlib.sha256).digest()).decode()
    headers = {HUBSPOT.header: expected, HUBSPOT.timestamp_header: ts}
    assert _verify(HUBSPOT, headers) == (True, "", 0)


RESERIALIZED = json.dumps(json.loads(BODY), separators=(",", ":")).encode()


@pytest.mark.parametrize(("name", "spec", "mutate", "expected"), [
    ("outreach ok", OUTREACH, lambda h, b: (h, b), (True, "")),
    ("hubspot ok", HUBSPOT, lambda h, b: (h, b), (True, "")),
    ("outreach re-serialized body", OUTREACH, lambda h, b: (h, RESERIALIZED),
     (False, "bad_signature")),
    ("hubspot re-serialized body", HUBSPOT, lambda h, b: (h, RESERIALIZED),
     (False, "bad_signature")),
    ("one byte changed", OUTREACH, lambda h, b: (h, b.replace(b"7", b"8")),
     (False, "bad_signature")),
    ("signature missing", OUTREACH, lambda h, b: ({}, b), (False, "missing_signature")),
    ("signature blank", OUTREACH, lambda h, b: ({OUTREACH.header: " "}, b),
     (False, "missing_signature")),
    ("signature not hex", OUTREACH, lambda h, b: ({OUTREACH.header: "zz" * 32}, b),
     (False, "bad_signature")),
    ("hex where base64 is declared", HUBSPOT,
     lambda h, b: ({**h, HUBSPOT.header: "ab" * 32}, b), (False, "bad_signature")),
    ("signature truncated", OUTREACH,
     lambda h, b: ({OUTREACH.header: h[OUTREACH.header][:-2]}, b), (False, "bad_signature")),
    ("timestamp missing", HUBSPOT, lambda h, b: ({HUBSPOT.header: h[HUBSPOT.header]}, b),
     (False, "missing_timestamp")),
    ("timestamp not a number", HUBSPOT,
     lambda h, b: ({**h, HUBSPOT.timestamp_header: "yesterday"}, b), (False, "bad_timestamp")),
    ("timestamp changed after signing", HUBSPOT,
     lambda h, b: ({**h, HUBSPOT.timestamp_header: str(NOW_US // 1000 - 1)}, b),
     (False, "bad_signature")),
])
def test_verdicts(name: str, spec: SignatureSpec, mutate: object,
                  expected: tuple[bool, str]) -> None:
    headers, body = mutate(_headers(spec, SECRET, BODY), BODY)  # type: ignore[operator]
    assert _verify(spec, headers, body)[:2] == expected, name


@pytest.mark.parametrize(("age_ms", "ok"), [
    (0, True), (299_000, True), (300_000, True), (300_001, False), (-300_001, False),
    (86_400_000, False),
])
def test_hubspot_timestamp_tolerance_is_five_minutes(age_ms: int, ok: bool) -> None:
    headers = _headers(HUBSPOT, SECRET, BODY, ts_ms=NOW_US // 1000 - age_ms)
    assert _verify(HUBSPOT, headers)[:2] == ((True, "") if ok else (False, "stale_timestamp"))


def test_the_uri_is_signed_for_hubspot_but_not_for_outreach() -> None:
    other = "https://elsewhere.example/hooks/x"
    assert _verify(HUBSPOT, _headers(HUBSPOT, SECRET, BODY), uri=other)[:2] == (
        False, "bad_signature")
    assert _verify(OUTREACH, _headers(OUTREACH, SECRET, BODY), uri=other)[0]


@pytest.mark.parametrize(("signed_with", "active", "expected"), [
    (SECRET, (SECRET, OLD), (True, "", 0)),
    (OLD, (SECRET, OLD), (True, "", 1)),          # rotation: the previous one still works
    (OLD, (SECRET,), (False, "bad_signature", -1)),  # ... until it is retired
    (b"someone-else", (SECRET, OLD), (False, "bad_signature", -1)),
    (SECRET, (), (False, "no_secret", -1)),
])
def test_several_active_secrets(signed_with: bytes, active: tuple[bytes, ...],
                                expected: tuple[bool, str, int]) -> None:
    assert _verify(OUTREACH, _headers(OUTREACH, signed_with, BODY), secrets=active) == expected


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"header": ""}, "header"),
    ({"header": "x", "algorithm": "md5"}, "algorithm"),
    ({"header": "x", "encoding": "base32"}, "encoding"),
    ({"header": "x", "signed": ("uri",)}, "signed"),
    ({"header": "x", "signed": ("body", "body")}, "signed"),
    ({"header": "x", "signed": ("body", "nonce")}, "signed"),
    ({"header": "x", "signed": ("body", "timestamp")}, "timestamp_header"),
    ({"header": "x", "timestamp_header": "t"}, "timestamp_header"),
    ({"header": "x", "signed": ("body", "timestamp"), "timestamp_header": "t",
      "timestamp_unit": "us"}, "timestamp_unit"),
    ({"header": "x", "tolerance_s": 0}, "tolerance_s"),
])
def test_a_contract_that_cannot_be_verified_is_refused(kwargs: dict[str, object],
                                                       field: str) -> None:
    with pytest.raises(BadSignatureSpec, match=f"^{field}:"):
        SignatureSpec(**kwargs)  # type: ignore[arg-type]

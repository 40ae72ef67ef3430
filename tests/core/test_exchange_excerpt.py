"""Redaction and bounds of a failed call's exchange excerpt (daemon/core/exchange_excerpt.py):
table-driven; every secret-bearing row must come out without its secret."""

from __future__ import annotations

import json

import pytest

from daemon.core.exchange_excerpt import (
    MAX_EXCERPT,
    MAX_PARSE,
    REDACTED,
    body_excerpt,
    safe_headers,
)

SECRET = "s3cr3t-VALUE-42"


@pytest.mark.parametrize(("body", "kept"), [
    ({"access_token": SECRET, "title": "CTO"}, {"access_token": REDACTED, "title": "CTO"}),
    ({"data": {"attributes": {"Email": SECRET, "phoneNumber": SECRET}}},
     {"data": {"attributes": {"Email": REDACTED, "phoneNumber": REDACTED}}}),
    ([{"client_secret": SECRET}, {"password": [SECRET]}],
     [{"client_secret": REDACTED}, {"password": REDACTED}]),
    ({"error": f"bad header Authorization: Bearer {SECRET}"},
     {"error": f"bad header Authorization: Bearer {REDACTED}"}),
    ({"apiKey": SECRET, "session_id": SECRET, "x-signature": SECRET},
     {"apiKey": REDACTED, "session_id": REDACTED, "x-signature": REDACTED}),
    ({"message": "Property values were not valid", "status": "error"},
     {"message": "Property values were not valid", "status": "error"}),
])
def test_json_bodies_lose_sensitive_values_at_any_depth(body: object, kept: object) -> None:
    text = body_excerpt(json.dumps(body).encode())
    assert SECRET not in text
    assert json.loads(text) == kept


@pytest.mark.parametrize("body", [
    f"token={SECRET}&x=1",
    f"Authorization: Bearer {SECRET}",
    f"<error>api_key={SECRET}</error>",
    f'{{"broken json, "password": "{SECRET}"',
    f"user email: {SECRET}",
    f"basic {SECRET}",
])
def test_text_bodies_lose_sensitive_values(body: str) -> None:
    assert SECRET not in body_excerpt(body.encode())


@pytest.mark.parametrize(("size", "length"), [
    (0, 0), (10, 10), (MAX_EXCERPT, MAX_EXCERPT), (MAX_EXCERPT + 1, MAX_EXCERPT),
    (MAX_PARSE + 1, MAX_EXCERPT),
])
def test_excerpts_are_bounded(size: int, length: int) -> None:
    assert len(body_excerpt(b"a" * size)) == length


def test_control_characters_become_spaces_and_bad_utf8_is_replaced() -> None:
    assert body_excerpt(b"a\x00b\x1bc\xff") == "a b c\ufffd"


def test_only_allow_listed_headers_are_kept() -> None:
    kept = safe_headers([
        ("Content-Type", "application/json"), ("Authorization", f"Bearer {SECRET}"),
        ("Set-Cookie", f"s={SECRET}"), ("X-RateLimit-Remaining", "0"),
        ("Retry-After", "10"), ("X-Secret-Thing", SECRET), ("X-Request-Id", "r" * 500),
    ])
    assert [name for name, _ in kept] == ["content-type", "x-ratelimit-remaining",
                                          "retry-after", "x-request-id"]
    assert SECRET not in repr(kept)
    assert len(dict(kept)["x-request-id"]) == 200

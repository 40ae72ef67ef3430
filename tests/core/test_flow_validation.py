"""The connect-flow body parser (``daemon/api/flow_validation.py``): outside input.

Any JSON value is either a valid flow body or an ApiError with a stable code, never
another exception; a token value is never echoed in the error.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from daemon.api.flow_validation import FlowBody, flow_body
from daemon.api.validation import ApiError
from daemon.core.connect_flows import Flow

SECRET = "tok-SECRET-zz"
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.just(SECRET),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["idempotency_key", "expected_generation", "reason", "identity",
                         "grant", "kind", "user_id", "provider", "type", "access_token",
                         "refresh_token", "expires_in", "scopes", "issuer",
                         "remote_account_id", "remote_subject", "installation_id", "x"]),
        inner, max_size=6),
    max_leaves=12)
CODES = {"invalid_request", "invalid_token_field", "unknown_flow"}


@given(flow=st.sampled_from([f.value for f in Flow] + ["nope"]), doc=JSON)
def test_any_json_is_a_body_or_a_stable_refusal(flow: str, doc: Any) -> None:
    refusal: ApiError | None = None
    try:
        body: FlowBody | None = flow_body(flow, doc)
    except ApiError as exc:
        body, refusal = None, exc
    if refusal is not None:
        assert refusal.code in CODES
        assert SECRET not in refusal.message
        assert refusal.status in (400, 404)
        return
    assert isinstance(body, FlowBody) and body.idempotency_key
    assert (body.expected_generation is None) == (body.flow is Flow.CONNECT)


@pytest.mark.parametrize(("value", "code"), [
    (12, "invalid_token_field"), ({"v": SECRET}, "invalid_token_field"),
    ([SECRET], "invalid_token_field"), (None, "invalid_token_field"),
    ("", "invalid_token_field"), ("a" * 9000, "invalid_token_field"),
])
def test_a_token_field_that_is_not_a_string_is_refused_without_its_value(
        value: Any, code: str) -> None:
    doc = {"idempotency_key": "k", "expected_generation": 1,
           "grant": {"type": "oauth_code_exchange", "access_token": value,
                     "expires_in": 60}}
    with pytest.raises(ApiError) as info:
        flow_body("reconnect", doc)
    assert info.value.code == code and SECRET not in info.value.message
    assert "grant.access_token" in info.value.message


def test_a_token_is_held_as_a_secret() -> None:
    body = flow_body("reconnect", {"idempotency_key": "k", "expected_generation": 1,
                                   "grant": {"type": "oauth_code_exchange",
                                             "access_token": SECRET, "expires_in": 60,
                                             "refresh_token": SECRET}})
    assert body.bundle is not None and body.bundle.access_token.reveal() == SECRET
    assert SECRET not in repr(body) and SECRET not in repr(body.bundle)

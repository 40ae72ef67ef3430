"""Validation of the connect-flow bodies (``POST /v1/bindings/{id}/{flow}``), pure.

Every failure is an :class:`~daemon.api.validation.ApiError` with a stable code and a
message that names the field, never its value (a token field that is not a string is
refused without echoing what it was).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from daemon.api.validation import MAX_ID_CHARS, ApiError, only_fields
from daemon.core.connect_flows import FLOWS, Flow
from daemon.core.principals import PrincipalKind
from daemon.core.token_bundle import SecretText, TokenBundle

IDENTITY_FIELDS = ("issuer", "remote_account_id", "remote_subject", "installation_id",
                   "scopes")
OAUTH_FIELDS = ("type", "access_token", "refresh_token", "expires_in", "scopes")
S2S_FIELDS = ("type",)
MAX_TOKEN_CHARS = 8192
MAX_SCOPES = 256
# A token endpoint's "expires_in" beyond a year is refused as malformed.
MAX_EXPIRES_IN_S = 366 * 24 * 3600


@attrs.frozen(kw_only=True)
class FlowBody:
    flow: Flow
    idempotency_key: str
    expected_generation: int | None
    reason: str
    kind: PrincipalKind = PrincipalKind.SHARED
    user_id: str = ""
    provider: str = ""
    identity: Mapping[str, Any] = attrs.field(factory=dict)
    bundle: TokenBundle | None = attrs.field(default=None, repr=False)
    expires_in_s: int = 0


def _text(doc: Mapping[str, Any], name: str, where: str, *, required: bool = True,
          max_chars: int = MAX_ID_CHARS) -> str:
    if name not in doc and not required:
        return ""
    value = doc.get(name)
    if not isinstance(value, str) or not value or len(value) > max_chars:
        raise ApiError(400, "invalid_request", f"{where}{name} must be a non-empty string"
                       f" of at most {max_chars} characters")
    return value


def _integer(doc: Mapping[str, Any], name: str, where: str, low: int, high: int) -> int:
    value = doc.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ApiError(400, "invalid_request",
                       f"{where}{name} must be an integer from {low} to {high}")
    return value


def _scopes(value: Any, where: str) -> tuple[str, ...]:
    if (not isinstance(value, list) or len(value) > MAX_SCOPES
            or not all(isinstance(s, str) and s and len(s) <= MAX_ID_CHARS for s in value)):
        raise ApiError(400, "invalid_request", f"{where} must be an array of at most"
                       f" {MAX_SCOPES} non-empty strings")
    return tuple(value)


def _identity(doc: Any, required: bool) -> dict[str, Any]:
    if not isinstance(doc, Mapping):
        raise ApiError(400, "invalid_request", "identity must be a JSON object")
    only_fields(doc, IDENTITY_FIELDS, "identity")
    out: dict[str, Any] = {}
    for name in IDENTITY_FIELDS[:4]:
        need = required and name != "installation_id"
        if name in doc or need:
            out[name] = _text(doc, name, "identity.", required=need)
    if "scopes" in doc:
        out["scopes"] = _scopes(doc["scopes"], "identity.scopes")
    return out


def _token(doc: Mapping[str, Any], name: str, required: bool) -> SecretText | None:
    if name not in doc and not required:
        return None
    value = doc.get(name)
    # Never echo the value: it is, or may be, a secret.
    if not isinstance(value, str):
        raise ApiError(400, "invalid_token_field", f"grant.{name} must be a string")
    if not value or len(value) > MAX_TOKEN_CHARS:
        raise ApiError(400, "invalid_token_field", f"grant.{name} must be a non-empty"
                       f" string of at most {MAX_TOKEN_CHARS} characters")
    return SecretText(value)


def grant_bundle(doc: Any) -> tuple[TokenBundle, int]:
    """The bundle a grant hands over, and its lifetime in seconds (0: mint on first use).

    ``oauth_code_exchange``: the token endpoint's answer to the authorization-code
    exchange (access token, optional refresh token, ``expires_in``, scopes);
    ``s2s_installation``: an app installation, whose access tokens integrationd mints
    itself (no token is handed over)."""
    if not isinstance(doc, Mapping):
        raise ApiError(400, "invalid_request", "grant must be a JSON object")
    kind = doc.get("type")
    if kind == "s2s_installation":
        only_fields(doc, S2S_FIELDS, "grant")
        return TokenBundle(access_token=SecretText(""), expires_at_us=0), 0
    if kind != "oauth_code_exchange":
        raise ApiError(400, "invalid_request",
                       "grant.type must be oauth_code_exchange or s2s_installation")
    only_fields(doc, OAUTH_FIELDS, "grant")
    access = _token(doc, "access_token", True)
    assert access is not None
    refresh = _token(doc, "refresh_token", False)
    expires_in = _integer(doc, "expires_in", "grant.", 1, MAX_EXPIRES_IN_S)
    scopes = _scopes(doc["scopes"], "grant.scopes") if "scopes" in doc else ()
    return TokenBundle(access_token=access, refresh_token=refresh, scopes=scopes), expires_in


_COMMON = ("idempotency_key", "expected_generation", "reason", "identity", "grant")
_CONNECT = ("idempotency_key", "reason", "kind", "user_id", "provider", "identity", "grant")


def flow_body(flow_name: str, doc: Any) -> FlowBody:
    """A connect-flow request body, checked field by field."""
    try:
        flow = Flow(flow_name)
    except ValueError:
        raise ApiError(404, "unknown_flow", f"no connect flow {flow_name[:64]!r}; one of"
                       f" {', '.join(f.value for f in FLOWS)}") from None
    if not isinstance(doc, Mapping):
        raise ApiError(400, "invalid_request", "the body must be a JSON object")
    connecting = flow is Flow.CONNECT
    only_fields(doc, _CONNECT if connecting else _COMMON, "the body")
    key = _text(doc, "idempotency_key", "")
    reason = _text(doc, "reason", "", required=False, max_chars=500) or f"runtime {flow}"
    expected = None if connecting else _integer(doc, "expected_generation", "", 1, 2**62)
    bundle, expires_in = (None, 0) if "grant" not in doc else grant_bundle(doc["grant"])
    kind = PrincipalKind.SHARED
    user_id = provider = ""
    if connecting:
        raw_kind = doc.get("kind", "shared")
        if raw_kind not in [k.value for k in PrincipalKind]:
            raise ApiError(400, "invalid_request", "kind must be shared or per_user")
        kind = PrincipalKind(raw_kind)
        user_id = _text(doc, "user_id", "", required=kind is PrincipalKind.PER_USER)
        provider = _text(doc, "provider", "", max_chars=64)
    return FlowBody(flow=flow, idempotency_key=key, expected_generation=expected,
                    reason=reason, kind=kind, user_id=user_id, provider=provider,
                    identity=(_identity(doc.get("identity"), required=connecting)
                              if "identity" in doc or connecting else {}),
                    bundle=bundle, expires_in_s=expires_in)

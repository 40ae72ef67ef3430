"""The reference Runtime's per-user grants and integrationd's connect flows, pure.

Theory of operation
-------------------
A CRM user connects their own provider account (the OAuth authorization-code exchange
happens in the CRM; here the caller hands the exchange's answer to the Runtime). The
Runtime passes the grant to integrationd with ``POST /v1/bindings/{binding_id}/{flow}``
(integrationd seals it: the Runtime keeps no token) and records what integrationd
answers as a :class:`UserGrant`: the binding id, its ``BindingGeneration``, state and
token version. Commands for the records a user owns carry ``command.user_id``;
integrationd pins that user's binding and generation at acceptance.

Each flow request names, except ``connect``, the generation the Runtime recorded
(``expected_generation``: a compare-and-swap in integrationd) and an idempotency key the
Runtime chooses once per user action: a resend after a lost answer carries the same key
and the same bytes, so integrationd applies it once and replays its answer.

Answers are classified by :func:`classify_flow_answer`:

* 200 with the binding's facts: definitive, recorded (:func:`apply_flow_answer`);
* 5xx, 408, 429, a transport error, an unreadable 200: not definitive
  (:class:`~sandbox.runtime.model.RetryLater`): the same bytes may be sent again;
* any other 4xx (``stale_generation``, ``idempotency_key_reused``, ``binding_exists``,
  ``unknown_binding``, ...): a :class:`FlowRefused`, a contract violation the Runtime
  counts and reports to its caller, never retried blindly. After ``stale_generation``
  the Runtime re-reads the binding (``GET /v1/bindings/{id}``) so that the user's next
  action names the current generation.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from typing import Any

import attrs

from daemon.core.connect_flows import Flow
from sandbox.runtime.model import RetryLater

USER_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
PROVIDER_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")
MAX_ERROR_CODE_CHARS = 64


# The /v1/ connect flows' names are the protocol's (integrationd's table defines them).
FlowName = Flow


class GrantStatus(enum.StrEnum):
    CONNECTED = "connected"
    DISCONNECTED = "disconnected"


def binding_id_for(user_id: str, provider: str) -> str:
    """The per-user binding's id the Runtime chooses: stable per (user, provider)."""
    return f"user.{user_id}.{provider}"


@attrs.frozen
class UserGrant:
    """What integrationd last told the Runtime about one user's binding (no token)."""

    user_id: str
    provider: str
    binding_id: str
    generation: int
    status: GrantStatus
    token_version: int | None
    # True after a stale_generation refusal until the binding was read again.
    stale: bool = False

    def view(self) -> dict[str, Any]:
        return {"user_id": self.user_id, "provider": self.provider,
                "binding_id": self.binding_id, "generation": self.generation,
                "state": self.status.value, "token_version": self.token_version,
                "stale": self.stale}


@attrs.frozen
class FlowAnswer:
    """integrationd's definitive answer: the binding after the flow."""

    binding_id: str
    generation: int
    status: GrantStatus
    token_version: int | None
    generation_bumped: bool
    replayed: bool


@attrs.frozen
class FlowRefused:
    """A 4xx that is not a retry: integrationd refused the flow (nothing was written)."""

    http_status: int
    error: str


def _error_code(doc: Mapping[str, Any] | None, status: int) -> str:
    error = doc.get("error") if doc else None
    if isinstance(error, str) and 0 < len(error) <= MAX_ERROR_CODE_CHARS:
        return error
    return f"http_{status}"


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _answer(doc: Mapping[str, Any] | None) -> FlowAnswer | None:
    if doc is None:
        return None
    binding_id, generation, state = doc.get("binding_id"), doc.get("generation"), doc.get(
        "state")
    version = doc.get("token_version")
    if (not isinstance(binding_id, str) or not binding_id
            or not isinstance(generation, int) or isinstance(generation, bool)
            or generation < 1 or state not in {s.value for s in GrantStatus}
            or not (version is None or (isinstance(version, int)
                                        and not isinstance(version, bool)))):
        return None
    return FlowAnswer(binding_id, generation, GrantStatus(state), version,
                      doc.get("generation_bumped") is True, doc.get("replayed") is True)


def classify_flow_answer(http_status: int, body: bytes) -> FlowAnswer | FlowRefused | RetryLater:
    """Classify integrationd's answer to a connect flow or a binding read."""
    doc = _json_object(body)
    if 200 <= http_status < 300:
        answer = _answer(doc)
        return answer if answer is not None else RetryLater(f"unreadable {http_status} answer")
    if http_status >= 500 or http_status in (408, 429) or http_status < 400:
        return RetryLater(f"http {http_status}")
    return FlowRefused(http_status, _error_code(doc, http_status))


def apply_flow_answer(before: UserGrant | None, *, user_id: str, provider: str,
                      answer: FlowAnswer) -> UserGrant:
    """The user's grant record after a definitive answer.

    A generation never goes backwards: an answer older than what is recorded (a replay
    of an earlier flow, say) is a contract violation.
    """
    if before is not None:
        if answer.binding_id != before.binding_id:
            raise GrantMismatch(f"integrationd answered for binding {answer.binding_id!r},"
                                f" not {before.binding_id!r}")
        if answer.generation < before.generation and not answer.replayed:
            raise GrantMismatch(f"binding {before.binding_id} went back from generation"
                                f" {before.generation} to {answer.generation}")
        if answer.replayed and answer.generation < before.generation:
            return attrs.evolve(before, stale=False)  # an old answer: keep the newer facts
    return UserGrant(user_id=user_id, provider=provider, binding_id=answer.binding_id,
                     generation=answer.generation, status=answer.status,
                     token_version=answer.token_version)


class GrantMismatch(Exception):
    """integrationd's answer contradicts the grant the Runtime recorded."""


def flow_request(flow: FlowName, *, idempotency_key: str, user_id: str, provider: str,
                 before: UserGrant | None, doc: Mapping[str, Any]) -> dict[str, Any]:
    """The ``/v1/bindings/{id}/{flow}`` body for ``flow``, from the caller's ``doc``.

    ``doc`` may hold ``identity`` (the remote identity fields), ``grant`` (the token
    endpoint's answer, handed over verbatim) and ``reason``. Raises :class:`FlowInputError`
    naming the field (never a token value).
    """
    unknown = sorted(set(doc) - {"identity", "grant", "reason"})
    if unknown:
        raise FlowInputError(f"unknown fields {', '.join(unknown)}")
    body: dict[str, Any] = {"idempotency_key": idempotency_key}
    reason = doc.get("reason")
    if reason is not None:
        if not isinstance(reason, str) or not 0 < len(reason) <= 500:
            raise FlowInputError("reason must be a string of 1 to 500 characters")
        body["reason"] = reason
    for name in ("identity", "grant"):
        if name in doc:
            if not isinstance(doc[name], dict):
                raise FlowInputError(f"{name} must be an object")
            body[name] = doc[name]
    if flow is FlowName.CONNECT:
        if before is not None:
            raise FlowInputError(f"user {user_id} has a {provider} binding: reconnect it")
        body.update(kind="per_user", user_id=user_id, provider=provider)
        return body
    if before is None:
        raise FlowInputError(f"user {user_id} never connected {provider}")
    body["expected_generation"] = before.generation
    return body


class FlowInputError(ValueError):
    """The caller's flow request is malformed (400)."""

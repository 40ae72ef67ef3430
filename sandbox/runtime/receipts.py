"""Result receipts (integrationd -> Runtime): parse a ``CommitResultRequest``, judge it.

Pure. :func:`decide_result` checks, in order: the exact trusted scope (403, disclosing nothing
about the intent), the result format (422 for an unknown one, or for format 2 in old-Runtime
mode), the format's shape (400), the intent's existence (404) and status (409 unless ACCEPTED
or COMMITTED), the accepted command id, payload digest and Catalog revision (409), the intent
kind for a no-effect result (400), and finally duplicate (same immutable result) versus
conflict (anything else; the first result stays).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from daemon.core.handoff import (
    NO_EFFECT_INTENT_KINDS,
    RESULT_FORMAT_NO_EFFECT,
    RESULT_FORMAT_SUCCESS,
    TrustedRuntimeWorkScope,
    parse_no_effect,
)
from sandbox.runtime.model import (
    IntentEvent,
    IntentState,
    IntentStatus,
    ResultReceipt,
    next_status,
)


class BadInput(ValueError):
    """A request body the caller must fix (400)."""


_RESULT_FIELDS: Mapping[str, type] = {
    "scope": dict,
    "intent_id": str,
    "command_id": str,
    "payload_digest": str,
    "catalog_revision": int,
    "result_format_version": int,
    "remote_id": str,
    "canonical_result": str,
    "result_digest": str,
}
_SCOPE_FIELDS = ("org_id", "app_installation_id", "runtime_capability_id",
                 "runtime_work_binding_digest")


@attrs.frozen
class ResultRequest:
    """A parsed ``CommitResultRequest``."""

    scope: TrustedRuntimeWorkScope
    intent_id: str
    command_id: str
    payload_digest: str
    catalog_revision: int
    result_format_version: int
    remote_id: str
    canonical_result: str
    result_digest: str

    def receipt(self) -> ResultReceipt:
        return ResultReceipt(
            intent_id=self.intent_id,
            command_id=self.command_id,
            payload_digest=self.payload_digest,
            catalog_revision=self.catalog_revision,
            result_format_version=self.result_format_version,
            remote_id=self.remote_id,
            canonical_result=self.canonical_result,
            result_digest=self.result_digest,
        )


def _check_fields(doc: object, fields: Mapping[str, type], what: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise BadInput(f"{what} must be a JSON object")
    missing = sorted(set(fields) - set(doc))
    if missing:
        raise BadInput(f"{what} is missing {', '.join(missing)}")
    unknown = sorted(set(doc) - set(fields))
    if unknown:
        raise BadInput(f"{what} has unknown fields {', '.join(unknown)}")
    for name, kind in fields.items():
        value = doc[name]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise BadInput(f"{what}.{name} must be {_TYPE_NAMES[kind]}")
    return doc


_TYPE_NAMES: Mapping[type, str] = {str: "a string", dict: "a JSON object", int: "an integer"}


def parse_result_request(doc: object) -> ResultRequest:
    """Validate the shape of a ``CommitResultRequest`` body; raises :class:`BadInput`."""
    body = _check_fields(doc, _RESULT_FIELDS, "request")
    scope = _check_fields(body["scope"], dict.fromkeys(_SCOPE_FIELDS, str), "scope")
    return ResultRequest(
        scope=TrustedRuntimeWorkScope(*(scope[name] for name in _SCOPE_FIELDS)),
        intent_id=body["intent_id"],
        command_id=body["command_id"],
        payload_digest=body["payload_digest"],
        catalog_revision=body["catalog_revision"],
        result_format_version=body["result_format_version"],
        remote_id=body["remote_id"],
        canonical_result=body["canonical_result"],
        result_digest=body["result_digest"],
    )


# Requests one POST /runtime/v1/results/batch may carry.
MAX_RESULTS_PER_BATCH = 256


def results_batch(doc: object) -> list[object]:
    """The requests of a batch body ``{"results": [...]}``; raises :class:`BadInput`.

    Only the envelope is checked here: each request is judged alone, as the single route
    judges it, and a malformed one gets its own 400 among the others' answers.
    """
    if not isinstance(doc, dict) or set(doc) != {"results"}:
        raise BadInput('the body must be a JSON object with exactly one field, "results"')
    results = doc["results"]
    if not isinstance(results, list) or not results:
        raise BadInput("results must be a non-empty array of CommitResultRequest objects")
    if len(results) > MAX_RESULTS_PER_BATCH:
        raise BadInput(f"at most {MAX_RESULTS_PER_BATCH} results in one batch")
    return results


@attrs.frozen
class CommitResult:
    """First valid result: record ``receipt``; the intent becomes COMMITTED."""

    receipt: ResultReceipt


@attrs.frozen
class DuplicateResult:
    """The exact result is already committed: confirm again, change nothing."""


@attrs.frozen
class RefuseResult:
    """Refuse the receipt; record nothing."""

    http_status: int
    error: str
    message: str


ResultDecision = CommitResult | DuplicateResult | RefuseResult


def decide_result(
    request: ResultRequest,
    state: IntentState | None,
    *,
    scope: TrustedRuntimeWorkScope,
    accept_no_effect_format: bool,
) -> ResultDecision:
    """Judge a result receipt against the intent it names (pure; the store applies it)."""
    if request.scope != scope:
        return RefuseResult(403, "scope_mismatch", "the request scope is not this Runtime's")
    fmt = request.result_format_version
    if fmt not in (RESULT_FORMAT_SUCCESS, RESULT_FORMAT_NO_EFFECT) or (
        fmt == RESULT_FORMAT_NO_EFFECT and not accept_no_effect_format
    ):
        return RefuseResult(422, "unsupported_result_format",
                            f"result format {fmt} is not supported by this Runtime")
    if fmt == RESULT_FORMAT_SUCCESS:
        if not request.remote_id.strip():
            return RefuseResult(400, "bad_result", "format 1 needs a non-empty remote_id")
        if request.canonical_result or request.result_digest:
            return RefuseResult(400, "bad_result",
                                "format 1 carries no canonical_result or result_digest")
    else:
        if request.remote_id:
            return RefuseResult(400, "bad_result", "format 2 must have an empty remote_id")
        try:
            parse_no_effect(request.canonical_result, request.result_digest)
        except ValueError as exc:
            return RefuseResult(400, "bad_result", f"format 2: {exc}")
    if state is None:
        return RefuseResult(404, "unknown_intent", "no such intent")
    if state.status is IntentStatus.PENDING:
        # The handoff's answer is still on its way back to the outbox (a batch
        # answer is slower than a fast effect): retryable, never fail closed.
        return RefuseResult(503, "handoff_answer_pending",
                            "the intent's handoff has not been answered yet; retry")
    if state.status not in (IntentStatus.ACCEPTED, IntentStatus.COMMITTED):
        return RefuseResult(409, "intent_not_accepted",
                            f"the intent is {state.status.value}, not ACCEPTED")
    intent = state.intent
    if (
        request.command_id != state.command_id
        or request.payload_digest != intent.payload_digest
        or request.catalog_revision != intent.catalog_revision
    ):
        return RefuseResult(409, "intent_mismatch",
                            "command id, payload digest or Catalog revision differs")
    if fmt == RESULT_FORMAT_NO_EFFECT and intent.kind not in NO_EFFECT_INTENT_KINDS:
        return RefuseResult(400, "no_effect_not_allowed",
                            f"a {intent.kind} intent does not admit a no-effect result")
    receipt = request.receipt()
    if state.status == IntentStatus.COMMITTED:
        if receipt == state.receipt:
            return DuplicateResult()
        return RefuseResult(409, "conflicting_result",
                            "a different result is already committed for this intent")
    return CommitResult(receipt)


def apply_commit(state: IntentState, decision: CommitResult, now_us: int) -> IntentState:
    status = next_status(state.status, IntentEvent.RESULT_COMMITTED)
    return attrs.evolve(state, status=status, receipt=decision.receipt, committed_at_us=now_us)

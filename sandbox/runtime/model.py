"""The reference Runtime's pure model: intents, admission answers, owner fence.

Theory of operation
-------------------
An *intent* is the Runtime's immutable record of one outbound change (``UPSERT title`` for a
Lead). It is handed to integrationd once, under ``EffectHandoffKey(scope, intent_id)``, and
integrationd answers with one terminal admission fact. The Runtime tracks the intent's
*status* with the table :data:`TRANSITIONS` ((status, event) -> status); an event missing
from the table is a contract violation and raises :class:`ContractViolation`:

============  ===============  ===============  ===================  ================
status        HANDOFF_ACCEPTED HANDOFF_REJECTED HANDOFF_QUARANTINED  RESULT_COMMITTED
============  ===============  ===============  ===================  ================
PENDING       ACCEPTED         REJECTED         QUARANTINED          --
ACCEPTED      ACCEPTED (same)  --               --                   COMMITTED
REJECTED      --               REJECTED         --                   --
QUARANTINED   ACCEPTED         REJECTED         QUARANTINED          --
COMMITTED     COMMITTED (same) --               --                   --
============  ===============  ===============  ===================  ================

"(same)": a repeated acceptance must name the command id already recorded.

Rules this module encodes (seed 003 and section 6.1 of seed 000):

* Only a ``HANDOFF_REJECTED`` receipt proves non-acceptance. A missing command, a 404, an
  unreadable answer or a quarantine is never treated as rejection.
* PENDING, ACCEPTED and QUARANTINED intents are *outstanding*: they block deleting the Lead
  and transferring its identity (the owner fence). A quarantined handoff has not been proven
  unaccepted, so it releases nothing; a ``HANDOFF_REJECTED`` receipt (for example from a
  withdraw) or a committed result releases it.
* A result receipt commits only for an ACCEPTED intent, for exactly the accepted command id,
  payload digest and Catalog revision, under this Runtime's exact trusted scope. A duplicate
  must be the same immutable result; anything else fails closed.
* Only a committed format-1 (success, RemoteID) receipt proves a remote identity; a
  no-effect (format 2) receipt never does.

Receipt validation lives in :mod:`sandbox.runtime.receipts`. Nothing here performs I/O; the
store applies these decisions and the HTTP layer renders them.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from daemon.core.canonical import canonical_bytes, canonical_digest
from daemon.core.handoff import (
    RESULT_FORMAT_SUCCESS,
    EffectHandoffKey,
    TrustedRuntimeWorkScope,
)

SUPPORTED_FIELDS: Mapping[str, str] = {"title": "jobtitle"}  # Lead field -> provider property
# How an operation's request carries the changed fields: the member holding them and
# each Lead field's remote name (HubSpot's sparse ``properties``; Outreach's JSON:API
# ``attributes``). An operation not named here is HubSpot-shaped.
REQUEST_SHAPES: Mapping[str, tuple[str, Mapping[str, str]]] = {
    "outreach.prospect.update_title": ("attributes", {"title": "title"}),
}
MAX_ERROR_CODE_CHARS = 64


class IntentStatus(enum.StrEnum):
    PENDING = "PENDING"
    ACCEPTED = "ACCEPTED"
    REJECTED = "REJECTED"
    QUARANTINED = "QUARANTINED"
    COMMITTED = "COMMITTED"


class IntentEvent(enum.StrEnum):
    HANDOFF_ACCEPTED = "HANDOFF_ACCEPTED"
    HANDOFF_REJECTED = "HANDOFF_REJECTED"
    HANDOFF_QUARANTINED = "HANDOFF_QUARANTINED"
    RESULT_COMMITTED = "RESULT_COMMITTED"


_S = IntentStatus
_E = IntentEvent
TRANSITIONS: Mapping[tuple[IntentStatus, IntentEvent], IntentStatus] = {
    (_S.PENDING, _E.HANDOFF_ACCEPTED): _S.ACCEPTED,
    (_S.PENDING, _E.HANDOFF_REJECTED): _S.REJECTED,
    (_S.PENDING, _E.HANDOFF_QUARANTINED): _S.QUARANTINED,
    (_S.ACCEPTED, _E.HANDOFF_ACCEPTED): _S.ACCEPTED,
    (_S.ACCEPTED, _E.RESULT_COMMITTED): _S.COMMITTED,
    (_S.REJECTED, _E.HANDOFF_REJECTED): _S.REJECTED,
    (_S.QUARANTINED, _E.HANDOFF_ACCEPTED): _S.ACCEPTED,
    (_S.QUARANTINED, _E.HANDOFF_REJECTED): _S.REJECTED,
    (_S.QUARANTINED, _E.HANDOFF_QUARANTINED): _S.QUARANTINED,
    (_S.COMMITTED, _E.HANDOFF_ACCEPTED): _S.COMMITTED,
}

OUTSTANDING: frozenset[IntentStatus] = frozenset({_S.PENDING, _S.ACCEPTED, _S.QUARANTINED})
"""Statuses that hold the owner fence (block delete and identity transfer)."""


class ContractViolation(Exception):
    """integrationd's answer contradicts what the Runtime already holds as proven."""


def next_status(status: IntentStatus, event: IntentEvent) -> IntentStatus:
    """The status after ``event``; raises :class:`ContractViolation` when not in the table."""
    try:
        return TRANSITIONS[(status, event)]
    except KeyError:
        raise ContractViolation(
            f"{event.value} is not allowed for a {status.value} intent"
        ) from None


# -- intents ---------------------------------------------------------------------------------


@attrs.frozen
class Intent:
    """One immutable outbound intent and the exact handoff derived from it."""

    intent_id: str
    lead_id: str
    kind: str
    field: str
    value: str
    catalog_revision: int
    operation: str
    created_at_us: int
    runtime_outbox_id: str
    effect_handoff_key: str
    payload_digest: str
    # The user whose per-user grant the command runs under ("" : the shared principal).
    user_id: str = ""

    @classmethod
    def create(
        cls,
        *,
        scope: TrustedRuntimeWorkScope,
        intent_id: str,
        lead_id: str,
        field: str,
        value: str,
        catalog_revision: int,
        operation: str,
        created_at_us: int,
        runtime_outbox_id: str,
        kind: str = "UPSERT",
        user_id: str = "",
    ) -> Intent:
        """Build an intent, deriving its handoff key and payload digest."""
        command = build_command(
            intent_id=intent_id,
            kind=kind,
            operation=operation,
            lead_id=lead_id,
            field=field,
            value=value,
            catalog_revision=catalog_revision,
            user_id=user_id,
        )
        return cls(
            intent_id=intent_id,
            lead_id=lead_id,
            kind=kind,
            field=field,
            value=value,
            catalog_revision=catalog_revision,
            operation=operation,
            created_at_us=created_at_us,
            runtime_outbox_id=runtime_outbox_id,
            effect_handoff_key=EffectHandoffKey(scope, intent_id).encode(),
            payload_digest=canonical_digest(command),
            user_id=user_id,
        )

    def command(self) -> dict[str, Any]:
        return build_command(
            intent_id=self.intent_id,
            kind=self.kind,
            operation=self.operation,
            lead_id=self.lead_id,
            field=self.field,
            value=self.value,
            catalog_revision=self.catalog_revision,
            user_id=self.user_id,
        )

    def handoff_body(self) -> bytes:
        """The exact ``POST /v1/commands`` body (canonical JSON; identical on every retry)."""
        return canonical_bytes(
            {
                "effect_handoff_key": self.effect_handoff_key,
                "payload_digest": self.payload_digest,
                "runtime_outbox_id": self.runtime_outbox_id,
                "command": self.command(),
            }
        )

    def reject_body(self) -> bytes:
        """The exact ``POST /v1/handoffs/reject`` body: the same three handoff values."""
        return canonical_bytes(
            {
                "effect_handoff_key": self.effect_handoff_key,
                "payload_digest": self.payload_digest,
                "runtime_outbox_id": self.runtime_outbox_id,
            }
        )


def build_command(
    *,
    intent_id: str,
    kind: str,
    operation: str,
    lead_id: str,
    field: str,
    value: str,
    catalog_revision: int,
    user_id: str = "",
) -> dict[str, Any]:
    """The command integrationd executes; its canonical digest is the payload digest.

    ``user_id`` (when not empty) names the user whose per-user principal binding the
    command runs under; integrationd pins that binding's generation at acceptance, or
    rejects the handoff durably with ``no_user_binding``."""
    command: dict[str, Any] = {
        "intent_id": intent_id,
        "intent_kind": kind,
        "operation": operation,
        "logical_target": {"object": "lead", "lead_id": lead_id},
        "catalog_revision": catalog_revision,
        "request": _request(operation, field, value),
    }
    if user_id:
        command["user_id"] = user_id
    return command


def _request(operation: str, field: str, value: str) -> dict[str, Any]:
    member, names = REQUEST_SHAPES.get(operation, ("properties", SUPPORTED_FIELDS))
    return {member: {names[field]: value}}


@attrs.frozen
class ResultReceipt:
    """The immutable part of a committed result; duplicates must equal it exactly."""

    intent_id: str
    command_id: str
    payload_digest: str
    catalog_revision: int
    result_format_version: int
    remote_id: str
    canonical_result: str
    result_digest: str


@attrs.frozen
class IntentState:
    """An intent and what the Runtime has learned about it so far."""

    intent: Intent
    status: IntentStatus = IntentStatus.PENDING
    command_id: str | None = None
    rejection_receipt: str | None = None  # JSON text of integrationd's HANDOFF_REJECTED receipt
    quarantine: Quarantine | None = None
    receipt: ResultReceipt | None = None
    committed_at_us: int | None = None

    @property
    def outstanding(self) -> bool:
        return self.status in OUTSTANDING


# -- admission answers (integrationd -> Runtime, over HTTP) -----------------------------------


@attrs.frozen
class CommandAccepted:
    command_id: str


@attrs.frozen
class HandoffRejected:
    receipt_json: str


@attrs.frozen
class Quarantine:
    http_status: int
    error: str


@attrs.frozen
class HandoffQuarantined:
    quarantine: Quarantine


@attrs.frozen
class RetryLater:
    """Not a definitive answer (transport error, 5xx, 408/429, unreadable 2xx)."""

    reason: str


@attrs.frozen
class WithdrawRefused:
    """A withdraw got a 4xx that is not an admission fact; the intent is left unchanged."""

    http_status: int
    error: str


AdmissionAnswer = CommandAccepted | HandoffRejected | HandoffQuarantined | RetryLater
RejectAnswer = CommandAccepted | HandoffRejected | WithdrawRefused | RetryLater


def apply_admission(
    state: IntentState, answer: CommandAccepted | HandoffRejected | HandoffQuarantined
) -> IntentState:
    """The intent after a definitive admission answer (pure)."""
    if isinstance(answer, CommandAccepted):
        status = next_status(state.status, IntentEvent.HANDOFF_ACCEPTED)
        if state.command_id is not None and state.command_id != answer.command_id:
            raise ContractViolation(
                f"intent {state.intent.intent_id} was accepted as {state.command_id!r}, "
                f"now reported as {answer.command_id!r}"
            )
        return attrs.evolve(state, status=status, command_id=answer.command_id)
    if isinstance(answer, HandoffRejected):
        status = next_status(state.status, IntentEvent.HANDOFF_REJECTED)
        receipt = state.rejection_receipt or answer.receipt_json
        return attrs.evolve(state, status=status, rejection_receipt=receipt)
    status = next_status(state.status, IntentEvent.HANDOFF_QUARANTINED)
    return attrs.evolve(state, status=status, quarantine=answer.quarantine)


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _error_code(doc: dict[str, Any] | None, status: int) -> str:
    error = doc.get("error") if doc else None
    if isinstance(error, str) and 0 < len(error) <= MAX_ERROR_CODE_CHARS:
        return error
    return f"http_{status}"


def _admission_fact(doc: dict[str, Any] | None) -> CommandAccepted | HandoffRejected | None:
    if doc is None:
        return None
    admission = doc.get("admission")
    if admission == "COMMAND_ACCEPTED":
        command_id = doc.get("command_id")
        if isinstance(command_id, str) and command_id:
            return CommandAccepted(command_id)
    if admission == "HANDOFF_REJECTED":
        receipt = doc.get("receipt")
        if isinstance(receipt, dict):
            return HandoffRejected(json.dumps(receipt, sort_keys=True, separators=(",", ":")))
    return None


_RETRYABLE_4XX = frozenset({408, 429})
# 409 codes that mean "nothing was written; send the same bytes again later"
# (docs/runtime-handoff.md), not a refusal of the request itself.
_RETRYABLE_CODES = frozenset({"binding_not_connected"})


def _classify(
    http_status: int, body: bytes
) -> CommandAccepted | HandoffRejected | RetryLater | dict[str, Any]:
    """The part both answers share: an admission fact, a retry, or the refusal's JSON."""
    return _classify_doc(http_status, _json_object(body))


def _classify_doc(
    http_status: int, doc: dict[str, Any] | None
) -> CommandAccepted | HandoffRejected | RetryLater | dict[str, Any]:
    fact = _admission_fact(doc)
    if 200 <= http_status < 300:
        return fact if fact is not None else RetryLater(f"unreadable {http_status} answer")
    if http_status == 409 and isinstance(fact, HandoffRejected):
        return fact
    if http_status >= 500 or http_status in _RETRYABLE_4XX or http_status < 400:
        return RetryLater(f"http {http_status}")
    if http_status == 409 and _error_code(doc, http_status) in _RETRYABLE_CODES:
        # integrationd wrote nothing and says when to send again (the binding is
        # disconnected until an operator reconnects it): a wait, not a contract breach.
        return RetryLater(_error_code(doc, http_status))
    return doc or {}


def classify_command_answer(http_status: int, body: bytes) -> AdmissionAnswer:
    """Classify integrationd's answer to ``POST /v1/commands``."""
    answer = _classify(http_status, body)
    if isinstance(answer, dict):
        return HandoffQuarantined(Quarantine(http_status, _error_code(answer, http_status)))
    return answer


def classify_batch_answer(http_status: int, body: bytes, *,
                          expected: int) -> list[AdmissionAnswer] | RetryLater:
    """Classify a 200 answer to ``POST /v1/commands/batch``: one answer per entry.

    Each entry carries the status ``POST /v1/commands`` would have answered and is
    classified exactly as that answer. Anything unreadable, or the wrong number of
    entries, retries the whole batch (admission is idempotent).
    """
    if http_status != 200:
        return RetryLater(f"http {http_status}")
    doc = _json_object(body)
    results = doc.get("results") if doc else None
    if not isinstance(results, list) or len(results) != expected or not all(
            isinstance(r, dict) and isinstance(r.get("status"), int) for r in results):
        return RetryLater("unreadable batch answer")
    answers: list[AdmissionAnswer] = []
    for result in results:
        answer = _classify_doc(result["status"], result)
        answers.append(HandoffQuarantined(Quarantine(result["status"], _error_code(
            answer, result["status"]))) if isinstance(answer, dict) else answer)
    return answers


def classify_reject_answer(http_status: int, body: bytes) -> RejectAnswer:
    """Classify integrationd's answer to ``POST /v1/handoffs/reject`` (RejectIfUnaccepted)."""
    answer = _classify(http_status, body)
    if isinstance(answer, dict):
        return WithdrawRefused(http_status, _error_code(answer, http_status))
    return answer


# -- owner fence ------------------------------------------------------------------------------


@attrs.frozen
class RemoteIdentity:
    """A Lead's remote identity and the intent whose format-1 receipt proved it."""

    remote_id: str
    proof_intent_id: str


@attrs.frozen
class FenceRefusal:
    http_status: int
    error: str
    message: str
    intent_ids: tuple[str, ...] = ()


def outstanding_ids(states: Iterable[IntentState]) -> tuple[str, ...]:
    return tuple(s.intent.intent_id for s in states if s.outstanding)


def decide_delete(states: Iterable[IntentState]) -> FenceRefusal | None:
    """None when the Lead may be deleted; otherwise why not."""
    blocking = outstanding_ids(states)
    if blocking:
        return FenceRefusal(409, "outstanding_intent",
                            "the lead has outstanding intents", blocking)
    return None


def proves_identity(identity: RemoteIdentity, proof: IntentState | None) -> bool:
    """True when ``proof`` is a committed success receipt for exactly this remote id."""
    return (
        proof is not None
        and proof.status == IntentStatus.COMMITTED
        and proof.receipt is not None
        and proof.receipt.result_format_version == RESULT_FORMAT_SUCCESS
        and proof.receipt.remote_id == identity.remote_id
        and proof.intent.intent_id == identity.proof_intent_id
    )


def decide_transfer(
    *,
    source_states: Iterable[IntentState],
    target_states: Iterable[IntentState],
    source_identity: RemoteIdentity | None,
    proof: IntentState | None,
    target_identity: RemoteIdentity | None,
) -> FenceRefusal | None:
    """None when the source Lead's remote identity may move to the target Lead."""
    blocking = outstanding_ids(source_states) + outstanding_ids(target_states)
    if blocking:
        return FenceRefusal(409, "outstanding_intent",
                            "the source or target lead has outstanding intents", blocking)
    if source_identity is None or not proves_identity(source_identity, proof):
        return FenceRefusal(409, "no_proven_remote_identity",
                            "no committed success receipt proves a remote identity")
    if target_identity is not None:
        return FenceRefusal(409, "target_has_remote_identity",
                            "the target lead already has a remote identity")
    return None

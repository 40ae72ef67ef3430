"""Values for commands, admissions, effect attempts, remote links and receipts.

Rows become these values only inside the storage modules that read them.
"""

from __future__ import annotations

import enum

import attrs

from daemon.core.effect_step import DispatchPins
from daemon.core.handoff import TrustedRuntimeWorkScope


class Admission(enum.StrEnum):
    COMMAND_ACCEPTED = "COMMAND_ACCEPTED"
    HANDOFF_REJECTED = "HANDOFF_REJECTED"
    # Not a stored admission: the request conflicted with the stored one.
    QUARANTINED = "QUARANTINED"


class Settlement(enum.StrEnum):
    OPEN = "open"
    SUCCEEDED = "succeeded"  # a success result is persisted; no further dispatch
    NO_EFFECT = "no_effect"  # a no-effect result is persisted; no further dispatch
    RETIRED = "retired"  # an operator retired/superseded it; no further dispatch


@attrs.frozen(kw_only=True)
class CommandDraft:
    """What command acceptance freezes (the scope comes from the authenticated caller)."""

    scope: TrustedRuntimeWorkScope
    runtime_name: str
    handoff_key: str
    payload_digest: str
    runtime_outbox_id: str
    intent_id: str
    intent_kind: str
    operation: str
    local_object: str
    local_id: str
    binding_id: str
    # The durable PrincipalBinding's generation as admission read it.
    binding_generation: int
    catalog_revision: int
    catalog_digest: str
    frozen_request: str  # canonical JSON
    max_attempts: int
    lane: str
    # The RemoteLink key the command targets, when admission could compute it:
    # carried in the WorkItem payload so the handler reads its context at once.
    link_key: str = ""


@attrs.frozen
class AdmissionResult:
    admission: Admission
    command_id: str | None = None
    receipt: str | None = None  # canonical JSON of a rejection receipt
    work_id: str | None = None
    # True only for the call that created the admission fact.
    created: bool = False
    # Why a request was quarantined (digest or outbox identity differs).
    reason: str = ""


@attrs.frozen(kw_only=True)
class Command:
    command_id: str
    handoff_key: str | None
    scope: TrustedRuntimeWorkScope
    runtime_name: str
    intent_id: str
    intent_kind: str
    operation: str
    local_object: str
    local_id: str
    binding_id: str
    # The durable PrincipalBinding generation pinned at admission (None: admitted before
    # the pin existed and never backfilled: refused before any call).
    binding_generation: int | None
    catalog_revision: int
    frozen_request: str
    payload_digest: str
    runtime_outbox_id: str
    settlement: Settlement
    repair_of: str | None
    created_at_us: int
    # The digest of the pinned Catalog revision ("" for commands older than pinning).
    catalog_digest: str = ""
    # The RemoteLink pinned at admission: its key, and its generation and remote
    # id as they were then (generation None: no link existed). All None for
    # commands admitted before pinning existed (refused before dispatch).
    link_key: str | None = None
    link_generation: int | None = None
    remote_id: str | None = None


@attrs.frozen
class BindingNow:
    """The durable PrincipalBinding of a command's binding as it is now."""

    generation: int
    connected: bool


@attrs.frozen(kw_only=True)
class Kin:
    """The WorkItems whose attempts are one effect's, whichever item made them: one
    family's items of one subject in one lane whose dedupe key starts with ``key_prefix``
    (every create step of one subscription). An unresolved attempt of any of them holds
    the next checkpoint of every one (issue 22: a new item does not start a new effect's
    history)."""

    family: str
    subject_kind: str
    subject_id: str
    lane: str
    key_prefix: str


@attrs.frozen(kw_only=True)
class AttemptDraft:
    command_id: str
    method: str
    target_path: str
    safe_headers: str  # canonical JSON of the headers that are safe to keep
    body_sha256: str
    idempotency_key: str
    pre_dispatch_evidence: str  # canonical JSON (binding generation, link, checks)
    # The client's deadline for the exchange (its timeout), in microseconds.
    give_up_after_us: int = 0
    # What the request was built for; the command checkpoint refuses a draft without
    # them, and one whose pins are not all current (storage.effects).
    pins: DispatchPins | None = None


@attrs.frozen(kw_only=True)
class EffectAttempt:
    attempt_id: str
    command_id: str
    work_id: str
    ownership_epoch: int
    method: str
    target_path: str
    safe_headers: str
    body_sha256: str
    idempotency_key: str
    pre_dispatch_evidence: str
    dispatch_started_at_us: int
    response_status: int | None
    provider_evidence: str | None
    outcome: str | None
    failure_class: str | None
    finished_at_us: int | None
    disposition: str | None
    disposition_note: str | None
    disposition_by: str | None
    disposition_at_us: int | None
    # not_sent / not_applied / maybe_applied / applied (None: recorded before evidence was).
    evidence: str | None = None
    # When the client gave up on (or finished) the exchange; until the outcome is
    # recorded, the client's deadline.
    gave_up_at_us: int | None = None

    @property
    def unresolved(self) -> bool:
        """Dispatched (or maybe dispatched) with no proven outcome yet."""
        if self.disposition is not None:
            return False
        return self.outcome is None or self.outcome == "OUTCOME_UNKNOWN"


class Disposition(enum.StrEnum):
    PROVEN_APPLIED = "proven_applied"  # reconciliation read the effect back
    PROVEN_ABSENT = "proven_absent"  # reconciliation proved nothing was written
    OPERATOR_APPLIED = "operator_applied"  # an operator attached provider evidence
    OPERATOR_ABSENT = "operator_absent"


APPLIED_DISPOSITIONS = frozenset({Disposition.PROVEN_APPLIED, Disposition.OPERATOR_APPLIED})


class LinkState(enum.StrEnum):
    PENDING_CREATE = "pending_create"
    ACTIVE = "active"
    RETIRED = "retired"


@attrs.frozen(kw_only=True)
class RemoteLink:
    link_key: str
    scope_digest: str
    local_object: str
    local_id: str
    remote_object: str | None
    remote_id: str | None
    locator_hash: str | None
    state: LinkState
    generation: int
    updated_at_us: int
    # The provider's last-modified time of the remote record as our latest accepted
    # change left it (migration 0033); None: unknown.
    modified_at_us: int | None = None


class ReceiptState(enum.StrEnum):
    PENDING = "pending"
    CONFIRMED = "confirmed"


@attrs.frozen(kw_only=True)
class ResultReceipt:
    command_id: str
    intent_id: str
    result_format_version: int
    remote_id: str
    canonical_result: str
    result_digest: str
    state: ReceiptState
    last_error: str | None
    created_at_us: int
    confirmed_at_us: int | None

"""WorkItem values (pure).

A :class:`WorkSpec` is what an enqueuer asks for; a :class:`WorkItem` is a row
as the storage port returns it; a :class:`Fence` is the live-claim proof that
every write after a claim must present (id + lease token + ownership epoch).
"""

from __future__ import annotations

import attrs

from daemon.core.states import WorkState

MAX_SUMMARY_CHARS = 240


@attrs.frozen
class Fence:
    """Proof of a live claim: the only thing that authorizes writes after a claim."""

    work_id: str
    lease_token: str
    ownership_epoch: int


@attrs.frozen(kw_only=True)
class WorkSpec:
    """Identity, binding and scheduling facts fixed when a WorkItem is created."""

    family: str
    org_id: str
    app_installation_id: str = ""
    subject_kind: str
    subject_id: str
    definition_ref: str = ""
    catalog_revision: int = 0
    catalog_digest: str = ""
    payload: str = "{}"
    payload_schema_version: int = 1
    engine_capability_version: int = 1
    queue_class: str = "default"
    source_lane: str | None = None
    target_lane: str | None = None
    max_attempts: int = 5
    run_after_us: int | None = None
    dedupe_key: str | None = None
    replay_of: str | None = None

    def __attrs_post_init__(self) -> None:
        if not self.family:
            raise ValueError("family is required")
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")


@attrs.frozen(kw_only=True)
class WorkItem:
    """One WorkItem row: identity/binding fields plus the mutable execution fields."""

    work_id: str
    family: str
    org_id: str
    app_installation_id: str
    subject_kind: str
    subject_id: str
    definition_ref: str
    catalog_revision: int
    catalog_digest: str
    payload: str
    payload_schema_version: int
    engine_capability_version: int
    queue_class: str
    source_lane: str | None
    source_seq: int | None
    target_lane: str | None
    state: WorkState
    run_after_us: int
    attempt: int
    max_attempts: int
    lease_owner: str | None
    lease_token: str | None
    lease_until_us: int | None
    ownership_epoch: int
    cancel_requested: bool
    rollback_execution_fence_id: str | None
    legacy_outcome_receipt_version: int | None
    legacy_outcome_receipt_digest: str | None
    terminal_outcome: str | None
    failure_class: str | None
    operator_summary: str | None
    dedupe_key: str | None
    replay_of: str | None
    created_at_us: int
    updated_at_us: int

    @property
    def fence(self) -> Fence | None:
        """The live-claim fence if the row is processing, else ``None``."""
        if self.state is not WorkState.PROCESSING or self.lease_token is None:
            return None
        return Fence(self.work_id, self.lease_token, self.ownership_epoch)


def sanitize_summary(text: str) -> str:
    """An operator summary: printable, one line, bounded. Callers pass no payloads."""
    flat = "".join(ch if ch.isprintable() else " " for ch in text)
    flat = " ".join(flat.split())
    if len(flat) > MAX_SUMMARY_CHARS:
        flat = flat[: MAX_SUMMARY_CHARS - 1] + "\u2026"
    return flat

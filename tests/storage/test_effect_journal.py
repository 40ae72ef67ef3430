"""Conformance: the effect journal, settlement and receipts, fenced, on every backend."""

from __future__ import annotations

import pytest

from daemon.core.work import WorkItem
from storage.effect_values import AttemptDraft, Disposition, ReceiptState, Settlement
from storage.port import LostLease, WorkConflict, WorkQuery
from storage.work_store import WorkStore
from tests.support.commands import draft
from tests.support.work import SEC, T0, claim


def attempt(command_id: str) -> AttemptDraft:
    return AttemptDraft(command_id=command_id, method="PATCH",
                        target_path="/crm/v3/objects/contacts/7", safe_headers="{}",
                        body_sha256="sha256:" + "0" * 64, idempotency_key=command_id,
                        pre_dispatch_evidence="{}")


async def _claimed_command(store: WorkStore, ttl: int = 30 * SEC) -> tuple[str, WorkItem]:
    result = await store.command_accept(draft(), T0)
    assert result.command_id is not None
    (item,) = (await claim(store, family="external_effect", ttl=ttl)).claimed
    return result.command_id, item


async def test_checkpoint_needs_the_live_fence_and_is_one_per_claim(store: WorkStore) -> None:
    command_id, item = await _claimed_command(store, ttl=5 * SEC)
    assert item.fence is not None
    attempt_id = await store.effect_checkpoint(item.fence, attempt(command_id), T0)
    with pytest.raises(WorkConflict, match="unresolved attempt"):
        await store.effect_checkpoint(item.fence, attempt(command_id), T0)
    (row,) = await store.effect_attempts(command_id)
    assert (row.attempt_id, row.ownership_epoch, row.outcome, row.unresolved) == (
        attempt_id, 1, None, True)
    # After the lease is gone, the stale claimant can neither checkpoint nor record.
    later = T0 + 6 * SEC
    with pytest.raises(LostLease):
        await store.effect_checkpoint(item.fence, attempt(command_id), later)
    with pytest.raises(LostLease):
        await store.effect_record(item.fence, attempt_id, outcome="ACCEPTED", response_status=200,
                                  provider_evidence={}, failure_class="", now_us=later)
    with pytest.raises(LostLease):
        await store.effect_settle(item.fence, command_id=command_id,
                                  settlement=Settlement.SUCCEEDED, result_format_version=1,
                                  remote_id="7", canonical_result="", result_digest="",
                                  receipt_max_attempts=5, now_us=later)
    assert (await store.command_get(command_id)).settlement is Settlement.OPEN  # type: ignore[union-attr]


async def test_one_outcome_per_attempt_then_settlement_queues_the_receipt(
    store: WorkStore,
) -> None:
    command_id, item = await _claimed_command(store)
    assert item.fence is not None
    attempt_id = await store.effect_checkpoint(item.fence, attempt(command_id), T0)
    await store.effect_record(item.fence, attempt_id, outcome="ACCEPTED", response_status=200,
                              provider_evidence={"id": "7"}, failure_class="", now_us=T0)
    with pytest.raises(WorkConflict, match="already has an outcome"):
        await store.effect_record(item.fence, attempt_id, outcome="REJECTED",
                                  response_status=400, provider_evidence={}, failure_class="x",
                                  now_us=T0)
    receipt_work = await store.effect_settle(
        item.fence, command_id=command_id, settlement=Settlement.SUCCEEDED,
        result_format_version=1, remote_id="7", canonical_result="", result_digest="",
        receipt_max_attempts=5, now_us=T0)
    with pytest.raises(WorkConflict, match="already settled"):
        await store.effect_settle(
            item.fence, command_id=command_id, settlement=Settlement.NO_EFFECT,
            result_format_version=2, remote_id="", canonical_result="{}", result_digest="x",
            receipt_max_attempts=5, now_us=T0)
    # No further dispatch once settled.
    with pytest.raises(WorkConflict, match="no further dispatch"):
        await store.effect_checkpoint(item.fence, attempt(command_id), T0)
    receipt = await store.receipt_get(command_id)
    assert receipt is not None
    assert (receipt.result_format_version, receipt.remote_id, receipt.state) == (
        1, "7", ReceiptState.PENDING)
    (sender,) = await store.work_list(WorkQuery(family="runtime_receipt"))
    assert sender.work_id == receipt_work and sender.subject_id == command_id
    (claimed,) = (await claim(store, family="runtime_receipt")).claimed
    assert claimed.fence is not None
    await store.receipt_mark(claimed.fence, command_id, confirmed=True, error=None, now_us=T0)
    confirmed = await store.receipt_get(command_id)
    assert confirmed is not None and confirmed.state is ReceiptState.CONFIRMED


async def test_unknown_outcomes_wait_for_a_disposition(store: WorkStore) -> None:
    command_id, item = await _claimed_command(store)
    assert item.fence is not None
    attempt_id = await store.effect_checkpoint(item.fence, attempt(command_id), T0)
    await store.effect_record(item.fence, attempt_id, outcome="OUTCOME_UNKNOWN",
                              response_status=None, provider_evidence={},
                              failure_class="transport", now_us=T0)
    assert await store.effect_unknown_backlog() == 1
    with pytest.raises(WorkConflict, match="operator_applied or operator_absent"):
        await store.effect_operator_disposition(
            attempt_id=attempt_id, disposition=Disposition.PROVEN_APPLIED, note="n",
            actor="alice", role="operator", now_us=T0)
    done = await store.effect_operator_disposition(
        attempt_id=attempt_id, disposition=Disposition.OPERATOR_APPLIED,
        note="HubSpot audit log shows the change", actor="alice", role="operator", now_us=T0)
    assert (done.disposition, done.disposition_by, done.outcome, done.unresolved) == (
        "operator_applied", "alice", "OUTCOME_UNKNOWN", False)
    with pytest.raises(WorkConflict, match="not awaiting"):
        await store.effect_operator_disposition(
            attempt_id=attempt_id, disposition=Disposition.OPERATOR_ABSENT, note="n",
            actor="bob", role="admin", now_us=T0)
    assert await store.effect_unknown_backlog() == 0
    (entry,) = await store.audit_list(target_id=attempt_id)
    assert (entry.action, entry.actor, entry.reason) == (
        "effect.disposition", "alice", "HubSpot audit log shows the change")

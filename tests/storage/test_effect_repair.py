"""Conformance: operator repair cannot multiply effects or strand the Runtime intent
(issue 8 item 4), on every backend."""

from __future__ import annotations

import json

import pytest

from daemon.core.handoff import NoEffectReason, parse_no_effect
from daemon.core.outcomes import DeadLetter
from daemon.core.work import WorkItem
from storage.command_repair import RepairActor
from storage.commands import _insert_command
from storage.effect_values import Disposition, Settlement
from storage.operator_refusal import ActionRefused
from storage.port import DuplicateKey, SqlTx, WorkConflict, WorkQuery
from storage.work_store import WorkStore
from tests.storage.test_effect_journal import record, settle_fenced
from tests.support.commands import accept_pinned, attempt, draft, publish_test_revision
from tests.support.work import SEC, T0, claim, finalize

WHO = RepairActor(actor="otto", role="operator", reason="repair it")
LATER = T0 + 120 * SEC  # past every in-flight window used here


async def _repair(store: WorkStore, command_id: str, now: int) -> str:
    await publish_test_revision(store)
    return await store.command_repair(command_id, WHO, binding_generation=1,
                                      catalog_revision=7, catalog_digest="sha256:catalog",
                                      max_attempts=8, now_us=now)


async def _accepted(store: WorkStore, intent: str = "int-1") -> str:
    result = await accept_pinned(store, draft(intent), T0)
    assert result.command_id is not None
    return result.command_id


async def _claim_one(store: WorkStore, now: int = T0) -> WorkItem:
    (item,) = (await claim(store, family="external_effect", now=now)).claimed
    assert item.fence is not None
    return item


async def _dead_unknown(store: WorkStore, command_id: str, *, now: int = T0) -> str:
    """One dispatched attempt with an unknown outcome, its work dead; the attempt id."""
    item = await _claim_one(store, now)
    assert item.fence is not None
    attempt_id = await store.effect_checkpoint(item.fence, attempt(command_id), lambda: now)
    await record(store, item.fence, attempt_id, now, outcome="OUTCOME_UNKNOWN", status=None,
                 failure_class="transport")
    await finalize(store, item, DeadLetter("outcome_unknown", "operator needed"), now=now)
    return attempt_id


async def _absent(store: WorkStore, attempt_id: str, now: int = LATER) -> None:
    await store.effect_operator_disposition(
        attempt_id=attempt_id, disposition=Disposition.OPERATOR_ABSENT,
        note="not in the provider's history", actor="otto", role="operator",
        in_flight_window_us=30 * SEC, now_us=now)


async def _settle_repair(store: WorkStore, repair_id: str, settlement: Settlement, *,
                         now: int = LATER, attempt_outcome: str | None = "ACCEPTED") -> None:
    (item,) = [i for i in (await claim(store, family="external_effect", now=now)).claimed
               if i.subject_id == repair_id]
    assert item.fence is not None
    if attempt_outcome is not None:
        attempt_id = await store.effect_checkpoint(item.fence, attempt(repair_id), lambda: now)
        # The evidence classify() gives such an answer: a 200 applied, a 400 not applied.
        await record(store, item.fence, attempt_id, now, outcome=attempt_outcome,
                     status=200 if attempt_outcome == "ACCEPTED" else 400,
                     effect_evidence="applied" if attempt_outcome == "ACCEPTED"
                     else "not_applied")
    if settlement is Settlement.SUCCEEDED:
        await settle_fenced(store, item.fence, repair_id, now, settlement=settlement,
                            result_format=1, remote_id="7")
    else:
        await settle_fenced(store, item.fence, repair_id, now, settlement=settlement,
                            result_format=2, canonical="{}", digest="sha256:" + "0" * 64)


async def test_repair_of_an_already_repaired_command_is_refused(store: WorkStore) -> None:
    command_id = await _accepted(store)
    await _absent(store, await _dead_unknown(store, command_id))
    first = await _repair(store, command_id, LATER)
    with pytest.raises(WorkConflict, match=f"repaired by {first}"):
        await _repair(store, command_id, LATER + 1)
    repairs = [e for e in await store.audit_list(target_id=command_id)
               if e.action == "command.repair"]
    assert len(repairs) == 1
    # The unique key holds even past the check (a racing second repair).
    original = await store.command_get(command_id)
    assert original is not None

    async def second(tx: SqlTx) -> str:
        return await _insert_command(tx, draft("int-x"), "01HZZZZZZZZZZZZZZZZZZZZZZZ", LATER,
                                     repair_of=command_id)

    with pytest.raises(DuplicateKey):
        await store.db.transact(second, name="test.second_repair")


async def test_repair_after_a_no_effect_settlement_is_refused(store: WorkStore) -> None:
    command_id = await _accepted(store)
    item = await _claim_one(store)
    assert item.fence is not None
    await settle_fenced(store, item.fence, command_id, T0, settlement=Settlement.NO_EFFECT,
                        result_format=2, canonical="{}", digest="sha256:" + "0" * 64)
    await finalize(store, item, DeadLetter("rejected", "no effect sent"))
    with pytest.raises(WorkConflict, match="is settled"):
        await _repair(store, command_id, LATER)
    assert await store.command_repaired_by(command_id) is None


async def test_repair_of_a_command_whose_effect_is_proven_applied_is_refused(
    store: WorkStore,
) -> None:
    command_id = await _accepted(store)
    attempt_id = await _dead_unknown(store, command_id)
    await store.effect_operator_disposition(
        attempt_id=attempt_id, disposition=Disposition.OPERATOR_APPLIED, note="seen",
        actor="otto", role="operator", in_flight_window_us=30 * SEC, now_us=LATER)
    with pytest.raises(WorkConflict, match="proven applied"):
        await _repair(store, command_id, LATER)


async def test_repair_with_an_unresolved_attempt_is_refused(store: WorkStore) -> None:
    command_id = await _accepted(store)
    await _dead_unknown(store, command_id)
    with pytest.raises(WorkConflict, match=r"\(unresolved\): .*record a disposition"):
        await _repair(store, command_id, LATER)


async def test_a_repairs_success_is_the_original_intents_receipt(store: WorkStore) -> None:
    command_id = await _accepted(store)
    await _absent(store, await _dead_unknown(store, command_id))
    repair_id = await _repair(store, command_id, LATER)
    assert await store.receipt_get(command_id) is None  # blocking until the repair lands
    await _settle_repair(store, repair_id, Settlement.SUCCEEDED)
    receipt = await store.receipt_get(command_id)
    assert receipt is not None
    assert (receipt.intent_id, receipt.result_format_version, receipt.remote_id) == (
        "int-1", 1, "7")
    assert await store.receipt_get(repair_id) is None
    (sender,) = await store.work_list(WorkQuery(family="runtime_receipt"))
    request = json.loads(sender.payload)["request"]
    # Bound to the original intent and the command the Runtime accepted.
    assert (request["command_id"], request["intent_id"], request["remote_id"]) == (
        command_id, "int-1", "7")
    original = await store.command_get(command_id)
    assert original is not None and request["payload_digest"] == original.payload_digest


async def test_a_repairs_no_effect_is_sent_only_when_the_whole_lineage_proves_it(
    store: WorkStore,
) -> None:
    # The original's attempt was disposed absent by an operator; the repair is
    # rejected by the provider: every attempt of the lineage is effect-free.
    command_id = await _accepted(store)
    await _absent(store, await _dead_unknown(store, command_id))
    repair_id = await _repair(store, command_id, LATER)
    await _settle_repair(store, repair_id, Settlement.NO_EFFECT, attempt_outcome="REJECTED")
    receipt = await store.receipt_get(command_id)
    assert receipt is not None and receipt.result_format_version == 2
    result = parse_no_effect(receipt.canonical_result, receipt.result_digest)
    assert result.reason is NoEffectReason.DEFINITIVE_NO_EFFECT


async def test_a_repair_of_a_repair_answers_the_root_intent(store: WorkStore) -> None:
    command_id = await _accepted(store)
    await _absent(store, await _dead_unknown(store, command_id))
    repair_id = await _repair(store, command_id, LATER)
    again = T0 + 300 * SEC
    await _absent(store, await _dead_unknown(store, repair_id, now=LATER), now=again)
    second = await _repair(store, repair_id, again)
    assert [c.command_id for c in await store.command_lineage(second)] == [
        command_id, repair_id, second]
    await _settle_repair(store, second, Settlement.SUCCEEDED, now=again)
    receipt = await store.receipt_get(command_id)
    assert receipt is not None and (receipt.intent_id, receipt.remote_id) == ("int-1", "7")


async def test_retiring_a_repair_with_proof_answers_the_root_intent(store: WorkStore) -> None:
    command_id = await _accepted(store)
    await _absent(store, await _dead_unknown(store, command_id))
    repair_id = await _repair(store, command_id, LATER)
    (repair_work,) = [i for i in await store.work_list(WorkQuery(family="external_effect"))
                      if i.subject_id == repair_id]
    await store.work_cancel(repair_work.work_id, LATER)  # never claimed: no attempt
    settlement = await store.command_retire(repair_id, WHO, receipt_max_attempts=5,
                                            now_us=LATER)
    # The repair sent nothing; the original's one attempt is disposed absent.
    assert settlement is Settlement.NO_EFFECT
    receipt = await store.receipt_get(command_id)
    assert receipt is not None and receipt.result_format_version == 2
    result = parse_no_effect(receipt.canonical_result, receipt.result_digest)
    assert result.reason is NoEffectReason.DEFINITIVE_NO_EFFECT


async def test_retire_computes_its_evidence_in_its_own_transaction(store: WorkStore) -> None:
    # Nothing was ever dispatched: the retire itself proves REJECTED_BEFORE_DISPATCH
    # (no evidence is passed in by the caller).
    command_id = await _accepted(store)
    item = await _claim_one(store)
    await finalize(store, item, DeadLetter("no_remote_link", "no link"))
    settlement = await store.command_retire(command_id, WHO, receipt_max_attempts=5,
                                            now_us=LATER)
    assert settlement is Settlement.NO_EFFECT
    receipt = await store.receipt_get(command_id)
    assert receipt is not None
    result = parse_no_effect(receipt.canonical_result, receipt.result_digest)
    assert result.reason is NoEffectReason.REJECTED_BEFORE_DISPATCH
    (entry,) = [e for e in await store.audit_list(target_id=command_id)
                if e.action == "command.retire"]
    assert json.loads(entry.after)["no_effect_reason"] == "REJECTED_BEFORE_DISPATCH"


async def test_retire_of_an_applied_command_without_a_pinned_remote_id_is_refused(
    store: WorkStore,
) -> None:
    # An operator saw the effect applied; the command pinned no remote id (admitted
    # without a link), so no success result can name the record: the retire is refused
    # with its code and writes nothing (it used to retire the command without a receipt,
    # stranding the intent: issue 20 item 3).
    command_id = await _accepted(store)
    attempt_id = await _dead_unknown(store, command_id)
    # Today's checkpoint sends nothing without the link pins; such a command is one an
    # older build admitted without a link and dispatched: take its remote id away.

    async def unpin(tx: SqlTx) -> None:
        await tx.execute("UPDATE external_commands SET remote_id = NULL WHERE command_id = ?",
                         (command_id,))

    await store.db.transact(unpin, name="test.unpin")
    await store.effect_operator_disposition(
        attempt_id=attempt_id, disposition=Disposition.OPERATOR_APPLIED, note="seen",
        actor="otto", role="operator", in_flight_window_us=30 * SEC, now_us=LATER)
    with pytest.raises(ActionRefused) as refused:
        await store.command_retire(command_id, WHO, receipt_max_attempts=5, now_us=LATER)
    assert refused.value.code == "no_remote_id"
    assert await store.receipt_get(command_id) is None
    command = await store.command_get(command_id)
    assert command is not None and command.settlement is Settlement.OPEN
    assert [e.action for e in await store.audit_list(target_id=command_id)] == []



"""The HubSpot Lead.Title PATCH slice end to end (seed 11.2), on every backend.

Lead.Title changes in the reference Runtime -> accepted command -> WorkItem ->
one EffectAttempt -> sparse PATCH contact.jobtitle on the simulator -> receipt
committed in the Runtime. Then the ambiguous and failing variants.
"""

from __future__ import annotations

import hashlib
import json

import attrs
import trio

from daemon.core.handoff import NoEffectReason, NoEffectResult
from daemon.core.states import WorkState
from sandbox.hubspot_sim import Fault
from storage.effect_values import ReceiptState, Settlement
from storage.port import WorkQuery
from storage.work_store import WorkStore
from tests.support.attempts import sent_attempts
from tests.support.backends import FreshDatabase
from tests.support.harness import wait_for
from tests.support.slice import RESULTS_TOKEN, running_slice


async def _command_id(store: WorkStore, intent_status: dict[str, object]) -> str:
    command_id = intent_status["command_id"]
    assert isinstance(command_id, str)
    return command_id


async def _receipt_confirmed(store: WorkStore, command_id: str) -> bool:
    # The Runtime commits the receipt first; integrationd records the confirmation
    # with the receipt item's finalization just after.
    receipt = await store.receipt_get(command_id)
    return receipt is not None and receipt.state is ReceiptState.CONFIRMED


async def test_title_change_flows_end_to_end(database: FreshDatabase, store: WorkStore) -> None:
    async with running_slice(store, database.url) as sl:
        await sl.lead("lead-1", "101")
        intent_id = await sl.set_title("lead-1", "CTO")
        intent = await sl.wait_intent("lead-1", intent_id, "COMMITTED")

        # Exactly one HTTP attempt, a sparse PATCH of jobtitle on the linked contact.
        (patch,) = sl.patches("101")
        assert patch.applied and patch.status == 200
        expected_body = b'{"properties":{"jobtitle":"CTO"}}'
        assert patch.body_sha256 in (hashlib.sha256(expected_body).hexdigest(),
                                     "sha256:" + hashlib.sha256(expected_body).hexdigest())
        assert sl.sim.contact("101")["properties"]["jobtitle"] == "CTO"  # type: ignore[index]
        assert sl.sim.contact("101")["properties"]["email"] == "lead-1@example.com"  # type: ignore[index]

        # The Runtime holds a format-1 success receipt naming the same remote record.
        doc = await sl.lead_doc("lead-1")
        (receipt,) = doc["receipts"]
        assert receipt["result_format_version"] == 1 and receipt["remote_id"] == "101"
        assert doc["remote_id"] == "101"

        # integrationd's operator evidence: command, one accepted attempt, confirmed receipt.
        command_id = await _command_id(store, intent)
        command = await store.command_get(command_id)
        assert command is not None and command.settlement is Settlement.SUCCEEDED
        (attempt,) = sent_attempts(await store.effect_attempts(command_id))
        assert (attempt.outcome, attempt.response_status, attempt.method) == ("ACCEPTED", 200,
                                                                              "PATCH")
        assert attempt.target_path == "/crm/v3/objects/contacts/101"
        assert json.loads(attempt.provider_evidence or "{}")["id"] == "101"
        assert "Authorization" not in attempt.safe_headers
        await wait_for(lambda: _receipt_confirmed(store, command_id), within_s=30)
        effect_items = await store.work_list(WorkQuery(family="external_effect"))
        assert [i.state.value for i in effect_items] == ["succeeded"]
        assert [i.state.value for i in await store.work_list(
            WorkQuery(family="runtime_receipt"))] == ["succeeded"]


async def test_titles_apply_in_order_per_lead(database: FreshDatabase, store: WorkStore) -> None:
    async with running_slice(store, database.url) as sl:
        await sl.lead("lead-1", "101")
        ids = [await sl.set_title("lead-1", t) for t in ("A", "B", "C")]
        for intent_id in ids:
            await sl.wait_intent("lead-1", intent_id, "COMMITTED")
        bodies = [r.body_sha256 for r in sl.patches("101")]
        assert len(bodies) == 3
        assert sl.sim.contact("101")["properties"]["jobtitle"] == "C"  # type: ignore[index]


async def test_ambiguous_write_is_reconciled_never_resent(database: FreshDatabase,
                                                         store: WorkStore) -> None:
    async with running_slice(store, database.url) as sl:
        await sl.lead("lead-1", "101")
        # The provider applies the PATCH, then the connection dies before the answer.
        sl.sim.inject(Fault(mode="reset_after", method="PATCH"))
        intent_id = await sl.set_title("lead-1", "CTO")
        intent = await sl.wait_intent("lead-1", intent_id, "COMMITTED")
        assert len(sl.patches("101")) == 1  # one external attempt for an ambiguous write
        attempts = sent_attempts(await store.effect_attempts(await _command_id(store, intent)))
        assert [(a.outcome, a.disposition) for a in attempts] == [
            ("OUTCOME_UNKNOWN", "proven_applied")]
        (receipt,) = (await sl.lead_doc("lead-1"))["receipts"]
        assert receipt["result_format_version"] == 1


async def test_lost_request_is_proven_absent_then_sent_once_more(
    database: FreshDatabase, store: WorkStore
) -> None:
    async with running_slice(store, database.url) as sl:
        await sl.lead("lead-1", "101")
        await trio.sleep(0.3)  # the contact's last change is older than the clock-skew margin
        sl.sim.inject(Fault(mode="reset_before", method="PATCH"))
        intent_id = await sl.set_title("lead-1", "CTO")
        intent = await sl.wait_intent("lead-1", intent_id, "COMMITTED")
        patches = sl.patches("101")
        assert [p.applied for p in patches] == [False, True]
        attempts = sent_attempts(await store.effect_attempts(await _command_id(store, intent)))
        assert [(a.outcome, a.disposition) for a in attempts] == [
            ("OUTCOME_UNKNOWN", "proven_absent"), ("ACCEPTED", None)]


async def test_rate_limit_waits_for_retry_after(database: FreshDatabase,
                                               store: WorkStore) -> None:
    async with running_slice(store, database.url) as sl:
        await sl.lead("lead-1", "101")
        sl.sim.inject(Fault(mode="rate_limit", method="PATCH", retry_after_s=1))
        intent_id = await sl.set_title("lead-1", "CTO")
        intent = await sl.wait_intent("lead-1", intent_id, "COMMITTED")
        first, second = sl.patches("101")
        assert (first.status, first.applied, second.applied) == (429, False, True)
        assert second.received_at - first.received_at >= 1.0  # honoured Retry-After
        attempts = sent_attempts(await store.effect_attempts(await _command_id(store, intent)))
        assert [a.outcome for a in attempts] == ["REPLAY_SAFE_RETRY", "ACCEPTED"]


async def test_provider_rejection_settles_no_effect_and_completes_outside_the_dlq(
    database: FreshDatabase, store: WorkStore
) -> None:
    async with running_slice(store, database.url) as sl:
        await sl.lead("lead-1", "999")
        sl.sim.reset()  # the linked contact no longer exists: HubSpot answers 404
        intent_id = await sl.set_title("lead-1", "CTO")
        await sl.wait_intent("lead-1", intent_id, "COMMITTED")
        (receipt,) = (await sl.lead_doc("lead-1"))["receipts"]
        expected = NoEffectResult(NoEffectReason.DEFINITIVE_NO_EFFECT)
        assert receipt["result_format_version"] == 2 and receipt["remote_id"] == ""
        assert receipt["canonical_result"] == expected.canonical.decode()
        assert receipt["result_digest"] == expected.digest
        # A no-effect receipt never proves a remote identity.
        transfer = await sl.http.post(f"{sl.runtime_url}/leads/lead-1/transfer",
                                      json={"to_lead_id": "lead-2"})
        assert transfer.status_code in (404, 409)
        # Settled with a delivered result: nothing is left for an operator, so the
        # item completes with its outcome recorded (it used to be left dead in the DLQ).
        (item,) = await store.work_list(WorkQuery(family="external_effect"))
        assert (item.state.value, item.terminal_outcome, item.failure_class) == (
            "succeeded", "no_effect", "http_404")
        dead = WorkQuery(family="external_effect", state=WorkState.DEAD)
        assert await store.work_list(dead) == []


async def test_missing_link_is_rejected_before_dispatch(database: FreshDatabase,
                                                       store: WorkStore) -> None:
    async with running_slice(store, database.url) as sl:
        await sl.lead("lead-1", "101", link=False)
        intent_id = await sl.set_title("lead-1", "CTO")
        await sl.wait_intent("lead-1", intent_id, "COMMITTED")
        (receipt,) = (await sl.lead_doc("lead-1"))["receipts"]
        assert json.loads(receipt["canonical_result"])["reason"] == "REJECTED_BEFORE_DISPATCH"
        assert sl.sim.requests == []  # nothing reached the provider


async def test_old_runtime_keeps_the_result_and_retries_after_upgrade(
    database: FreshDatabase, store: WorkStore
) -> None:
    async with running_slice(store, database.url, old_runtime=True) as sl:
        await sl.lead("lead-1", "101", link=False)
        intent_id = await sl.set_title("lead-1", "CTO")
        intent = await sl.wait_intent("lead-1", intent_id, "ACCEPTED")
        command_id = await _command_id(store, intent)

        async def rejected_once() -> bool:
            receipt = await store.receipt_get(command_id)
            return receipt is not None and (receipt.last_error or "").startswith("http_422")

        await wait_for(rejected_once, within_s=30)
        before = await store.receipt_get(command_id)
        assert before is not None and before.state is ReceiptState.PENDING
        assert (await sl.intent("lead-1", intent_id))["status"] == "ACCEPTED"  # still blocking
        # The Runtime upgrades; the exact same result is delivered.
        sl.runtime.store.accept_no_effect_format = True
        await sl.wait_intent("lead-1", intent_id, "COMMITTED", within_s=120)
        await wait_for(lambda: _receipt_confirmed(store, command_id), within_s=30)
        after = await store.receipt_get(command_id)
        assert after is not None
        assert (after.canonical_result, after.result_digest) == (before.canonical_result,
                                                                 before.result_digest)


async def test_runtime_down_while_a_receipt_is_pending(database: FreshDatabase,
                                                      store: WorkStore) -> None:
    async with running_slice(store, database.url) as sl:
        await sl.lead("lead-1", "101")
        settings = sl.settings
        # Point receipts at a closed port: the Runtime is "down".
        down = settings.runtimes[0]
        object.__setattr__(settings, "runtimes", (attrs.evolve(
            down, results_url="http://127.0.0.1:9/runtime/v1/results",
            results_batch_url="http://127.0.0.1:9/runtime/v1/results/batch"),))
        intent_id = await sl.set_title("lead-1", "CTO")
        intent = await sl.wait_intent("lead-1", intent_id, "ACCEPTED")
        command_id = await _command_id(store, intent)

        async def failed_delivery() -> bool:
            receipt = await store.receipt_get(command_id)
            return receipt is not None and (receipt.last_error or "").startswith("transport")

        await wait_for(failed_delivery, within_s=30)
        object.__setattr__(settings, "runtimes", (down,))  # the Runtime is back
        await sl.wait_intent("lead-1", intent_id, "COMMITTED", within_s=60)
        # The Runtime commits first; the confirmation is recorded just after.
        await wait_for(lambda: _receipt_confirmed(store, command_id), within_s=30)
        receipt = await store.receipt_get(command_id)
        assert receipt is not None and receipt.state is ReceiptState.CONFIRMED
        assert RESULTS_TOKEN not in (receipt.last_error or "")

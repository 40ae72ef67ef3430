"""The in-memory store, synchronously: each call is one atomic step."""

from __future__ import annotations

import itertools
import json

import pytest

from daemon.core.handoff import NoEffectReason, NoEffectResult
from sandbox.runtime.model import (
    CommandAccepted,
    ContractViolation,
    HandoffQuarantined,
    HandoffRejected,
    IntentStatus,
    Quarantine,
)
from sandbox.runtime.receipts import BadInput, CommitResult, DuplicateResult
from sandbox.runtime.store import Refused, RuntimeStore
from tests.sandbox_runtime import SCOPE, result_request


@pytest.fixture
def store() -> RuntimeStore:
    counter = itertools.count(1)
    return RuntimeStore(
        scope=SCOPE,
        catalog_revision=7,
        operation="hubspot.contact.update_jobtitle",
        accept_no_effect_format=True,
        now_us=lambda: 1_800_000_000_000_000,
        new_id=lambda prefix: f"{prefix}-{next(counter)}",
    )


def accepted(store: RuntimeStore, lead_id: str = "lead-1", title: str = "CTO") -> str:
    intent_id = store.update_lead(lead_id, {"title": title}).intent.intent_id
    store.record_answer(intent_id, CommandAccepted(f"cmd-{intent_id}"))
    return intent_id


def test_update_creates_intent_and_outbox_entry_atomically(store: RuntimeStore) -> None:
    store.create_lead({"lead_id": "lead-1", "title": "Engineer"})
    state = store.update_lead("lead-1", {"title": "CTO"})
    assert store.lead("lead-1").title == "CTO"
    assert state.status is IntentStatus.PENDING
    [entry] = store.outbox.values()
    assert entry.intent_id == state.intent.intent_id
    assert entry.body == state.intent.handoff_body()
    assert json.loads(entry.body)["command"]["request"] == {"properties": {"jobtitle": "CTO"}}


@pytest.mark.parametrize(
    ("body", "error"),
    [({"owner": "x"}, "unsupported_field"), ({"title": "a", "email": "b"}, "unsupported_field")],
)
def test_update_refuses_other_fields(store: RuntimeStore, body: object, error: str) -> None:
    store.create_lead({"lead_id": "lead-1", "title": "Engineer"})
    with pytest.raises(Refused) as info:
        store.update_lead("lead-1", body)
    assert (info.value.http_status, info.value.error) == (400, error)
    assert not store.intents and not store.outbox


@pytest.mark.parametrize("body", [{}, {"title": 3}, [], "x"])
def test_update_bad_input(store: RuntimeStore, body: object) -> None:
    store.create_lead({"lead_id": "lead-1", "title": "Engineer"})
    with pytest.raises(BadInput):
        store.update_lead("lead-1", body)
    assert not store.intents


def test_outbox_sends_one_lead_in_order(store: RuntimeStore) -> None:
    for lead in ("a", "b"):
        store.create_lead({"lead_id": lead, "title": "t"})
    a1 = store.update_lead("a", {"title": "1"}).intent
    a2 = store.update_lead("a", {"title": "2"}).intent
    b1 = store.update_lead("b", {"title": "1"}).intent
    due = store.due_entries(0.0, exclude=set(), limit=10)
    assert [e.intent_id for e in due] == [a1.intent_id, b1.intent_id]
    # a1 in flight: a2 waits behind it
    assert store.due_entries(0.0, exclude={a1.runtime_outbox_id}, limit=10) == due[1:]
    assert store.due_entries(0.0, exclude=set(), limit=1) == due[:1]
    store.schedule_retry(a1.runtime_outbox_id, next_at=5.0, reason="http 503")
    assert [e.intent_id for e in store.due_entries(1.0, exclude=set(), limit=10)] == [
        b1.intent_id
    ]
    assert store.next_due_at(exclude={b1.runtime_outbox_id}) == 5.0
    store.record_answer(a1.intent_id, CommandAccepted("cmd-1"))
    assert [e.intent_id for e in store.due_entries(1.0, exclude=set(), limit=10)] == [
        a2.intent_id, b1.intent_id
    ]


def test_definitive_answers_end_the_outbox_entry(store: RuntimeStore) -> None:
    store.create_lead({"lead_id": "lead-1", "title": "t"})
    answers: list[CommandAccepted | HandoffRejected | HandoffQuarantined] = [
        CommandAccepted("cmd-1"),
        HandoffRejected("{}"),
        HandoffQuarantined(Quarantine(422, "quarantined")),
    ]
    for answer in answers:
        state = store.update_lead("lead-1", {"title": "x"})
        store.record_answer(state.intent.intent_id, answer)
        assert state.intent.runtime_outbox_id not in store.outbox
    assert store.schedule_retry("obx-gone", next_at=1.0, reason="x") == 0


def test_contract_violation_leaves_the_intent(store: RuntimeStore) -> None:
    store.create_lead({"lead_id": "lead-1", "title": "t"})
    intent_id = accepted(store)
    with pytest.raises(ContractViolation):
        store.record_answer(intent_id, HandoffRejected("{}"))
    assert store.intents[intent_id].status is IntentStatus.ACCEPTED
    assert store.stats()["contract_violations"] == 1


def test_success_receipt_proves_identity_and_transfer_moves_it(store: RuntimeStore) -> None:
    for lead in ("lead-1", "lead-2"):
        store.create_lead({"lead_id": lead, "title": "t"})
    intent_id = accepted(store)
    view = store.intent_view(store.intents[intent_id])
    assert isinstance(store.commit_result(result_request(view)), CommitResult)
    assert isinstance(store.commit_result(result_request(view)), DuplicateResult)
    identity = store.lead("lead-1").remote_identity
    assert identity is not None and identity.remote_id == "123"
    store.transfer("lead-1", {"to_lead_id": "lead-2"})
    assert store.lead("lead-1").remote_identity is None
    assert store.lead("lead-2").remote_identity == identity
    stats = store.stats()
    assert (stats["receipts_committed"], stats["duplicates"], stats["transfers"]) == (1, 1, 1)


def test_no_effect_receipt_releases_but_proves_nothing(store: RuntimeStore) -> None:
    for lead in ("lead-1", "lead-2"):
        store.create_lead({"lead_id": lead, "title": "t"})
    intent_id = accepted(store)
    result = NoEffectResult(NoEffectReason.REJECTED_BEFORE_DISPATCH)
    view = store.intent_view(store.intents[intent_id])
    doc = result_request(view, result_format_version=2, remote_id="",
                         canonical_result=result.canonical.decode(), result_digest=result.digest)
    store.commit_result(doc)
    assert store.lead("lead-1").remote_identity is None
    with pytest.raises(Refused) as info:
        store.transfer("lead-1", {"to_lead_id": "lead-2"})
    assert info.value.error == "no_proven_remote_identity"
    store.delete_lead("lead-1")
    with pytest.raises(Refused) as info:
        store.create_lead({"lead_id": "lead-1", "title": "again"})
    assert info.value.error == "lead_exists"


def test_commit_for_an_old_runtime_records_nothing(store: RuntimeStore) -> None:
    store.accept_no_effect_format = False
    store.create_lead({"lead_id": "lead-1", "title": "t"})
    intent_id = accepted(store)
    result = NoEffectResult(NoEffectReason.DEFINITIVE_NO_EFFECT)
    view = store.intent_view(store.intents[intent_id])
    doc = result_request(view, result_format_version=2, remote_id="",
                         canonical_result=result.canonical.decode(), result_digest=result.digest)
    with pytest.raises(Refused) as info:
        store.commit_result(doc)
    assert (info.value.http_status, info.value.error) == (422, "unsupported_result_format")
    assert store.intents[intent_id].status is IntentStatus.ACCEPTED
    assert store.intents[intent_id].receipt is None
    assert store.stats()["rejected_formats"] == 1

"""The reference Runtime's pure model, synchronous and table-driven."""

from __future__ import annotations

import contextlib
import itertools
import json
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from daemon.core.canonical import canonical_digest
from daemon.core.handoff import (
    EffectHandoffKey,
    NoEffectReason,
    NoEffectResult,
    TrustedRuntimeWorkScope,
)
from sandbox.runtime.model import (
    OUTSTANDING,
    CommandAccepted,
    ContractViolation,
    HandoffQuarantined,
    HandoffRejected,
    Intent,
    IntentEvent,
    IntentState,
    IntentStatus,
    Quarantine,
    RemoteIdentity,
    RetryLater,
    WithdrawRefused,
    apply_admission,
    classify_batch_answer,
    classify_command_answer,
    classify_reject_answer,
    decide_delete,
    decide_transfer,
    next_status,
)
from sandbox.runtime.receipts import (
    BadInput,
    CommitResult,
    DuplicateResult,
    RefuseResult,
    ResultDecision,
    apply_commit,
    decide_result,
    parse_result_request,
)
from tests.sandbox_runtime import SCOPE

S = IntentStatus
E = IntentEvent

# Written out independently of the module's table: every (status, event) pair is judged.
EXPECTED = {
    (S.PENDING, E.HANDOFF_ACCEPTED): S.ACCEPTED,
    (S.PENDING, E.HANDOFF_REJECTED): S.REJECTED,
    (S.PENDING, E.HANDOFF_QUARANTINED): S.QUARANTINED,
    (S.PENDING, E.RESULT_COMMITTED): None,
    (S.ACCEPTED, E.HANDOFF_ACCEPTED): S.ACCEPTED,
    (S.ACCEPTED, E.HANDOFF_REJECTED): None,
    (S.ACCEPTED, E.HANDOFF_QUARANTINED): None,
    (S.ACCEPTED, E.RESULT_COMMITTED): S.COMMITTED,
    (S.REJECTED, E.HANDOFF_ACCEPTED): None,
    (S.REJECTED, E.HANDOFF_REJECTED): S.REJECTED,
    (S.REJECTED, E.HANDOFF_QUARANTINED): None,
    (S.REJECTED, E.RESULT_COMMITTED): None,
    (S.QUARANTINED, E.HANDOFF_ACCEPTED): S.ACCEPTED,
    (S.QUARANTINED, E.HANDOFF_REJECTED): S.REJECTED,
    (S.QUARANTINED, E.HANDOFF_QUARANTINED): S.QUARANTINED,
    (S.QUARANTINED, E.RESULT_COMMITTED): None,
    (S.COMMITTED, E.HANDOFF_ACCEPTED): S.COMMITTED,
    (S.COMMITTED, E.HANDOFF_REJECTED): None,
    (S.COMMITTED, E.HANDOFF_QUARANTINED): None,
    (S.COMMITTED, E.RESULT_COMMITTED): None,
}


def test_expected_table_covers_every_pair() -> None:
    assert set(EXPECTED) == set(itertools.product(IntentStatus, IntentEvent))


@pytest.mark.parametrize(("status", "event"), sorted(EXPECTED))
def test_transition(status: IntentStatus, event: IntentEvent) -> None:
    expected = EXPECTED[(status, event)]
    if expected is None:
        with pytest.raises(ContractViolation):
            next_status(status, event)
    else:
        assert next_status(status, event) is expected


def test_outstanding_statuses_hold_the_fence() -> None:
    assert {S.PENDING, S.ACCEPTED, S.QUARANTINED} == OUTSTANDING


def make_intent(kind: str = "UPSERT", intent_id: str = "int-1", lead_id: str = "lead-1") -> Intent:
    return Intent.create(
        scope=SCOPE,
        intent_id=intent_id,
        lead_id=lead_id,
        field="title",
        value="CTO",
        catalog_revision=7,
        operation="hubspot.contact.update_jobtitle",
        created_at_us=1_800_000_000_000_000,
        runtime_outbox_id=f"obx-{intent_id}",
        kind=kind,
    )


def state(status: IntentStatus = S.PENDING, *, kind: str = "UPSERT", command_id: str | None = None,
          intent_id: str = "int-1", lead_id: str = "lead-1") -> IntentState:
    if command_id is None and status in (S.ACCEPTED, S.COMMITTED):
        command_id = "cmd-1"
    return IntentState(make_intent(kind, intent_id, lead_id), status=status, command_id=command_id)


# -- the handoff ----------------------------------------------------------------------------


def test_handoff_body_is_the_wire_contract() -> None:
    intent = make_intent()
    command = {
        "intent_id": "int-1",
        "intent_kind": "UPSERT",
        "operation": "hubspot.contact.update_jobtitle",
        "logical_target": {"object": "lead", "lead_id": "lead-1"},
        "catalog_revision": 7,
        "request": {"properties": {"jobtitle": "CTO"}},
    }
    assert json.loads(intent.handoff_body()) == {
        "effect_handoff_key": EffectHandoffKey(SCOPE, "int-1").encode(),
        "payload_digest": canonical_digest(command),
        "runtime_outbox_id": "obx-int-1",
        "command": command,
    }
    assert json.loads(intent.reject_body()) == {
        "effect_handoff_key": EffectHandoffKey(SCOPE, "int-1").encode(),
        "payload_digest": canonical_digest(command),
        "runtime_outbox_id": "obx-int-1",
    }
    assert intent.handoff_body() == make_intent().handoff_body()


# -- admission answers ----------------------------------------------------------------------

ACCEPTED_BODY = b'{"admission":"COMMAND_ACCEPTED","command_id":"cmd-9"}'
REJECTED_BODY = b'{"admission":"HANDOFF_REJECTED","receipt":{"version":1}}'
QUARANTINED_BODY = b'{"error":"quarantined","message":"digest differs"}'

COMMAND_ANSWERS: list[tuple[int, bytes, object]] = [
    (200, ACCEPTED_BODY, CommandAccepted("cmd-9")),
    (201, ACCEPTED_BODY, CommandAccepted("cmd-9")),
    (200, b'{"admission":"COMMAND_ACCEPTED"}', RetryLater("unreadable 200 answer")),
    (200, b'{"admission":"COMMAND_ACCEPTED","command_id":""}', RetryLater("unreadable 200 answer")),
    (200, b"not json", RetryLater("unreadable 200 answer")),
    (200, b"[]", RetryLater("unreadable 200 answer")),
    (409, REJECTED_BODY, HandoffRejected('{"version":1}')),
    (409, b'{"admission":"HANDOFF_REJECTED"}', HandoffQuarantined(Quarantine(409, "http_409"))),
    (409, QUARANTINED_BODY, HandoffQuarantined(Quarantine(409, "quarantined"))),
    # The binding is disconnected: nothing was written; resent once it is reconnected
    # (docs/runtime-handoff.md), never a quarantine (simulation seeds 31, 32).
    (409, b'{"error":"binding_not_connected","message":"disconnected"}',
     RetryLater("binding_not_connected")),
    (422, QUARANTINED_BODY, HandoffQuarantined(Quarantine(422, "quarantined"))),
    (400, b"", HandoffQuarantined(Quarantine(400, "http_400"))),
    (401, b'{"error":"unauthorized"}', HandoffQuarantined(Quarantine(401, "unauthorized"))),
    (404, b"{}", HandoffQuarantined(Quarantine(404, "http_404"))),
    (422, b'{"error":"' + b"x" * 65 + b'"}', HandoffQuarantined(Quarantine(422, "http_422"))),
    (408, b"", RetryLater("http 408")),
    (429, b"", RetryLater("http 429")),
    (500, b"", RetryLater("http 500")),
    (503, REJECTED_BODY, RetryLater("http 503")),
    (302, b"", RetryLater("http 302")),
]


@pytest.mark.parametrize(("status", "body", "expected"), COMMAND_ANSWERS)
def test_classify_command_answer(status: int, body: bytes, expected: object) -> None:
    assert classify_command_answer(status, body) == expected


REJECT_ANSWERS: list[tuple[int, bytes, object]] = [
    (200, REJECTED_BODY, HandoffRejected('{"version":1}')),
    (409, REJECTED_BODY, HandoffRejected('{"version":1}')),
    (200, ACCEPTED_BODY, CommandAccepted("cmd-9")),
    (200, b"{}", RetryLater("unreadable 200 answer")),
    # absence of a command is never a rejection
    (404, b'{"error":"not_found"}', WithdrawRefused(404, "not_found")),
    (200, b'{"admission":"NO_COMMAND"}', RetryLater("unreadable 200 answer")),
    (409, QUARANTINED_BODY, WithdrawRefused(409, "quarantined")),
    (503, b"", RetryLater("http 503")),
    (429, b"", RetryLater("http 429")),
]


@pytest.mark.parametrize(("status", "body", "expected"), REJECT_ANSWERS)
def test_classify_reject_answer(status: int, body: bytes, expected: object) -> None:
    assert classify_reject_answer(status, body) == expected


@given(status=st.integers(100, 599), body=st.binary(max_size=200))
def test_classifiers_accept_any_answer(status: int, body: bytes) -> None:
    classify_command_answer(status, body)
    classify_reject_answer(status, body)
    classify_batch_answer(status, body, expected=1)


@pytest.mark.parametrize(("status", "body", "expected"), COMMAND_ANSWERS)
def test_each_batch_entry_is_classified_as_its_single_answer(status: int, body: bytes,
                                                             expected: object) -> None:
    doc = json.loads(body) if body.startswith(b"{") else {}
    entry = json.dumps({"status": status, **doc}).encode()
    answers = classify_batch_answer(200, b'{"results":[' + entry + b"]}", expected=1)
    if isinstance(expected, RetryLater):
        assert isinstance(answers, list) and isinstance(answers[0], RetryLater)
    else:
        assert answers == [expected]


BATCH_FAILURES: list[tuple[int, bytes]] = [
    (503, b""),
    (429, b'{"results":[]}'),
    (200, b"not json"),
    (200, b'{"results":{}}'),
    (200, b'{"results":[{"status":200,"admission":"COMMAND_ACCEPTED","command_id":"c"}]}'),
    (200, b'{"results":[{"admission":"COMMAND_ACCEPTED","command_id":"c"},{"status":200}]}'),
]


@pytest.mark.parametrize(("status", "body"), BATCH_FAILURES)
def test_an_unreadable_batch_answer_retries_the_whole_batch(status: int, body: bytes) -> None:
    assert isinstance(classify_batch_answer(status, body, expected=2), RetryLater)


def test_apply_admission() -> None:
    accepted = apply_admission(state(), CommandAccepted("cmd-1"))
    assert (accepted.status, accepted.command_id) == (S.ACCEPTED, "cmd-1")
    assert apply_admission(accepted, CommandAccepted("cmd-1")) == accepted
    with pytest.raises(ContractViolation):
        apply_admission(accepted, CommandAccepted("cmd-2"))
    with pytest.raises(ContractViolation):
        apply_admission(accepted, HandoffRejected("{}"))
    rejected = apply_admission(state(), HandoffRejected('{"a":1}'))
    assert (rejected.status, rejected.rejection_receipt) == (S.REJECTED, '{"a":1}')
    assert apply_admission(rejected, HandoffRejected('{"b":2}')).rejection_receipt == '{"a":1}'
    with pytest.raises(ContractViolation):
        apply_admission(rejected, CommandAccepted("cmd-1"))
    quarantined = apply_admission(state(), HandoffQuarantined(Quarantine(422, "quarantined")))
    assert quarantined.status is S.QUARANTINED and quarantined.outstanding
    assert apply_admission(quarantined, HandoffRejected("{}")).status is S.REJECTED
    assert apply_admission(quarantined, CommandAccepted("cmd-1")).status is S.ACCEPTED


# -- result receipts ------------------------------------------------------------------------

NO_EFFECT = NoEffectResult(NoEffectReason.DEFINITIVE_NO_EFFECT)


def request_doc(**overrides: Any) -> dict[str, Any]:
    intent = make_intent()
    doc: dict[str, Any] = {
        "scope": SCOPE.as_json(),
        "intent_id": "int-1",
        "command_id": "cmd-1",
        "payload_digest": intent.payload_digest,
        "catalog_revision": 7,
        "result_format_version": 1,
        "remote_id": "123",
        "canonical_result": "",
        "result_digest": "",
    }
    doc.update(overrides)
    return doc


def no_effect(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "result_format_version": 2,
        "remote_id": "",
        "canonical_result": NO_EFFECT.canonical.decode(),
        "result_digest": NO_EFFECT.digest,
    }
    return request_doc(**(fields | overrides))


def committed(doc: dict[str, Any], *, kind: str = "UPSERT") -> IntentState:
    accepted = state(S.ACCEPTED, kind=kind)
    decision = decide_result(parse_result_request(doc), accepted, scope=SCOPE,
                             accept_no_effect_format=True)
    assert isinstance(decision, CommitResult)
    return apply_commit(accepted, decision, 1)


OTHER_SCOPE = attrs.evolve(SCOPE, runtime_work_binding_digest=canonical_digest({"b": 2}))
GOOD_1 = request_doc()
GOOD_2 = no_effect()

RESULT_CASES: list[tuple[str, dict[str, Any], IntentState | None, bool, object]] = [
    ("commit format 1", GOOD_1, state(S.ACCEPTED), True, CommitResult),
    ("commit format 2", GOOD_2, state(S.ACCEPTED), True, CommitResult),
    ("commit format 2 DELETE", no_effect(payload_digest=make_intent("DELETE").payload_digest),
     state(S.ACCEPTED, kind="DELETE"), True, CommitResult),
    ("old runtime accepts format 1", GOOD_1, state(S.ACCEPTED), False, CommitResult),
    ("scope org", request_doc(scope={**SCOPE.as_json(), "org_id": "org-2"}),
     state(S.ACCEPTED), True, (403, "scope_mismatch")),
    ("scope binding", request_doc(scope=OTHER_SCOPE.as_json()), None, True,
     (403, "scope_mismatch")),
    ("unknown intent", GOOD_1, None, True, (404, "unknown_intent")),
    ("pending", GOOD_1, state(S.PENDING), True, (503, "handoff_answer_pending")),
    ("rejected", GOOD_1, state(S.REJECTED), True, (409, "intent_not_accepted")),
    ("quarantined", GOOD_1, state(S.QUARANTINED), True, (409, "intent_not_accepted")),
    ("wrong command id", request_doc(command_id="cmd-2"), state(S.ACCEPTED), True,
     (409, "intent_mismatch")),
    ("wrong digest", request_doc(payload_digest=canonical_digest({})), state(S.ACCEPTED), True,
     (409, "intent_mismatch")),
    ("wrong revision", request_doc(catalog_revision=8), state(S.ACCEPTED), True,
     (409, "intent_mismatch")),
    ("format 1 without remote id", request_doc(remote_id=""), state(S.ACCEPTED), True,
     (400, "bad_result")),
    ("format 1 blank remote id", request_doc(remote_id="  "), state(S.ACCEPTED), True,
     (400, "bad_result")),
    ("format 1 with canonical result", request_doc(canonical_result="{}"), state(S.ACCEPTED),
     True, (400, "bad_result")),
    ("format 1 with digest", request_doc(result_digest=NO_EFFECT.digest), state(S.ACCEPTED),
     True, (400, "bad_result")),
    ("format 2 with remote id", no_effect(remote_id="123"),
     state(S.ACCEPTED), True, (400, "bad_result")),
    ("format 2 bad digest", no_effect() | {"result_digest": canonical_digest({})},
     state(S.ACCEPTED), True, (400, "bad_result")),
    ("format 2 not canonical", no_effect() | {
        "canonical_result": '{"version":1,"outcome":"NO_EFFECT","reason":"DEFINITIVE_NO_EFFECT"}',
        "result_digest": canonical_digest({"x": 1})}, state(S.ACCEPTED), True,
     (400, "bad_result")),
    ("format 2 for SEND_MAIL",
     no_effect(payload_digest=make_intent("SEND_MAIL").payload_digest),
     state(S.ACCEPTED, kind="SEND_MAIL"), True,
     (400, "no_effect_not_allowed")),
    ("old runtime rejects format 2", GOOD_2, state(S.ACCEPTED), False,
     (422, "unsupported_result_format")),
    ("unknown format", request_doc(result_format_version=3), state(S.ACCEPTED), True,
     (422, "unsupported_result_format")),
    ("duplicate format 1", GOOD_1, committed(GOOD_1), True, DuplicateResult),
    ("duplicate format 2", GOOD_2, committed(GOOD_2), True, DuplicateResult),
    ("conflict remote id", request_doc(remote_id="456"), committed(GOOD_1), True,
     (409, "conflicting_result")),
    ("conflict format", GOOD_2, committed(GOOD_1), True, (409, "conflicting_result")),
    ("conflict other command", request_doc(command_id="cmd-2"), committed(GOOD_1), True,
     (409, "intent_mismatch")),
]


@pytest.mark.parametrize(("name", "doc", "intent", "accept_no_effect", "expected"),
                         RESULT_CASES, ids=[c[0] for c in RESULT_CASES])
def test_decide_result(name: str, doc: dict[str, Any], intent: IntentState | None,
                       accept_no_effect: bool, expected: object) -> None:
    decision: ResultDecision = decide_result(
        parse_result_request(doc), intent, scope=SCOPE, accept_no_effect_format=accept_no_effect
    )
    if isinstance(expected, tuple):
        assert isinstance(decision, RefuseResult), decision
        assert (decision.http_status, decision.error) == expected
    else:
        assert isinstance(expected, type)
        assert isinstance(decision, expected), decision


def test_commit_records_the_exact_receipt() -> None:
    done = committed(GOOD_2)
    assert done.status is S.COMMITTED and not done.outstanding
    assert done.receipt is not None and done.receipt.result_format_version == 2
    assert done.receipt.canonical_result == NO_EFFECT.canonical.decode()


BAD_REQUESTS: list[tuple[object, str]] = [
    ([], "request must be a JSON object"),
    ({k: v for k, v in GOOD_1.items() if k != "command_id"}, "missing command_id"),
    (GOOD_1 | {"remoteId": "1"}, "unknown fields remoteId"),
    (GOOD_1 | {"catalog_revision": "7"}, "catalog_revision must be an integer"),
    (GOOD_1 | {"result_format_version": True}, "result_format_version must be an integer"),
    (GOOD_1 | {"remote_id": 123}, "remote_id must be a string"),
    (GOOD_1 | {"scope": "org-1"}, "scope must be a JSON object"),
    (GOOD_1 | {"scope": {"org_id": "org-1"}}, "scope is missing"),
    (GOOD_1 | {"scope": {**SCOPE.as_json(), "org_id": 1}}, "scope.org_id must be a string"),
]


@pytest.mark.parametrize(("doc", "message"), BAD_REQUESTS)
def test_parse_result_request_rejects(doc: object, message: str) -> None:
    with pytest.raises(BadInput, match=message):
        parse_result_request(doc)


def test_parse_result_request() -> None:
    parsed = parse_result_request(GOOD_1)
    assert parsed.scope == SCOPE and parsed.remote_id == "123"
    assert isinstance(parsed.scope, TrustedRuntimeWorkScope)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12,
)


@given(doc=st.one_of(JSON, st.fixed_dictionaries(
    {k: st.one_of(st.just(v), JSON) for k, v in GOOD_1.items()})))
def test_parse_result_request_any_json(doc: object) -> None:
    with contextlib.suppress(BadInput):
        parse_result_request(doc)


# -- owner fence ----------------------------------------------------------------------------


@pytest.mark.parametrize("status", list(IntentStatus))
def test_delete_is_fenced_by_outstanding_intents(status: IntentStatus) -> None:
    refusal = decide_delete([state(S.COMMITTED, intent_id="int-0"), state(status)])
    if status in (S.PENDING, S.ACCEPTED, S.QUARANTINED):
        assert refusal is not None and refusal.error == "outstanding_intent"
        assert refusal.intent_ids == ("int-1",)
    else:
        assert refusal is None


def test_delete_without_intents() -> None:
    assert decide_delete([]) is None


PROOF = committed(GOOD_1)
IDENTITY = RemoteIdentity("123", "int-1")

TRANSFER_CASES: list[tuple[str, dict[str, Any], str | None]] = [
    ("proven", {}, None),
    ("pending source", {"source_states": [PROOF, state(intent_id="int-2")]},
     "outstanding_intent"),
    ("accepted target", {"target_states": [state(S.ACCEPTED, intent_id="int-3",
                                                 lead_id="lead-2")]}, "outstanding_intent"),
    ("quarantined source", {"source_states": [PROOF, state(S.QUARANTINED, intent_id="int-2")]},
     "outstanding_intent"),
    ("no identity", {"source_identity": None, "proof": None}, "no_proven_remote_identity"),
    ("no-effect receipt", {"proof": committed(GOOD_2)}, "no_proven_remote_identity"),
    ("other remote id", {"source_identity": RemoteIdentity("999", "int-1")},
     "no_proven_remote_identity"),
    ("proof not committed", {"proof": state(S.ACCEPTED)}, "no_proven_remote_identity"),
    ("proof missing", {"proof": None}, "no_proven_remote_identity"),
    ("target has identity", {"target_identity": RemoteIdentity("777", "int-9")},
     "target_has_remote_identity"),
]


@pytest.mark.parametrize(("name", "overrides", "error"), TRANSFER_CASES,
                         ids=[c[0] for c in TRANSFER_CASES])
def test_decide_transfer(name: str, overrides: dict[str, Any], error: str | None) -> None:
    args: dict[str, Any] = {
        "source_states": [PROOF],
        "target_states": [],
        "source_identity": IDENTITY,
        "proof": PROOF,
        "target_identity": None,
    } | overrides
    refusal = decide_transfer(**args)
    assert (refusal.error if refusal else None) == error

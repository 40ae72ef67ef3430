"""The Runtime's per-user grants and connect-flow requests (sandbox/runtime/grants.py and
the store's flow steps), table-driven with the refusals; and ``command.user_id``."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing

from daemon.core.canonical import canonical_digest
from sandbox.runtime.grants import (
    FlowAnswer,
    FlowInputError,
    FlowName,
    FlowRefused,
    GrantMismatch,
    GrantStatus,
    UserGrant,
    apply_flow_answer,
    classify_flow_answer,
    flow_request,
)
from sandbox.runtime.model import RetryLater, build_command
from sandbox.runtime.receipts import BadInput
from sandbox.runtime.store import Refused, RuntimeStore
from tests.sandbox_runtime import SCOPE

TOKEN = "access-SECRET-1"
OK = {"binding_id": "user.ada.hubspot", "generation": 2, "state": "connected",
      "token_version": 1, "generation_bumped": True, "kind": "per_user"}


def _body(doc: object) -> bytes:
    return json.dumps(doc).encode()


@pytest.mark.parametrize(("status", "body", "expected"), [
    (200, _body(OK), FlowAnswer("user.ada.hubspot", 2, GrantStatus.CONNECTED, 1, True,
                                False)),
    (200, _body({**OK, "replayed": True, "state": "disconnected", "token_version": None}),
     FlowAnswer("user.ada.hubspot", 2, GrantStatus.DISCONNECTED, None, True, True)),
    # Not definitive: the same bytes may be sent again.
    (200, b"not json", RetryLater("unreadable 200 answer")),
    (200, _body({**OK, "generation": 0}), RetryLater("unreadable 200 answer")),
    (200, _body({**OK, "generation": True}), RetryLater("unreadable 200 answer")),
    (200, _body({**OK, "state": "gone"}), RetryLater("unreadable 200 answer")),
    (200, _body({**OK, "binding_id": ""}), RetryLater("unreadable 200 answer")),
    (200, _body({**OK, "token_version": "1"}), RetryLater("unreadable 200 answer")),
    (503, b"", RetryLater("http 503")),
    (429, b"{}", RetryLater("http 429")),
    (408, b"{}", RetryLater("http 408")),
    (302, b"", RetryLater("http 302")),
    # Refusals: contract answers, never resent.
    (409, _body({"error": "stale_generation"}), FlowRefused(409, "stale_generation")),
    (409, _body({"error": "idempotency_key_reused"}),
     FlowRefused(409, "idempotency_key_reused")),
    (404, _body({"error": "unknown_binding"}), FlowRefused(404, "unknown_binding")),
    (400, b"garbage", FlowRefused(400, "http_400")),
    (400, _body({"error": "x" * 65}), FlowRefused(400, "http_400")),
])
def test_flow_answers_are_classified(status: int, body: bytes, expected: object) -> None:
    assert classify_flow_answer(status, body) == expected


def _grant(generation: int = 2, **kw: Any) -> UserGrant:
    return UserGrant(user_id="ada", provider="hubspot", binding_id="user.ada.hubspot",
                     generation=generation, status=GrantStatus.CONNECTED, token_version=1,
                     **kw)


def _answer(generation: int, *, replayed: bool = False, binding: str = "user.ada.hubspot",
            status: GrantStatus = GrantStatus.CONNECTED) -> FlowAnswer:
    return FlowAnswer(binding, generation, status, 1, False, replayed)


@pytest.mark.parametrize(("before", "answer", "generation", "status"), [
    (None, _answer(1), 1, GrantStatus.CONNECTED),
    (_grant(1), _answer(2), 2, GrantStatus.CONNECTED),
    (_grant(2, stale=True), _answer(2, status=GrantStatus.DISCONNECTED), 2,
     GrantStatus.DISCONNECTED),
    # A replay of an older flow's answer keeps the newer facts.
    (_grant(3), _answer(2, replayed=True), 3, GrantStatus.CONNECTED),
])
def test_answers_update_the_grant(before: UserGrant | None, answer: FlowAnswer,
                                  generation: int, status: GrantStatus) -> None:
    after = apply_flow_answer(before, user_id="ada", provider="hubspot", answer=answer)
    assert (after.generation, after.status, after.stale) == (generation, status, False)


@pytest.mark.parametrize(("before", "answer", "words"), [
    (_grant(3), _answer(2), "went back from generation 3 to 2"),
    (_grant(1), _answer(2, binding="user.bob.hubspot"), "not 'user.ada.hubspot'"),
])
def test_contradicting_answers_are_contract_violations(
        before: UserGrant, answer: FlowAnswer, words: str) -> None:
    with pytest.raises(GrantMismatch, match=words):
        apply_flow_answer(before, user_id="ada", provider="hubspot", answer=answer)


def test_flow_requests_name_the_recorded_generation() -> None:
    grant = {"type": "oauth_code_exchange", "access_token": TOKEN, "expires_in": 60}
    connect = flow_request(FlowName.CONNECT, idempotency_key="k1", user_id="ada",
                           provider="hubspot", before=None,
                           doc={"identity": {"issuer": "i"}, "grant": grant})
    assert connect == {"idempotency_key": "k1", "kind": "per_user", "user_id": "ada",
                       "provider": "hubspot", "identity": {"issuer": "i"}, "grant": grant}
    reconnect = flow_request(FlowName.RECONNECT, idempotency_key="k2", user_id="ada",
                             provider="hubspot", before=_grant(4),
                             doc={"grant": grant, "reason": "re-authorized"})
    assert reconnect == {"idempotency_key": "k2", "expected_generation": 4,
                         "grant": grant, "reason": "re-authorized"}


@pytest.mark.parametrize(("flow", "before", "doc", "words"), [
    (FlowName.CONNECT, _grant(1), {}, "has a hubspot binding: reconnect it"),
    (FlowName.DISCONNECT, None, {}, "never connected hubspot"),
    (FlowName.RECONNECT, _grant(1), {"token": TOKEN}, "unknown fields token"),
    (FlowName.RECONNECT, _grant(1), {"grant": TOKEN}, "grant must be an object"),
    (FlowName.RECONNECT, _grant(1), {"identity": []}, "identity must be an object"),
    (FlowName.DISCONNECT, _grant(1), {"reason": ""}, "reason must be a string"),
])
def test_malformed_flow_requests_are_refused_without_echoing_tokens(
        flow: FlowName, before: UserGrant | None, doc: dict[str, Any], words: str) -> None:
    with pytest.raises(FlowInputError, match=words) as raised:
        flow_request(flow, idempotency_key="k", user_id="ada", provider="hubspot",
                     before=before, doc=doc)
    assert TOKEN not in str(raised.value)


def _store() -> RuntimeStore:
    ids = iter(range(1, 1000))
    return RuntimeStore(scope=SCOPE, catalog_revision=7,
                        operation="hubspot.contact.update_jobtitle",
                        also_operations=("outreach.prospect.update_title",),
                        accept_no_effect_format=True, now_us=lambda: 1,
                        new_id=lambda prefix: f"{prefix}-{next(ids)}")


def test_a_resent_action_reuses_its_idempotency_key_and_a_new_one_gets_a_new_key() -> None:
    store = _store()
    doc = {"identity": {"issuer": "i"}, "grant": {"type": "oauth_code_exchange",
                                                  "access_token": TOKEN, "expires_in": 60}}
    first = store.prepare_flow("ada", "hubspot", "connect", doc)
    again = store.prepare_flow("ada", "hubspot", "connect", doc)
    assert first.body == again.body  # the same bytes under the same key
    assert json.loads(first.body)["idempotency_key"] == "flow-1"
    assert TOKEN not in repr(first)
    other = store.prepare_flow("ada", "hubspot", "connect", {**doc, "reason": "other"})
    assert json.loads(other.body)["idempotency_key"] == "flow-2"
    grant = store.record_flow_answer("ada", "hubspot", _answer(1))
    assert grant.generation == 1 and store.pending_flows == {}
    off = store.prepare_flow("ada", "hubspot", "disconnect", {})
    assert json.loads(off.body)["expected_generation"] == 1
    store.record_flow_refusal("ada", "hubspot", FlowRefused(409, "stale_generation"))
    assert store.grants[("ada", "hubspot")].stale
    assert (store.counters["stale_generation"], store.counters["flows_refused"]) == (1, 1)
    assert store.pending_flows == {}  # the next action is a new request
    assert TOKEN not in json.dumps(store.user_view("ada"))


@pytest.mark.parametrize(("args", "error"), [
    (("a b", "hubspot", "connect"), BadInput),
    (("ada", "HubSpot", "connect"), BadInput),
    (("ada", "hubspot", "teleport"), Refused),
])
def test_bad_flow_names_are_refused(args: tuple[str, str, str], error: type) -> None:
    with pytest.raises(error):
        _store().prepare_flow(*args, {})


def test_an_owned_leads_commands_carry_user_id_one_per_operation() -> None:
    store = _store()
    store.create_lead({"lead_id": "lead-1", "title": "E", "owner": "ada"})
    store.create_lead({"lead_id": "lead-2", "title": "E"})
    owned = store.update_lead_intents("lead-1", {"title": "CTO"})
    assert [s.intent.operation for s in owned] == ["hubspot.contact.update_jobtitle",
                                                    "outreach.prospect.update_title"]
    for state in owned:
        command = json.loads(state.intent.handoff_body())["command"]
        assert command["user_id"] == "ada"
        assert state.intent.payload_digest == canonical_digest(command)
    (shared, _) = store.update_lead_intents("lead-2", {"title": "CTO"})
    assert "user_id" not in json.loads(shared.intent.handoff_body())["command"]
    assert build_command(intent_id="i", kind="UPSERT", operation="o", lead_id="l",
                         field="title", value="v", catalog_revision=1, user_id="") == {
        "intent_id": "i", "intent_kind": "UPSERT", "operation": "o",
        "logical_target": {"object": "lead", "lead_id": "l"}, "catalog_revision": 1,
        "request": {"properties": {"jobtitle": "v"}}}


@pytest.mark.parametrize("owner", ["", "a b", 7, "x" * 65])
def test_a_bad_owner_is_refused(owner: object) -> None:
    with pytest.raises(BadInput, match="owner"):
        _store().create_lead({"lead_id": "lead-1", "title": "E", "owner": owner})


class _ScriptedIntegration:
    """A connect port answering from a script; records every request byte for byte."""

    def __init__(self, *answers: FlowAnswer | FlowRefused | RetryLater,
                 read: FlowAnswer | None = None) -> None:
        self.answers = list(answers)
        self.read = read
        self.sent: list[tuple[str, str, bytes]] = []

    async def binding_flow(self, binding_id: str, flow: str,
                           body: bytes) -> FlowAnswer | FlowRefused | RetryLater:
        self.sent.append((binding_id, flow, body))
        return self.answers.pop(0)

    async def binding_read(self, binding_id: str) -> FlowAnswer | FlowRefused | RetryLater:
        return self.read if self.read is not None else RetryLater("no read")


def _runtime() -> Any:
    from sandbox.runtime import ReferenceRuntime

    return ReferenceRuntime(scope=SCOPE, integration_url="http://127.0.0.1:9",
                            integration_token="t", results_token="r", catalog_revision=7)


CONNECT_DOC = {"identity": {"issuer": "i"}, "grant": {
    "type": "oauth_code_exchange", "access_token": TOKEN, "expires_in": 60}}


async def test_an_unanswered_flow_is_resent_with_the_same_bytes_then_applied_once(
        autojump_clock: trio.testing.MockClock) -> None:
    from sandbox.runtime.connect import run_flow

    runtime = _runtime()
    port = _ScriptedIntegration(RetryLater("http 503"), RetryLater("transport error"),
                                _answer(1))
    grant = await run_flow(runtime, port, "ada", "hubspot", "connect", CONNECT_DOC)
    assert grant.generation == 1
    assert len(port.sent) == 3 and len({body for _, _, body in port.sent}) == 1
    assert port.sent[0][:2] == ("user.ada.hubspot", "connect")


async def test_no_definitive_answer_is_a_503_and_the_next_call_resends_the_same_key(
        autojump_clock: trio.testing.MockClock) -> None:
    from sandbox.runtime.connect import run_flow

    runtime = _runtime()
    port = _ScriptedIntegration(*[RetryLater("http 503")] * 3, _answer(1))
    with pytest.raises(Refused) as raised:
        await run_flow(runtime, port, "ada", "hubspot", "connect", CONNECT_DOC)
    assert (raised.value.http_status, raised.value.error) == (503, "integration_unavailable")
    assert runtime.store.grant("ada", "hubspot") is None
    await run_flow(runtime, port, "ada", "hubspot", "connect", CONNECT_DOC)
    assert len({body for _, _, body in port.sent}) == 1  # one key for the one action
    assert runtime.store.counters["flows_unanswered"] == 1


async def test_a_stale_generation_is_not_resent_and_the_binding_is_read_again() -> None:
    from sandbox.runtime.connect import run_flow

    runtime = _runtime()
    port = _ScriptedIntegration(_answer(1), FlowRefused(409, "stale_generation"),
                                _answer(3, status=GrantStatus.DISCONNECTED),
                                read=_answer(3))
    await run_flow(runtime, port, "ada", "hubspot", "connect", CONNECT_DOC)
    with pytest.raises(Refused) as raised:
        await run_flow(runtime, port, "ada", "hubspot", "disconnect", {})
    assert (raised.value.http_status, raised.value.error) == (409, "stale_generation")
    assert raised.value.extra["generation"] == 3
    assert len(port.sent) == 2  # not resent
    grant = await run_flow(runtime, port, "ada", "hubspot", "disconnect", {})
    assert json.loads(port.sent[-1][2])["expected_generation"] == 3
    assert (grant.generation, grant.status) == (3, GrantStatus.DISCONNECTED)


async def test_other_refusals_are_reported_as_bad_gateway_and_counted() -> None:
    from sandbox.runtime.connect import run_flow

    runtime = _runtime()
    port = _ScriptedIntegration(FlowRefused(400, "invalid_token_field"))
    with pytest.raises(Refused) as raised:
        await run_flow(runtime, port, "ada", "hubspot", "connect", CONNECT_DOC)
    assert (raised.value.http_status, raised.value.error) == (502, "invalid_token_field")
    assert runtime.store.counters["flows_refused"] == 1 and len(port.sent) == 1
    assert TOKEN not in str(raised.value.body())

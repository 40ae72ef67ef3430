"""The reference Runtime over real HTTP: leads, intents, owner fence, transfer, receipts."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
import trio

from daemon.core.canonical import canonical_digest
from daemon.core.handoff import EffectHandoffKey, NoEffectReason, NoEffectResult
from sandbox.runtime.model import Intent
from tests.sandbox_runtime import (
    INTEGRATION_TOKEN,
    SCOPE,
    FakeIntegration,
    RunningRuntime,
    result_request,
    running_runtime,
    wait_until,
)
from tests.support.raw_http import refused_then_next


async def accepted_intent(rt: RunningRuntime, lead_id: str = "lead-1") -> dict[str, Any]:
    intent_id = await rt.patch_title(lead_id)
    return await rt.wait_status(intent_id, "ACCEPTED")


def no_effect_request(intent: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    result = NoEffectResult(NoEffectReason.DEFINITIVE_NO_EFFECT)
    fields = {"result_format_version": 2, "remote_id": "",
              "canonical_result": result.canonical.decode(), "result_digest": result.digest}
    return result_request(intent, **(fields | overrides))


async def test_lead_update_hands_off_the_exact_command(
    rt: RunningRuntime, fake: tuple[FakeIntegration, str]
) -> None:
    await rt.create_lead("lead-1", "Engineer")
    response = await rt.http.get("/leads/lead-1")
    assert response.status_code == 200
    assert response.json() == {
        "lead_id": "lead-1", "title": "Engineer", "remote_id": None,
        "remote_id_proof_intent_id": None, "owner": None, "intents": [], "receipts": [],
    }
    intent_id = await rt.patch_title("lead-1", "CTO")
    intent = await rt.wait_status(intent_id, "ACCEPTED")
    assert intent["command_id"] == "cmd-1"

    [sent] = fake[0].commands()
    assert sent.authorization == f"Bearer {INTEGRATION_TOKEN}"
    command = {
        "intent_id": intent_id,
        "intent_kind": "UPSERT",
        "operation": "hubspot.contact.update_jobtitle",
        "logical_target": {"object": "lead", "lead_id": "lead-1"},
        "catalog_revision": 7,
        "request": {"properties": {"jobtitle": "CTO"}},
    }
    assert json.loads(sent.body) == {
        "effect_handoff_key": EffectHandoffKey(SCOPE, intent_id).encode(),
        "payload_digest": canonical_digest(command),
        "runtime_outbox_id": intent["runtime_outbox_id"],
        "command": command,
    }

    view = (await rt.http.get("/leads/lead-1")).json()
    assert view["title"] == "CTO"
    [listed] = view["intents"]
    assert listed["status"] == "ACCEPTED" and listed["value"] == "CTO"
    assert listed["in_outbox"] is False and listed["created_at"].endswith("Z")


@pytest.mark.parametrize(
    ("path", "method", "body", "status", "error"),
    [
        ("/leads", "POST", b"{", 400, "malformed_json"),
        ("/leads", "POST", b"\xff", 400, "malformed_json"),
        ("/leads", "POST", b"[]", 400, "bad_request"),
        ("/leads", "POST", b'{"lead_id": "a/b", "title": "x"}', 400, "bad_request"),
        ("/leads", "POST", b'{"lead_id": "lead-9"}', 400, "bad_request"),
        ("/leads", "POST", b'{"lead_id": "lead-1", "title": "dup"}', 409, "lead_exists"),
        ("/leads/lead-1", "PATCH", b'{"owner": "bob"}', 400, "unsupported_field"),
        ("/leads/lead-1", "PATCH", b"{}", 400, "bad_request"),
        ("/leads/lead-1", "PATCH", b"", 400, "malformed_json"),
        ("/leads/lead-404", "PATCH", b'{"title": "x"}', 404, "lead_not_found"),
        ("/leads/lead-404", "GET", None, 404, "lead_not_found"),
        ("/leads/lead-1/transfer", "POST", b'{"to_lead_id": "lead-1"}', 400, "bad_request"),
        ("/leads/lead-1/transfer", "POST", b'{"to_lead_id": "lead-7"}', 404, "target_not_found"),
        ("/leads/lead-1/intents/int-x/withdraw", "POST", None, 404, "intent_not_found"),
        ("/_runtime/intents?status=DONE", "GET", None, 400, "bad_request"),
        ("/nowhere", "GET", None, 404, "not_found"),
        ("/leads", "PUT", b"{}", 405, "method_not_allowed"),
    ],
)
async def test_input_errors_are_json(
    rt: RunningRuntime, path: str, method: str, body: bytes | None, status: int, error: str
) -> None:
    await rt.create_lead("lead-1")
    response = await rt.http.request(method, path, content=body)
    assert response.status_code == status, response.text
    assert response.json()["error"] == error
    assert isinstance(response.json()["message"], str)
    assert not rt.runtime.store.intents


@pytest.mark.parametrize("path", ["/leads", "/runtime/v1/results"])
async def test_bodies_over_64_kib_are_refused(rt: RunningRuntime, path: str) -> None:
    body = json.dumps({"lead_id": "lead-1", "title": "x" * (64 * 1024)}).encode()
    response = await rt.http.post(
        path, content=body, headers={"authorization": "Bearer results-secret-token"}
    )
    assert response.status_code == 413
    assert response.json()["error"] == "body_too_large"
    assert not rt.runtime.store.leads


@pytest.mark.parametrize(
    "authorization", [None, "Bearer wrong", "Basic results-secret-token", "results-secret-token"]
)
async def test_results_need_the_results_token(
    rt: RunningRuntime, authorization: str | None
) -> None:
    await rt.create_lead()
    intent = await accepted_intent(rt)
    headers = {"authorization": authorization} if authorization else {}
    response = await rt.http.post("/runtime/v1/results", json=result_request(intent),
                                  headers=headers)
    assert response.status_code == 401
    assert response.json()["error"] == "unauthorized"
    assert rt.status(intent["intent_id"]) == "ACCEPTED"


async def test_result_receipts_over_http(rt: RunningRuntime) -> None:
    await rt.create_lead()
    intent = await accepted_intent(rt)
    good = result_request(intent)
    other_scope = {**good["scope"], "app_installation_id": "app-2"}

    refusals = [
        (result_request(intent, scope=other_scope), 403, "scope_mismatch"),
        (result_request(intent, intent_id="int-unknown"), 404, "unknown_intent"),
        (result_request(intent, command_id="cmd-other"), 409, "intent_mismatch"),
        (result_request(intent, payload_digest=canonical_digest({})), 409, "intent_mismatch"),
        (result_request(intent, catalog_revision=8), 409, "intent_mismatch"),
        (result_request(intent, remote_id=""), 400, "bad_result"),
        (no_effect_request(intent, result_digest=canonical_digest({})), 400, "bad_result"),
        (result_request(intent, result_format_version=9), 422, "unsupported_result_format"),
        ({k: v for k, v in good.items() if k != "remote_id"}, 400, "bad_request"),
    ]
    for doc, status, error in refusals:
        response = await rt.post_result(doc)
        assert (response.status_code, response.json()["error"]) == (status, error), doc
    # a scope mismatch discloses nothing about the intent
    response = await rt.post_result(result_request(intent, scope=other_scope))
    assert set(response.json()) == {"error", "message"}
    assert intent["intent_id"] not in response.text
    assert rt.status(intent["intent_id"]) == "ACCEPTED"

    response = await rt.post_result(good)
    assert (response.status_code, response.json()) == (200, {"status": "COMMITTED"})
    response = await rt.post_result(good)
    assert (response.status_code, response.json()) == (200, {"status": "DUPLICATE"})
    response = await rt.post_result(result_request(intent, remote_id="456"))
    assert (response.status_code, response.json()["error"]) == (409, "conflicting_result")
    response = await rt.post_result(no_effect_request(intent))
    assert (response.status_code, response.json()["error"]) == (409, "conflicting_result")

    view = (await rt.http.get("/leads/lead-1")).json()
    assert view["remote_id"] == "123"
    [receipt] = view["receipts"]
    assert receipt["remote_id"] == "123" and receipt["command_id"] == intent["command_id"]
    assert view["intents"][0]["status"] == "COMMITTED"

    stats = (await rt.http.get("/_runtime/stats")).json()
    assert stats["intents_by_status"]["COMMITTED"] == 1
    assert (stats["receipts_committed"], stats["duplicates"], stats["conflicts"]) == (1, 1, 2)
    assert stats["rejected_formats"] == 1

    response = await rt.http.post("/runtime/v1/results", content=b"{nope",
                                  headers={"authorization": "Bearer results-secret-token"})
    assert (response.status_code, response.json()["error"]) == (400, "malformed_json")


async def test_result_before_acceptance_is_recorded_is_retryable(
    rt: RunningRuntime, fake: tuple[FakeIntegration, str]
) -> None:
    fake[0].hold_before_decision = trio.Event()
    await rt.create_lead()
    intent_id = await rt.patch_title()
    intent = rt.intent(intent_id) | {"command_id": "cmd-1"}
    response = await rt.post_result(result_request(intent))
    assert (response.status_code, response.json()["error"]) == (503, "handoff_answer_pending")
    assert rt.status(intent_id) == "PENDING"  # nothing recorded
    fake[0].hold_before_decision.set()
    await rt.wait_status(intent_id, "ACCEPTED")
    assert (await rt.post_result(result_request(intent))).status_code == 200


async def test_owner_fence_blocks_delete_and_transfer_until_a_terminal_receipt(
    rt: RunningRuntime, fake: tuple[FakeIntegration, str]
) -> None:
    fake[0].hold_before_decision = trio.Event()
    await rt.create_lead("lead-1")
    await rt.create_lead("lead-2")
    intent_id = await rt.patch_title("lead-1")
    await wait_until(lambda: len(fake[0].commands()) == 1)

    # pending: blocks before any remote link exists
    assert rt.status(intent_id) == "PENDING"
    response = await rt.http.delete("/leads/lead-1")
    assert response.status_code == 409
    assert response.json()["error"] == "outstanding_intent"
    assert response.json()["intent_ids"] == [intent_id]
    response = await rt.http.post("/leads/lead-1/transfer", json={"to_lead_id": "lead-2"})
    assert (response.status_code, response.json()["error"]) == (409, "outstanding_intent")
    # the target's outstanding intents block too
    response = await rt.http.post("/leads/lead-2/transfer", json={"to_lead_id": "lead-1"})
    assert (response.status_code, response.json()["intent_ids"]) == (409, [intent_id])

    fake[0].hold_before_decision.set()
    intent = await rt.wait_status(intent_id, "ACCEPTED")
    response = await rt.http.delete("/leads/lead-1")
    assert (response.status_code, response.json()["intent_ids"]) == (409, [intent_id])

    assert (await rt.post_result(result_request(intent))).status_code == 200
    response = await rt.http.post("/leads/lead-1/transfer", json={"to_lead_id": "lead-2"})
    assert response.status_code == 200, response.text
    assert response.json()["from"]["remote_id"] is None
    assert response.json()["to"]["remote_id"] == "123"
    assert (await rt.http.get("/leads/lead-2")).json()["remote_id"] == "123"
    # the identity moved: lead-1 has nothing left to transfer
    response = await rt.http.post("/leads/lead-1/transfer", json={"to_lead_id": "lead-2"})
    assert (response.status_code, response.json()["error"]) == (409, "no_proven_remote_identity")

    response = await rt.http.delete("/leads/lead-1")
    assert response.status_code == 204 and response.content == b""
    assert (await rt.http.get("/leads/lead-1")).status_code == 404
    # a committed receipt for a deleted lead is still confirmed as a duplicate
    response = await rt.post_result(result_request(intent))
    assert response.json() == {"status": "DUPLICATE"}


async def test_no_effect_receipt_releases_the_fence_but_proves_no_identity(
    rt: RunningRuntime,
) -> None:
    await rt.create_lead("lead-1")
    await rt.create_lead("lead-2")
    intent = await accepted_intent(rt)
    response = await rt.post_result(no_effect_request(intent))
    assert (response.status_code, response.json()) == (200, {"status": "COMMITTED"})
    assert (await rt.post_result(no_effect_request(intent))).json() == {"status": "DUPLICATE"}
    response = await rt.http.post("/leads/lead-1/transfer", json={"to_lead_id": "lead-2"})
    assert (response.status_code, response.json()["error"]) == (409, "no_proven_remote_identity")
    view = (await rt.http.get("/leads/lead-1")).json()
    assert view["remote_id"] is None and view["receipts"][0]["result_format_version"] == 2
    assert (await rt.http.delete("/leads/lead-1")).status_code == 204


async def test_no_effect_is_refused_for_other_intent_kinds(rt: RunningRuntime) -> None:
    await rt.create_lead("lead-1")
    store = rt.runtime.store
    intent = Intent.create(
        scope=SCOPE, intent_id="int-mail", lead_id="lead-1", field="title", value="x",
        catalog_revision=7, operation="mail.send", created_at_us=rt.runtime.now_us(),
        runtime_outbox_id="obx-mail", kind="SEND_MAIL",
    )
    store.add_intent(intent)
    rt.runtime.wakeup.set()
    view = await rt.wait_status("int-mail", "ACCEPTED")
    response = await rt.post_result(no_effect_request(view))
    assert (response.status_code, response.json()["error"]) == (400, "no_effect_not_allowed")
    assert (await rt.post_result(result_request(view))).status_code == 200


async def test_old_runtime_rejects_format_2_and_records_nothing(
    fake: tuple[FakeIntegration, str],
) -> None:
    async with running_runtime(fake[1], accept_no_effect_format=False) as rt:
        await rt.create_lead()
        intent = await accepted_intent(rt)
        response = await rt.post_result(no_effect_request(intent))
        assert (response.status_code, response.json()["error"]) == (
            422, "unsupported_result_format"
        )
        assert rt.status(intent["intent_id"]) == "ACCEPTED"
        assert (await rt.http.get("/leads/lead-1")).json()["receipts"] == []
        assert (await rt.http.delete("/leads/lead-1")).status_code == 409
        stats = (await rt.http.get("/_runtime/stats")).json()
        assert (stats["rejected_formats"], stats["receipts_committed"]) == (1, 0)
        # the same intent still settles with a success receipt
        assert (await rt.post_result(result_request(intent))).json() == {"status": "COMMITTED"}


async def test_introspection(rt: RunningRuntime, fake: tuple[FakeIntegration, str]) -> None:
    await rt.create_lead()
    first = await accepted_intent(rt)
    fake[0].command_script.append((422, {"error": "quarantined", "message": "x"}))
    second = await rt.patch_title(title="CEO")
    await rt.wait_status(second, "QUARANTINED")
    listed = (await rt.http.get("/_runtime/intents", params={"status": "ACCEPTED"})).json()
    assert [i["intent_id"] for i in listed["intents"]] == [first["intent_id"]]
    everything = (await rt.http.get("/_runtime/intents")).json()["intents"]
    assert [i["intent_id"] for i in everything] == [first["intent_id"], second]
    stats = (await rt.http.get("/_runtime/stats")).json()
    assert stats["intents_by_status"] == {
        "PENDING": 0, "ACCEPTED": 1, "REJECTED": 0, "QUARANTINED": 1, "COMMITTED": 0,
    }
    assert stats["outbox"] == 0 and stats["leads"] == 1


def test_tokens_stay_out_of_reprs() -> None:
    from tests.sandbox_runtime import runtime_config

    runtime = runtime_config("http://127.0.0.1:1")
    text = repr(runtime) + repr(attrs.asdict(runtime, recurse=False))
    assert INTEGRATION_TOKEN not in text and "results-secret-token" not in text


async def test_an_early_401_does_not_stall_the_next_request_on_the_connection(
    rt: RunningRuntime,
) -> None:
    # The receipt sender's case: the Runtime answers 401 before reading the receipt, the
    # body arrives after the answer, and the next request on that kept-alive connection
    # used to wait forever.
    address = str(rt.http.base_url).rstrip("/")
    first, second = await refused_then_next(
        address, "POST", "/runtime/v1/results",
        {"Content-Type": "application/json", "authorization": "Bearer wrong"},
        b" " * 50_000, "/_runtime/intents")
    assert first.status == 401
    assert second is not None and second.status == 200


async def test_the_connect_flow_routes_refuse_bad_requests_and_keep_no_token(
        rt: RunningRuntime) -> None:
    token = "access-SECRET-route"
    grant = {"type": "oauth_code_exchange", "access_token": token, "expires_in": 60}
    cases = [
        ("/users/a%20b/grants/hubspot/connect", {}, 400, "bad_request"),
        ("/users/ada/grants/HubSpot/connect", {}, 400, "bad_request"),
        ("/users/ada/grants/hubspot/teleport", {}, 404, "unknown_flow"),
        ("/users/ada/grants/hubspot/disconnect", {}, 400, "bad_request"),  # never connected
        ("/users/ada/grants/hubspot/connect", {"grant": grant, "token": token}, 400,
         "bad_request"),
        # This fake integrationd has no connect flows: its 404 is a refusal, not a retry.
        ("/users/ada/grants/hubspot/connect", {"grant": grant}, 502, "http_404"),
    ]
    for path, doc, status, error in cases:
        response = await rt.http.post(path, json=doc)
        assert (response.status_code, response.json()["error"]) == (status, error), path
        assert token not in response.text
    user = (await rt.http.get("/users/ada")).json()
    assert user == {"user_id": "ada", "grants": [], "leads": []}
    stats = (await rt.http.get("/_runtime/stats")).json()
    assert (stats["flows_refused"], stats["flows_applied"]) == (1, 0)
    assert token not in json.dumps(stats)

"""The reference Runtime's batch route for result receipts, over real HTTP: each request of a
batch gets, in order, the answer the single route gives it alone, and the envelope's errors
are the whole request's."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from daemon.core.canonical import canonical_digest
from sandbox.runtime.receipts import MAX_RESULTS_PER_BATCH
from tests.sandbox_runtime import (
    RESULTS_TOKEN,
    RunningRuntime,
    result_request,
)
from tests.sandbox_runtime.test_server import accepted_intent, no_effect_request

BATCH = "/runtime/v1/results/batch"


async def _batch(rt: RunningRuntime, body: object, *,
                 token: str | None = RESULTS_TOKEN) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"} if token is not None else {}
    return await rt.http.post(BATCH, json=body, headers=headers)


async def test_each_request_gets_the_single_routes_answer_in_order(rt: RunningRuntime) -> None:
    await rt.create_lead("lead-1")
    await rt.create_lead("lead-2")
    intent = await accepted_intent(rt, "lead-1")
    other = await accepted_intent(rt, "lead-2")
    good = result_request(intent)
    other_scope = {**good["scope"], "app_installation_id": "app-2"}
    cases: list[tuple[dict[str, Any], int, str]] = [
        (result_request(intent, scope=other_scope), 403, "scope_mismatch"),
        (result_request(intent, intent_id="int-unknown"), 404, "unknown_intent"),
        (result_request(intent, command_id="cmd-other"), 409, "intent_mismatch"),
        (result_request(intent, payload_digest=canonical_digest({})), 409, "intent_mismatch"),
        (result_request(intent, remote_id=""), 400, "bad_result"),
        (result_request(intent, result_format_version=9), 422, "unsupported_result_format"),
        ({k: v for k, v in good.items() if k != "remote_id"}, 400, "bad_request"),
        (good, 200, ""),                                   # committed
        (good, 200, ""),                                   # the same again: a duplicate
        (result_request(intent, remote_id="456"), 409, "conflicting_result"),
        (no_effect_request(intent), 409, "conflicting_result"),
        (result_request(other, remote_id="789"), 200, ""),  # another intent, committed
    ]
    response = await _batch(rt, {"results": [doc for doc, _, _ in cases]})
    assert response.status_code == 200, response.text
    answers = response.json()["results"]
    assert [(a["status"], a.get("error", "")) for a in answers] == \
        [(status, error) for _, status, error in cases]
    assert [a.get("result") for a in answers if a["status"] == 200] == \
        ["COMMITTED", "DUPLICATE", "COMMITTED"]
    # A refusal carries the single route's message; a scope mismatch still says nothing
    # about the intent.
    assert set(answers[0]) == {"status", "error", "message"}
    assert intent["intent_id"] not in str(answers[0])
    # What was committed is exactly what the single route would have committed.
    assert rt.status(intent["intent_id"]) == "COMMITTED"
    assert rt.status(other["intent_id"]) == "COMMITTED"
    assert (await rt.http.get("/leads/lead-1")).json()["remote_id"] == "123"
    assert (await rt.http.get("/leads/lead-2")).json()["remote_id"] == "789"
    single = await rt.post_result(good)
    assert (single.status_code, single.json()) == (200, {"status": "DUPLICATE"})
    stats = (await rt.http.get("/_runtime/stats")).json()
    assert (stats["receipts_committed"], stats["duplicates"]) == (2, 2)


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ([], "bad_request"),                                    # not an object
        ({}, "bad_request"),                                    # no "results"
        ({"results": []}, "bad_request"),                       # empty
        ({"results": {}}, "bad_request"),                       # not an array
        ({"results": [{}], "more": 1}, "bad_request"),          # another field
        ({"results": [{}] * (MAX_RESULTS_PER_BATCH + 1)}, "bad_request"),  # too many
    ],
)
async def test_a_bad_envelope_is_refused_whole_and_records_nothing(
        rt: RunningRuntime, body: object, error: str) -> None:
    await rt.create_lead()
    intent = await accepted_intent(rt)
    response = await _batch(rt, body)
    assert (response.status_code, response.json()["error"]) == (400, error)
    assert rt.status(intent["intent_id"]) == "ACCEPTED"


async def test_the_batch_route_needs_the_results_token_and_json(rt: RunningRuntime) -> None:
    await rt.create_lead()
    intent = await accepted_intent(rt)
    for token in (None, "wrong-token"):
        response = await _batch(rt, {"results": [result_request(intent)]}, token=token)
        assert (response.status_code, response.json()["error"]) == (401, "unauthorized")
    response = await rt.http.post(BATCH, content=b'{"results": [',
                                  headers={"authorization": f"Bearer {RESULTS_TOKEN}"})
    assert (response.status_code, response.json()["error"]) == (400, "malformed_json")
    assert rt.status(intent["intent_id"]) == "ACCEPTED"

"""A failed call keeps what was sent and what came back (issue 23 item 2): the executor
builds the redacted, bounded exchange excerpt for a non-2xx answer and for a call lost
in flight, never for a success, and never with the credential."""

from __future__ import annotations

import json

import pytest
import trio

from daemon.core.exchange_excerpt import MAX_EXCERPT, REDACTED
from daemon.providers.executor import HttpExecutor, prepare
from tests.providers.jsonapi import ProspectApi
from tests.providers.test_jsonapi_operation import TOKEN, binding, operation

LEAKED = "sk-live-0123456789"  # a token pasted into a field value


@pytest.fixture
async def served(nursery: trio.Nursery) -> tuple[ProspectApi, str]:
    api = ProspectApi(TOKEN)
    api.add(42, title="Engineer")
    port = await nursery.start(api.run)
    return api, f"http://127.0.0.1:{port}"


async def test_a_404_keeps_the_redacted_request_and_the_answer(
        served: tuple[ProspectApi, str]) -> None:
    _, url = served
    executor = HttpExecutor()
    try:
        prepared = prepare(operation(), binding(url), "43",
                           {"attributes": {"title": f"CTO, Bearer {LEAKED}"}}, "cmd-1")
        seen, _ = await executor.dispatch(prepared, TOKEN, 5.0)
    finally:
        await executor.aclose()
    assert seen.status == 404
    assert seen.exchange is not None
    sent = json.loads(seen.exchange.request_body)
    assert sent["data"]["attributes"] == {"title": f"CTO, Bearer {REDACTED}"}
    assert "Prospect not found" in seen.exchange.response_body
    names = {name for name, _ in seen.exchange.response_headers}
    assert "content-type" in names and names <= {"content-type", "content-length", "date",
                                                 "x-request-id"}
    stored = seen.exchange.to_json()
    assert TOKEN not in stored and LEAKED not in stored and "authorization" not in stored


async def test_a_success_keeps_no_exchange(served: tuple[ProspectApi, str]) -> None:
    _, url = served
    executor = HttpExecutor()
    try:
        prepared = prepare(operation(), binding(url), "42", {"attributes": {"title": "CTO"}},
                           "cmd-1")
        seen, _ = await executor.dispatch(prepared, TOKEN, 5.0)
    finally:
        await executor.aclose()
    assert seen.status == 200 and seen.exchange is None


async def test_a_huge_error_body_is_cut_to_the_bound(served: tuple[ProspectApi, str]) -> None:
    _, url = served
    executor = HttpExecutor()
    try:
        prepared = prepare(operation(), binding(url), "43",
                           {"attributes": {"title": "x" * 50_000}}, "cmd-1")
        seen, _ = await executor.dispatch(prepared, TOKEN, 5.0)
    finally:
        await executor.aclose()
    assert seen.exchange is not None
    assert len(seen.exchange.request_body) == MAX_EXCERPT
    assert seen.exchange.request_body.endswith("…")

"""Seed 12 (R6): Outreach's JSON:API Prospect PATCH runs on the provider-neutral
executor from its L1 definition alone (config/providers/outreach.toml), against a
minimal JSON:API endpoint on loopback, first through the executor, then through a
whole replica: /v1 admission -> WorkItem -> checkpoint -> PATCH -> settlement.
"""

from __future__ import annotations

import json

import attrs
import httpx
import pytest
import trio

from config.catalog import load_catalog, load_definitions
from config.definitions import OperationDefinition
from config.settings import BindingSettings, Secret
from daemon.core.canonical import canonical_digest
from daemon.core.effects import OutcomeClass, Phase, classify
from daemon.core.handoff import EffectHandoffKey
from daemon.core.identity import integration_scope_digest
from daemon.providers.executor import HttpExecutor, prepare
from daemon.services.assembly import assemble
from daemon.services.catalog_view import publish_current
from daemon.services.clock import WallClock
from daemon.services.metrics import Metrics
from daemon.services.replica import Replica
from sandbox.ports import free_port
from storage.effect_values import Settlement
from storage.work_store import WorkStore
from tests.providers.jsonapi import MEDIA, ProspectApi
from tests.support.backends import FreshDatabase
from tests.support.harness import wait_for
from tests.support.slice import REVISION, RUNTIME_TOKEN, SCOPE, slice_settings

OP = "outreach.prospect.update_title"
TOKEN = "outreach-token-31c4"


def operation() -> OperationDefinition:
    return load_definitions()[0][OP]


def binding(url: str) -> BindingSettings:
    return BindingSettings(
        binding_id="outreach-main", provider="outreach", org_id=SCOPE.org_id,
        app_installation_id=SCOPE.app_installation_id, remote_account_id="org-77",
        base_url=url, timeout=5.0, max_in_flight=1.0, max_clock_skew=0.1,
        auth="static_token", token=Secret(TOKEN))


@pytest.fixture
async def served(nursery: trio.Nursery) -> tuple[ProspectApi, str]:
    api = ProspectApi(TOKEN)
    api.add(42, title="Engineer", firstName="Ada")
    port = await nursery.start(api.run)
    return api, f"http://127.0.0.1:{port}"


async def test_the_executor_patches_a_prospect_from_the_definition_alone(
        served: tuple[ProspectApi, str]) -> None:
    api, url = served
    op = operation()
    executor = HttpExecutor()
    try:
        prepared = prepare(op, binding(url), "42", {"attributes": {"title": "CTO"}}, "cmd-1")
        seen, evidence = await executor.dispatch(prepared, TOKEN, 5.0)
        assert classify(op.contract, seen).outcome is OutcomeClass.ACCEPTED
        assert seen.identity is not None and seen.identity.named == "42"
        assert evidence["id"] == "42" and evidence["x-request-id"] == "req-200"
        assert evidence["updatedAt"] == api.prospects[42]["updatedAt"]
        (method, path, content_type, body) = api.seen[-1]
        assert (method, path, content_type) == ("PATCH", "/api/v2/prospects/42", MEDIA)
        assert json.loads(body) == {"data": {"type": "prospect", "id": 42,
                                             "attributes": {"title": "CTO"}}}
        assert api.prospects[42]["title"] == "CTO" and api.patches_applied == 1

        snapshot = await executor.read(op, binding(url), "42", ["title"], TOKEN, 5.0)
        assert snapshot.exists and snapshot.properties["title"] == "CTO"
        assert snapshot.properties["firstName"] == "Ada"
        assert snapshot.updated_at_us is not None
        assert api.seen[-1][:2] == ("GET", "/api/v2/prospects/42")
        missing = await executor.read(op, binding(url), "43", ["title"], TOKEN, 5.0)
        assert not missing.exists
    finally:
        await executor.aclose()


async def test_a_json_api_200_naming_another_prospect_is_outcome_unknown(
        served: tuple[ProspectApi, str]) -> None:
    api, url = served
    api.answer_with_id = 7
    op = operation()
    executor = HttpExecutor()
    try:
        prepared = prepare(op, binding(url), "42", {"attributes": {"title": "CTO"}}, "cmd-1")
        seen, _ = await executor.dispatch(prepared, TOKEN, 5.0)
        verdict = classify(op.contract, seen)
        assert (verdict.outcome, verdict.failure_class) == (OutcomeClass.OUTCOME_UNKNOWN,
                                                            "identity_mismatch")
    finally:
        await executor.aclose()


async def test_a_closed_send_gate_is_a_dispatch_that_never_left(
        served: tuple[ProspectApi, str]) -> None:
    """A quota slot that expired by the last moment before sending: held back by our own
    side (so the slot is given back and the claim requeued, no attempt charged), nothing
    arrived."""
    api, url = served
    op = operation()
    executor = HttpExecutor()
    try:
        prepared = prepare(op, binding(url), "42", {"attributes": {"title": "CTO"}}, "cmd-1")
        seen, evidence = await executor.dispatch(prepared, TOKEN, 5.0, lambda: False)
        assert (seen.phase, seen.detail, evidence) == (Phase.HELD, "quota_slot_expired", {})
        verdict = classify(op.contract, seen)
        assert (verdict.outcome, verdict.held) == (OutcomeClass.RETRYABLE_PRE_DISPATCH, True)
        assert api.seen == [] and api.prospects[42]["title"] == "Engineer"
        seen, _ = await executor.dispatch(prepared, TOKEN, 5.0, lambda: True)
        assert seen.status == 200 and api.prospects[42]["title"] == "CTO"
    finally:
        await executor.aclose()


def command(intent_id: str, title: str) -> dict[str, object]:
    doc = {
        "intent_id": intent_id, "intent_kind": "UPSERT", "operation": OP,
        "logical_target": {"object": "lead", "lead_id": "lead-1"},
        "catalog_revision": REVISION, "request": {"attributes": {"title": title}},
    }
    return {"effect_handoff_key": EffectHandoffKey(SCOPE, intent_id).encode(),
            "payload_digest": canonical_digest(doc), "runtime_outbox_id": f"ob-{intent_id}",
            "command": doc}


async def test_a_replica_runs_the_json_api_operation_end_to_end(
        database: FreshDatabase, store: WorkStore, served: tuple[ProspectApi, str]) -> None:
    api, url = served
    api_port = free_port()
    settings = slice_settings(api_port=api_port, runtime_url="http://127.0.0.1:9",
                              hubspot_url="http://127.0.0.1:9", url=database.url)
    settings = attrs.evolve(settings, bindings=(*settings.bindings, binding(url)))
    await store.link_adopt(
        integration_scope_digest(SCOPE.org_id, SCOPE.app_installation_id, "outreach",
                                 "org-77"),
        "lead", "lead-1", "prospect", "42", actor="test", role="admin",
        reason="jsonapi setup", now_us=WallClock().now_us())
    clock = WallClock()
    metrics = Metrics()
    await publish_current(store, load_catalog(settings), actor="test", role="admin",
                          reason="jsonapi setup", now_us=clock.now_us())
    parts = assemble(settings, store, clock, metrics)
    try:
        async with trio.open_nursery() as nursery, httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{api_port}",
                headers={"Authorization": f"Bearer {RUNTIME_TOKEN}"}) as http:
            replica = Replica(settings, store, parts.registry, clock, metrics=metrics,
                              api_app=parts.api_app, replica_id="jsonapi-replica")
            assert parts.api_context is not None
            parts.api_context.wake = replica.wake
            await nursery.start(replica.run)

            # A command whose request does not fit the definition is refused at the door.
            bad = command("int-bad", "CTO")
            bad["command"]["request"] = {"properties": {"title": "CTO"}}  # type: ignore[index]
            bad["payload_digest"] = canonical_digest(bad["command"])
            refused = await http.post("/v1/commands", json=bad)
            assert refused.status_code == 422, refused.text
            assert "request.attributes must be a non-empty object" in refused.json()["message"]

            accepted = await http.post("/v1/commands", json=command("int-1", "CTO"))
            assert accepted.status_code == 200, accepted.text
            command_id = accepted.json()["command_id"]

            async def settled() -> bool:
                found = await store.command_get(command_id)
                return found is not None and found.settlement is not Settlement.OPEN

            await wait_for(settled, within_s=30)
            found = await store.command_get(command_id)
            assert found is not None and found.settlement is Settlement.SUCCEEDED
            (attempt,) = await store.effect_attempts(command_id)
            assert (attempt.outcome, attempt.method, attempt.target_path) == (
                "ACCEPTED", "PATCH", "/api/v2/prospects/42")
            assert json.loads(attempt.safe_headers) == {"Content-Type": MEDIA}
            assert api.prospects[42]["title"] == "CTO" and api.patches_applied == 1
            # Drain first, as the slice harness does (the receipt item keeps retrying:
            # no Runtime listens at its results_url).
            replica.request_drain()
            await wait_for(lambda: replica.state == "stopped", within_s=30)
            nursery.cancel_scope.cancel()
    finally:
        await parts.aclose()

"""Conformance: the Runtime's connect flows on every backend (one transaction per flow).

Two flows racing on one binding generation have one winner; the same request racing
with itself (a Runtime retry while the first is still in flight) is applied once and
both callers get the same answer; a refusal writes nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from daemon.core.connect_flows import Flow
from daemon.core.principals import (
    BindingIdentity,
    BindingRefused,
    PrincipalKind,
    connect,
)
from daemon.core.token_bundle import (
    BundleContext,
    SealedBundle,
    SecretText,
    TokenBundle,
    TokenKey,
    open_bundle,
    seal,
)
from storage.binding_flows import FlowGrant, FlowKeyReused, FlowRequest, FlowResult
from storage.port import WorkConflict
from storage.principals import Actor
from storage.work_store import WorkStore
from tests.support.work import T0

KEY = TokenKey("k1", bytes(range(32)))
ID = BindingIdentity(issuer="https://auth.example", remote_account_id="portal-1",
                     remote_subject="user-1", scopes=("read", "write"))
NEW = connect(binding_id="b1", kind=PrincipalKind.PER_USER, org_id="org-1",
              app_installation_id="install-1", provider="p", identity=ID, user_id="ada")
RUNTIME = Actor("runtime:crm", "runtime", "the user connected")


def _grant(token: str) -> FlowGrant:
    bundle = TokenBundle(access_token=SecretText(token), expires_at_us=T0 + 10**9)

    def sealer(context: BundleContext) -> SealedBundle:
        return seal(bundle, KEY, context)

    return FlowGrant(seal=sealer, expires_at_us=T0 + 10**9)


def _req(flow: Flow, key: str, *, digest: str = "", token: str = "access-1",
         **over: Any) -> FlowRequest:
    fields: dict[str, Any] = {
        "runtime_name": "crm", "idempotency_key": key, "request_digest": digest or key,
        "org_id": "org-1", "app_installation_id": "install-1", "binding_id": "b1",
        "flow": flow, "actor": RUNTIME, "grant": _grant(token),
        "new": NEW if flow is Flow.CONNECT else None,
        "expected_generation": None if flow is Flow.CONNECT else 1}
    fields.update(over)
    return FlowRequest(**fields)


async def test_connect_then_reconnect_installs_each_generations_grant(
        store: WorkStore) -> None:
    first = await store.binding_flow(_req(Flow.CONNECT, "k1"), T0)
    assert (first.response["generation"], first.response["token_version"]) == (1, 1)
    second = await store.binding_flow(_req(Flow.RECONNECT, "k2", token="access-2"), T0 + 1)
    assert (second.response["generation"], second.replayed) == (2, False)
    for generation, token in ((1, "access-1"), (2, "access-2")):
        stored = await store.grant_get("b1", generation)
        assert stored is not None
        opened = open_bundle(stored.sealed, {"k1": KEY}, BundleContext("b1", generation, 1))
        assert opened.access_token.reveal() == token
    # The same key again: the stored answer, applied once.
    again = await store.binding_flow(_req(Flow.RECONNECT, "k2", token="access-2"), T0 + 2)
    assert again == FlowResult(second.response, True)
    facts = await store.binding_get("b1")
    assert facts is not None and facts.generation == 2
    with pytest.raises(FlowKeyReused):
        await store.binding_flow(_req(Flow.DISCONNECT, "k2", digest="other", grant=None,
                                      expected_generation=2), T0 + 3)


async def test_a_refusal_writes_nothing(store: WorkStore) -> None:
    await store.binding_flow(_req(Flow.CONNECT, "k1"), T0)
    audit = await store.audit_list(target_id="b1")
    with pytest.raises(BindingRefused) as info:
        await store.binding_flow(_req(Flow.RECONNECT, "k2", expected_generation=5), T0)
    assert info.value.reason == "stale_generation"
    with pytest.raises(BindingRefused) as info:
        await store.binding_flow(_req(Flow.REBIND, "k3", changes=(("issuer", "x"),)), T0)
    assert info.value.reason == "field_not_allowed"
    with pytest.raises(BindingRefused) as info:  # another scope's binding: unknown
        await store.binding_flow(_req(Flow.DISCONNECT, "k4", org_id="org-2", grant=None), T0)
    assert info.value.reason == "unknown_binding"
    assert await store.audit_list(target_id="b1") == audit
    assert await store.grant_get("b1", 2) is None
    # Refused keys were not consumed: each can still be used for a good request.
    ok = await store.binding_flow(_req(Flow.RECONNECT, "k2"), T0 + 1)
    assert ok.response["generation"] == 2


async def test_two_flows_racing_on_one_generation_have_one_winner(store: WorkStore) -> None:
    await store.binding_flow(_req(Flow.CONNECT, "k1"), T0)
    outcomes: list[str] = []

    async def reconnect(key: str) -> None:
        try:
            result = await store.binding_flow(_req(Flow.RECONNECT, key, token=key), T0 + 1)
            outcomes.append(f"gen{result.response['generation']}")
        except BindingRefused as exc:
            outcomes.append(exc.reason)
        except WorkConflict:
            outcomes.append("stale_generation")

    async with trio.open_nursery() as nursery:
        for key in ("ra", "rb", "rc"):
            nursery.start_soon(reconnect, key)
    assert sorted(outcomes) == ["gen2", "stale_generation", "stale_generation"]
    facts = await store.binding_get("b1")
    assert facts is not None and facts.generation == 2
    actions = [e.action for e in await store.audit_list(target_id="b1")]
    assert actions.count("binding.reconnect") == 1


async def test_one_request_racing_with_its_retry_is_applied_once(store: WorkStore) -> None:
    await store.binding_flow(_req(Flow.CONNECT, "k1"), T0)
    results: list[FlowResult] = []

    async def send() -> None:
        results.append(await store.binding_flow(_req(Flow.RECONNECT, "same"), T0 + 1))

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(send)
    assert {r.response["generation"] for r in results} == {2}
    assert sorted(r.replayed for r in results) == [False, True, True]
    actions = [e.action for e in await store.audit_list(target_id="b1")]
    assert actions.count("binding.reconnect") == 1


async def test_a_refresh_that_raced_a_disconnect_does_not_revive_the_grant(
        store: WorkStore) -> None:
    await store.binding_flow(_req(Flow.CONNECT, "k1"), T0)
    off = await store.binding_flow(_req(Flow.DISCONNECT, "k2", grant=None), T0 + 1)
    assert (off.response["state"], off.response["generation"]) == ("disconnected", 1)
    stored = await store.grant_get("b1", 1)
    assert stored is not None and stored.state.value == "revoked"
    # A refresh owner that read version 1 before the disconnect activates version 2.
    sealed = seal(TokenBundle(access_token=SecretText("access-late")), KEY,
                  BundleContext("b1", 1, 2))
    assert await store.grant_replace(binding_id="b1", generation=1, expected_version=1,
                                     sealed=sealed, expires_at_us=T0 + 10**9, now_us=T0 + 2,
                                     refreshed=True)
    stored = await store.grant_get("b1", 1)
    assert stored is not None and (stored.token_version, stored.state.value) == (2, "revoked")

"""Conformance: PrincipalBinding rows on every backend: audited CAS transitions."""

from __future__ import annotations

import attrs
import pytest
import trio

from daemon.core.principals import (
    BindingEvent,
    BindingIdentity,
    BindingRefused,
    BindingState,
    PrincipalKind,
    connect,
)
from storage.port import WorkConflict
from storage.principals import Actor
from storage.work_store import WorkStore
from tests.support.work import T0

ID = BindingIdentity(issuer="https://auth.example", remote_account_id="portal-1",
                     remote_subject="app-7", scopes=("write",))
FACTS = connect(binding_id="b1", kind=PrincipalKind.SHARED, org_id="org-1",
                app_installation_id="install-1", provider="p", identity=ID)
ALICE = Actor("alice", "admin", "setup")


async def test_connect_then_read(store: WorkStore) -> None:
    assert await store.binding_connect(FACTS, ALICE, T0) == FACTS
    assert await store.binding_get("b1") == FACTS
    assert await store.binding_list("org-1") == [FACTS]
    assert await store.binding_list("org-2") == []
    with pytest.raises(WorkConflict, match="already exists"):
        await store.binding_connect(FACTS, ALICE, T0)
    (entry,) = await store.audit_list(target_id="b1")
    assert (entry.action, entry.actor) == ("binding.connect", "alice")


async def test_disconnect_reconnect_moves_the_generation_once(store: WorkStore) -> None:
    await store.binding_connect(FACTS, ALICE, T0)
    off = await store.binding_transition("b1", BindingEvent.DISCONNECT, ALICE,
                                         expected_generation=1, now_us=T0)
    assert (off.state, off.generation) == (BindingState.DISCONNECTED, 1)
    back = await store.binding_transition(
        "b1", BindingEvent.RECONNECT, ALICE, expected_generation=1, now_us=T0,
        identity=attrs.evolve(ID, remote_account_id="portal-2"))
    assert (back.state, back.generation, back.identity.remote_account_id) == (
        BindingState.CONNECTED, 2, "portal-2")
    assert await store.binding_get("b1") == back
    actions = [e.action for e in await store.audit_list(target_id="b1")]
    assert sorted(actions) == ["binding.connect", "binding.disconnect", "binding.reconnect"]


async def test_a_stale_or_illegal_transition_writes_nothing(store: WorkStore) -> None:
    await store.binding_connect(FACTS, ALICE, T0)
    with pytest.raises(WorkConflict, match="not 7"):
        await store.binding_transition("b1", BindingEvent.DISCONNECT, ALICE,
                                       expected_generation=7, now_us=T0)
    with pytest.raises(BindingRefused) as info:
        await store.binding_transition("b1", BindingEvent.RECONNECT, ALICE,
                                       expected_generation=1, now_us=T0)
    assert info.value.reason == "not_disconnected"
    with pytest.raises(WorkConflict, match="no binding"):
        await store.binding_transition("nosuch", BindingEvent.DISCONNECT, ALICE,
                                       expected_generation=1, now_us=T0)
    assert await store.binding_get("b1") == FACTS
    assert len(await store.audit_list(target_id="b1")) == 1


async def test_racing_changes_have_one_winner(store: WorkStore) -> None:
    await store.binding_connect(FACTS, ALICE, T0)
    results: list[str] = []

    async def change(account: str) -> None:
        try:
            await store.binding_transition(
                "b1", BindingEvent.CHANGE, ALICE, expected_generation=1, now_us=T0,
                identity=attrs.evolve(ID, remote_account_id=account))
            results.append("won")
        except WorkConflict:
            results.append("lost")

    async with trio.open_nursery() as nursery:
        for i in range(4):
            nursery.start_soon(change, f"portal-{i + 10}")
    assert sorted(results) == ["lost", "lost", "lost", "won"]
    got = await store.binding_get("b1")
    assert got is not None and got.generation == 2
